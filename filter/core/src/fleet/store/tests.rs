use super::*;
use crate::testing::{hex, MemoryHost};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn shared<'a>(host: &'a MemoryHost, keys: &'a Keys) -> Store<'a, MemoryHost> {
    Store { host, keys, n: 3 }
}

/// Adds `delta` to one backend's in-flight record, outside a request.
fn add_inflight(
    s: &Store<'_, MemoryHost>,
    backend: usize,
    delta: Delta,
) -> Result<Vec<InFlight>, HostError> {
    let mut deltas = vec![Delta::default(); s.n];
    deltas[backend] = delta;
    s.account(None, writer(s, 1), &deltas, false)
        .map(|a| a.ledger.inflight)
}

/// VM `vm` writing now, with a lease of 1.5 s.
fn writer(s: &Store<'_, MemoryHost>, vm: u64) -> Writer {
    Writer {
        vm,
        now_ms: s.host.now_ms(),
        lease_ms: 1500,
    }
}

/// Reserves an index event's seq outside a request, as a request's write does.
fn reserve_log_seq(s: &Store<'_, MemoryHost>) -> Result<u64, HostError> {
    s.account(None, writer(s, 1), &[], true)
        .map(|a| a.seq.unwrap_or_default())
}

fn requests_of(c: Vec<InFlight>) -> Vec<u32> {
    c.iter().map(|c| c.requests).collect()
}

fn requests(s: &Store<'_, MemoryHost>) -> Vec<u32> {
    requests_of(s.inflight().unwrap())
}

/// One more request on `backend` with a log event, written from the read
/// `seed`; the counts after and the event's seq.
fn one_more_after(s: &Store<'_, MemoryHost>, seed: Versioned, backend: usize) -> (Vec<u32>, u64) {
    let mut deltas = vec![Delta::default(); s.n];
    deltas[backend] = Delta::requests(1);
    let a = s.account(Some(seed), writer(s, 1), &deltas, true).unwrap();
    (requests_of(a.ledger.inflight), a.seq.unwrap())
}

#[test]
fn prefill_and_output_are_accounted_beside_requests() {
    let (host, keys) = (MemoryHost::default(), Keys::new(1, 4096));
    let s = shared(&host, &keys);
    let sent = Delta {
        requests: 1,
        prefill_blocks: 40,
        decode_tokens: 100,
    };
    add_inflight(&s, 2, sent).unwrap();
    add_inflight(&s, 2, sent).unwrap();
    // The first answer byte of one request: its prefill is done, the request is not.
    let c = add_inflight(&s, 2, Delta::prefill(-40)).unwrap();
    assert_eq!(
        c[2],
        InFlight {
            requests: 2,
            prefill_blocks: 40,
            decode_tokens: 200,
        }
    );
    // Its end gives the rest back.
    let c = add_inflight(
        &s,
        2,
        -Delta {
            prefill_blocks: 0,
            ..sent
        },
    )
    .unwrap();
    assert_eq!(
        (c[2].requests, c[2].prefill_blocks, c[2].decode_tokens),
        (1, 40, 100)
    );
    assert_eq!((c[0], c[1]), (InFlight::default(), InFlight::default()));
    // A record written in another layout reads as empty, never as garbage.
    host.set_shared(&keys.ledger, &[1, 0, 0, 0], None).unwrap();
    assert_eq!(s.read_ledger().unwrap().value, Ledger::decode(None, 3));
}

#[test]
fn inflight_counts_survive_conflicts() {
    let (host, keys) = (MemoryHost::default(), Keys::new(1, 4096));
    let s = shared(&host, &keys);
    add_inflight(&s, 1, Delta::requests(1)).unwrap();
    host.inject_conflicts.set(5);
    add_inflight(&s, 1, Delta::requests(1)).unwrap();
    add_inflight(&s, 2, Delta::requests(1)).unwrap();
    add_inflight(&s, 1, Delta::requests(-1)).unwrap();
    assert_eq!(requests(&s), vec![0, 1, 1]);
    add_inflight(&s, 0, Delta::requests(-1)).unwrap();
    assert_eq!(requests(&s), vec![0, 1, 1], "never below zero");
}

