//! Several VM instances (Envoy workers) of the module sharing one shared-data store.

use crate::common::*;
use host_tests::*;
use serde_json::json;
use std::cell::RefCell;
use std::rc::Rc;

fn conv(i: u64, turns: usize) -> Vec<u8> {
    let mut msgs = vec![json!({"role": "system", "content": text(7000 + i, 2000)})];
    for t in 0..turns {
        msgs.push(json!({"role": "user", "content": text(8000 + i * 10 + t as u64, 400)}));
        msgs.push(json!({"role": "assistant", "content": text(9000 + i * 10 + t as u64, 400)}));
    }
    msgs.push(json!({"role": "user", "content": format!("question {turns}")}));
    json!({"model": "m", "messages": msgs})
        .to_string()
        .into_bytes()
}

fn matched(r: &Routed) -> u32 {
    r.stream
        .response_headers(&[(":status", "200")], false)
        .unwrap();
    let d = r.debug().expect("debug header");
    d.split(';')
        .find_map(|kv| kv.strip_prefix("match="))
        .and_then(|m| m.split('/').next())
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("{d}"))
}

fn cfg() -> String {
    config(
        4,
        json!({"strategy": "cache_aware", "debug_header": true, "debug_match_counts": true, "metrics": {"enabled": false}}),
    )
}

