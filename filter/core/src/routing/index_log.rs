//! The index's change log: how one VM's routing reaches every other worker's
//! index replica ([`crate::routing::index`]).
//!
//! A ring of `slots` shared-data values, each holding one [`Event`] ("backend
//! b received this chain at time t, routed by VM v", or "backend b
//! no longer holds what it last used at or before t", when its own cache
//! report said so: [`crate::routing::feedback`]). Event `seq`
//! lives in slot `seq % slots`; the sequence counter lives in the ledger
//! ([`crate::fleet::store`]), so the CAS that accounts a request also reserves its
//! event's number, and an append costs one write of its own slot, whatever
//! the log's size. A reader that falls more than `slots` events behind has
//! lost the overwritten ones (a *gap*: its index misses prefixes routed
//! meanwhile, and keeps entries an eviction event would have dropped).
//!
//! ```text
//! slots      = clamp(log_bytes / 16 KiB, 16, 1024)
//! slot_bytes = log_bytes / slots
//! event      = version u8 ‖ kind u8 ‖ seq u64 ‖ origin u64 ‖ backend u16
//!              ‖ time_ms u64 ‖ prefill u32 ‖ len u32 ‖ n u32 ‖ n × block u64
//!              (little-endian, [`crate::codec`]; kind 0 received: a chain of
//!               len blocks, as its hashes at the positions the index holds,
//!               [`crate::routing::index::kept_positions`], and the prefill blocks its
//!               VM accounted for it ([`crate::routing::pending`] settles by them);
//!               kind 1 evicted: no blocks, time_ms is the cut-off)
//! ```
//! A slot may instead hold a *pack*: several events a peer gateway replica
//! sent ([`crate::routing::exchange`]), all under the slot's one seq:
//!
//! ```text
//! pack       = PACK u8 ‖ n u16 ‖ n × (bytes u32 ‖ event)
//! ```
//! A replica that joins copies a peer's whole outbox (hundreds to thousands of
//! events) in one pull; one slot each would lap the ring before the other VMs
//! read it, and they would keep only the last `slots` of them. Packed, a
//! conversation's events (~14 hashes) go ~100 to a 16 KiB slot.
//!
//! The index holds a chain only at sampled positions, so the event carries
//! only those: ~100 hashes for a 128 KB prompt instead of 512, and a slot of
//! 16 KiB holds the sample of any chain up to ~2^100 blocks. Writer and
//! readers copy a fifth of the bytes. A list cut to fit a slot keeps its
//! head, the part other requests most likely share.

use crate::codec::{put, Reader};
use crate::fleet::store::{Store, MIN_SLOT_BYTES};
use crate::host::{Host, HostError};
use crate::routing::index::kept_positions;

/// What an event says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// The backend received its blocks (a routed prompt's chain).
    Received = 0,
    /// The backend no longer holds what it last used at or before `time_ms`.
    Evicted = 1,
}

/// What an event says besides its chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
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
    /// Prompt blocks the origin accounted as waiting for prefill there (0 for an eviction).
    pub prefill: u32,
}

/// One change to what `head.backend` holds, seen by VM `head.origin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// What it says besides the chain.
    pub head: Head,
    /// Length of the chain received (0 for an eviction).
    pub len: u32,
    /// The chain's hashes at [`crate::routing::index::kept_positions`] of `len`, in order.
    pub blocks: Vec<u64>,
}

/// Origin of the events a peer gateway replica sent ([`crate::routing::exchange`]):
/// every VM applies them (none appended them itself), and they are not served
/// to peers again.
pub const IMPORTED: u64 = crate::fleet::store::PEERS_VM;

const EVENT_VERSION: u8 = 5;
const EVENT_HEADER: usize = 1 + 1 + 8 + 8 + 2 + 8 + 4 + 4 + 4;
/// First byte of a pack (never an event's version).
const PACK: u8 = 0x80 | EVENT_VERSION;
const PACK_HEADER: usize = 1 + 2;
/// Each packed event's length before it.
const PACKED_PREFIX: usize = 4;
// A slot of the store's ring holds at least one header and one block.
const _: () = assert!(EVENT_HEADER + 8 <= MIN_SLOT_BYTES);