#[test]
fn a_stale_seed_costs_a_reread_never_a_lost_update() {
    let (host, keys) = (MemoryHost::default(), Keys::new(1, 4096));
    let s = shared(&host, &keys);
    // A seed of a key that does not exist yet carries no CAS token: never trusted.
    let absent = s.read_ledger().unwrap();
    add_inflight(&s, 2, Delta::requests(1)).unwrap();
    reserve_log_seq(&s).unwrap();
    assert_eq!(one_more_after(&s, absent.raw, 0), (vec![1, 0, 1], 1));
    let seed = s.read_ledger().unwrap();
    // Another worker moves the ledger between this worker's read and write.
    add_inflight(&s, 0, Delta::requests(1)).unwrap();
    reserve_log_seq(&s).unwrap();
    assert_eq!(one_more_after(&s, seed.raw, 0), (vec![3, 0, 1], 3));
    // A current seed applies directly.
    let seed = s.read_ledger().unwrap();
    assert_eq!(seed.value.next_seq, 4);
    assert_eq!(one_more_after(&s, seed.raw, 1), (vec![3, 1, 1], 4));
    // Releases never move the log.
    add_inflight(&s, 1, -Delta::requests(1)).unwrap();
    assert_eq!(s.read_ledger().unwrap().value.next_seq, 5);
}

#[test]
fn a_silent_vms_share_is_taken_back_by_the_next_write() {
    let (host, keys) = (MemoryHost::default(), Keys::new(1, 4096));
    let s = shared(&host, &keys);
    let on_0 = |requests| {
        let mut d = vec![Delta::default(); 3];
        d[0] = Delta::requests(requests);
        d
    };
    s.account(None, writer(&s, 1), &on_0(5), false).unwrap();
    host.now.set(1000);
    s.account(None, writer(&s, 2), &on_0(2), false).unwrap();
    assert_eq!(requests(&s), vec![7, 0, 0]);
    // VM 1 last wrote at 0: still its own until 1500.
    host.now.set(1499);
    let a = s.account(None, writer(&s, 2), &[], false).unwrap();
    assert!(a.reclaimed.is_empty());
    assert_eq!(requests_of(a.ledger.inflight), vec![7, 0, 0]);
    host.now.set(1500);
    let a = s.account(None, writer(&s, 2), &[], false).unwrap();
    assert_eq!(a.reclaimed, vec![1]);
    assert_eq!(requests_of(a.ledger.inflight), vec![2, 0, 0]);
    // VM 1 comes back: its releases saturate at 0 and take nothing of VM 2's.
    host.now.set(1600);
    let a = s.account(None, writer(&s, 1), &on_0(-5), false).unwrap();
    assert_eq!(requests_of(a.ledger.inflight), vec![2, 0, 0]);
    assert_eq!(a.ledger.shares.len(), 1, "an empty share is not kept");
    // Nobody takes back its own share, however old.
    host.now.set(99_999);
    let a = s.account(None, writer(&s, 2), &[], false).unwrap();
    assert_eq!(requests_of(a.ledger.inflight), vec![2, 0, 0]);
    // A share is judged by its own writer's lease, not the reader's.
    let long = Writer {
        lease_ms: 60_000,
        ..writer(&s, 3)
    };
    s.account(None, long, &on_0(1), false).unwrap();
    host.now.set(99_999 + 30_000);
    let a = s.account(None, writer(&s, 2), &[], false).unwrap();
    assert_eq!(requests_of(a.ledger.inflight), vec![3, 0, 0]);
}

#[test]
fn endless_conflicts_give_up() {
    let (host, keys) = (MemoryHost::default(), Keys::new(1, 4096));
    let s = shared(&host, &keys);
    add_inflight(&s, 0, Delta::requests(1)).unwrap();
    host.inject_conflicts.set(1000);
    assert_eq!(
        add_inflight(&s, 0, Delta::requests(1)),
        Err(HostError::CasMismatch)
    );
}

