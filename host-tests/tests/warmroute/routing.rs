//! Routing: per strategy, scripted request sequences yield the expected backends; route
//! modes; client-sent routing headers are removed.

use crate::common::*;
use host_tests::*;
use serde_json::json;
use std::collections::HashSet;

fn counts(seq: &[usize], n: usize) -> Vec<usize> {
    let mut c = vec![0; n];
    for &b in seq {
        c[b] += 1;
    }
    c
}

#[test]
fn inference_post_pauses_on_headers_then_routes_on_body() {
    let h = host();
    let vm = start(&h, &config(3, json!({})));
    let r = chat_request(&vm, "hello there");
    assert_eq!(
        r.header_action,
        Action::Pause,
        "POST /v1/chat/completions must wait for the body"
    );
    assert_eq!(r.body_action, Some(Action::Continue));
    r.backend();
    for path in ["/v1/completions", "/v1/responses"] {
        let body = json!({"model": "m", "prompt": "hi", "input": "hi"}).to_string();
        let r = post(&vm, path, body.as_bytes(), &[]);
        assert_eq!(r.header_action, Action::Pause, "{path}");
        assert_eq!(r.body_action, Some(Action::Continue), "{path}");
        r.backend();
    }
}

#[test]
fn other_requests_are_routed_at_header_time() {
    let h = host();
    let vm = start(&h, &config(3, json!({})));
    for (m, p) in [
        ("GET", "/v1/models"),
        ("GET", "/health"),
        ("GET", "/v1/chat/completions"),
        ("POST", "/v1/embeddings"),
    ] {
        let s = vm.new_http_stream().unwrap();
        let a = s
            .request_headers(
                &[(":method", m), (":path", p), (":authority", "gw")],
                m == "GET",
            )
            .unwrap();
        assert_eq!(a, Action::Continue, "{m} {p} must not pause");
        let e = s
            .request_header(ENDPOINT)
            .unwrap_or_else(|| panic!("{m} {p}: no routing header"));
        assert!(
            backend_of(e.split(',').next().unwrap()).is_some(),
            "{m} {p}: {e}"
        );
        s.finish().unwrap();
    }
}

#[test]
fn post_without_body_is_routed_at_header_time() {
    let h = host();
    let vm = start(&h, &config(3, json!({})));
    let r = post(&vm, "/v1/chat/completions", b"", &[]);
    assert_eq!(r.header_action, Action::Continue);
    r.backend();
}

#[test]
fn round_robin_cycles_through_backends_in_order() {
    let h = host();
    let vm = start(&h, &config(3, json!({"strategy": "round_robin"})));
    let seq: Vec<usize> = (0..12)
        .map(|i| route_and_finish(&vm, &text(i, 300)))
        .collect();
    for w in seq.windows(2) {
        assert_eq!(w[1], (w[0] + 1) % 3, "not a rotation: {seq:?}");
    }
    assert_eq!(counts(&seq, 3), vec![4, 4, 4]);
}

#[test]
fn least_request_picks_the_least_loaded_backend() {
    let h = host();
    let vm = start(&h, &config(3, json!({"strategy": "least_request"})));
    // Three open requests land on three different backends.
    let open: Vec<Routed> = (0..3).map(|i| chat_request(&vm, &text(i, 300))).collect();
    let used: HashSet<usize> = open.iter().map(|r| r.backend()).collect();
    assert_eq!(
        used.len(),
        3,
        "three concurrent requests should spread over three backends"
    );
    // Finish the one on backend X: the next request goes to X (the only one with 0 in flight).
    let x = open[1].backend();
    open[1].finish();
    let next = chat_request(&vm, &text(100, 300));
    assert_eq!(
        next.backend(),
        x,
        "least_request should pick the backend that just freed up"
    );
    // Six more open requests (9 in flight): still balanced (each backend 3 in flight).
    let more: Vec<Routed> = (0..6)
        .map(|i| chat_request(&vm, &text(200 + i, 300)))
        .collect();
    let mut c = vec![0; 3];
    for r in open
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, r)| r)
        .chain(std::iter::once(&next))
        .chain(more.iter())
    {
        c[r.backend()] += 1;
    }
    assert_eq!(c, vec![3, 3, 3], "in-flight per backend");
}