/// The index log's slots in shared data.
impl<H: Host> Store<'_, H> {
    /// Sequence number the next index event gets.
    pub fn log_next_seq(&self) -> Result<u64, HostError> {
        self.read_ledger().map(|r| r.value.next_seq)
    }

    /// The event in `seq`'s slot, whichever event that is now (or none).
    pub fn log_event(&self, seq: u64) -> Result<Option<Event>, HostError> {
        let v = self.host.get_shared(self.keys.log_slot(seq))?.0;
        Ok(v.as_deref().and_then(Event::decode))
    }

    /// Writes the event of a reserved `head.seq` into its slot (the seq is ours
    /// alone, so unconditionally).
    pub fn write_event(&self, head: Head, blocks: &[u64]) -> Result<(), HostError> {
        let event = Event::encode(head, blocks, self.keys.log_shape().slot_bytes);
        self.host
            .set_shared(self.keys.log_slot(head.seq), &event, None)
    }

    /// Every event in `seq`'s slot, whichever slot's events those are now:
    /// one, a pack's, or none (empty, garbage).
    pub fn log_events(&self, seq: u64) -> Result<Vec<Event>, HostError> {
        let v = self.host.get_shared(self.keys.log_slot(seq))?.0;
        Ok(v.as_deref().map(Event::decode_slot).unwrap_or_default())
    }

    /// Writes `events` (another replica's, each a chain of `len` blocks as its
    /// kept hashes) as one pack in the reserved slot `seq`; their heads' seq is
    /// set to it. A group from [`pack_groups`] fits the slot whole.
    pub fn write_pack(&self, seq: u64, events: &[(Head, u32, &[u64])]) -> Result<(), HostError> {
        let slot_bytes = self.keys.log_shape().slot_bytes;
        let mut out = Vec::with_capacity(slot_bytes.min(1 << 16));
        put(&mut out, PACK);
        put(&mut out, events.len().min(usize::from(u16::MAX)) as u16);
        for &(head, len, kept) in events.iter().take(usize::from(u16::MAX)) {
            let e = Event::encode_kept(Head { seq, ..head }, len, kept, packed_room(slot_bytes));
            put(&mut out, e.len() as u32);
            out.extend_from_slice(&e);
        }
        self.host.set_shared(self.keys.log_slot(seq), &out, None)
    }
}

/// The most bytes one packed event takes in a slot of `slot_bytes` (a longer
/// one keeps its head, as [`Event::encode`] cuts any event).
fn packed_room(slot_bytes: usize) -> usize {
    slot_bytes.saturating_sub(PACK_HEADER + PACKED_PREFIX)
}

/// Splits events of `kept[i]` kept hashes each, in order, into consecutive
/// groups that each fill one slot of `slot_bytes` as a pack: the ranges.
pub fn pack_groups(kept: &[usize], slot_bytes: usize) -> Vec<std::ops::Range<usize>> {
    let room = packed_room(slot_bytes);
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, PACK_HEADER);
    for (i, &n) in kept.iter().enumerate() {
        let size = PACKED_PREFIX + (EVENT_HEADER + 8 * n).min(room);
        if i > start && (bytes + size > slot_bytes || i - start >= usize::from(u16::MAX)) {
            out.push(start..i);
            (start, bytes) = (i, PACK_HEADER);
        }
        bytes += size;
    }
    if start < kept.len() {
        out.push(start..kept.len());
    }
    out
}

impl Event {
    /// Encodes the event for one slot: of a received `chain`, its hashes at the
    /// positions the index holds; a list longer than `max_bytes` keeps its head
    /// (the part other requests are most likely to share).
    pub fn encode(head: Head, chain: &[u64], max_bytes: usize) -> Vec<u8> {
        // Positions past the chain's end cannot occur, so every kept position has its hash.
        let kept = kept_positions(chain.len()).filter_map(|i| chain.get(i).copied());
        let len = u32::try_from(chain.len()).unwrap_or(u32::MAX);
        Event::encode_with(head, len, kept, max_bytes)
    }

    /// [`Event::encode`] of a chain of `len` blocks given as its hashes at the
    /// kept positions (an event another replica sent).
    pub fn encode_kept(head: Head, len: u32, kept: &[u64], max_bytes: usize) -> Vec<u8> {
        Event::encode_with(head, len, kept.iter().copied(), max_bytes)
    }

