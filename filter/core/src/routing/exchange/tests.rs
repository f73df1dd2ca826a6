use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn event(kind: Kind, len: u32) -> (Vec<u64>, Kind, u32) {
    let blocks: Vec<u64> = match kind {
        Kind::Received => kept_positions(len as usize)
            .map(|i| i as u64 * 7 + 1)
            .collect(),
        Kind::Evicted => Vec::new(),
    };
    (blocks, kind, len)
}

fn sample() -> Vec<u8> {
    let mut w = BatchWriter::new(42, 10, 1 << 20);
    let (a, k, l) = event(Kind::Received, 40);
    assert!(w.push(
        10,
        "10.0.0.1:8000",
        PeerEventRef {
            kind: k,
            age_ms: 5,
            len: l,
            blocks: &a
        }
    ));
    w.skip_to(12);
    let (b, k, l) = event(Kind::Evicted, 0);
    assert!(w.push(
        12,
        "10.0.0.2:8000",
        PeerEventRef {
            kind: k,
            age_ms: 9,
            len: l,
            blocks: &b
        }
    ));
    let (c, k, l) = event(Kind::Received, 3);
    assert!(w.push(
        13,
        "10.0.0.1:8000",
        PeerEventRef {
            kind: k,
            age_ms: 0,
            len: l,
            blocks: &c
        }
    ));
    w.finish()
}

#[test]
fn a_reply_reads_back_as_written() {
    let b = Batch::decode(&sample()).unwrap();
    assert_eq!((b.replica, b.next_seq), (42, 14));
    assert_eq!(b.pods, ["10.0.0.1:8000", "10.0.0.2:8000"]);
    let summary: Vec<_> = b
        .events
        .iter()
        .map(|e| (e.kind, e.pod, e.age_ms, e.len))
        .collect();
    assert_eq!(
        summary,
        [
            (Kind::Received, 0, 5, 40),
            (Kind::Evicted, 1, 9, 0),
            (Kind::Received, 0, 0, 3)
        ]
    );
    assert_eq!(b.events[0].blocks, event(Kind::Received, 40).0);
}

#[test]
fn the_reply_layout_is_pinned() {
    let mut w = BatchWriter::new(1, 0, 1 << 20);
    w.push(
        0,
        "a",
        PeerEventRef {
            kind: Kind::Received,
            age_ms: 2,
            len: 1,
            blocks: &[3],
        },
    );
    w.load(
        "a",
        InFlight {
            requests: 2,
            prefill_blocks: 3,
            decode_tokens: 4,
        },
    );
    let hex: String = w.finish().iter().map(|b| format!("{b:02x}")).collect();
    let expected = [
        "77727078",         // magic
        "01",               // version
        "0100000000000000", // replica
        "0100000000000000", // next_seq
        "0100",             // one pod
        "0161",             // "a"
        "0100",             // one load
        "0000",             // pod 0
        "02000000",         // 2 requests
        "03000000",         // 3 blocks to prefill
        "04000000",         // 4 tokens to decode
        "01000000",         // one event
        "00",               // received
        "0000",             // pod 0
        "02000000",         // age 2 ms
        "01000000",         // chain of 1 block
        "01000000",         // one hash kept
        "0300000000000000", // the hash
    ];
    assert_eq!(hex, expected.concat());
}

#[test]
fn every_truncation_and_every_lie_is_refused_whole() {
    let good = sample();
    for cut in 0..good.len() {
        assert!(Batch::decode(&good[..cut]).is_err(), "cut at {cut}");
    }
    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(Batch::decode(&trailing), Err(BatchError::Malformed));
    let mut version = good.clone();
    version[4] = 2;
    assert_eq!(Batch::decode(&version), Err(BatchError::Version));
    assert_eq!(
        Batch::decode(b"# HELP not a peer"),
        Err(BatchError::Version)
    );
    // A pod index past the table, a chain longer than its length keeps, an
    // eviction with blocks, an unknown kind, an event count the bytes cannot hold.
    let first_event = REPLY_HEADER - 4 + 2 * (1 + 13) + 4;
    for (at, value) in [
        (first_event + 1, 9u8), // pod 9 of 2
        (first_event + 7, 1),   // len 1 keeps 1 position, 40 hashes follow
        (first_event, 7),       // kind 7
    ] {
        let mut bad = good.clone();
        bad[at] = value;
        assert_eq!(
            Batch::decode(&bad),
            Err(BatchError::Malformed),
            "byte {at} = {value}"
        );
    }
    let mut count = good.clone();
    count[first_event - 4..first_event].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(Batch::decode(&count), Err(BatchError::Malformed));
}

