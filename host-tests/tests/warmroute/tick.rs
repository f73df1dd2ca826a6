//! Tick: metric scrapes through dispatch_http_call, scripted /metrics answers, health.

use crate::common::*;
use host_tests::*;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};

fn cfg(strategy: &str) -> String {
    config(
        3,
        json!({"strategy": strategy, "metrics": {"period_ms": 500, "timeout_ms": 400, "unhealthy_after": 2, "stale_after_ms": 5000}}),
    )
}

/// Advance to the next scrape and answer every pending scrape with `f(backend)`.
fn scrape_round(h: &Host, f: impl Fn(usize) -> HttpCallReply) -> Vec<HttpCall> {
    h.advance(500).unwrap();
    let calls = h.pending_http_calls();
    for c in &calls {
        h.respond(c.token, f(scrape_target(c))).unwrap();
    }
    calls
}

fn healthy(_: usize) -> HttpCallReply {
    HttpCallReply::ok(vllm_metrics(0, 0, 0.1))
}

#[test]
fn scrapes_go_to_every_backend_with_the_contract_headers() {
    let h = host();
    let c = json!({
        "backends": [
            {"name": "a", "address": "10.0.0.1:8000", "host": "a.svc:8000"},
            {"name": "b", "address": "10.0.0.2:8000", "metrics_path": "/custom/metrics"},
        ],
        "metrics": {"cluster": "vllm-pool", "period_ms": 500, "timeout_ms": 400}
    });
    let vm = start(&h, &c.to_string());
    assert_eq!(vm.tick_period_ms(), 500);
    assert!(
        h.pending_http_calls().is_empty(),
        "no scrape before the first tick"
    );
    h.advance(500).unwrap();
    let mut calls = h.pending_http_calls();
    calls.sort_by_key(|c| c.header(ENDPOINT));
    assert_eq!(calls.len(), 2, "{calls:#?}");
    for c in &calls {
        assert_eq!(c.upstream, "vllm-pool");
        assert_eq!(c.method().as_deref(), Some("GET"));
        assert_eq!(c.timeout_ms, 400);
    }
    assert_eq!(calls[0].path().as_deref(), Some("/metrics"));
    assert_eq!(calls[0].authority().as_deref(), Some("a.svc:8000"));
    assert_eq!(calls[0].header(ENDPOINT).as_deref(), Some("10.0.0.1:8000"));
    assert_eq!(calls[1].path().as_deref(), Some("/custom/metrics"));
    assert_eq!(
        calls[1].authority().as_deref(),
        Some("10.0.0.2:8000"),
        "host defaults to address"
    );
    assert_eq!(calls[1].header(ENDPOINT).as_deref(), Some("10.0.0.2:8000"));
}

#[test]
fn disabled_metrics_never_scrape() {
    let h = host();
    start(&h, &config(3, json!({"metrics": {"enabled": false}})));
    h.advance(5000).unwrap();
    assert!(
        h.http_call_history().is_empty(),
        "{:#?}",
        h.http_call_history()
    );
}

#[test]
fn only_one_vm_scrapes_per_period() {
    let h = host();
    let vms: Vec<Vm> = (0..3).map(|_| start(&h, &cfg("cache_aware"))).collect();
    let mut per_period = Vec::new();
    for _ in 0..8 {
        let calls = scrape_round(&h, healthy);
        let from: BTreeSet<usize> = calls.iter().map(|c| c.vm).collect();
        let targets: BTreeSet<usize> = calls.iter().map(scrape_target).collect();
        per_period.push((calls.len(), from.clone()));
        assert_eq!(
            from.len(),
            1,
            "more than one VM scraped in one period: {per_period:?}"
        );
        assert_eq!(
            calls.len(),
            3,
            "each backend scraped once per period: {per_period:?}"
        );
        assert_eq!(targets.len(), 3);
    }
    // Counts reach Envoy's stat at the next tick.
    h.tick_all().unwrap();
    assert_eq!(h.metric_value("warmroute.scrape.ok"), Some(24));
    drop(vms);
}

#[test]
fn scraper_role_moves_when_the_scraping_vm_stops_ticking() {
    // The scrape lease must not stay with a worker that is gone: when the scraping VM's
    // timer stops, another VM takes over within a few periods.
    let h = host();
    let vms: Vec<Vm> = (0..2).map(|_| start(&h, &cfg("cache_aware"))).collect();
    let calls = scrape_round(&h, healthy);
    let scraper = calls[0].vm;
    vms[scraper].suspend_ticks(true);
    let mut took_over_after = None;
    for period in 1..=8 {
        let calls = scrape_round(&h, healthy);
        assert!(calls.iter().all(|c| c.vm != scraper));
        if !calls.is_empty() {
            took_over_after = Some(period);
            break;
        }
    }
    let p = took_over_after.unwrap_or_else(|| {
        panic!("no other VM scraped within 8 periods after VM {scraper} stopped")
    });
    assert!(p <= 4, "takeover took {p} periods");
}

fn share_of_backend0(h: &Host, vm: &Vm, n: u64, seed: u64) -> (usize, Vec<usize>) {
    let mut c = vec![0; 3];
    for i in 0..n {
        c[route_and_finish(vm, &text(seed + i, 600))] += 1;
    }
    let _ = h;
    (c[0], c)
}

