use clap::Parser;
use std::process::ExitCode;

/// A print to a closed pipe (`plexus list | head -1`) ends the process as a C program's would: by
/// SIGPIPE, quietly (a shell reports status 141), not with a panic message. Rust ignores SIGPIPE, so
/// that a write to a closed pipe or socket returns EPIPE; `print!` panics on it. Only that panic
/// is caught here: SIGPIPE stays ignored for everything else, so that a peer's closed socket in
/// data-parallel training (c10d, Gloo) is still an error the code sees, not a silent death.
fn end_quietly_on_broken_pipes() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = plexus::torch_panic::payload_text(info.payload()).unwrap_or("");
        let printing = text.starts_with("failed printing to stdout") || text.starts_with("failed printing to stderr");
        if printing && text.ends_with(&format!("(os error {})", libc::EPIPE)) {
            // SAFETY: restoring the default action of a signal and raising it in this process.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                libc::raise(libc::SIGPIPE);
            }
            std::process::exit(128 + libc::SIGPIPE);
        }
        previous(info);
    }));
}

fn main() -> ExitCode {
    plexus::torch_panic::install();
    end_quietly_on_broken_pipes();
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
