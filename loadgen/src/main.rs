//! `warmroute-loadgen` binary: see [`warmroute_loadgen::cli`].

use clap::Parser;

fn main() {
    let cli = warmroute_loadgen::cli::Cli::parse();
    match warmroute_loadgen::cli::main_with(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("warmroute-loadgen: error: {e:#}");
            std::process::exit(1);
        }
    }
}
