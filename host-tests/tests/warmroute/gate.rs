//! The priority gate through the compiled filter: two VMs (Envoy workers) share one pod at
//! its knee; a request ending in one VM wakes the other VM's held request through its shared
//! queue, which resumes it under its own context with a route; a deadline passes into a 429.

use crate::common::*;
use host_tests::*;
use serde_json::json;

fn cfg() -> String {
    config(
        1,
        json!({"metrics": {"enabled": false},
               "gate": {"knee": {"requests": 1}, "lower_share": 0}}),
    )
}

#[test]
fn a_request_ending_in_one_vm_releases_the_best_held_request_of_another() {
    let h = host();
    let a = start(&h, &cfg());
    let b = start(&h, &cfg());
    let first = chat_request(&a, &text(1, 300));
    assert_eq!(first.body_action, Some(Action::Continue));
    let batch = post(
        &b,
        "/v1/chat/completions",
        &chat(&text(2, 300)),
        &[("x-warmroute-priority", "batch")],
    );
    let chat_b = post(
        &b,
        "/v1/chat/completions",
        &chat(&text(3, 300)),
        &[("x-warmroute-priority", "interactive")],
    );
    for held in [&batch, &chat_b] {
        assert_eq!(held.body_action, Some(Action::Pause));
        assert!(
            held.header(ENDPOINT).is_none(),
            "a held request has no route yet"
        );
    }
    first.finish();
    assert!(
        !chat_b.stream.request_resumed(),
        "VM a cannot resume VM b's request itself"
    );
    h.deliver_queue_ready().unwrap();
    assert!(
        chat_b.stream.request_resumed(),
        "the wake-up resumed the interactive request"
    );
    assert_eq!(chat_b.endpoint(), addr(0));
    assert!(
        !batch.stream.request_resumed(),
        "the pod is at its knee again"
    );
    chat_b.finish();
    assert!(
        batch.stream.request_resumed(),
        "VM b released its own held request at once"
    );
    assert_eq!(batch.endpoint(), addr(0));
    batch.finish();
    h.advance(1000).unwrap();
    assert_eq!(
        h.metric_value("warmroute.gate.interactive.released"),
        Some(1)
    );
    assert_eq!(h.metric_value("warmroute.gate.batch.released"), Some(1));
    assert_eq!(h.metric_value("warmroute.backend.vllm-0.inflight"), Some(0));
}

#[test]
fn a_held_request_past_its_deadline_is_answered_429_at_the_next_check() {
    let h = host();
    let a = start(&h, &cfg());
    let first = chat_request(&a, &text(1, 300));
    let late = post(
        &a,
        "/v1/chat/completions",
        &chat(&text(2, 300)),
        &[("x-warmroute-deadline-ms", "120")],
    );
    assert_eq!(late.body_action, Some(Action::Pause));
    h.advance(100).unwrap();
    assert!(
        late.stream.local_response().is_none(),
        "not before its deadline"
    );
    h.advance(70).unwrap();
    let r = late
        .stream
        .local_response()
        .expect("a 429 one check (50 ms) after the deadline");
    assert_eq!(r.status, 429);
    first.finish();
    assert!(
        !late.stream.request_resumed(),
        "a shed request is never forwarded"
    );
}

/// Fuel the filter spends per request it releases when capacity returns for 1,024 held
/// requests at once, on 32 pods of 32 slots: the grant runs inside a CAS that may be retried,
/// so its cost per grant must not grow with everything held (it was a sort of every held
/// request and a scan of every pod for each, per grant). Fuel is deterministic: not a
/// timed assertion.
#[test]
fn releasing_a_thousand_held_requests_costs_each_about_what_routing_it_does() {
    const PODS: usize = 32;
    const HELD: usize = 1024;
    let h = fuel_host();
    let gate = json!({"gate": {
        "knee": {"requests": 32, "waiting": 1},
        "classes": [{"name": "standard", "max_wait_ms": 60000, "max_queue": HELD},
                    {"name": "batch", "max_wait_ms": 60000, "max_queue": HELD}],
        "default_class": "standard"}});
    let vm = start(&h, &config(PODS, gate));
    let fuel_of = |vm: &Vm| vm.fuel_used().expect("the host meters fuel");
    // Every pod queues: past its knee.
    // The VM ticks at the gate's check period (50 ms); scrapes go out every 500 ms.
    let scrapes = |waiting: u32| {
        let mut answered = 0;
        while answered < PODS {
            h.advance(50).unwrap();
            answered += h
                .respond_all(|_| HttpCallReply::ok(vllm_metrics(0, waiting, 0.1)))
                .unwrap();
        }
    };
    scrapes(5);
    // Two classes, so that every tenth release looks for a lower class's request.
    let held: Vec<Routed> = (0..HELD as u64)
        .map(|i| {
            let class = if i % 2 == 0 { "standard" } else { "batch" };
            post(
                &vm,
                "/v1/chat/completions",
                &chat(&text(i, 200)),
                &[("x-warmroute-priority", class)],
            )
        })
        .collect();
    let paused = held
        .iter()
        .filter(|r| r.body_action == Some(Action::Pause))
        .count();
    assert_eq!(paused, HELD, "{}", vm.log_text());
    // The same requests routed straight (another VM, no gate): the cost of routing one.
    let plain = start(&h, &config(PODS, json!({"metrics": {"enabled": false}})));
    let before = fuel_of(&plain);
    for i in 0..HELD as u64 {
        chat_request(&plain, &text(i, 200)).finish();
    }
    let route = (fuel_of(&plain) - before) / HELD as u64;
    // The next scrape finds every pod idle; the next gate check releases all.
    let before = fuel_of(&vm);
    scrapes(0);
    h.advance(50).unwrap();
    let release = (fuel_of(&vm) - before) / HELD as u64;
    let resumed = held.iter().filter(|r| r.stream.request_resumed()).count();
    eprintln!("fuel per request: routed {route}, released {release}; resumed {resumed}");
    assert_eq!(resumed, HELD);
    assert!(
        release < 4 * route,
        "releasing a held request cost {release} fuel, routing one {route}"
    );
}

