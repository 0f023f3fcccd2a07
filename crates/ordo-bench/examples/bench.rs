//! `ordo bench` without the rest of the `ordo` command, for working on the
//! harness: `cargo run -p ordo-bench --example bench -- varmail --targets tmpfs`.

use clap::Parser;

#[derive(Parser)]
#[command(name = "ordo bench")]
struct Cli {
    #[command(flatten)]
    args: ordo_bench::cli::BenchArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match ordo_bench::cli::run(&cli.args) {
        Ok(code) => std::process::ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("ordo bench: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
