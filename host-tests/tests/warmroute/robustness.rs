//! Robustness: hostile bodies never trap the VM and always yield a routing decision;
//! memory stays bounded.

use crate::common::*;
use host_tests::*;
use serde_json::json;

fn hostile_bodies() -> Vec<(&'static str, Vec<u8>)> {
    let deep_arr = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let deep_obj = format!("{}1{}", "{\"a\":".repeat(10_000), "}".repeat(10_000));
    let deep_in_msgs = format!(
        "{{\"model\":\"m\",\"messages\":[{{\"role\":\"user\",\"content\":{}\"x\"{}}}]}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let huge = "z".repeat(6 << 20);
    let mut invalid_utf8 = br#"{"model":"m","messages":[{"role":"user","content":"abc"#.to_vec();
    invalid_utf8.extend_from_slice(b"\xff\xfe\xc3\x28\xa0\xa1\xe2\x28\xa1\xf0\x28\x8c\xbc");
    invalid_utf8.extend_from_slice(br#""}]}"#);
    let full = chat(&text(1, 2000));
    vec![
        ("empty", b"".to_vec()),
        ("whitespace", b"   \n\t ".to_vec()),
        ("null", b"null".to_vec()),
        ("truncated", full[..full.len() / 2].to_vec()),
        ("truncated-escape", br#"{"model":"m","messages":[{"role":"user","content":"abc\u12"#.to_vec()),
        ("deep-array-10k", deep_arr.into_bytes()),
        ("deep-object-10k", deep_obj.into_bytes()),
        ("deep-in-content-10k", deep_in_msgs.into_bytes()),
        ("huge-string-6MiB", json!({"model": "m", "messages": [{"role": "user", "content": huge}]}).to_string().into_bytes()),
        ("huge-model", json!({"model": "m".repeat(1 << 20), "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes()),
        ("many-messages", json!({"model": "m", "messages": (0..50_000).map(|i| json!({"role": "user", "content": i.to_string()})).collect::<Vec<_>>()}).to_string().into_bytes()),
        ("invalid-utf8", invalid_utf8),
        ("binary", (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect()),
        ("messages-number", br#"{"model":"m","messages":5}"#.to_vec()),
        ("messages-empty", br#"{"model":"m","messages":[]}"#.to_vec()),
        ("messages-null", br#"{"model":"m","messages":null}"#.to_vec()),
        ("content-object", br#"{"model":"m","messages":[{"role":"user","content":{"a":1}}]}"#.to_vec()),
        ("content-number", br#"{"model":"m","messages":[{"role":"user","content":12}]}"#.to_vec()),
        ("content-parts", br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:..."}},7,null]}]}"#.to_vec()),
        ("role-missing", br#"{"model":"m","messages":[{"content":"hi"}]}"#.to_vec()),
        ("role-number", br#"{"model":"m","messages":[{"role":1,"content":"hi"}]}"#.to_vec()),
        ("model-array", br#"{"model":[],"messages":[{"role":"user","content":"hi"}]}"#.to_vec()),
        ("prompt-array-of-ints", br#"{"model":"m","prompt":[1,2,3,[4]]}"#.to_vec()),
        ("prompt-object", br#"{"model":"m","prompt":{"x":1}}"#.to_vec()),
        ("top-level-array", br#"[{"model":"m"}]"#.to_vec()),
        ("duplicate-keys", br#"{"model":"m","messages":[],"messages":[{"role":"user","content":"hi"}]}"#.to_vec()),
        ("nul-bytes", b"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\0\"}]}".to_vec()),
        ("lone-surrogate", br#"{"model":"m","messages":[{"role":"user","content":"\ud800\udc00\ud800"}]}"#.to_vec()),
        ("big-numbers", br#"{"model":"m","max_tokens":1e999999,"messages":[{"role":"user","content":"hi"}],"n":-99999999999999999999999}"#.to_vec()),
        ("trailing-garbage", [full.clone(), b"}}}]]]".to_vec()].concat()),
    ]
}

fn check_routed(vm: &Vm, r: &Routed, what: &str) {
    assert!(
        vm.crashed().is_none(),
        "{what}: VM crashed:\n{}",
        vm.crashed().unwrap_or_default()
    );
    let e = r.stream.request_header_all(ENDPOINT);
    assert_eq!(
        e.len(),
        1,
        "{what}: expected one routing header, got {e:?}\n{}",
        vm.log_text()
    );
    assert!(
        backend_of(e[0].split(',').next().unwrap()).is_some(),
        "{what}: {e:?}"
    );
}

#[test]
fn hostile_bodies_never_trap_and_always_route() {
    for strategy in ["cache_aware", "prefix_hash"] {
        let h = host();
        let vm = start(&h, &config(3, json!({"strategy": strategy})));
        for path in ["/v1/chat/completions", "/v1/completions", "/v1/responses"] {
            for (name, body) in hostile_bodies() {
                let what = format!("{strategy} {path} {name}");
                let stream = vm.new_http_stream().unwrap();
                let hs = [
                    (":method", "POST"),
                    (":path", path),
                    (":authority", "gw"),
                    ("content-type", "application/json"),
                ];
                let ha = stream
                    .request_headers(&hs, body.is_empty())
                    .unwrap_or_else(|e| panic!("{what}: trapped on headers: {e:?}"));
                let r = if body.is_empty() {
                    Routed {
                        stream,
                        header_action: ha,
                        body_action: None,
                    }
                } else {
                    let ba = stream
                        .request_body(&body, true)
                        .unwrap_or_else(|e| panic!("{what}: trapped on body: {e:?}"));
                    assert_eq!(
                        ba,
                        Action::Continue,
                        "{what}: the body callback must continue"
                    );
                    Routed {
                        stream,
                        header_action: ha,
                        body_action: Some(ba),
                    }
                };
                check_routed(&vm, &r, &what);
                r.finish();
            }
        }
        assert!(h.metric_value("warmroute.decision.fallback").is_some());
    }
}

/// A cache_aware VM over 3 backends that tells its decisions in the debug header.
fn debug_vm(h: &Host) -> Vm {
    start(
        h,
        &config(
            3,
            json!({"strategy": "cache_aware", "debug_header": true, "debug_match_counts": true}),
        ),
    )
}

/// The request headers of a chat completion whose body follows.
const CHAT_POST: [(&str, &str); 3] = [
    (":method", "POST"),
    (":path", "/v1/chat/completions"),
    (":authority", "gw"),
];

#[test]
fn a_body_that_ends_with_trailers_is_routed_accounted_and_indexed() {
    let h = host();
    let vm = debug_vm(&h);
    let body = chat(&text(11, 6000));
    let s = vm.new_http_stream().unwrap();
    assert_eq!(s.request_headers(&CHAT_POST, false).unwrap(), Action::Pause);
    assert_eq!(s.request_body(&body, false).unwrap(), Action::Pause);
    assert_eq!(
        s.request_header(ENDPOINT),
        None,
        "routed before the trailers"
    );
    assert_eq!(
        s.request_trailers(&[("x-checksum", "1")]).unwrap(),
        Action::Continue
    );
    let first = s.request_header(ENDPOINT).expect("routed at the trailers");
    s.response_headers(&[(":status", "200")], false).unwrap();
    s.response_body(b"{}", true).unwrap();
    s.finish().unwrap();
    // Counts reach Envoy's stat at the next tick.
    h.tick_all().unwrap();
    assert_eq!(
        h.metric_value("warmroute.prompt_blocks").map(|b| b > 0),
        Some(true),
        "counted"
    );
    // Indexed: the same prompt, sent plainly, finds its prefix where the first one went.
    let again = post(&vm, "/v1/chat/completions", &body, &[]);
    assert_eq!(again.endpoint(), first);
    again
        .stream
        .response_headers(&[(":status", "200")], false)
        .unwrap();
    let dbg = again.debug();
    assert!(
        dbg.as_deref()
            .is_some_and(|d| d.contains("reason=cache_hit")),
        "{dbg:?}"
    );
}

#[test]
fn chunked_body_is_buffered_until_end_of_stream() {
    let h = host();
    let vm = debug_vm(&h);
    let body = chat(&text(5, 20_000));
    let s = vm.new_http_stream().unwrap();
    let a = s.request_headers(&CHAT_POST, false).unwrap();
    assert_eq!(a, Action::Pause);
    let chunks: Vec<&[u8]> = body.chunks(1000).collect();
    for (i, c) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let a = s.request_body(c, last).unwrap();
        if last {
            assert_eq!(a, Action::Continue);
        } else {
            assert_eq!(
                a,
                Action::Pause,
                "chunk {i}: must buffer until end of stream"
            );
            assert_eq!(
                s.request_header(ENDPOINT),
                None,
                "routed before the body was complete"
            );
        }
    }
    let chosen = s.request_header(ENDPOINT).expect("routed at end of stream");
    s.response_headers(&[(":status", "200")], false).unwrap();
    let dbg = s.response_header(DEBUG).unwrap_or_default();
    let total: u32 = dbg
        .split(';')
        .find_map(|kv| kv.strip_prefix("match="))
        .and_then(|m| m.split('/').nth(1))
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    assert!(
        total >= 70,
        "the whole 20 KB body should be hashed (~78 blocks): {dbg}"
    );
    s.finish().unwrap();
    // The same prompt sent in one piece is a full cache hit on the same backend.
    let one = chat_request(&vm, &text(5, 20_000));
    one.stream
        .response_headers(&[(":status", "200")], false)
        .unwrap();
    let d1 = one.debug().unwrap_or_default();
    assert_eq!(one.endpoint(), chosen, "{dbg} vs {d1}");
    let total = d1
        .split(';')
        .find_map(|kv| kv.strip_prefix("match="))
        .unwrap_or_default()
        .to_string();
    let (m, t) = total.split_once('/').unwrap_or(("", ""));
    assert!(
        !m.is_empty() && m == t,
        "expected a full match, got {d1} (chunked: {dbg})"
    );
}

#[test]
fn oversized_bodies_fall_back_but_still_route() {
    let h = host();
    let vm = start(&h, &config(3, json!({"max_body_bytes": 4096})));
    let big = chat(&text(1, 10_000));
    // Declared too large: decided at header time.
    let len = big.len().to_string();
    let s = vm.new_http_stream().unwrap();
    let a = s
        .request_headers(
            &[
                (":method", "POST"),
                (":path", "/v1/chat/completions"),
                (":authority", "gw"),
                ("content-length", &len),
            ],
            false,
        )
        .unwrap();
    assert_eq!(
        a,
        Action::Continue,
        "a declared oversize body must not be buffered"
    );
    assert!(s.request_header(ENDPOINT).is_some());
    assert_eq!(s.request_body(&big, true).unwrap(), Action::Continue);
    // Undeclared (chunked) and too large: fall back once the buffer passes the limit.
    let s = vm.new_http_stream().unwrap();
    s.request_headers(&CHAT_POST, false).unwrap();
    let mut routed_at = None;
    for (i, c) in big.chunks(1000).enumerate() {
        let a = s.request_body(c, false).unwrap();
        if a == Action::Continue {
            routed_at = Some(i);
            break;
        }
    }
    // Envoy's per-request buffer only has room for max_body_bytes plus one more chunk: the
    // filter must let go with the very chunk that crosses the limit, never wait for the end.
    assert_eq!(
        routed_at,
        Some(4096 / 1000),
        "did not stop buffering at the first chunk past max_body_bytes"
    );
    assert!(s.request_header(ENDPOINT).is_some());
    assert_eq!(h.metric_value("warmroute.fallback.too_large"), Some(0));
    // Counts reach Envoy's stat at the next tick.
    h.tick_all().unwrap();
    assert!(h.metric_value("warmroute.fallback.too_large").unwrap_or(0) >= 2);
}

#[test]
fn compressed_bodies_are_not_parsed_but_routed() {
    let h = host();
    let vm = start(&h, &config(3, json!({})));
    let r = post(
        &vm,
        "/v1/chat/completions",
        b"\x1f\x8b\x08\x00garbage",
        &[("content-encoding", "gzip")],
    );
    assert_eq!(
        r.header_action,
        Action::Continue,
        "compressed body: decide at header time"
    );
    r.backend();
}

/// 100k requests with distinct prefixes: the VM's linear memory must plateau.
/// (~60 s in a debug build; `cargo test --release -p host-tests` is much faster.)
#[test]
fn memory_stays_bounded_over_100k_distinct_prefixes() {
    let h = host();
    let vm = start(
        &h,
        &config(
            4,
            json!({"strategy": "cache_aware", "index": {"max_blocks": 20000, "ttl_ms": 600000, "log_bytes": 65536}}),
        ),
    );
    let n = 100_000u64;
    let mut samples = Vec::new();
    let t0 = std::time::Instant::now();
    for i in 0..n {
        // ~1.6 KB prompts, distinct from their first byte: ~6 blocks each, 600k blocks total.
        let r = chat_request(&vm, &text(i, 1600));
        r.stream.finish().unwrap();
        if i % 1000 == 999 {
            h.advance(10).unwrap();
        }
        if (i + 1) % 20_000 == 0 {
            samples.push((i + 1, vm.memory_pages()));
        }
    }
    eprintln!(
        "memory pages at (requests, pages): {samples:?} in {:?}",
        t0.elapsed()
    );
    let (_, at40k) = samples[1];
    let (_, at100k) = samples[4];
    assert!(
        at100k <= at40k + at40k / 10 + 16,
        "memory keeps growing with distinct prefixes: {samples:?} (64 KiB pages)"
    );
    assert!(
        at100k < 1024,
        "more than 64 MiB of linear memory: {samples:?}"
    );
    assert_eq!(vm.live_streams(), 0);
}

#[test]
fn memory_stays_bounded_with_default_index_limits() {
    // Default config: the default index (262144 blocks) must also stay within a sane size.
    let h = host();
    let vm = start(&h, &config(4, json!({})));
    for i in 0..20_000u64 {
        let r = chat_request(&vm, &text(i, 4000));
        r.stream.finish().unwrap();
    }
    let pages = vm.memory_pages();
    eprintln!("default config after 20k x 4KB prompts: {pages} pages");
    assert!(pages < 2048, "{pages} pages (> 128 MiB)");
}