#[test]
fn a_counter_two_vms_create_at_once_hands_out_no_number_twice() {
    let (host, keys) = (MemoryHost::default(), Keys::new(1, 4096));
    let s = shared(&host, &keys);
    // Both VMs read the key missing and both create it (a write without CAS: the
    // second overwrites the first); only then does either take a number.
    for _ in 0..2 {
        host.set_shared(&keys.rotation, &0u64.to_le_bytes(), None)
            .unwrap();
    }
    let taken: Vec<u64> = (0..4).map(|_| s.next_rotation().unwrap()).collect();
    assert_eq!(taken, vec![0, 1, 2, 3]);
    // A missing key is created, not handed out: the first number is still 0.
    let other = Keys::new(2, 4096);
    let t = shared(&host, &other);
    assert_eq!((t.next_rotation(), t.next_rotation()), (Ok(0), Ok(1)));
    assert_eq!((t.new_vm_id(), t.new_vm_id()), (Ok(1), Ok(2)));
}

#[test]
fn rotation_and_vm_ids_are_unique() {
    let (host, keys) = (MemoryHost::default(), Keys::new(1, 4096));
    let s = shared(&host, &keys);
    assert_eq!(
        (s.next_rotation().unwrap(), s.next_rotation().unwrap()),
        (0, 1)
    );
    assert_ne!(s.new_vm_id().unwrap(), s.new_vm_id().unwrap());
}

#[test]
fn lease_has_one_holder_until_it_expires() {
    let (host, keys) = (MemoryHost::default(), Keys::new(1, 4096));
    let s = shared(&host, &keys);
    host.now.set(1000);
    assert!(s.try_lease(1, 1500).unwrap());
    assert!(!s.try_lease(2, 1500).unwrap());
    assert!(s.try_lease(1, 1500).unwrap());
    host.now.set(2500);
    assert!(!s.try_lease(2, 1500).unwrap());
    host.now.set(2501);
    assert!(s.try_lease(2, 1500).unwrap());
    assert!(!s.try_lease(1, 1500).unwrap());
}

#[test]
fn log_shape_fits_the_budget() {
    for bytes in [4096, 65_536, 262_144, 1 << 20, 64 << 20] {
        let s = LogShape::new(bytes);
        assert!((16..=1024).contains(&s.slots), "{s:?}");
        assert!(s.slots as usize * s.slot_bytes <= bytes.max(16 * MIN_SLOT_BYTES));
    }
    assert_eq!(
        LogShape::new(1 << 20),
        LogShape {
            slots: 64,
            slot_bytes: 16384
        }
    );
    assert_eq!(LogShape::new(1 << 20).slot(130), 2);
}

