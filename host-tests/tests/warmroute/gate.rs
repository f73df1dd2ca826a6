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
