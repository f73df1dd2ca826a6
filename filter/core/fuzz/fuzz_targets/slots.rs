//! The slot table of a discovered pool (`members.v1`) as another VM could
//! have written it, then an assignment of fuzzed endpoints to it, as the VM
//! holding the scrape lease runs one per admin reply.
//! Input: slot count (1..=8), `now_ms` (one byte), the table's length (u16
//! LE) and bytes, then the endpoints a line each: a flags byte (bit 0:
//! routable; the rest: cluster, 0..=2) and the address.
//! Invariants: no panic; bounded allocation; what decodes re-encodes to a
//! record of the same length that decodes the same; a table holding no pod
//! twice keeps each listed pod in its slot, holds only listed pods (with
//! their cluster and routability), never one twice, and places every other
//! endpoint in a free slot or counts it unplaced; the table it leaves round-trips.
#![no_main]

use fuzz_support::bounded;
use libfuzzer_sys::fuzz_target;
use warmroute_core::fleet::membership::{PoolEndpoint, Slots};

fuzz_target!(|data: &[u8]| {
    let [sel, now, l0, l1, rest @ ..] = data else {
        return;
    };
    let n = 1 + usize::from(sel % 8);
    let now = u64::from(*now);
    let (table, list) = rest.split_at(usize::from(u16::from_le_bytes([*l0, *l1])).min(rest.len()));
    bounded(data.len(), || check(table, list, n, now));
});

fn addresses(s: &Slots) -> Vec<&str> {
    s.members
        .iter()
        .flatten()
        .map(|m| m.address.as_str())
        .collect()
}

fn check(table: &[u8], list: &[u8], n: usize, now: u64) {
    let decoded = Slots::decode(table, n);
    if let Some(s) = &decoded {
        assert_eq!(s.members.len(), n);
        let again = s.encode();
        // Not byte for byte: an empty slot's routable flag and cluster, and a
        // routable byte other than 0 or 1, are not kept.
        assert_eq!(again.len(), table.len());
        assert_eq!(Slots::decode(&again, n).as_ref(), Some(s));
    }
    // The endpoints as `parse_endpoints` gives them: sorted by address, each
    // once, none empty (it writes `ip:port`).
    let mut endpoints: Vec<PoolEndpoint> = list
        .split(|&b| b == b'\n')
        .filter_map(|line| {
            let (&flags, address) = line.split_first()?;
            Some(PoolEndpoint {
                address: String::from_utf8_lossy(address).into_owned(),
                routable: flags & 1 == 1,
                cluster: u16::from(flags >> 1) % 3,
            })
        })
        .filter(|e| !e.address.is_empty())
        .collect();
    endpoints.sort_by(|a, b| a.address.cmp(&b.address).then(a.cluster.cmp(&b.cluster)));
    endpoints.dedup_by(|a, b| a.address == b.address);

    let before = decoded.unwrap_or_else(|| Slots::empty(n));
    let mut s = before.clone();
    let changes = s.assign(&endpoints, now);
    assert_eq!(s.members.len(), n);
    let mut held = addresses(&before);
    held.sort_unstable();
    if held.windows(2).any(|w| w[0] == w[1]) {
        // A table no VM writes (a pod in two slots): only "no panic".
        return;
    }
    let listed = |a: &str| endpoints.iter().find(|e| e.address == a);
    for (slot, (was, is)) in before.members.iter().zip(&s.members).enumerate() {
        if let Some(was) = was {
            if listed(&was.address).is_some_and(|e| e.cluster == was.cluster) {
                let is = is.as_ref().expect("a listed pod lost its slot");
                assert_eq!((&is.address, is.cluster), (&was.address, was.cluster));
            } else {
                assert!(changes.left.contains(&(slot, was.address.clone())));
            }
        }
        if let Some(is) = is {
            let e = listed(&is.address).expect("an unlisted pod holds a slot");
            assert_eq!((e.cluster, e.routable), (is.cluster, is.routable));
            if changes.joined.iter().any(|(b, _)| *b == slot) {
                assert_eq!(s.joined_ms(slot), now.max(1));
            }
        }
    }
    let mut now_held = addresses(&s);
    now_held.sort_unstable();
    let placed = now_held.len();
    now_held.dedup();
    assert_eq!(now_held.len(), placed, "a pod in two slots");
    assert_eq!(placed + changes.unplaced, endpoints.len());
    if changes.unplaced > 0 {
        assert!(
            s.members.iter().all(Option::is_some),
            "unplaced beside a free slot"
        );
    }
    assert_eq!(Slots::decode(&s.encode(), n), Some(s));
}
