//! Decision time of the warmroute router as pods and prompt length grow.
//!
//! Times, natively (x86-64, not wasm), the two parts of a routing decision that
//! the filter runs per request: `openai::prompt_key` (parse the chat body, hash
//! its blocks) and `Router::route` (+ `release`) over an index warmed with
//! earlier turns of the same conversations, so lookups hit real chains. Two
//! VMs (workers) share one host and take turns, each keeping a window of
//! requests open, as a busy gateway does: the ledger then holds both VMs'
//! shares and each request applies the other VM's index events.
//! The host is `MemoryHost` (shared data in a HashMap): Envoy's shared-data calls
//! cost more, which the through-Envoy overhead measurement (bench/overhead.py) covers.
//! The router's steps are timed with `phase-timing` ([`warmroute_core::phases`])
//! on a real clock: each adds ~25 ns to `route_us`.
//!
//! Output: one JSON object per line: {"axis", "backends", "prompt_tokens",
//! "body_bytes", "vms", "open", "parse_us", "route_us", "total_us"} (medians
//! over repetitions) and `steps`, the mean µs of each router step.
//!
//! Usage: `warmroute-decision-bench [--quick] [--axis pods|prompt]
//! [--backends N --tokens T] [--reps R]`.

use std::sync::OnceLock;
use std::time::Instant;

use warmroute_core::config::Config;
use warmroute_core::fleet::inflight::Delta;
use warmroute_core::phases;
use warmroute_core::prompt::openai::{prompt_key, Endpoint};
use warmroute_core::routing::router::{Request, Router, ANCHOR_BYTES};
use warmroute_core::testing::MemoryHost;

/// Worker VMs sharing the host.
const VMS: usize = 2;
/// Requests each VM keeps open (released in the order they were routed).
const OPEN: usize = 8;

/// Deterministic pseudo-words (~7 bytes with the space, one sim token each), in lines.
fn words(tag: u64, n: usize) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(n * 8);
    let mut x = tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Lines of 12 words, as the load generator writes: real prompts have
        // line breaks, and text with JSON escapes costs the parser more.
        if i > 0 {
            s.push(if i.is_multiple_of(12) { '\n' } else { ' ' });
        }
        let _ = write!(s, "w{:05x}", x & 0xfffff);
    }
    s
}

fn body(system: &str, user: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": "sim-llama-8b",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user}
        ],
        "max_tokens": 64,
        "stream": true
    }))
    .unwrap_or_default()
}

