//! `ordo crash` without the rest of the `ordo` command, for working on the
//! explorer alone: `cargo run --release -p ordo-crash --example crash -- --mode sync --workload seq1`.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match ordo_crash::cli::run(&args) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    }
}