#[test]
fn random_uses_every_backend_roughly_evenly() {
    let h = host();
    let vm = start(&h, &config(3, json!({"strategy": "random"})));
    let seq: Vec<usize> = (0..300)
        .map(|i| route_and_finish(&vm, &text(i, 100)))
        .collect();
    let c = counts(&seq, 3);
    for (b, &n) in c.iter().enumerate() {
        assert!(
            (50..=150).contains(&n),
            "backend {b} got {n}/300 requests: {c:?}"
        );
    }
    // Not a plain rotation.
    assert!(
        seq.windows(2).any(|w| w[1] != (w[0] + 1) % 3),
        "random behaves like round robin: {seq:?}"
    );
}

#[test]
fn prefix_hash_is_stable_per_prompt_and_spreads_prompts() {
    let h = host();
    let vm = start(&h, &config(4, json!({"strategy": "prefix_hash"})));
    let prompts: Vec<String> = (0..40).map(|i| text(i, 2000)).collect();
    let first: Vec<usize> = prompts.iter().map(|p| route_and_finish(&vm, p)).collect();
    let again: Vec<usize> = prompts.iter().map(|p| route_and_finish(&vm, p)).collect();
    assert_eq!(first, again, "the same prompt must map to the same backend");
    let c = counts(&first, 4);
    assert!(
        c.iter().all(|&n| n > 0),
        "40 distinct prompts should reach every backend: {c:?}"
    );
    // The same prompt from a second VM (another worker) lands on the same backend.
    let vm2 = start(&h, &config(4, json!({"strategy": "prefix_hash"})));
    let other: Vec<usize> = prompts.iter().map(|p| route_and_finish(&vm2, p)).collect();
    assert_eq!(
        first, other,
        "prefix_hash placement must not depend on the worker"
    );
}

/// Matched blocks reported by the debug response header (`match=<m>/<total>`).
fn matched_blocks(r: &Routed) -> u32 {
    r.stream
        .response_headers(&[(":status", "200")], false)
        .unwrap();
    let dbg = r
        .debug()
        .unwrap_or_else(|| panic!("debug_header on but no {DEBUG} response header"));
    dbg.split(';')
        .find_map(|kv| kv.strip_prefix("match="))
        .and_then(|m| m.split('/').next())
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("cannot parse match from {dbg:?}"))
}