#[test]
fn prefix_learned_through_one_vm_is_matched_through_another() {
    let h = host();
    let a = start(&h, &cfg());
    let b = start(&h, &cfg());
    let mut bad = Vec::new();
    for i in 0..8u64 {
        let ra = post(&a, "/v1/chat/completions", &conv(i, 1), &[]);
        let ba = ra.backend();
        ra.finish();
        let rb = post(&b, "/v1/chat/completions", &conv(i, 2), &[]);
        let bb = rb.backend();
        let m = matched(&rb);
        rb.stream.finish().unwrap();
        if ba != bb || m == 0 {
            bad.push(format!(
                "conversation {i}: VM A -> vllm-{ba}; VM B -> vllm-{bb} match={m}"
            ));
        }
        // And the identical prompt through B is a hit too.
        let same = post(&b, "/v1/chat/completions", &conv(i, 1), &[]);
        let sb = same.backend();
        let sm = matched(&same);
        same.stream.finish().unwrap();
        if sb != ba || sm == 0 {
            bad.push(format!(
                "identical prompt {i}: VM A -> vllm-{ba}; VM B -> vllm-{sb} match={sm}"
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "VM B did not use what VM A learned:\n{}",
        bad.join("\n")
    );
}

#[test]
fn round_robin_rotation_is_shared_by_all_workers() {
    let h = host();
    let c = config(
        3,
        json!({"strategy": "round_robin", "metrics": {"enabled": false}}),
    );
    let vms = [start(&h, &c), start(&h, &c)];
    let seq: Vec<usize> = (0..12)
        .map(|i| route_and_finish(&vms[i % 2], &text(i as u64, 200)))
        .collect();
    for w in seq.windows(2) {
        assert_eq!(
            w[1],
            (w[0] + 1) % 3,
            "rotation not shared across VMs: {seq:?}"
        );
    }
}

fn inflight_total(h: &Host, n: usize) -> i64 {
    (0..n)
        .map(|i| {
            h.metric_value(&format!("warmroute.backend.vllm-{i}.inflight"))
                .unwrap_or(0)
        })
        .sum()
}

#[test]
fn a_crashed_vms_in_flight_is_taken_back_within_three_ticks() {
    let h = host();
    // Ticks every 500 ms; scraping off so only the ledger is at work.
    let c = config(
        2,
        json!({"strategy": "least_request", "metrics": {"enabled": false, "period_ms": 500, "timeout_ms": 400}}),
    );
    let a = start(&h, &c);
    let b = start(&h, &c);
    let routed: Vec<Routed> = (0..10)
        .map(|i| chat_request(&a, &format!("q{i}")))
        .collect();
    for r in routed.iter().take(5) {
        r.finish();
    }
    h.tick_all().unwrap();
    assert_eq!(inflight_total(&h, 2), 5, "{:?}", h.metrics());
    // A's VM goes down with five requests open: nothing of it runs again.
    a.kill("worker crashed");
    for _ in 0..3 {
        h.advance(500).unwrap();
    }
    assert_eq!(
        inflight_total(&h, 2),
        0,
        "B's ticks did not take A's share back: {:?}",
        h.metrics()
    );
    assert!(b.crashed().is_none());
}

#[test]
fn inflight_cas_conflict_between_vms_loses_no_update() {
    let h = host();
    let c = config(
        2,
        json!({"strategy": "least_request", "metrics": {"enabled": false}}),
    );
    let a = start(&h, &c);
    let b = start(&h, &c);
    // Make the in-flight key exist (so the next write is a real CAS).
    route_and_finish(&a, "warm-up");
    let before = h.shared_data().lock().unwrap().cas_mismatches;
    // While A is between its read and its CAS write of the in-flight counters, B routes
    // (and accounts) a request of its own.
    let b_req: Rc<RefCell<Option<Routed>>> = Rc::new(RefCell::new(None));
    {
        let (b, slot) = (b.clone(), b_req.clone());
        h.before_shared_set(Some(&a), "ledger", 1, move |_| {
            *slot.borrow_mut() = Some(chat_request(&b, "from B"));
        });
    }
    let ra = chat_request(&a, "from A");
    let rb = b_req
        .borrow_mut()
        .take()
        .expect("the hook ran: A wrote the in-flight key");
    assert!(
        h.shared_data().lock().unwrap().cas_mismatches > before,
        "no CAS conflict happened (did A write in-flight with cas=0?)"
    );
    // Both requests are accounted: 2 in flight.
    h.advance(1000).unwrap();
    assert_eq!(
        inflight_total(&h, 2),
        2,
        "an in-flight update was lost: {:?}",
        h.metrics()
    );
    // least_request sees both: a third request goes where fewer are in flight.
    let (x, y) = (ra.backend(), rb.backend());
    let third = chat_request(&b, "third");
    if x == y {
        assert_ne!(
            third.backend(),
            x,
            "third request ignored 2 in flight on vllm-{x}"
        );
    }
    ra.finish();
    rb.finish();
    third.finish();
    h.advance(1000).unwrap();
    assert_eq!(
        inflight_total(&h, 2),
        0,
        "in-flight not released: {:?}",
        h.metrics()
    );
}

#[test]
fn index_log_cas_conflict_between_vms_loses_no_update() {
    let h = host();
    let a = start(&h, &cfg());
    let b = start(&h, &cfg());
    // Make sure the log key exists on both sides.
    let w = post(&a, "/v1/chat/completions", &conv(99, 1), &[]);
    w.finish();
    let w = post(&b, "/v1/chat/completions", &conv(98, 1), &[]);
    w.finish();
    let before = h.shared_data().lock().unwrap().cas_mismatches;
    let b_backend = Rc::new(RefCell::new(None));
    {
        let (b, slot) = (b.clone(), b_backend.clone());
        // The log's one CAS reserves a sequence number in the ledger, with the in-flight count.
        h.before_shared_set(Some(&a), "ledger", 1, move |_| {
            let r = post(&b, "/v1/chat/completions", &conv(2, 1), &[]);
            *slot.borrow_mut() = Some(r.backend());
            r.finish();
        });
    }
    let ra = post(&a, "/v1/chat/completions", &conv(1, 1), &[]);
    let a_backend = ra.backend();
    ra.finish();
    let b_backend = b_backend
        .borrow()
        .expect("hook ran: A appended to the index log");
    assert!(
        h.shared_data().lock().unwrap().cas_mismatches > before,
        "no CAS conflict on the index log"
    );
    // What A learned is visible through B, and what B learned through A.
    let via_b = post(&b, "/v1/chat/completions", &conv(1, 2), &[]);
    let (vb, mb) = (via_b.backend(), matched(&via_b));
    let via_a = post(&a, "/v1/chat/completions", &conv(2, 2), &[]);
    let (va, ma) = (via_a.backend(), matched(&via_a));
    assert!(
        vb == a_backend && mb > 0 && va == b_backend && ma > 0,
        "an index update was lost in the CAS conflict: A learned conv1 on vllm-{a_backend}, B matched it on vllm-{vb} ({mb} blocks); \
         B learned conv2 on vllm-{b_backend}, A matched it on vllm-{va} ({ma} blocks)"
    );
}

#[test]
fn vms_start_with_distinct_identities_and_do_not_trap() {
    let h = host();
    let vms: Vec<Vm> = (0..4).map(|_| start(&h, &cfg())).collect();
    for (i, vm) in vms.iter().enumerate() {
        let r = post(vm, "/v1/chat/completions", &conv(i as u64, 1), &[]);
        r.backend();
        r.finish();
        assert!(vm.crashed().is_none());
    }
}
