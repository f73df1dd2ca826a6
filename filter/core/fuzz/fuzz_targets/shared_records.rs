//! Every decoder of a value kept in shared data, fed what another (buggy,
//! older, or hostile) VM could have written: the ledger, health, in-flight
//! records, index log events, the scrape lease and a bucket of the record of
//! stored responses.
//! Invariants: no panic; bounded allocation; what decodes re-encodes the same.
#![no_main]

use fuzz_support::bounded;
use libfuzzer_sys::fuzz_target;
use warmroute_core::fleet::health::decode_health;
use warmroute_core::fleet::inflight::{decode_inflight, encode_inflight};
use warmroute_core::fleet::responses::{self, Entry};
use warmroute_core::fleet::store::{Keys, Store, Writer};
use warmroute_core::host::Host;
use warmroute_core::routing::index::kept_positions;
use warmroute_core::routing::index_log::{Event, Head, Kind};
use warmroute_core::testing::MemoryHost;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, bytes)) = data.split_first() else {
        return;
    };
    let n = 1 + sel as usize % 8;
    bounded(bytes.len(), || match sel % 5 {
        0 => {
            let h = decode_health(bytes, n);
            assert_eq!(h.len(), n);
        }
        1 => {
            if let Some(f) = decode_inflight(bytes, n) {
                let mut out = Vec::new();
                encode_inflight(&f, &mut out);
                assert_eq!(out, bytes);
            }
        }
        2 => {
            // An event carries its chain's hashes at the kept positions only (their
            // head when cut to fit a slot): a chain with those hashes at those places
            // re-encodes to the same bytes. Checked for chains small enough to build.
            let Some(ev) = Event::decode(bytes) else {
                return;
            };
            let len = ev.len as usize;
            if len <= 4096 && ev.blocks.len() <= kept_positions(len).count() {
                let mut chain = vec![0; len];
                let places = kept_positions(len).zip(&ev.blocks);
                places.for_each(|(i, &h)| chain[i] = h);
                assert_eq!(Event::encode(ev.head, &chain, bytes.len()), bytes);
            }
        }
        3 => {
            // A bucket of the stored responses' record: what decodes re-encodes the
            // same; an insert keeps one entry per id, within the capacity.
            let entries = responses::decode(bytes);
            if !entries.is_empty() {
                assert_eq!(responses::encode(&entries), bytes);
            }
            let cap = 1 + n;
            let new = Entry {
                id: 9,
                pod: 1,
                at_ms: 2,
            };
            let after = responses::insert(entries, new, cap);
            assert!(after.len() <= cap);
            assert_eq!(after.iter().filter(|e| e.id == 9).count(), 1);
            assert_eq!(responses::find(&responses::encode(&after), 9), Some(new));
        }
        _ => {
            // The ledger, health, the lease and a log slot, as a VM reads and updates them.
            let host = MemoryHost::default();
            let keys = Keys::new(1, 4096);
            let store = Store {
                host: &host,
                keys: &keys,
                n,
            };
            let w = Writer {
                vm: 7,
                now_ms: 1,
                lease_ms: 1500,
            };
            let _ = store.account(None, w, &vec![Default::default(); n], true);
            let _ = store.try_lease(7, 1500);
            let _ = store.update_health(0, |_| {});
            let head = Head {
                kind: Kind::Received,
                seq: 0,
                origin: 1,
                backend: 0,
                time_ms: 0,
                prefill: 1,
            };
            let _ = store.write_event(head, &[1]);
            for key in host.shared_keys() {
                let _ = host.set_shared(&key, bytes, None);
            }
            let ledger = store.read_ledger().map(|r| r.value.inflight.len());
            assert_eq!(ledger, Ok(n));
            if let Ok(a) = store.account(None, w, &vec![Default::default(); n], true) {
                assert_eq!(a.ledger.inflight.len(), n);
            }
            let _ = store.try_lease(7, 1500);
            let _ = store.log_event(0);
            let health = store.health().map(|h| h.len());
            assert_eq!(health, Ok(n));
        }
    });
});