/// For 12 prompts: send `first(i)`, finish, then `follow(i)` (which shares a long prefix
/// with it): the follow-up must go to the same backend and report a prefix match.
fn cache_aware_follows_prefix(
    path: &str, first: impl Fn(u64) -> Vec<u8>, follow: impl Fn(u64) -> Vec<u8>,
) {
    let h = host();
    let vm = start(
        &h,
        &config(
            4,
            json!({"strategy": "cache_aware", "debug_header": true, "debug_match_counts": true}),
        ),
    );
    let mut failures = Vec::new();
    for i in 0..12u64 {
        let a = post(&vm, path, &first(i), &[]);
        let b = a.backend();
        a.finish();
        let f = post(&vm, path, &follow(i), &[]);
        let fb = f.backend();
        let m = matched_blocks(&f);
        f.stream.finish().unwrap();
        if fb != b || m == 0 {
            failures.push(format!(
                "prompt {i}: first -> vllm-{b}, follow-up -> vllm-{fb} with match={m}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "follow-ups sharing a long prefix did not return to the prefix's backend:\n{}",
        failures.join("\n")
    );
}

#[test]
fn cache_aware_multi_turn_conversation_returns_to_its_backend() {
    let conv = |i: u64, turns: usize| -> Vec<u8> {
        let mut msgs = vec![json!({"role": "system", "content": text(7000 + i, 2000)})];
        for t in 0..turns {
            msgs.push(json!({"role": "user", "content": text(8000 + i * 10 + t as u64, 400)}));
            msgs.push(json!({"role": "assistant", "content": text(9000 + i * 10 + t as u64, 400)}));
        }
        msgs.push(json!({"role": "user", "content": format!("question {turns}")}));
        json!({"model": "m", "messages": msgs})
            .to_string()
            .into_bytes()
    };
    cache_aware_follows_prefix("/v1/chat/completions", |i| conv(i, 1), |i| conv(i, 2));
}

#[test]
fn cache_aware_same_long_prompt_prefix_returns_to_its_backend_chat() {
    // One user message; the follow-up is the same 3000-byte text plus a short suffix.
    cache_aware_follows_prefix(
        "/v1/chat/completions",
        |i| chat(&text(1000 + i, 3000)),
        |i| {
            chat(&format!(
                "{} and then a different follow-up question {i}",
                text(1000 + i, 3000)
            ))
        },
    );
}

#[test]
fn cache_aware_same_long_prompt_prefix_returns_to_its_backend_completions() {
    let body = |p: String| json!({"model": "m", "prompt": p}).to_string().into_bytes();
    cache_aware_follows_prefix(
        "/v1/completions",
        |i| body(text(3000 + i, 3000)),
        |i| body(format!("{} plus a new tail {i}", text(3000 + i, 3000))),
    );
}

#[test]
fn cache_aware_identical_prompt_is_a_full_cache_hit() {
    cache_aware_follows_prefix(
        "/v1/chat/completions",
        |i| chat(&text(4000 + i, 3000)),
        |i| chat(&text(4000 + i, 3000)),
    );
}

#[test]
fn cache_aware_spreads_unrelated_prompts() {
    let h = host();
    let vm = start(&h, &config(4, json!({"strategy": "cache_aware"})));
    let seq: Vec<usize> = (0..80)
        .map(|i| route_and_finish(&vm, &text(5000 + i, 1500)))
        .collect();
    let c = counts(&seq, 4);
    assert!(
        c.iter().all(|&n| n >= 8),
        "unrelated prompts should use every backend: {c:?}"
    );
}

#[test]
fn sticky_session_keeps_a_session_on_one_backend() {
    let h = host();
    let vm = start(&h, &config(4, json!({"strategy": "sticky_session"})));
    let mut placement = Vec::new();
    for s in 0..20 {
        let sid = format!("session-{s}");
        let mut seen = HashSet::new();
        for i in 0..5 {
            let r = post(
                &vm,
                "/v1/chat/completions",
                &chat(&text(s * 100 + i, 200)),
                &[("x-session-id", &sid)],
            );
            seen.insert(r.backend());
            r.finish();
        }
        assert_eq!(
            seen.len(),
            1,
            "session {sid} moved between backends: {seen:?}"
        );
        placement.push(*seen.iter().next().unwrap());
    }
    let c = counts(&placement, 4);
    assert!(
        c.iter().filter(|&&n| n > 0).count() >= 3,
        "20 sessions should spread: {c:?}"
    );
    // Without the header: round robin.
    let seq: Vec<usize> = (0..8)
        .map(|i| route_and_finish(&vm, &text(900 + i, 200)))
        .collect();
    for w in seq.windows(2) {
        assert_eq!(
            w[1],
            (w[0] + 1) % 4,
            "sessionless requests should rotate: {seq:?}"
        );
    }
}

#[test]
fn sticky_session_honours_a_custom_session_header() {
    let h = host();
    let vm = start(
        &h,
        &config(
            4,
            json!({"strategy": "sticky_session", "session_header": "x-conversation"}),
        ),
    );
    let mut seen = HashSet::new();
    for i in 0..6 {
        let r = post(
            &vm,
            "/v1/chat/completions",
            &chat(&text(i, 200)),
            &[("X-Conversation", "abc")],
        );
        seen.insert(r.backend());
        r.finish();
    }
    assert_eq!(seen.len(), 1, "{seen:?}");
}

#[test]
fn endpoint_mode_lists_distinct_fallbacks() {
    let h = host();
    let vm = start(
        &h,
        &config(4, json!({"route": {"mode": "endpoint", "fallbacks": 2}})),
    );
    let r = chat_request(&vm, &text(1, 500));
    let e = r.endpoint();
    let parts: Vec<&str> = e.split(',').collect();
    assert_eq!(parts.len(), 3, "primary + 2 fallbacks expected: {e}");
    let uniq: HashSet<&&str> = parts.iter().collect();
    assert_eq!(uniq.len(), 3, "fallbacks must be distinct: {e}");
    assert!(parts.iter().all(|p| backend_of(p).is_some()), "{e}");
    let vm0 = start(&h, &config(4, json!({"route": {"fallbacks": 0}})));
    assert_eq!(
        chat_request(&vm0, &text(1, 500))
            .endpoint()
            .split(',')
            .count(),
        1
    );
    // Fewer backends than fallbacks: every backend listed once.
    let vm2 = start(&h, &config(2, json!({"route": {"fallbacks": 5}})));
    assert_eq!(
        chat_request(&vm2, &text(1, 500))
            .endpoint()
            .split(',')
            .count(),
        2
    );
}

#[test]
fn header_mode_writes_the_backend_name() {
    let h = host();
    let vm = start(
        &h,
        &config(
            3,
            json!({"strategy": "round_robin", "route": {"mode": "header"}}),
        ),
    );
    let mut names = Vec::new();
    for i in 0..3 {
        let r = chat_request(&vm, &text(i, 200));
        let all = r.stream.request_header_all(BACKEND_HEADER);
        assert_eq!(all.len(), 1, "{all:?}");
        names.push(all[0].clone());
        assert_eq!(
            r.header(ENDPOINT),
            None,
            "header mode must not set {ENDPOINT}"
        );
        r.finish();
    }
    names.sort();
    assert_eq!(names, vec!["vllm-0", "vllm-1", "vllm-2"]);
    let custom = start(
        &h,
        &config(
            3,
            json!({"route": {"mode": "header", "header": "x-pool-member"}}),
        ),
    );
    let r = chat_request(&custom, &text(7, 200));
    let v = r.header("x-pool-member").expect("custom header set");
    assert!(v.starts_with("vllm-"), "{v}");
}

#[test]
fn authority_mode_rewrites_authority_to_the_backend_host() {
    let h = host();
    let vm = start(
        &h,
        &config(
            3,
            json!({"strategy": "round_robin", "route": {"mode": "authority"}}),
        ),
    );
    let mut hosts = Vec::new();
    for i in 0..3 {
        let r = chat_request(&vm, &text(i, 200));
        let authority = r.stream.request_header_all(":authority");
        // The backend's name beside it, for per-pod routes to match besides the Host (a
        // client's Host alone must not reach them while the filter does not run).
        let name = r.stream.request_header_all(BACKEND_HEADER);
        assert_eq!(name.len(), 1, "{name:?}");
        assert!(
            authority
                .iter()
                .all(|a| a.starts_with(&format!("{}.", name[0]))),
            "{authority:?} {name:?}"
        );
        hosts.push(authority);
        r.finish();
    }
    let mut flat: Vec<String> = hosts
        .into_iter()
        .map(|v| {
            assert_eq!(v.len(), 1, "{v:?}");
            v[0].clone()
        })
        .collect();
    flat.sort();
    assert_eq!(
        flat,
        vec![
            "vllm-0.vllm.ns.svc:8000",
            "vllm-1.vllm.ns.svc:8000",
            "vllm-2.vllm.ns.svc:8000"
        ]
    );
    // host defaults to the address.
    let vm2 = start(
        &h,
        r#"{"backends":[{"name":"a","address":"10.0.0.1:8000"}],"route":{"mode":"authority"}}"#,
    );
    assert_eq!(
        chat_request(&vm2, "x").header(":authority").as_deref(),
        Some("10.0.0.1:8000")
    );
}

#[test]
fn client_sent_routing_headers_are_removed() {
    let h = host();
    let evil = [
        (ENDPOINT, "6.6.6.6:1"),
        (ENDPOINT, "6.6.6.7:1"),
        (BACKEND_HEADER, "evil"),
        ("X-Gateway-Destination-Endpoint", "6.6.6.8:1"),
    ];
    // Endpoint mode, routed POST and header-time GET.
    let vm = start(&h, &config(3, json!({})));
    let r = post(&vm, "/v1/chat/completions", &chat("hi"), &evil);
    assert!(!r.endpoint().contains("6.6.6."), "{}", r.endpoint());
    assert_eq!(
        r.header(BACKEND_HEADER),
        None,
        "client {BACKEND_HEADER} kept"
    );
    let s = vm.new_http_stream().unwrap();
    let mut hs = vec![
        (":method", "GET"),
        (":path", "/v1/models"),
        (":authority", "gw"),
    ];
    hs.extend_from_slice(&evil);
    s.request_headers(&hs, true).unwrap();
    let all = s.request_header_all(ENDPOINT);
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(!all[0].contains("6.6.6."), "{all:?}");
    assert_eq!(s.request_header(BACKEND_HEADER), None);
    // Header mode with a custom header: the client copy of that header and of the endpoint header go.
    let vm = start(
        &h,
        &config(
            3,
            json!({"route": {"mode": "header", "header": "x-pool-member"}}),
        ),
    );
    let mut ev = evil.to_vec();
    ev.push(("x-pool-member", "evil"));
    let r = post(&vm, "/v1/chat/completions", &chat("hi"), &ev);
    let all = r.stream.request_header_all("x-pool-member");
    assert_eq!(all.len(), 1, "{all:?}");
    assert_ne!(all[0], "evil");
    assert_eq!(
        r.header(ENDPOINT),
        None,
        "client {ENDPOINT} kept in header mode"
    );
    assert_eq!(r.header(BACKEND_HEADER), None);
    // Even when the body cannot be parsed (fallback), the client headers are gone.
    let r = post(&vm, "/v1/chat/completions", b"{not json", &ev);
    assert_ne!(r.header("x-pool-member").as_deref(), Some("evil"));
    assert_eq!(r.header(ENDPOINT), None);
}
