//! The gate's queue record (`gate.v2`: beats, then tickets with their body
//! bytes) as another (buggy, older or hostile) VM could have written it, then
//! a sweep and a grant on it with fuzzed free slots, as the gate runs them.
//! Input: slot count (0..=16), the slots, `lower_every` (0..=11), `now_ms`
//! (u64 LE), then the record.
//! Invariants: no panic; bounded allocation; what decodes re-encodes to the
//! same bytes; the sweep keeps exactly the live VMs' beats and their tickets
//! still within their grant TTL or deadline; a grant only grants held tickets,
//! each once, to a pod it may go to, never more per pod than its free slots
//! less the grants already out there, and stops only when no held ticket fits
//! a pod with a slot left.
#![no_main]

use fuzz_support::bounded;
use libfuzzer_sys::fuzz_target;
use warmroute_core::gate::{Queue, GRANT_TTL_MS};

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 17);
    let Some((slots, rest)) = rest.split_at_checked(n) else {
        return;
    };
    let Some((&every, rest)) = rest.split_first() else {
        return;
    };
    let Some((now, bytes)) = rest.split_first_chunk::<8>() else {
        return;
    };
    let slots: Vec<u32> = slots.iter().map(|&s| u32::from(s % 8)).collect();
    let every = u64::from(every % 12);
    let now = u64::from_le_bytes(*now);
    bounded(bytes.len(), || check(bytes, &slots, every, now));
});

fn check(bytes: &[u8], slots: &[u32], every: u64, now: u64) {
    let q = Queue::decode(bytes);
    // A damaged record reads as the empty queue; any other re-encodes exactly.
    if q != Queue::default() || bytes == Queue::default().encode() {
        assert_eq!(q.encode(), bytes);
    }
    let _ = (q.held_bytes(), q.any_held(), q.held(0));

    // Sweep.
    let mut swept = q.clone();
    swept.sweep(now);
    let live = |vm: u64| {
        q.beats
            .iter()
            .any(|b| b.vm == vm && now.saturating_sub(b.beat_ms) < b.lease_ms)
    };
    let beats: Vec<_> = q
        .beats
        .iter()
        .filter(|b| now.saturating_sub(b.beat_ms) < b.lease_ms)
        .copied()
        .collect();
    assert_eq!(swept.beats, beats);
    let kept: Vec<_> = q
        .tickets
        .iter()
        .filter(|t| {
            live(t.vm)
                && if t.granted_ms > 0 {
                    now.saturating_sub(t.granted_ms) < GRANT_TTL_MS
                } else {
                    now < t.deadline_ms.saturating_add(GRANT_TTL_MS)
                }
        })
        .cloned()
        .collect();
    assert_eq!(swept.tickets, kept);

    // Grant, on the record as read (a hostile one is not swept clean first).
    let mut after = q.clone();
    let mut left = slots.to_vec();
    let out = after.grant(&mut left, now, every);
    assert_eq!(after.tickets.len(), q.tickets.len());
    // A record's count is foreign input: it wraps (corpus/gate_queue/regression-releases-at-max).
    assert_eq!(after.releases, q.releases.wrapping_add(out.len() as u64));
    let mut granted = vec![0u32; slots.len()];
    let mut changed = 0;
    for (was, is) in q.tickets.iter().zip(&after.tickets) {
        if was == is {
            continue;
        }
        // Only held tickets, marked with the time and a pod they fit.
        changed += 1;
        assert_eq!(was.granted_ms, 0, "a granted ticket granted again");
        assert_eq!(is.granted_ms, now.max(1));
        let pod = usize::from(is.pod);
        assert!(pod < slots.len() && was.fits(pod), "{is:?}");
        granted[pod] += 1;
        let mut back = is.clone();
        (back.granted_ms, back.pod) = (0, was.pod);
        assert_eq!(&back, was, "a grant changed more than its mark");
        assert!(out.contains(is));
    }
    assert_eq!(changed, out.len(), "a ticket granted twice");
    for (b, &free) in slots.iter().enumerate() {
        let out_there = q
            .tickets
            .iter()
            .filter(|t| t.granted_ms > 0 && usize::from(t.pod) == b)
            .count() as u32;
        let room = free.saturating_sub(out_there);
        assert!(granted[b] <= room, "pod {b}: {} > {room}", granted[b]);
        assert_eq!(left[b], room - granted[b]);
    }
    assert_eq!(Queue::decode(&after.encode()), after);
    // Nothing held could still go, eligibility bits past the fleet included
    // (corpus/gate_queue/regression-eligible-past-fleet).
    for t in after.tickets.iter().filter(|t| t.granted_ms == 0) {
        let fits = (0..slots.len()).find(|&b| left[b] > 0 && t.fits(b));
        assert_eq!(fits, None, "held while a pod it fits has a slot: {t:?}");
    }
}
