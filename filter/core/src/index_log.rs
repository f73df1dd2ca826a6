//! The index's change log: how one VM's routing reaches every other worker's
//! index replica ([`crate::index`]).
//!
//! A ring of `slots` shared-data values, each holding one [`Event`] ("backend
//! b received these block hashes at time t, routed by VM v", or "backend b
//! no longer holds what it last used at or before t", when its own cache
//! report said so: [`crate::feedback`]). Event `seq`
//! lives in slot `seq % slots`; the sequence counter lives in the ledger
//! ([`crate::store`]), so the CAS that accounts a request also reserves its
//! event's number, and an append costs one write of its own slot, whatever
//! the log's size. A reader that falls more than `slots` events behind has
//! lost the overwritten ones (a *gap*: its index misses prefixes routed
//! meanwhile, and keeps entries an eviction event would have dropped).
//!
//! ```text
//! slots      = clamp(log_bytes / 16 KiB, 16, 1024)
//! slot_bytes = log_bytes / slots
//! event      = version u8 ‖ kind u8 ‖ seq u64 ‖ origin u64 ‖ backend u16
//!              ‖ time_ms u64 ‖ n u32 ‖ n × block u64
//!              (little-endian, [`crate::codec`]; kind 0 received;
//!               kind 1 evicted: no blocks, time_ms is the cut-off)
//! ```
//! A chain longer than a slot keeps its head, the part other requests most
//! likely share. 16 KiB holds ~2k blocks ≈ 128k tokens at 256-byte blocks.

use crate::codec::{put, Reader};

/// What an event says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// The backend received its blocks (a routed prompt's chain).
    Received = 0,
    /// The backend no longer holds what it last used at or before `time_ms`.
    Evicted = 1,
}

/// One change to what `backend` holds, seen by VM `origin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// What the blocks are.
    pub kind: Kind,
    /// Position in the log.
    pub seq: u64,
    /// VM that appended it (it applied the event itself already).
    pub origin: u64,
    /// Backend index.
    pub backend: u16,
    /// Host time of the routing decision; for an eviction, the cut-off.
    pub time_ms: u64,
    /// Block hashes now held.
    pub blocks: Vec<u64>,
}

const EVENT_VERSION: u8 = 3;
const EVENT_HEADER: usize = 1 + 1 + 8 + 8 + 2 + 8 + 4;
/// Slot size the ring aims for.
const SLOT_TARGET: usize = 16 << 10;

/// Geometry of the shared change log for a `log_bytes` budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogShape {
    /// Number of slots in the ring.
    pub slots: u64,
    /// Largest encoded event a slot holds.
    pub slot_bytes: usize,
}

impl LogShape {
    /// Splits `log_bytes` into 16..1024 slots of about 16 KiB.
    pub fn new(log_bytes: usize) -> LogShape {
        let slots = (log_bytes / SLOT_TARGET).clamp(16, 1024);
        LogShape {
            slots: slots as u64,
            slot_bytes: (log_bytes / slots).max(EVENT_HEADER + 8),
        }
    }

    /// The slot that event `seq` lives in.
    pub fn slot(&self, seq: u64) -> u64 {
        seq % self.slots.max(1)
    }
}

impl Event {
    /// Encodes the event for one slot; a chain longer than `max_bytes` keeps its head
    /// (the part other requests are most likely to share).
    pub fn encode(
        kind: Kind,
        seq: u64,
        origin: u64,
        backend: u16,
        time_ms: u64,
        blocks: &[u64],
        max_bytes: usize,
    ) -> Vec<u8> {
        let room = max_bytes.saturating_sub(EVENT_HEADER) / 8;
        let blocks = &blocks[..blocks.len().min(room)];
        let mut out = Vec::with_capacity(EVENT_HEADER + blocks.len() * 8);
        put(&mut out, EVENT_VERSION);
        put(&mut out, kind as u8);
        put(&mut out, seq);
        put(&mut out, origin);
        put(&mut out, backend);
        put(&mut out, time_ms);
        put(&mut out, blocks.len() as u32);
        for &h in blocks {
            put(&mut out, h);
        }
        out
    }

    /// Decodes a slot; garbage (another version, truncation) reads as no event,
    /// which costs the index what the event said, never a misread one.
    pub fn decode(b: &[u8]) -> Option<Event> {
        let mut r = Reader::new(b);
        if r.get::<u8>()? != EVENT_VERSION {
            return None;
        }
        let kind = match r.get::<u8>()? {
            0 => Kind::Received,
            1 => Kind::Evicted,
            _ => return None,
        };
        let (seq, origin, backend, time_ms) = (r.get()?, r.get()?, r.get()?, r.get()?);
        let n = r.get::<u32>()? as usize;
        if r.rest().len() != n.checked_mul(8)? {
            return None;
        }
        Some(Event {
            kind,
            seq,
            origin,
            backend,
            time_ms,
            blocks: (0..n).map_while(|_| r.get()).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn event_round_trip() {
        let bytes = Event::encode(Kind::Evicted, 9, 7, 2, 1234, &[1, 2, 3], 4096);
        assert_eq!(
            Event::decode(&bytes),
            Some(Event {
                kind: Kind::Evicted,
                seq: 9,
                origin: 7,
                backend: 2,
                time_ms: 1234,
                blocks: vec![1, 2, 3]
            })
        );
    }

    #[test]
    fn oversized_event_keeps_its_head() {
        let blocks: Vec<u64> = (0..10_000).collect();
        let bytes = Event::encode(Kind::Received, 1, 1, 0, 0, &blocks, 4096);
        assert!(bytes.len() <= 4096);
        let ev = Event::decode(&bytes).unwrap();
        assert_eq!(ev.blocks[..3], [0, 1, 2]);
        assert!(ev.blocks.len() > 400);
    }

    #[test]
    fn garbage_slots_read_as_no_event() {
        for junk in [vec![], vec![9u8; 40], vec![2u8, 0, 0], {
            let mut v = Event::encode(Kind::Received, 1, 1, 0, 0, &[1, 2, 3], 4096);
            v.truncate(v.len() - 3);
            v
        }] {
            assert_eq!(Event::decode(&junk), None);
        }
    }

    #[test]
    fn log_shape_fits_the_budget() {
        for bytes in [4096, 65_536, 262_144, 1 << 20, 64 << 20] {
            let s = LogShape::new(bytes);
            assert!((16..=1024).contains(&s.slots), "{s:?}");
            assert!(s.slots as usize * s.slot_bytes <= bytes.max(16 * (EVENT_HEADER + 8)));
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

    #[cfg(not(target_arch = "wasm32"))]
    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(crate::testing::proptest_config())]

            #[test]
            fn decode_inverts_encode(
                seq in any::<u64>(),
                origin in any::<u64>(),
                backend in any::<u16>(),
                time_ms in any::<u64>(),
                blocks in proptest::collection::vec(any::<u64>(), 0..600),
                evicted in any::<bool>(),
            ) {
                let kind = if evicted { Kind::Evicted } else { Kind::Received };
                let bytes = Event::encode(kind, seq, origin, backend, time_ms, &blocks, 4096);
                let ev = Event::decode(&bytes).unwrap();
                // A chain longer than the slot keeps its head.
                let kept = blocks.len().min((4096 - EVENT_HEADER) / 8);
                prop_assert_eq!(ev, Event { kind, seq, origin, backend, time_ms, blocks: blocks[..kept].to_vec() });
            }
        }
    }
}
