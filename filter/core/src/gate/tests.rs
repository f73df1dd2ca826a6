use super::*;
use crate::config::{Class, GateConfig, Knee};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn ticket(vm: u64, context: u32, class: u8, deadline_ms: u64) -> Ticket {
    Ticket {
        vm,
        context,
        wake: 7,
        class,
        deadline_ms,
        ..Ticket::default()
    }
}

fn contexts(ts: &[Ticket]) -> Vec<u32> {
    ts.iter().map(|t| t.context).collect()
}

#[test]
fn higher_classes_leave_first_then_earlier_deadlines_then_arrivals() {
    let mut q = Queue::default();
    q.push(ticket(1, 1, 2, 100)); // batch
    q.push(ticket(1, 2, 0, 900)); // interactive, late deadline
    q.push(ticket(2, 3, 0, 500)); // interactive, early deadline, another VM
    q.push(ticket(1, 4, 1, 100)); // standard
    q.push(ticket(2, 5, 0, 900)); // interactive, same deadline as 2, later
    let granted = q.grant(&mut [5], 10, 0);
    assert_eq!(contexts(&granted), vec![3, 2, 5, 4, 1]);
    assert!(!q.any_held());
}

#[test]
fn grants_stop_at_the_slots_and_reserve_them_until_routed() {
    let mut q = Queue::default();
    for c in 0..4 {
        q.push(ticket(1, c, 0, 1000));
    }
    assert_eq!(q.grant(&mut [1, 1], 10, 0).len(), 2);
    // The same free slots seen again (the grants are not in the ledger yet): no more.
    assert!(q.grant(&mut [1, 1], 11, 0).is_empty());
    // One grant is routed (its VM removes it): its slot is the ledger's business again.
    let first = q.tickets.iter().find(|t| t.granted_ms > 0).unwrap().clone();
    q.remove(first.vm, first.context);
    assert_eq!(q.grant(&mut [1, 1], 12, 0).len(), 1);
    assert_eq!(q.held(0), 1);
}

#[test]
fn a_lower_class_gets_its_share_under_sustained_high_load() {
    let mut q = Queue::default();
    for c in 0..20 {
        q.push(ticket(1, 100 + c, 2, 1000));
    }
    let mut batch = 0;
    for c in 0..100 {
        q.push(ticket(1, c, 0, 1000));
        let g = q.grant(&mut [1], 10, 10);
        batch += g.iter().filter(|t| t.class == 2).count();
        for t in g {
            q.remove(t.vm, t.context);
        }
    }
    assert_eq!(batch, 10, "one release in ten");
    // Without a share, batch waits as long as interactive does.
    let mut q = Queue::default();
    q.push(ticket(1, 100, 2, 1000));
    for c in 0..50 {
        q.push(ticket(1, c, 0, 1000));
        let g = q.grant(&mut [1], 10, 0);
        assert_eq!(g[0].class, 0);
        q.remove(g[0].vm, g[0].context);
    }
}

#[test]
fn lower_turns_go_round_the_lower_classes() {
    let mut q = Queue::default();
    for c in 0..20 {
        q.push(ticket(1, 100 + c, 1, 1000)); // standard
        q.push(ticket(1, 200 + c, 2, 1000)); // batch
    }
    let mut got = [0; 3];
    for c in 0..100 {
        q.push(ticket(1, c, 0, 1000));
        for t in q.grant(&mut [1], 10, 10) {
            got[usize::from(t.class)] += 1;
            q.remove(t.vm, t.context);
        }
    }
    assert_eq!(got, [90, 5, 5], "batch gets its turns beside standard");
}

#[test]
fn a_request_no_free_pod_may_serve_does_not_block_those_behind_it() {
    let mut q = Queue::default();
    let mut only_b0 = ticket(1, 1, 0, 100);
    only_b0.eligible = mask([true, false].into_iter(), 2);
    q.push(only_b0);
    q.push(ticket(1, 2, 1, 100));
    let g = q.grant(&mut [0, 1], 10, 0);
    assert_eq!((contexts(&g), g[0].pod), (vec![2], 1));
    assert_eq!(q.held(0), 1);
}

#[test]
fn the_record_round_trips_and_damage_reads_as_empty() {
    let mut q = Queue::default();
    q.push(ticket(u64::MAX, 3, 1, 77));
    let mut t = ticket(5, 9, 0, 88);
    t.eligible = mask([true, false, true].into_iter(), 3);
    q.push(t);
    q.grant(&mut [0, 0, 1], 5, 0);
    let bytes = q.encode();
    assert_eq!(Queue::decode(&bytes), q);
    assert_eq!(Queue::decode(&bytes[..bytes.len() - 1]), Queue::default());
    assert_eq!(Queue::decode(b""), Queue::default());
    assert_eq!(mask([true, true].into_iter(), 2), Vec::<u8>::new());
}

