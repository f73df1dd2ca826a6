//! `warmroute-check-config [--shipped] [--buffer-limits BODY,LISTENER] FILE...`:
//! the filter's own verdict on plugin configurations, for deploy-time checks
//! (deploy/validate.sh runs it with `--shipped` on every `pluginConfig` and
//! `configuration` the repository ships).
//!
//! Each FILE holds one configuration exactly as Envoy hands it to the filter
//! (JSON). It is parsed and validated by the same `Config::parse` that
//! `on_configure` runs, so a config this accepts is one the filter accepts,
//! and a rejection names the same field the filter's log would. `--shipped`
//! also rejects what the filter accepts but no shipped default may do: the
//! debug header, which tells clients where requests went.
//!
//! `--buffer-limits BODY,LISTENER` names the Envoy buffers the config runs
//! under: BODY, the most one request may buffer (the virtual host's or route's
//! `request_body_buffer_limit`, else the listener's limit), and LISTENER, the
//! listener's `per_connection_buffer_limit_bytes`. The filter holds a body of
//! up to `max_body_bytes` and lets it go with the chunk that crosses that
//! size; Envoy adds each chunk to the buffer before the filter sees it, and
//! one chunk is one socket read, at most LISTENER + [`READ_SLACK`] bytes. So
//! `max_body_bytes + LISTENER + READ_SLACK <= BODY`, or a body just past
//! `max_body_bytes` is answered 413 instead of being proxied by the
//! `too_large` fallback. Prints one line per file; exits 1 if any is
//! rejected, 2 on a usage or I/O error.

use std::process::ExitCode;
use warmroute_core::config::Config;

/// How far one socket read may pass the listener's limit: Envoy reserves
/// reads in 16 KiB slices and rounds the room left up to a whole slice.
const READ_SLACK: u64 = 16 * 1024;

const USAGE: &str =
    "usage: warmroute-check-config [--shipped] [--buffer-limits BODY,LISTENER] FILE...";

/// Envoy's buffer limits a configuration runs under, in bytes.
#[derive(Clone, Copy)]
struct Buffers {
    body: u64,
    listener: u64,
}

impl Buffers {
    fn parse(s: &str) -> Option<Buffers> {
        let (body, listener) = s.split_once(',')?;
        Some(Buffers {
            body: body.trim().parse().ok()?,
            listener: listener.trim().parse().ok()?,
        })
    }

    /// Why `max_body_bytes` does not fit, if it does not.
    fn misfit(self, max_body_bytes: usize) -> Option<String> {
        let need = u64::try_from(max_body_bytes)
            .unwrap_or(u64::MAX)
            .saturating_add(self.listener)
            .saturating_add(READ_SLACK);
        (need > self.body).then(|| {
            format!(
                "max_body_bytes: {max_body_bytes} plus one socket read ({} + {READ_SLACK}) is {need}, \
                 over the {} bytes Envoy buffers per request: bodies just past max_body_bytes \
                 would get 413 (raise request_body_buffer_limit or lower max_body_bytes)",
                self.listener, self.body
            )
        })
    }
}

fn main() -> ExitCode {
    let mut shipped = false;
    let mut buffers = None;
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--shipped" => shipped = true,
            "--buffer-limits" => match args.next().as_deref().and_then(Buffers::parse) {
                Some(b) => buffers = Some(b),
                None => {
                    eprintln!("--buffer-limits wants BODY,LISTENER in bytes\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            _ => files.push(a),
        }
    }
    if files.is_empty() {
        eprintln!("{USAGE}");
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
        let verdict = Config::parse(&bytes)
            .map_err(|e| e.to_string())
            .and_then(|c| {
                if shipped && c.debug_header {
                    return Err("debug_header: must be off in a shipped configuration".into());
                }
                match buffers.and_then(|b| b.misfit(c.max_body_bytes)) {
                    Some(why) => Err(why),
                    None => Ok(c),
                }
            });
        match verdict {
            Ok(c) => println!(
                "ok   {f}: {}, strategy {}, route mode {:?}{}",
                c.describe_fleet(),
                c.strategy.name(),
                c.route.mode,
                buffers.map_or(String::new(), |b| format!(
                    ", max_body_bytes {} fits Envoy's {}-byte request buffer",
                    c.max_body_bytes, b.body
                ))
            ),
            Err(why) => {
                rejected += 1;
                println!("FAIL {f}: {why}");
            }
        }
    }
    if rejected > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_sizes_fit_and_a_listener_sized_body_buffer_does_not() {
        let shipped = Buffers::parse("16777216,1048576").unwrap();
        assert!(shipped.misfit(8 << 20).is_none());
        // Only the listener's 1 MiB for the body: even half of it leaves no room for one read.
        let listener_only = Buffers::parse("1048576,1048576").unwrap();
        assert!(listener_only.misfit(512 << 10).is_some());
        // The edge: max_body + listener + 16 KiB exactly.
        let edge =
            Buffers::parse(&format!("{},1048576", (8 << 20) + (1 << 20) + (16 << 10))).unwrap();
        assert!(edge.misfit(8 << 20).is_none());
        assert!(edge.misfit((8 << 20) + 1).is_some());
    }

    #[test]
    fn buffer_limits_must_be_two_numbers() {
        for bad in ["", "1", "1,", ",1", "a,1", "1,2,3", "-1,2"] {
            assert!(Buffers::parse(bad).is_none(), "{bad:?}");
        }
    }
}