    fn encode_with(
        head: Head,
        len: u32,
        kept: impl Iterator<Item = u64> + Clone,
        max_bytes: usize,
    ) -> Vec<u8> {
        let room = max_bytes.saturating_sub(EVENT_HEADER) / 8;
        let kept = kept.take(room);
        // The count is the number written (a mismatch would read back as no event,
        // never a misread one).
        let n = kept.clone().count();
        let mut out = Vec::with_capacity(EVENT_HEADER + n * 8);
        put(&mut out, EVENT_VERSION);
        put(&mut out, head.kind as u8);
        put(&mut out, head.seq);
        put(&mut out, head.origin);
        put(&mut out, head.backend);
        put(&mut out, head.time_ms);
        put(&mut out, head.prefill);
        put(&mut out, len);
        put(&mut out, n as u32);
        for h in kept {
            put(&mut out, h);
        }
        out
    }

    /// Decodes a slot that holds one event or a pack; garbage (another
    /// version, truncation, a pack whose count or lengths lie) reads as no
    /// events, never a misread one.
    pub fn decode_slot(b: &[u8]) -> Vec<Event> {
        if b.first() != Some(&PACK) {
            return Event::decode(b).into_iter().collect();
        }
        let mut r = Reader::new(b);
        let unpack = |r: &mut Reader<'_>| -> Option<Vec<Event>> {
            r.get::<u8>()?;
            let n = usize::from(r.get::<u16>()?);
            let events = (0..n)
                .map(|_| {
                    let len = r.get::<u32>()? as usize;
                    Event::decode(r.take(len)?)
                })
                .collect::<Option<Vec<Event>>>()?;
            r.is_empty().then_some(events)
        };
        unpack(&mut r).unwrap_or_default()
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
        // A struct literal evaluates its fields in the order written: the wire order.
        let head = Head {
            kind,
            seq: r.get()?,
            origin: r.get()?,
            backend: r.get()?,
            time_ms: r.get()?,
            prefill: r.get()?,
        };
        let len = r.get()?;
        let n = r.get::<u32>()? as usize;
        if r.rest().len() != n.checked_mul(8)? {
            return None;
        }
        Some(Event {
            head,
            len,
            blocks: (0..n).map_while(|_| r.get()).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::store::{Keys, Writer};
    use crate::host::HostError;
    use crate::testing::MemoryHost;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// A head that accounts 7 prefill blocks for a received chain.
    fn head(kind: Kind, seq: u64, origin: u64, backend: u16, time_ms: u64) -> Head {
        let prefill = if kind == Kind::Received { 7 } else { 0 };
        Head {
            kind,
            seq,
            origin,
            backend,
            time_ms,
            prefill,
        }
    }

    #[test]
    fn event_round_trip() {
        let bytes = Event::encode(head(Kind::Evicted, 9, 7, 2, 1234), &[], 4096);
        assert_eq!(
            Event::decode(&bytes),
            Some(Event {
                head: head(Kind::Evicted, 9, 7, 2, 1234),
                len: 0,
                blocks: vec![]
            })
        );
    }

    #[test]
    fn a_received_chain_travels_as_its_kept_positions() {
        let chain: Vec<u64> = (100..100 + 600).collect();
        let ev = Event::decode(&Event::encode(
            head(Kind::Received, 1, 1, 0, 0),
            &chain,
            16384,
        ))
        .unwrap();
        assert_eq!(ev.len, 600);
        let kept: Vec<u64> = kept_positions(600).map(|i| chain[i]).collect();
        assert_eq!(ev.blocks, kept);
        // Every block of the dense head, a sample after it, and the last block.
        assert_eq!(ev.blocks[..3], [100, 101, 102]);
        assert_eq!(ev.blocks.last(), Some(&699));
        assert!(ev.blocks.len() < 200);
    }

    #[test]
    fn oversized_event_keeps_its_head() {
        let blocks: Vec<u64> = (0..1_000_000).collect();
        let bytes = Event::encode(head(Kind::Received, 1, 1, 0, 0), &blocks, 512);
        assert!(bytes.len() <= 512);
        let ev = Event::decode(&bytes).unwrap();
        assert_eq!(ev.len, 1_000_000);
        assert_eq!(ev.blocks[..3], [0, 1, 2]);
        assert_eq!(ev.blocks.len(), (512 - EVENT_HEADER) / 8);
    }

    #[test]
    fn a_pack_reads_back_as_its_events_under_the_slot_seq() {
        let (host, keys) = (MemoryHost::default(), Keys::new(1, 1 << 20));
        let s = Store {
            host: &host,
            keys: &keys,
            n: 3,
        };
        let chains: Vec<Vec<u64>> = (0..3u64)
            .map(|i| (i * 100..i * 100 + 20).collect())
            .collect();
        let events: Vec<(Head, u32, &[u64])> = chains
            .iter()
            .enumerate()
            .map(|(i, c)| {
                (
                    head(Kind::Received, 0, 9, i as u16, 50 + i as u64),
                    20,
                    c.as_slice(),
                )
            })
            .chain([(head(Kind::Evicted, 0, 9, 1, 77), 0, &[][..])])
            .collect();
        s.write_pack(5, &events).unwrap();
        let back = s.log_events(5).unwrap();
        assert_eq!(back.len(), 4);
        for (ev, (h, len, kept)) in back.iter().zip(&events) {
            assert_eq!(ev.head, Head { seq: 5, ..*h });
            assert_eq!((ev.len, ev.blocks.as_slice()), (*len, *kept));
        }
        // A slot of one event reads as that one.
        s.write_event(head(Kind::Received, 6, 9, 0, 1), &[1, 2])
            .unwrap();
        assert_eq!(s.log_events(6).unwrap().len(), 1);
    }

    #[test]
    fn a_pack_that_lies_reads_as_no_events() {
        let (host, keys) = (MemoryHost::default(), Keys::new(1, 1 << 20));
        let s = Store {
            host: &host,
            keys: &keys,
            n: 3,
        };
        let c = [1u64, 2, 3];
        s.write_pack(1, &[(head(Kind::Received, 0, 9, 0, 1), 3, &c[..]); 2])
            .unwrap();
        let good = host.get_shared(keys.log_slot(1)).unwrap().0.unwrap();
        let mut more = good.clone();
        more[1] = 3; // a count past what follows
        let mut short = good.clone();
        short.pop();
        let mut trailing = good.clone();
        trailing.push(0);
        for junk in [
            more,
            short,
            trailing,
            vec![PACK],
            vec![PACK, 1, 0, 255, 255, 255, 255],
        ] {
            assert!(Event::decode_slot(&junk).is_empty(), "{junk:?}");
        }
        assert_eq!(Event::decode_slot(&good).len(), 2);
    }

    #[test]
    fn pack_groups_fill_slots_in_order_and_each_fits_its_slot() {
        let (host, keys) = (MemoryHost::default(), Keys::new(1, 1 << 20));
        let s = Store {
            host: &host,
            keys: &keys,
            n: 3,
        };
        let slot_bytes = keys.log_shape().slot_bytes;
        // Conversation-sized events (14 hashes), a long prompt's (~100), one past a slot.
        let kept: Vec<usize> = (0..400)
            .map(|i| match i % 50 {
                0 => 100,
                7 => 5000,
                _ => 14,
            })
            .collect();
        let groups = pack_groups(&kept, slot_bytes);
        assert_eq!(groups.first().map(|g| g.start), Some(0));
        assert_eq!(groups.last().map(|g| g.end), Some(kept.len()));
        assert!(groups
            .windows(2)
            .all(|w| w[0].end == w[1].start && w[0].start < w[0].end));
        assert!(
            groups.len() < kept.len() / 20,
            "{} slots for {} events",
            groups.len(),
            kept.len()
        );
        let chain: Vec<u64> = (0..5000).collect();
        for (i, g) in groups.iter().enumerate() {
            let events: Vec<(Head, u32, &[u64])> = kept[g.clone()]
                .iter()
                .map(|&n| (head(Kind::Received, 0, 9, 0, 1), n as u32, &chain[..n]))
                .collect();
            s.write_pack(i as u64, &events).unwrap();
            let bytes = host.get_shared(keys.log_slot(i as u64)).unwrap().0.unwrap();
            assert!(
                bytes.len() <= slot_bytes,
                "group {i}: {} bytes",
                bytes.len()
            );
            assert_eq!(Event::decode_slot(&bytes).len(), g.len());
        }
    }

    #[test]
    fn garbage_slots_read_as_no_event() {
        for junk in [vec![], vec![9u8; 40], vec![2u8, 0, 0], {
            let mut v = Event::encode(head(Kind::Received, 1, 1, 0, 0), &[1, 2, 3], 4096);
            v.truncate(v.len() - 3);
            v
        }] {
            assert_eq!(Event::decode(&junk), None);
        }
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
                blocks in proptest::collection::vec(any::<u64>(), 0..3000),
                evicted in any::<bool>(),
                max_bytes in 64usize..4096,
            ) {
                let kind = if evicted { Kind::Evicted } else { Kind::Received };
                let bytes = Event::encode(head(kind, seq, origin, backend, time_ms), &blocks, max_bytes);
                prop_assert!(bytes.len() <= max_bytes.max(EVENT_HEADER));
                let ev = Event::decode(&bytes).unwrap();
                // The chain's kept positions, their head when they outgrow the slot.
                let room = (max_bytes - EVENT_HEADER) / 8;
                let kept: Vec<u64> = kept_positions(blocks.len()).take(room).map(|i| blocks[i]).collect();
                let len = blocks.len() as u32;
                let prefill = if evicted { 0 } else { 7 };
                prop_assert_eq!(ev, Event { head: Head { kind, seq, origin, backend, time_ms, prefill }, len, blocks: kept });
            }

            #[test]
            fn a_replica_fed_the_event_holds_what_the_writer_recorded(
                len in 1usize..3000,
                backend in 0usize..2,
            ) {
                // The writer records the whole chain; another VM records the event.
                let chain: Vec<u64> = (0..len as u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1).collect();
                let ev = Event::decode(&Event::encode(head(Kind::Received, 0, 0, backend as u16, 5), &chain, 16384)).unwrap();
                let mut writer = crate::routing::index::Index::new(2, 1 << 16, 60_000);
                let mut reader = crate::routing::index::Index::new(2, 1 << 16, 60_000);
                writer.record(&chain, backend, 5);
                reader.record_kept(ev.len as usize, &ev.blocks, backend, 5);
                let (mut w, mut r) = (Vec::new(), Vec::new());
                writer.match_lengths(&chain, 5, &mut w);
                reader.match_lengths(&chain, 5, &mut r);
                prop_assert_eq!(&w, &r);
                prop_assert_eq!(w[backend] as usize, len);
            }
        }
    }