#[test]
fn stale_grants_and_long_expired_tickets_are_swept() {
    let mut q = Queue::default();
    // VM 1 stays alive throughout: only the ages of its tickets count here.
    q.beat(1, 0, u64::MAX);
    q.push(ticket(1, 1, 0, 100));
    q.push(ticket(1, 2, 0, 100_000));
    q.grant(&mut [1], 1000, 0);
    q.sweep(1000 + GRANT_TTL_MS);
    assert_eq!(
        contexts(&q.tickets),
        vec![2],
        "the unrouted grant stopped reserving"
    );
    q.sweep(100_000 + GRANT_TTL_MS);
    assert!(q.tickets.is_empty(), "a ticket its VM never shed");
}

#[test]
fn counters_read_from_a_record_wrap_rather_than_panic() {
    // Found by the gate_queue fuzz target: a record's counts are foreign input.
    let mut q = Queue {
        next_seq: u64::MAX,
        releases: u64::MAX,
        ..Queue::default()
    };
    q.push(ticket(1, 1, 0, 100));
    assert_eq!(q.next_seq, 0);
    assert_eq!(q.grant(&mut [1], 10, 3).len(), 1);
    assert_eq!(q.releases, 0);
}

#[test]
fn a_vm_that_stops_beating_loses_its_tickets_held_or_granted() {
    let mut q = Queue::default();
    q.beat(1, 0, 1500);
    q.beat(2, 0, 1500);
    q.push(ticket(1, 1, 2, 60_000));
    q.push(ticket(2, 2, 2, 60_000));
    q.push(ticket(2, 3, 2, 60_000));
    q.grant(&mut [1], 100, 0);
    assert_eq!(q.tickets.iter().filter(|t| t.granted_ms > 0).count(), 1);
    // VM 1 beats on; VM 2 went silent at 0.
    q.beat(1, 1000, 1500);
    q.sweep(1499);
    assert_eq!(q.tickets.len(), 3, "within its lease");
    q.sweep(1500);
    assert_eq!(contexts(&q.tickets), vec![1]);
    assert_eq!(q.beat_of(2), None);
    // A ticket of a VM with no beat at all (a foreign or damaged record) goes too.
    q.push(ticket(3, 4, 2, 60_000));
    q.sweep(1600);
    assert_eq!(contexts(&q.tickets), vec![1]);
}

#[test]
fn the_knee_counts_requests_and_work_and_a_scraped_queue_or_full_cache() {
    let k = Knee {
        requests: Some(8.0),
        work: Some(20.0),
        waiting: Some(1.0),
        kv_usage: Some(0.95),
    };
    assert_eq!(k.headroom(5.0, 3.0, Some(0.0), Some(0.5)), 3.0);
    assert_eq!(k.headroom(5.0, 19.0, None, None), 1.0);
    assert_eq!(k.headroom(1.0, 1.0, Some(2.0), None), 0.0);
    assert_eq!(k.headroom(1.0, 1.0, None, Some(0.97)), 0.0);
    assert!(Knee::default()
        .headroom(100.0, 100.0, None, None)
        .is_infinite());
}

fn gate() -> GateConfig {
    GateConfig {
        knee: Knee::default(),
        classes: vec![
            Class {
                name: "interactive".into(),
                aliases: vec!["critical".into()],
                max_wait_ms: 5000,
                max_queue: 2,
            },
            Class {
                name: "batch".into(),
                aliases: vec![],
                max_wait_ms: 60_000,
                max_queue: 2,
            },
        ],
        default_class: 1,
        class_header: "x-warmroute-priority".into(),
        objectives: vec![("premium-chat".into(), 0)],
        deadline_header: "x-warmroute-deadline-ms".into(),
        lower_share: 0.1,
        check_ms: 50,
        retry_after_s: 1,
        max_held_bytes: 1 << 27,
    }
}

#[test]
fn classes_come_from_names_or_aliases_and_deadlines_are_capped() {
    let g = gate();
    assert_eq!(g.classify(Some("Critical"), None, None), (0, 5000));
    assert_eq!(g.classify(Some("interactive"), None, Some("250")), (0, 250));
    assert_eq!(
        g.classify(Some("interactive"), None, Some("99999")),
        (0, 5000)
    );
    assert_eq!(g.classify(Some("gold"), None, Some("soon")), (1, 60_000));
    assert_eq!(g.classify(None, None, None), (1, 60_000));
    // An objective names no class itself: only through the configured map.
    assert_eq!(g.classify(None, Some("premium-chat"), None), (0, 5000));
    assert_eq!(g.classify(None, Some("interactive"), None), (1, 60_000));
    assert_eq!(g.classify(Some("batch"), Some("premium-chat"), None).0, 1);
    assert_eq!(g.lower_every(), 10);
}

#[test]
fn a_shed_request_reads_as_an_openai_error() {
    let v: serde_json::Value =
        serde_json::from_slice(&shed_body("batch", Shed::QueueFull)).unwrap();
    assert_eq!(v["error"]["code"], "queue_full");
    assert_eq!(v["error"]["type"], "rate_limit_error");
}

