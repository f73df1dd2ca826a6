//! `warmroute-check-config [--shipped] FILE...`: the filter's own verdict on
//! plugin configurations, for deploy-time checks (deploy/validate.sh runs it
//! with `--shipped` on every `pluginConfig` and `configuration` the
//! repository ships).
//!
//! Each FILE holds one configuration exactly as Envoy hands it to the filter
//! (JSON). It is parsed and validated by the same `Config::parse` that
//! `on_configure` runs, so a config this accepts is one the filter accepts,
//! and a rejection names the same field the filter's log would. `--shipped`
//! also rejects what the filter accepts but no shipped default may do: the
//! debug header, which tells clients where requests went. Prints one line per
//! file; exits 1 if any is rejected, 2 on a usage or I/O error.

use std::process::ExitCode;
use warmroute_core::config::Config;

fn main() -> ExitCode {
    let mut files: Vec<String> = std::env::args().skip(1).collect();
    let shipped = files.first().is_some_and(|f| f == "--shipped");
    if shipped {
        files.remove(0);
    }
    if files.is_empty() {
        eprintln!("usage: warmroute-check-config [--shipped] FILE...");
        return ExitCode::from(2);
    }
    let mut rejected = 0;
    for f in &files {
        let bytes = match std::fs::read(f) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("{f}: {e}");
                return ExitCode::from(2);
            }
        };
        match Config::parse(&bytes) {
            Ok(c) if shipped && c.debug_header => {
                rejected += 1;
                println!("FAIL {f}: debug_header: must be off in a shipped configuration");
            }
            Ok(c) => println!(
                "ok   {f}: {} backends, strategy {}, route mode {:?}",
                c.backends.len(),
                c.strategy.name(),
                c.route.mode
            ),
            Err(e) => {
                rejected += 1;
                println!("FAIL {f}: {e}");
            }
        }
    }
    if rejected > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