#[test]
fn a_load_reads_back_and_one_about_no_pod_is_refused() {
    let mut w = BatchWriter::new(1, 0, 1 << 20);
    let held = InFlight {
        requests: 5,
        prefill_blocks: 6,
        decode_tokens: 7,
    };
    assert!(w.load("10.0.0.1:8000", held));
    let good = w.finish();
    let b = Batch::decode(&good).unwrap();
    assert_eq!(b.pods.len(), 1);
    assert_eq!(b.loads, [(0, held)]);
    let mut bad = good.clone();
    let pod_at = 4 + 1 + 8 + 8 + 2 + 1 + 13 + 2;
    bad[pod_at] = 1;
    assert_eq!(Batch::decode(&bad), Err(BatchError::Malformed));
}

#[test]
fn a_reply_stays_within_its_budget_and_resumes_where_it_stopped() {
    let (a, k, l) = event(Kind::Received, 40);
    let one = EVENT_HEADER + 8 * a.len();
    let mut w = BatchWriter::new(1, 100, REPLY_HEADER + 1 + 8 + 2 * one);
    let e = PeerEventRef {
        kind: k,
        age_ms: 0,
        len: l,
        blocks: &a,
    };
    assert!(w.push(100, "pod-a:80", e));
    assert!(w.push(101, "pod-a:80", e));
    assert!(!w.push(102, "pod-a:80", e));
    let bytes = w.finish();
    assert!(bytes.len() <= REPLY_HEADER + 1 + 8 + 2 * one);
    assert_eq!(Batch::decode(&bytes).unwrap().next_seq, 102);
}

#[test]
fn loads_leave_the_ask_to_the_events() {
    let (a, k, l) = event(Kind::Received, 40);
    let one = EVENT_HEADER + 8 * a.len();
    let e = PeerEventRef {
        kind: k,
        age_ms: 0,
        len: l,
        blocks: &a,
    };
    let events = |with_load: bool| {
        let mut w = BatchWriter::new(1, 100, 1 << 20).asked(REPLY_HEADER + 1 + 8 + 2 * one);
        if with_load {
            assert!(w.load("pod-b:80", InFlight::default()));
        }
        (100..110).take_while(|&s| w.push(s, "pod-a:80", e)).count()
    };
    assert_eq!(events(false), 2);
    assert_eq!(events(true), 2);
}

#[test]
fn the_query_names_where_to_start() {
    assert_eq!(since_of("/warmroute/peer/v1/events?since=17"), 17);
    assert_eq!(since_of("/warmroute/peer/v1/events?x=1&since=5"), 5);
    assert_eq!(since_of("/warmroute/peer/v1/events?since=-1"), 0);
    assert_eq!(since_of("/warmroute/peer/v1/events"), 0);
    assert!(is_peer_path("/warmroute/peer/v1/events?since=3"));
    assert!(!is_peer_path("/warmroute/peer/v1/events/x"));
    assert!(!is_peer_path("/v1/chat/completions"));
    assert_eq!(
        answers_of("/warmroute/peer/v1/events?since=1&answers=9"),
        Some(9)
    );
    assert_eq!(
        answers_of("/warmroute/peer/v1/events?since=1&answers=x"),
        Some(0)
    );
    assert_eq!(answers_of("/warmroute/peer/v1/events?since=1"), None);
    assert_eq!(
        bytes_of("/warmroute/peer/v1/events?since=1&bytes=4096"),
        Some(4096)
    );
    assert_eq!(bytes_of("/warmroute/peer/v1/events?since=1&bytes=x"), None);
    assert_eq!(bytes_of("/warmroute/peer/v1/events?since=1"), None);
}

