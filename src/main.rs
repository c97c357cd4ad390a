use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    plexus::torch_panic::install();
    // Before libtorch's first large allocation: reuse a step's freed tensors (src/malloc.rs).
    plexus::malloc::keep_freed_memory();
    let cli = plexus::cli::Cli::parse();
    match plexus::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match plexus::dist::launched_rank().filter(|&r| r > 0) {
                // A rank of `--nproc`: rank 0 speaks for the group. An error that every rank meets
                // (a batch that does not split, missing data) ends rank 0 first, and the launcher
                // stops this one before it prints; an error of this rank alone is still printed.
                // Three seconds: ranks start together, but on a loaded machine one may reach the
                // shared error a second or more before rank 0 does.
                Some(rank) => {
                    std::thread::sleep(std::time::Duration::from_secs(3));
                    eprintln!("error (rank {rank}): {e:#}");
                }
                None => eprintln!("error: {e:#}"),
            }
            ExitCode::from(plexus::cli::exit_code(&e))
        }
    }
}
