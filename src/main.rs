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
            eprintln!("error: {e:#}");
            ExitCode::from(plexus::cli::exit_code(&e))
        }
    }
}