#[test]
fn health_updates_one_backend() {
    let (host, keys) = (MemoryHost::default(), Keys::new(1, 4096));
    let s = shared(&host, &keys);
    s.update_health(1, |h| h.failures += 1).unwrap();
    s.update_health(1, |h| h.failures += 1).unwrap();
    let h = s.health().unwrap();
    assert_eq!((h[0].failures, h[1].failures), (0, 2));
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod properties {
    use super::*;
    use crate::testing::MemoryHost;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const N: usize = 6;

    /// One VM's ledger write: (vm, ms since the last write, deltas on backends).
    type Write = (u64, u64, Vec<(i32, i32, i32)>);

    fn writes() -> impl Strategy<Value = Vec<Write>> {
        proptest::collection::vec(
            (
                1..4u64,
                0..1200u64,
                proptest::collection::vec((-2..3i32, -20..30i32, -50..80i32), 0..=N),
            ),
            1..30,
        )
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config())]

        /// Sparse shares account exactly like one dense record per backend
        /// per VM: totals, reclaimed shares and the shares kept.
        #[test]
        fn sparse_shares_account_like_dense_ones(writes in writes()) {
            let (host, keys) = (MemoryHost::default(), Keys::new(1, 4096));
            let s = Store { host: &host, keys: &keys, n: N };
            // The model: vm → (heartbeat, lease, a record per backend).
            let mut model: BTreeMap<u64, (u64, u64, Vec<InFlight>)> = BTreeMap::new();
            let mut now = 0;
            for (vm, dt, deltas) in writes {
                now += dt;
                host.now.set(now);
                let deltas: Vec<Delta> = deltas
                    .into_iter()
                    .map(|(requests, prefill_blocks, decode_tokens)| Delta { requests, prefill_blocks, decode_tokens })
                    .collect();
                let writer = Writer { vm, now_ms: now, lease_ms: 1000 };
                let a = s.account(None, writer, &deltas, false).unwrap();
                let mut reclaimed = Vec::new();
                let mut mine = model.remove(&vm).map_or(vec![InFlight::default(); N], |m| m.2);
                model.retain(|&v, (beat, lease, _)| {
                    let gone = now.saturating_sub(*beat) >= *lease;
                    if gone {
                        reclaimed.push(v);
                    }
                    !gone
                });
                for (f, d) in mine.iter_mut().zip(&deltas) {
                    f.apply(*d);
                }
                if mine.iter().any(|f| *f != InFlight::default()) {
                    model.insert(vm, (now, 1000, mine));
                }
                let mut got = a.reclaimed.clone();
                got.sort_unstable();
                prop_assert_eq!(got, reclaimed);
                let mut totals = vec![InFlight::default(); N];
                for (_, _, dense) in model.values() {
                    for (t, f) in totals.iter_mut().zip(dense) {
                        t.add(f);
                    }
                }
                prop_assert_eq!(&a.ledger.inflight, &totals);
                prop_assert_eq!(s.inflight().unwrap(), totals);
                let mut vms: Vec<u64> = a.ledger.shares.iter().map(|x| x.vm).collect();
                vms.sort_unstable();
                prop_assert_eq!(vms, model.keys().copied().collect::<Vec<_>>());
            }
        }

        /// The ledger decodes what it encodes; any other bytes (a cut, a
        /// flipped byte) read as empty or as some valid ledger, never wrongly sized.
        #[test]
        fn ledger_bytes_round_trip_and_damage_is_contained(
            writes in writes(),
            cut in 0..400usize,
            flip in (0..400usize, any::<u8>()),
        ) {
            let (host, keys) = (MemoryHost::default(), Keys::new(1, 4096));
            let s = Store { host: &host, keys: &keys, n: N };
            for (vm, _, deltas) in writes {
                let deltas: Vec<Delta> = deltas
                    .into_iter()
                    .map(|(requests, prefill_blocks, decode_tokens)| Delta { requests, prefill_blocks, decode_tokens })
                    .collect();
                s.account(None, Writer { vm, now_ms: 0, lease_ms: 1000 }, &deltas, true).unwrap();
            }
            let bytes = host.get_shared(&keys.ledger).unwrap().0.unwrap_or_default();
            let ledger = Ledger::decode(Some(&bytes), N);
            prop_assert_eq!(ledger.encode(), bytes.clone());
            let mut cut_bytes = bytes.clone();
            cut_bytes.truncate(cut);
            if cut_bytes.len() < bytes.len() {
                prop_assert_eq!(Ledger::decode(Some(&cut_bytes), N), Ledger::decode(None, N));
            }
            let mut flipped = bytes.clone();
            if let Some(b) = flipped.get_mut(flip.0) {
                *b ^= flip.1;
            }
            let damaged = Ledger::decode(Some(&flipped), N);
            prop_assert_eq!(damaged.inflight.len(), N);
            prop_assert!(damaged.shares.iter().all(|s| s.inflight.iter().all(|(b, _)| (*b as usize) < N)));
        }
    }
}

