//! Decision time of the warmroute router as backends and prompt length grow.
//!
//! Times, natively (x86-64, not wasm), the two parts of a routing decision that
//! the filter runs per request: `openai::prompt_key` (parse the chat body, hash
//! its blocks) and `Router::route` (+ `release`) over an index warmed with
//! earlier turns of the same conversations, so lookups hit real chains.
//! The host is `MemoryHost` (shared data in a HashMap): Envoy's shared-data calls
//! cost more, which the through-Envoy overhead measurement (bench/overhead.py) covers.
//!
//! Output: one JSON object per line: {"axis", "backends", "prompt_tokens",
//! "body_bytes", "parse_us", "route_us", "total_us"} (medians over repetitions).

use std::time::Instant;

use warmroute_core::config::Config;
use warmroute_core::openai::{prompt_key, Endpoint};
use warmroute_core::router::{Request, Router, ANCHOR_BYTES};
use warmroute_core::testing::MemoryHost;

/// Deterministic pseudo-words (~7 bytes with the space, one sim token each), in lines.
fn words(tag: u64, n: usize) -> String {
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
        s.push_str(&format!("w{:05x}", x & 0xfffff));
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
    v[v.len() / 2]
}

/// Median µs of (parse+hash, route+release) for `convs` conversations of
/// `tokens` prompt tokens over `n` backends, index warmed with each
/// conversation's previous turn (the common case: a cache hit).
fn measure(n: usize, tokens: usize, reps: usize) -> (usize, f64, f64) {
    let host = MemoryHost::default();
    let cfg = config(n);
    let block = cfg.block_bytes;
    let mut router = Router::new(cfg, &host);
    let system = words(1, 1000.min(tokens / 2));
    let user_len = tokens - 1000.min(tokens / 2);
    let convs = (n * 4).clamp(16, 256);
    let mut bodies = Vec::with_capacity(convs);
    for c in 0..convs {
        let user = words(1000 + c as u64, user_len);
        // Warm: the previous turn (first 80% of the user text) is already placed.
        let cut = user.len() * 4 / 5;
        let cut = user[..cut].rfind(' ').unwrap_or(cut);
        let prev = body(&system, &user[..cut]);
        if let Ok(k) = prompt_key(Endpoint::Chat, &prev, block, ANCHOR_BYTES) {
            let r = router.route(
                &host,
                &Request {
                    key: Some(&k),
                    session: None,
                },
            );
            let _ = router.release(&host, r.decision.order[0], r.held);
        }
        bodies.push(body(&system, &user));
    }
    let mut parse = Vec::with_capacity(reps);
    let mut route = Vec::with_capacity(reps);
    let body_bytes = bodies[0].len();
    for i in 0..reps {
        let b = &bodies[i % bodies.len()];
        host.now.set(host.now.get() + 1);
        let t0 = Instant::now();
        let key = match prompt_key(Endpoint::Chat, b, block, ANCHOR_BYTES) {
            Ok(k) => k,
            Err(e) => {
                eprintln!("prompt_key: {e:?}");
                std::process::exit(1)
            }
        };
        let t1 = Instant::now();
        let r = router.route(
            &host,
            &Request {
                key: Some(&key),
                session: None,
            },
        );
        let _ = router.release(&host, r.decision.order[0], r.held);
        let t2 = Instant::now();
        parse.push((t1 - t0).as_secs_f64() * 1e6);
        route.push((t2 - t1).as_secs_f64() * 1e6);
    }
    (body_bytes, median(parse), median(route))
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let reps = |tokens: usize| {
        let base = if quick { 60 } else { 300 };
        (base * 4096 / tokens.max(4096)).max(20)
    };
    let backend_axis: &[usize] = if quick {
        &[3, 64, 256]
    } else {
        &[3, 8, 16, 32, 64, 128, 256]
    };
    let token_axis: &[usize] = if quick {
        &[1024, 8192, 32768, 131072]
    } else {
        &[1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
    };
    for &n in backend_axis {
        let t = 4096;
        let (bytes, p, r) = measure(n, t, reps(t));
        println!(
            "{}",
            serde_json::json!({"axis": "backends", "backends": n, "prompt_tokens": t,
                "body_bytes": bytes, "parse_us": p, "route_us": r, "total_us": p + r})
        );
    }
    for &t in token_axis {
        let n = 3;
        let (bytes, p, r) = measure(n, t, reps(t));
        println!(
            "{}",
            serde_json::json!({"axis": "prompt", "backends": n, "prompt_tokens": t,
                "body_bytes": bytes, "parse_us": p, "route_us": r, "total_us": p + r})
        );
    }
}