fn config(n: usize) -> Config {
    let backends: Vec<_> = (0..n)
        .map(|i| {
            serde_json::json!({"name": format!("b{i}"),
                "address": format!("10.{}.{}.{}:8000", i / 65536, (i / 256) % 256, i % 256)})
        })
        .collect();
    let cfg = serde_json::json!({"strategy": "cache_aware", "backends": backends});
    match Config::parse(cfg.to_string().as_bytes()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("config: {e}");
            std::process::exit(1)
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Nanoseconds since the first call: the real clock the router's steps are timed with.
fn clock_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// One measured point.
struct Point {
    body_bytes: usize,
    parse_us: f64,
    route_us: f64,
    steps: Vec<f64>,
}

/// Median µs of (parse+hash, route+release) for conversations of `tokens`
/// prompt tokens over `n` backends, index warmed with each conversation's
/// previous turn (the common case: a cache hit).
fn measure(n: usize, tokens: usize, reps: usize) -> Point {
    let host = MemoryHost::default();
    let cfg = config(n);
    let block = cfg.block_bytes;
    let mut vms: Vec<Router> = (0..VMS).map(|_| Router::new(cfg.clone(), &host)).collect();
    let mut open: Vec<std::collections::VecDeque<(usize, Delta)>> =
        (0..VMS).map(|_| Default::default()).collect();
    let system = words(1, 1000.min(tokens / 2));
    let user_len = tokens - 1000.min(tokens / 2);
    // Fewer conversations of long prompts: building them dominates otherwise.
    let convs = (n * 4).clamp(16, 256).min((1 << 22) / tokens).max(4);
    let mut bodies = Vec::with_capacity(convs);
    for c in 0..convs {
        let user = words(1000 + c as u64, user_len);
        // Warm: the previous turn (first 80% of the user text) is already placed.
        let cut = user.len() * 4 / 5;
        let cut = user[..cut].rfind(' ').unwrap_or(cut);
        let prev = body(&system, &user[..cut]);
        if let Ok(k) = prompt_key(Endpoint::Chat, &prev, block, ANCHOR_BYTES) {
            let vm = &mut vms[c % VMS];
            let r = vm.route(
                &host,
                &Request {
                    key: Some(&k),
                    session: None,
                    previous: None,
                },
            );
            if let Some(&b) = r.decision.order.first() {
                let _ = vm.fleet_mut().release(&host, b, r.claim);
            }
        }
        bodies.push(body(&system, &user));
    }
    let mut parse = Vec::with_capacity(reps);
    let mut route = Vec::with_capacity(reps);
    let body_bytes = bodies.first().map_or(0, Vec::len);
    let _ = phases::take();
    for i in 0..reps + OPEN * VMS {
        let b = &bodies[i % bodies.len()];
        let v = i % VMS;
        host.now.set(host.now.get() + 1);
        // The first requests only open the window: not timed.
        let timed = i >= OPEN * VMS;
        if i == OPEN * VMS {
            let _ = phases::take();
            host.ns_clock.set(Some(clock_ns));
        }
        let t0 = Instant::now();
        let key = match prompt_key(Endpoint::Chat, b, block, ANCHOR_BYTES) {
            Ok(k) => k,
            Err(e) => {
                eprintln!("prompt_key: {e:?}");
                std::process::exit(1)
            }
        };
        let t1 = Instant::now();
        let vm = &mut vms[v];
        let r = vm.route(
            &host,
            &Request {
                key: Some(&key),
                session: None,
                previous: None,
            },
        );
        if let Some(&b) = r.decision.order.first() {
            open[v].push_back((b, r.claim));
        }
        if open[v].len() > OPEN {
            if let Some((b, held)) = open[v].pop_front() {
                let _ = vm.fleet_mut().release(&host, b, held);
            }
        }
        let t2 = Instant::now();
        if timed {
            phases::count();
            parse.push((t1 - t0).as_secs_f64() * 1e6);
            route.push((t2 - t1).as_secs_f64() * 1e6);
        }
    }
    let (_, means) = phases::take();
    Point {
        body_bytes,
        parse_us: median(parse),
        route_us: median(route),
        // The router's steps (after the filter's four phases), in µs.
        steps: means.iter().skip(4).map(|ns| ns / 1000.0).collect(),
    }
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let axis: Option<String> = arg(&args, "--axis");
    let fixed_reps: Option<usize> = arg(&args, "--reps");
    let reps = |tokens: usize| {
        let base = if quick { 60 } else { 300 };
        fixed_reps.unwrap_or((base * 4096 / tokens.max(4096)).max(20))
    };
    let mut points: Vec<(&str, usize, usize)> = Vec::new();
    if let (Some(n), Some(t)) = (arg(&args, "--backends"), arg(&args, "--tokens")) {
        points.push(("point", n, t));
    } else {
        if axis.as_deref() != Some("prompt") {
            for n in [3, 16, 64, 256, 1024] {
                points.push(("backends", n, 4096));
            }
        }
        if axis.as_deref() != Some("pods") {
            let tokens: &[usize] = if quick {
                &[1024, 16384, 131072]
            } else {
                &[1024, 16384, 131072, 524288]
            };
            for &t in tokens {
                points.push(("prompt", 16, t));
            }
        }
    }
    for (axis, n, t) in points {
        let p = measure(n, t, reps(t));
        let steps: serde_json::Map<String, serde_json::Value> = phases::NAMES
            .iter()
            .skip(4)
            .zip(&p.steps)
            .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
            .collect();
        println!(
            "{}",
            serde_json::json!({"axis": axis, "backends": n, "prompt_tokens": t,
                "body_bytes": p.body_bytes, "vms": VMS, "open": OPEN,
                "parse_us": p.parse_us, "route_us": p.route_us,
                "total_us": p.parse_us + p.route_us, "steps": steps})
        );
    }
}