#[test]
fn every_key_names_its_layout_version() {
    let keys = Keys::new(0xfeed, 1 << 20);
    let versioned = |k: &str| {
        k.split('.').any(|part| {
            part.strip_prefix('v')
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
    };
    let buckets: Vec<String> = (0..responses::BUCKETS).map(responses::key).collect();
    let all: Vec<&str> = keys
        .every()
        .chain([FLEETS_KEY])
        .chain(buckets.iter().map(String::as_str))
        .collect();
    assert!(all.len() > 16 + responses::BUCKETS);
    for k in all {
        assert!(versioned(k), "{k}");
    }
}

#[test]
fn the_stores_own_records_keep_their_layout() {
    // Re-pinning a record's bytes below means a new layout: its key's version too.
    let named = Keys::new(1, 1 << 20);
    for (key, version) in [
        (&named.ledger, ".ledger.v5"),
        (&named.served, ".served.v1"),
        (&named.lease, ".lease.v1"),
        (&named.rotation, ".rotation.v1"),
        (&named.vm_seq, ".vm_seq.v1"),
        (&named.health, ".health.v2"),
        (&named.members, ".members.v1"),
        (&named.lora, ".lora.v1"),
        (&named.gate, ".gate.v2"),
        (&named.replica, ".replica.v1"),
    ] {
        assert!(key.ends_with(version), "{key}");
    }
    assert!(FLEETS_KEY.ends_with(".v1"));
    let ledger = Ledger {
        inflight: Vec::new(),
        next_seq: 7,
        shares: vec![Share {
            vm: 2,
            heartbeat_ms: 1000,
            lease_ms: 1500,
            inflight: vec![(
                1,
                InFlight {
                    requests: 3,
                    ..InFlight::default()
                },
            )],
        }],
    };
    assert_eq!(
        hex(&ledger.encode()),
        "0700000000000000010000000200000000000000e803000000000000dc050000000000000100000001000000030000000000000000000000",
        "ledger.v5"
    );
    assert_eq!(
        hex(&encode_served(&[5, 0])),
        "05000000000000000000000000000000",
        "served.v1"
    );
    let host = MemoryHost::default();
    let keys = Keys::new(1, 1 << 20);
    let s = shared(&host, &keys);
    host.now.set(100);
    assert_eq!(s.try_lease(9, 50), Ok(true));
    assert_eq!(s.next_rotation(), Ok(0));
    assert_eq!(s.new_vm_id(), Ok(1));
    let read = |k: &str| {
        hex(&host
            .get_shared(k)
            .ok()
            .and_then(|v| v.0)
            .unwrap_or_default())
    };
    assert_eq!(
        read(&keys.lease),
        "09000000000000009600000000000000",
        "lease.v1"
    );
    assert_eq!(read(&keys.rotation), "0100000000000000", "rotation.v1");
    assert_eq!(read(&keys.vm_seq), "0100000000000000", "vm_seq.v1");
    // The first VM sets the replica id, the others read it.
    assert_eq!(s.replica_id(0x0102), Ok(0x0102));
    assert_eq!(s.replica_id(0x0304), Ok(0x0102));
    assert_eq!(read(&keys.replica), "0201000000000000", "replica.v1");
    s.sweep_fleets(100, 30_000).ok();
    assert_eq!(
        read(FLEETS_KEY),
        "0100000000000000640000000000000000001000000000003075000000000000",
        "fleets.v1"
    );
    let answered = responses::Entry {
        id: 0x0102_0304_0506_0708,
        pod: 0x1112_1314_1516_1718,
        at_ms: 1000,
    };
    assert_eq!(s.remember_response(answered, 64), Ok(()));
    assert_eq!(
        read(&responses::key(1)),
        "08070605040302011817161514131211e803000000000000",
        "responses.v1"
    );
    assert!(responses::key(1).ends_with(".responses.v1.1"));
}

#[test]
fn a_response_is_found_by_any_vm_and_its_bucket_stays_bounded() {
    let host = MemoryHost::default();
    let keys = Keys::new(1, 1 << 20);
    let s = shared(&host, &keys);
    let entry = |id: u64, at_ms: u64| responses::Entry { id, pod: 42, at_ms };
    // Ids of one bucket (same top byte), more than it holds.
    for i in 0..10u64 {
        s.remember_response(entry((7 << 56) | i, 100 + i), 4)
            .unwrap();
    }
    let other_keys = Keys::new(2, 1 << 10);
    let other_fleet = shared(&host, &other_keys);
    assert_eq!(
        other_fleet.response_holder((7 << 56) | 9),
        Ok(Some(entry((7 << 56) | 9, 109))),
        "the record is the Envoy's, not a fleet's"
    );
    assert_eq!(
        s.response_holder((7 << 56) | 5),
        Ok(None),
        "the oldest went"
    );
    let (bytes, _) = host.get_shared(&responses::key(7)).unwrap();
    assert_eq!(bytes.map(|b| b.len()), Some(4 * responses::ENTRY_BYTES));
    assert_eq!(s.response_holder(1), Ok(None));
}