#[test]
fn a_tick_of_pulls_writes_at_most_half_the_ring() {
    let shape = |slots: u64| LogShape {
        slots,
        slot_bytes: 16 << 10,
    };
    // The default 1 MiB log: 64 slots; two peers, then seven.
    assert_eq!(ring_share(shape(64), 2), (16, 16 * (16 << 10) / 3));
    assert_eq!(ring_share(shape(64), 7).0, 4);
    for (slots, peers) in [(64, 1), (64, 2), (64, 7), (1024, 31), (32, 5)] {
        let (per_pull, bytes) = ring_share(shape(slots), peers);
        assert!(
            per_pull * peers <= slots as usize / 2,
            "{slots} slots, {peers} peers"
        );
        // A reply of that size packs into those slots, even all evictions (no hashes:
        // 15 bytes in the reply, 44 in a pack, the most a packed event grows).
        let evictions = vec![0; (bytes - REPLY_HEADER) / EVENT_HEADER];
        assert!(crate::routing::index_log::pack_groups(&evictions, 16 << 10).len() <= per_pull);
    }
    // However many peers, one pull still brings a slot's worth.
    assert_eq!(ring_share(shape(16), 40), (3, 16 << 10));
}

#[test]
fn the_answers_section_layout_is_pinned_and_checked() {
    let mut w = BatchWriter::new(1, 0, 1 << 20);
    assert!(w.open_answers(4));
    let a = PeerAnswer {
        id: 5,
        pod: 6,
        age_ms: 7,
    };
    assert!(w.answer(4, a));
    let bytes = w.finish();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let expected = [
        "77727078",         // magic
        "01",               // version
        "0100000000000000", // replica
        "0000000000000000", // next_seq
        "0000",             // no pods
        "0000",             // no loads
        "00000000",         // no events
        "0500000000000000", // answers: ask from 5 next
        "0100",             // one answer
        "0500000000000000", // its id
        "0600000000000000", // its pod
        "07000000",         // age 7 ms
    ];
    assert_eq!(hex, expected.concat());
    let batch = Batch::decode(&bytes).unwrap();
    assert_eq!(
        batch.answers,
        Some(Answers {
            next: 5,
            entries: vec![a]
        })
    );
    // Cut inside the section, or a count the bytes do not hold: refused whole.
    for cut in REPLY_HEADER + 1..bytes.len() {
        assert!(Batch::decode(&bytes[..cut]).is_err(), "cut at {cut}");
    }
    // Cut just before it, a reply reads as one without answers: the cursor
    // stays, and the next pull asks from there again.
    assert_eq!(Batch::decode(&bytes[..REPLY_HEADER]).unwrap().answers, None);
    // A reply too small for an answer keeps the cursor where the answer was.
    let mut small = BatchWriter::new(1, 0, REPLY_HEADER + ANSWERS_HEADER + ANSWER_BYTES - 1);
    assert!(small.open_answers(4));
    assert!(!small.answer(4, a));
    assert_eq!(
        Batch::decode(&small.finish())
            .unwrap()
            .answers
            .unwrap()
            .next,
        4
    );
}