    /// Appends an index event outside a request: reserves its seq, then writes its slot.
    fn append_log(
        s: &Store<'_, MemoryHost>,
        origin: u64,
        backend: u16,
        blocks: &[u64],
    ) -> Result<u64, HostError> {
        let seq = s
            .account(
                None,
                Writer {
                    vm: 1,
                    now_ms: s.host.now_ms(),
                    lease_ms: 1500,
                },
                &[],
                true,
            )?
            .seq
            .unwrap_or_default();
        let head = Head {
            kind: Kind::Received,
            seq,
            origin,
            backend,
            time_ms: s.host.now_ms(),
            prefill: 1,
        };
        s.write_event(head, blocks)?;
        Ok(seq)
    }

    #[test]
    fn log_append_and_read_back() {
        let (host, keys) = (MemoryHost::default(), Keys::new(1, 4096));
        let s = Store {
            host: &host,
            keys: &keys,
            n: 3,
        };
        assert_eq!(s.log_next_seq().unwrap(), 0);
        assert_eq!(append_log(&s, 7, 2, &[1, 2, 3]).unwrap(), 0);
        host.inject_conflicts.set(3);
        assert_eq!(
            append_log(&s, 8, 1, &[4]).unwrap(),
            1,
            "a lost CAS retries, never reuses a seq"
        );
        assert_eq!(s.log_next_seq().unwrap(), 2);
        let ev = s.log_event(1).unwrap().unwrap();
        assert_eq!(
            (
                ev.head.seq,
                ev.head.origin,
                ev.head.backend,
                ev.len,
                ev.blocks
            ),
            (1, 8, 1, 1, vec![4])
        );
        // The ring wraps: seq 16 overwrites seq 0's slot.
        for i in 2..=16 {
            append_log(&s, 9, 0, &[i]).unwrap();
        }
        assert_eq!(s.log_event(0).unwrap().map(|e| e.head.seq), Some(16));
    }

    #[test]
    fn an_event_keeps_its_layout() {
        let received = Event::encode(head(Kind::Received, 9, 7, 2, 1234), &[11, 12, 13], 4096);
        assert_eq!(crate::testing::hex(&received), "0500090000000000000007000000000000000200d2040000000000000700000003000000030000000b000000000000000c000000000000000d00000000000000", "index_log.v1");
    }
}