#[test]
fn a_crashed_vms_held_requests_stop_holding_a_place_within_three_ticks() {
    let h = host();
    let c = config(
        1,
        json!({"metrics": {"enabled": false, "period_ms": 500},
               "gate": {"knee": {"requests": 1}, "lower_share": 0}}),
    );
    let a = start(&h, &c);
    let b = start(&h, &c);
    let first = chat_request(&a, &text(1, 300));
    assert_eq!(first.body_action, Some(Action::Continue));
    let batch = |vm: &Vm, i: u64| {
        post(
            vm,
            "/v1/chat/completions",
            &chat(&text(i, 300)),
            &[("x-warmroute-priority", "batch")],
        )
    };
    let stranded: Vec<Routed> = (0..50).map(|i| batch(&b, 100 + i)).collect();
    assert!(stranded
        .iter()
        .all(|r| r.body_action == Some(Action::Pause)));
    let live = batch(&a, 2);
    assert_eq!(live.body_action, Some(Action::Pause));
    // B's worker goes down holding 50 requests ahead of A's: none of them will ever be routed.
    b.kill("worker crashed");
    // The pod frees; its slot is granted to B's first ticket, which nobody routes.
    first.finish();
    assert!(!live.stream.request_resumed());
    // B's lease (3 ticks of 500 ms) runs out without a beat: its tickets go, held and granted.
    h.advance(3 * 500).unwrap();
    assert!(
        live.stream.request_resumed(),
        "A's request still waits behind a crashed VM's"
    );
    assert_eq!(live.endpoint(), addr(0));
    assert!(a.crashed().is_none());
}

/// Held requests keep their prompt's key in the VM until they go: a `model` of 4 MiB each
/// (no pod serves such a name) must not be kept, or 200 of them would take 800 MiB of the
/// VM's memory.
#[test]
fn held_requests_with_huge_model_names_keep_the_vm_small() {
    let h = host();
    let c = config(
        1,
        json!({"metrics": {"enabled": false},
               "gate": {"knee": {"requests": 1}, "lower_share": 0, "max_held_bytes": 1u64 << 31,
                        "classes": [{"name": "standard", "max_wait_ms": 60000, "max_queue": 256}],
                        "default_class": "standard"}}),
    );
    let vm = start(&h, &c);
    let first = chat_request(&vm, &text(1, 300));
    assert_eq!(first.body_action, Some(Action::Continue));
    // Spliced, not serialised: serde_json escaping 800 MiB of model names in a debug build
    // takes longer than the filter's reading them (`text` needs no escaping).
    let model = "m".repeat(4 << 20);
    let body = |i: u64| {
        format!(
            r#"{{"model":"{model}","messages":[{{"role":"user","content":"{}"}}]}}"#,
            text(i, 200)
        )
        .into_bytes()
    };
    // One held request first: the pages a 4 MiB body's read leaves behind are the baseline.
    let mut held = vec![post(&vm, "/v1/chat/completions", &body(0), &[])];
    let after_one = vm.memory_pages();
    held.extend((1..200).map(|i| post(&vm, "/v1/chat/completions", &body(i), &[])));
    assert!(held.iter().all(|r| r.body_action == Some(Action::Pause)));
    let after_all = vm.memory_pages();
    eprintln!("VM pages: after one held {after_one}, after 200 {after_all}");
    // 64 KiB pages: 199 more keys of 4 MiB would be 12,736 pages; a few pages per request's
    // own state is what may remain.
    assert!(
        after_all < after_one + 200,
        "{after_one} → {after_all} pages for 199 more held requests"
    );
    first.finish();
}