#[test]
fn the_puller_follows_each_peer_and_leaves_itself_out() {
    let mut p = Peers::new(7);
    p.set_members(vec!["b:1".into(), "a:1".into(), "a:1".into()]);
    let due = p.due(0, 1000, 4096, true);
    assert_eq!(
        due,
        [
            (
                "a:1".to_owned(),
                format!("{PEER_PATH}?since=0&answers=0&bytes=4096")
            ),
            (
                "b:1".to_owned(),
                format!("{PEER_PATH}?since=0&answers=0&bytes=4096")
            )
        ]
    );
    p.dispatched("a:1", 1, 0);
    p.dispatched("b:1", 2, 0);
    assert!(
        p.due(10, 1000, 4096, true).is_empty(),
        "one pull per peer at a time"
    );
    let theirs = BatchWriter::new(9, 30, 1 << 20).finish();
    let mine = BatchWriter::new(7, 0, 1 << 20).finish();
    assert!(matches!(p.answered(1, Some(&theirs), 0), Pulled::Events(b) if b.next_seq == 30));
    assert_eq!(p.answered(2, Some(&mine), 0), Pulled::Me);
    assert_eq!(p.count(), 1);
    assert_eq!(
        p.due(20, 1000, 4096, true),
        [(
            "a:1".to_owned(),
            format!("{PEER_PATH}?since=30&answers=0&bytes=4096")
        )]
    );
    // A lost pull is given up; garbage moves no cursor.
    p.dispatched("a:1", 3, 20);
    assert!(p.due(500, 1000, 4096, true).is_empty());
    assert_eq!(p.due(1021, 1000, 4096, true).len(), 1);
    p.dispatched("a:1", 4, 1021);
    assert_eq!(p.answered(4, Some(b"garbage"), 1021), Pulled::Failed);
    assert_eq!(
        p.due(1030, 1000, 4096, true),
        [(
            "a:1".to_owned(),
            format!("{PEER_PATH}?since=30&answers=0&bytes=4096")
        )]
    );
    // A reply with answers moves the answers' cursor; one without keeps it.
    let mut w = BatchWriter::new(9, 30, 1 << 20);
    assert!(w.open_answers(0));
    w.answers_to(5);
    p.dispatched("a:1", 6, 1030);
    assert!(matches!(
        p.answered(6, Some(&w.finish()), 1030),
        Pulled::Events(_)
    ));
    p.dispatched("a:1", 7, 1030);
    let without = BatchWriter::new(9, 30, 1 << 20).finish();
    assert!(matches!(
        p.answered(7, Some(&without), 1030),
        Pulled::Events(_)
    ));
    assert_eq!(
        p.due(1030, 1000, 4096, true),
        [(
            "a:1".to_owned(),
            format!("{PEER_PATH}?since=30&answers=5&bytes=4096")
        )]
    );
    // An Envoy that keeps no stored responses asks for none.
    assert_eq!(
        p.due(1030, 1000, 4096, false),
        [("a:1".to_owned(), format!("{PEER_PATH}?since=30&bytes=4096"))]
    );
    // Members change: the cursor of a peer that stays is kept.
    // Loads: the latest of each peer that answered lately, summed per pod.
    let mut w = BatchWriter::new(9, 30, 1 << 20);
    let two = InFlight {
        requests: 2,
        ..InFlight::default()
    };
    w.load("pod:1", two);
    p.dispatched("a:1", 5, 1030);
    assert!(matches!(
        p.answered(5, Some(&w.finish()), 1030),
        Pulled::Events(_)
    ));
    assert_eq!(p.loads(1030, 100), [("pod:1".to_owned(), two)]);
    assert!(p.loads(1131, 100).is_empty(), "a silent peer's load lapses");
    p.set_members(vec!["a:1".into(), "c:1".into()]);
    let since: Vec<String> = p
        .due(1040, 1000, 4096, true)
        .into_iter()
        .map(|(_, path)| path)
        .collect();
    assert_eq!(
        since,
        [
            format!("{PEER_PATH}?since=30&answers=5&bytes=4096"),
            format!("{PEER_PATH}?since=0&answers=0&bytes=4096")
        ]
    );
    // The peer restarts (another replica id): whatever this reply skipped, the
    // next pull asks for everything it keeps; the one after goes on from there.
    let mut w = BatchWriter::new(10, 40, 1 << 20);
    assert!(w.open_answers(5));
    w.answers_to(9);
    p.dispatched("a:1", 8, 1030);
    p.dispatched("c:1", 18, 1030);
    assert!(matches!(
        p.answered(8, Some(&w.finish()), 1030),
        Pulled::Events(_)
    ));
    assert_eq!(
        p.due(1030, 1000, 4096, true)[0],
        (
            "a:1".to_owned(),
            format!("{PEER_PATH}?since=0&answers=0&bytes=4096")
        )
    );
    let mut w = BatchWriter::new(10, 0, 1 << 20);
    w.skip_to(40);
    assert!(w.open_answers(0));
    w.answers_to(9);
    p.dispatched("a:1", 9, 1030);
    assert!(matches!(
        p.answered(9, Some(&w.finish()), 1030),
        Pulled::Events(_)
    ));
    assert_eq!(
        p.due(1030, 1000, 4096, true)[0],
        (
            "a:1".to_owned(),
            format!("{PEER_PATH}?since=40&answers=9&bytes=4096")
        )
    );
}