fn long_queue_gets_fewer(strategy: &str) {
    // Baseline: all backends report an empty queue.
    let h = host();
    let vm = start(&h, &cfg(strategy));
    scrape_round(&h, healthy);
    let (base0, base) = share_of_backend0(&h, &vm, 60, 10_000);
    // Same, but backend 0 reports a long waiting queue.
    let h2 = host();
    let vm2 = start(&h2, &cfg(strategy));
    scrape_round(&h2, |b| {
        if b == 0 {
            HttpCallReply::ok(vllm_metrics(16, 40, 0.9))
        } else {
            healthy(b)
        }
    });
    let (busy0, busy) = share_of_backend0(&h2, &vm2, 60, 10_000);
    assert!(
        busy0 * 4 <= base0.max(4) && busy0 <= 5,
        "{strategy}: a backend with 40 waiting requests should get far fewer requests: \
         baseline {base:?}, with long queue on vllm-0 {busy:?}"
    );
}

#[test]
fn long_waiting_queue_gets_fewer_requests_cache_aware() {
    long_queue_gets_fewer("cache_aware");
}

#[test]
fn long_waiting_queue_gets_fewer_requests_least_request() {
    long_queue_gets_fewer("least_request");
}

#[test]
fn long_waiting_queue_gets_fewer_requests_prefix_hash() {
    long_queue_gets_fewer("prefix_hash");
}

fn backends_used(vm: &Vm, n: u64, seed: u64) -> BTreeMap<usize, usize> {
    let mut m = BTreeMap::new();
    for i in 0..n {
        *m.entry(route_and_finish(vm, &text(seed + i, 300)))
            .or_insert(0) += 1;
    }
    m
}

fn down_then_up(fail: impl Fn() -> Option<HttpCallReply>) {
    let h = host();
    let vm = start(&h, &cfg("round_robin"));
    scrape_round(&h, healthy);
    assert_eq!(backends_used(&vm, 30, 0).len(), 3);
    // Backend 1 fails N=2 consecutive scrapes (None = leave unanswered -> timeout).
    for round in 0..2 {
        h.advance(500).unwrap();
        for c in h.pending_http_calls() {
            let b = scrape_target(&c);
            if b == 1 {
                if let Some(r) = fail() {
                    h.respond(c.token, r).unwrap();
                }
            } else {
                h.respond(c.token, healthy(b)).unwrap();
            }
        }
        if round == 0 {
            assert!(
                backends_used(&vm, 30, 100).contains_key(&1),
                "one failed scrape must not yet take the backend out (unhealthy_after=2)"
            );
        }
    }
    // Let any timeout fire (timeout 400 < period 500).
    h.advance(450).unwrap();
    let used = backends_used(&vm, 30, 200);
    assert!(
        !used.contains_key(&1),
        "vllm-1 failed 2 scrapes but still gets traffic: {used:?}\n{}",
        h.log_text()
    );
    assert!(
        h.logs_contain("vllm-1"),
        "no log about vllm-1 going down:\n{}",
        h.log_text()
    );
    // Two good scrapes in a row bring it back (healthy_after=2); one is not enough.
    for round in 0..2 {
        h.advance(if round == 0 { 50 } else { 500 }).unwrap();
        for c in h.pending_http_calls() {
            h.respond(c.token, healthy(scrape_target(&c))).unwrap();
        }
        if round == 0 {
            assert!(
                !backends_used(&vm, 30, 250).contains_key(&1),
                "one good scrape must not yet bring the backend back (healthy_after=2)"
            );
        }
    }
    let used = backends_used(&vm, 30, 300);
    assert!(
        used.contains_key(&1),
        "vllm-1 answered a good scrape but gets no traffic: {used:?}\n{}",
        h.log_text()
    );
    // A timed-out scrape is counted as slow, the others as failed.
    let bad = ["warmroute.scrape.failed", "warmroute.scrape.slow"]
        .map(|m| h.metric_value(m).unwrap_or(0));
    assert!(bad.iter().sum::<i64>() >= 2, "{bad:?}");
}

#[test]
fn reset_scrapes_mark_a_backend_down_and_two_good_ones_bring_it_back() {
    down_then_up(|| Some(HttpCallReply::Reset));
}

#[test]
fn timed_out_scrapes_mark_a_backend_down_and_two_good_ones_bring_it_back() {
    down_then_up(|| None);
}

#[test]
fn error_status_scrapes_mark_a_backend_down_and_two_good_ones_bring_it_back() {
    down_then_up(|| Some(HttpCallReply::status(503, "upstream connect error")));
}

#[test]
fn garbage_metrics_bodies_never_trap() {
    let h = host();
    let vm = start(&h, &cfg("cache_aware"));
    let bodies: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"\xff\xfe\x00garbage".to_vec(),
        b"vllm:num_requests_waiting NaN\nvllm:num_requests_running +Inf\nvllm:kv_cache_usage_perc -1\n".to_vec(),
        b"vllm:num_requests_waiting{model_name=\"m\" 3\n".to_vec(),
        b"vllm:num_requests_waiting 1e400\n".to_vec(),
        "x".repeat(2 << 20).into_bytes(),
        format!("vllm:num_requests_waiting{{{}}} 1\n", "a=\"b\",".repeat(10_000)).into_bytes(),
    ];
    for body in bodies {
        scrape_round(&h, |_| HttpCallReply::Response {
            status: 200,
            headers: vec![],
            body: body.clone(),
            trailers: vec![],
        });
        assert!(vm.crashed().is_none());
        route_and_finish(&vm, "still routing");
    }
}