#[test]
fn the_record_keeps_its_layout() {
    let q = Queue {
        next_seq: 4,
        releases: 2,
        beats: vec![Beat {
            vm: 1,
            beat_ms: 300,
            lease_ms: 1500,
        }],
        tickets: vec![
            ticket(1, 2, 0, 9000),
            Ticket {
                granted_ms: 500,
                pod: 1,
                eligible: vec![0b101],
                seq: 3,
                ..ticket(5, 6, 1, 7000)
            },
        ],
    };
    assert_eq!(crate::testing::hex(&q.encode()), "0204000000000000000200000000000000010001000000000000002c01000000000000dc05000000000000010000000000000002000000070000000028230000000000000000000000000000000000000000000000000000000000000500000000000000060000000700000001581b0000000000000300000000000000f401000000000000010000000000010005", "gate.v2");
}

/// The grant as it was first written, one full sort and fit scan per grant:
/// the faster one must pick the same tickets, in the same order, on the same pods.
#[cfg(not(target_arch = "wasm32"))]
fn reference_grant(q: &mut Queue, slots: &mut [u32], now_ms: u64, lower_every: u64) -> Vec<Ticket> {
    for t in q.tickets.iter().filter(|t| t.granted_ms > 0) {
        if let Some(s) = slots.get_mut(usize::from(t.pod)) {
            *s = s.saturating_sub(1);
        }
    }
    let mut out = Vec::new();
    loop {
        let pod_for = |t: &Ticket| {
            (0..slots.len())
                .filter(|&b| slots[b] > 0 && t.fits(b))
                .max_by_key(|&b| (slots[b], std::cmp::Reverse(b)))
        };
        let mut waiting: Vec<usize> = (0..q.tickets.len())
            .filter(|&i| q.tickets[i].granted_ms == 0)
            .collect();
        waiting.sort_by_key(|&i| q.tickets[i].order());
        let Some(&best) = waiting.iter().find(|&&i| pod_for(&q.tickets[i]).is_some()) else {
            break;
        };
        let lower_turn = lower_every > 0 && q.releases % lower_every == lower_every - 1;
        let top = q.tickets[best].class;
        let pick = if lower_turn {
            let mut lower: Vec<u8> = waiting
                .iter()
                .map(|&i| &q.tickets[i])
                .filter(|t| t.class > top && pod_for(t).is_some())
                .map(|t| t.class)
                .collect();
            lower.dedup();
            let turn = q.releases / lower_every;
            match lower.get((turn % lower.len().max(1) as u64) as usize) {
                Some(&class) => waiting
                    .iter()
                    .copied()
                    .find(|&i| q.tickets[i].class == class && pod_for(&q.tickets[i]).is_some())
                    .unwrap_or(best),
                None => best,
            }
        } else {
            best
        };
        let Some(pod) = pod_for(&q.tickets[pick]) else {
            break;
        };
        slots[pod] -= 1;
        q.releases += 1;
        let t = &mut q.tickets[pick];
        t.granted_ms = now_ms.max(1);
        t.pod = pod as u16;
        out.push(t.clone());
    }
    out
}

#[cfg(not(target_arch = "wasm32"))]
proptest::proptest! {
    #![proptest_config(crate::testing::proptest_config())]
    #[test]
    fn the_grant_picks_what_the_plain_scan_picks(
        held in proptest::collection::vec(
            (0u8..3, 0u64..50, proptest::option::of(proptest::collection::vec(proptest::bool::ANY, 12)), proptest::bool::weighted(0.2), 0u16..12),
            0..40,
        ),
        slots in proptest::collection::vec(0u32..4, 1..12),
        releases in 0u64..20,
        lower_every in 0u64..5,
    ) {
        let n = slots.len();
        let tickets = held
            .iter()
            .enumerate()
            .map(|(i, (class, deadline, eligible, granted, pod))| Ticket {
                class: *class,
                deadline_ms: *deadline,
                seq: i as u64,
                context: i as u32,
                eligible: eligible
                    .as_ref()
                    .map_or(Vec::new(), |e| mask(e.iter().copied(), n)),
                granted_ms: u64::from(*granted),
                pod: pod % n as u16,
                ..Ticket::default()
            })
            .collect();
        let q = Queue { next_seq: held.len() as u64, releases, tickets, ..Queue::default() };
        let (mut fast, mut plain) = (q.clone(), q);
        let (mut fast_slots, mut plain_slots) = (slots.clone(), slots);
        let got = fast.grant(&mut fast_slots, 100, lower_every);
        let want = reference_grant(&mut plain, &mut plain_slots, 100, lower_every);
        proptest::prop_assert_eq!(got, want);
        proptest::prop_assert_eq!(fast, plain);
        proptest::prop_assert_eq!(fast_slots, plain_slots);
    }
}
