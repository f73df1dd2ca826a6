//! The approximate picture of each backend's prefix cache.
//!
//! ## Shape
//! Every Envoy worker runs its own VM, so the index lives twice:
//! - **the truth that all workers share** is a bounded *change log* in
//!   proxy-wasm shared data (`[version][first_seq][next_seq] events…`), each
//!   event "backend b received these block hashes at time t", appended with
//!   CAS and trimmed from the front to `log_bytes`;
//! - **each VM's replica** ([`Index`]) applies the events it has not seen.
//!   A longest-prefix lookup is then local memory only: one hash-map probe per
//!   block, with early exit, and no host call per block — the only host calls
//!   per request are reading a sequence hint, the log when it moved, and one
//!   CAS append.
//!
//! ## Forgetting like the backend does
//! Entries are `(block, backend) → last use`. Each backend has an LRU queue
//! bounded by its capacity (its real KV capacity when the tick learned it from
//! `vllm:cache_config_info`, else an equal share of `max_blocks`), and entries
//! unused for `ttl_ms` count as gone. Queues are lazy: a refresh pushes a new
//! record and the stale one is skipped when it reaches the front, with a
//! compaction when stale records outnumber live ones.
//!
//! | parameter    | default | why |
//! |--------------|---------|-----|
//! | `max_blocks` | 262 144 | × 256 B blocks ≈ 64 MB of prompt ≈ 16M tokens: more than 3 H100 replicas hold |
//! | `ttl_ms`     | 600 000 | an idle conversation's blocks are likely evicted within minutes on a busy pod |
//! | `log_bytes`  | 65 536+ | must hold the events appended between two requests of the slowest worker |
//!
//! Cost: lookup O(matched blocks); record O(new blocks) amortised.

use hashbrown::HashMap;
use std::collections::VecDeque;

/// Refreshing an entry more often than this buys nothing and grows the LRU queue.
const REFRESH_MS: u64 = 1000;

#[derive(Debug, Default)]
struct Lru {
    queue: VecDeque<(u64, u64)>,
    live: usize,
    capacity: usize,
}

/// Per-VM replica of the fleet's prefix picture.
#[derive(Debug)]
pub struct Index {
    map: HashMap<u64, Vec<(u16, u64)>>,
    lru: Vec<Lru>,
    max_blocks: usize,
    ttl_ms: u64,
}

impl Index {
    /// An empty index over `backends` backends.
    pub fn new(backends: usize, max_blocks: usize, ttl_ms: u64) -> Index {
        let mut ix = Index {
            map: HashMap::new(),
            lru: (0..backends).map(|_| Lru::default()).collect(),
            max_blocks,
            ttl_ms,
        };
        ix.set_capacities(&vec![None; backends]);
        ix
    }

    /// Sizes each backend's share: its known capacity in blocks, else an equal
    /// share; scaled down together so the sum never exceeds `max_blocks`.
    pub fn set_capacities(&mut self, known: &[Option<usize>]) {
        let n = self.lru.len().max(1);
        let share = self.max_blocks / n;
        let wanted: Vec<usize> = (0..self.lru.len())
            .map(|b| known.get(b).copied().flatten().unwrap_or(share).max(1))
            .collect();
        let sum: usize = wanted.iter().sum();
        for (lru, w) in self.lru.iter_mut().zip(wanted) {
            lru.capacity = if sum > self.max_blocks {
                ((w as u128 * self.max_blocks as u128) / sum as u128).max(1) as usize
            } else {
                w
            };
        }
    }

    /// Capacity in blocks of one backend's share.
    pub fn capacity(&self, backend: usize) -> usize {
        self.lru.get(backend).map_or(0, |l| l.capacity)
    }

    /// Live entries held for one backend.
    pub fn len_of(&self, backend: usize) -> usize {
        self.lru.get(backend).map_or(0, |l| l.live)
    }

    /// Total live (block, backend) entries.
    pub fn len(&self) -> usize {
        self.lru.iter().map(|l| l.live).sum()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// For each backend, how many leading blocks of `blocks` it holds.
    pub fn match_lengths(&self, blocks: &[u64], now_ms: u64, out: &mut Vec<u32>) {
        out.clear();
        out.resize(self.lru.len(), 0);
        let mut alive: Vec<u16> = Vec::new();
        for (i, h) in blocks.iter().enumerate() {
            let holders = match self.map.get(h) {
                Some(v) => v,
                None => break,
            };
            let fresh = |b: u16| {
                holders
                    .iter()
                    .any(|&(hb, t)| hb == b && now_ms.saturating_sub(t) <= self.ttl_ms)
            };
            if i == 0 {
                alive = holders
                    .iter()
                    .filter(|&&(_, t)| now_ms.saturating_sub(t) <= self.ttl_ms)
                    .map(|&(b, _)| b)
                    .collect();
            } else {
                alive.retain(|&b| fresh(b));
            }
            if alive.is_empty() {
                break;
            }
            for &b in &alive {
                if let Some(m) = out.get_mut(b as usize) {
                    *m = (i + 1) as u32;
                }
            }
        }
    }

    /// Records that `backend` now holds `blocks` (as of `now_ms`).
    pub fn record(&mut self, blocks: &[u64], backend: usize, now_ms: u64) {
        let Some(lru) = self.lru.get_mut(backend) else {
            return;
        };
        let b = backend as u16;
        for &h in blocks {
            let holders = self.map.entry(h).or_default();
            match holders.iter_mut().find(|(hb, _)| *hb == b) {
                Some((_, t)) if now_ms.saturating_sub(*t) < REFRESH_MS => continue,
                Some((_, t)) => *t = now_ms,
                None => {
                    holders.push((b, now_ms));
                    lru.live += 1;
                }
            }
            lru.queue.push_back((h, now_ms));
        }
        self.evict(backend, now_ms);
    }

    /// Drops entries past their TTL or beyond capacity, oldest first.
    fn evict(&mut self, backend: usize, now_ms: u64) {
        let Some(lru) = self.lru.get_mut(backend) else {
            return;
        };
        let b = backend as u16;
        while let Some(&(h, t)) = lru.queue.front() {
            let expired = now_ms.saturating_sub(t) > self.ttl_ms;
            if lru.live <= lru.capacity && !expired {
                break;
            }
            lru.queue.pop_front();
            if let Some(holders) = self.map.get_mut(&h) {
                // A newer record for this entry is further back: this one is stale.
                if let Some(pos) = holders.iter().position(|&(hb, ht)| hb == b && ht == t) {
                    holders.swap_remove(pos);
                    lru.live -= 1;
                    if holders.is_empty() {
                        self.map.remove(&h);
                    }
                }
            }
        }
        if lru.queue.len() > 2 * lru.live + 1024 {
            let map = &self.map;
            lru.queue.retain(|&(h, t)| {
                map.get(&h)
                    .is_some_and(|v| v.iter().any(|&(hb, ht)| hb == b && ht == t))
            });
        }
    }

    /// Ages every backend's share out (called from the tick).
    pub fn expire(&mut self, now_ms: u64) {
        for b in 0..self.lru.len() {
            self.evict(b, now_ms);
        }
    }
}

/// One change: `backend` received `blocks` at `time_ms`, seen by VM `origin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Position in the log.
    pub seq: u64,
    /// VM that appended it (it applied the event itself already).
    pub origin: u64,
    /// Backend index.
    pub backend: u16,
    /// Host time of the routing decision.
    pub time_ms: u64,
    /// Block hashes now held.
    pub blocks: Vec<u64>,
}

const LOG_VERSION: u8 = 1;
const HEADER: usize = 1 + 8 + 8;
const EVENT_HEADER: usize = 8 + 8 + 2 + 8 + 4;

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)?.try_into().ok().map(u64::from_le_bytes)
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)?.try_into().ok().map(u32::from_le_bytes)
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2)?.try_into().ok().map(u16::from_le_bytes)
}

/// A decoded view of the shared change log.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Log {
    /// Sequence number of the oldest event still held.
    pub first_seq: u64,
    /// Sequence number the next event gets.
    pub next_seq: u64,
    events: Vec<(usize, usize)>,
    bytes: Vec<u8>,
}

impl Log {
    /// Decodes the log; garbage (another version, truncation) reads as empty,
    /// which only makes the index forget, never misroute.
    pub fn decode(bytes: Vec<u8>) -> Log {
        Log::try_decode(bytes).unwrap_or_default()
    }

    fn try_decode(bytes: Vec<u8>) -> Option<Log> {
        if *bytes.first()? != LOG_VERSION {
            return None;
        }
        let first_seq = u64_at(&bytes, 1)?;
        let next_seq = u64_at(&bytes, 9)?;
        let mut events = Vec::new();
        let mut at = HEADER;
        while at < bytes.len() {
            let n = u32_at(&bytes, at + 26)? as usize;
            let end = at
                .checked_add(EVENT_HEADER)?
                .checked_add(n.checked_mul(8)?)?;
            if end > bytes.len() {
                return None;
            }
            events.push((at, end));
            at = end;
        }
        Some(Log {
            first_seq,
            next_seq,
            events,
            bytes,
        })
    }

    /// Events with `seq >= from`, oldest first.
    pub fn since(&self, from: u64) -> impl Iterator<Item = Event> + '_ {
        self.events.iter().filter_map(move |&(s, e)| {
            let b = &self.bytes[s..e];
            let seq = u64_at(b, 0)?;
            if seq < from {
                return None;
            }
            let blocks = b[EVENT_HEADER..]
                .chunks_exact(8)
                .filter_map(|c| c.try_into().ok().map(u64::from_le_bytes))
                .collect();
            Some(Event {
                seq,
                origin: u64_at(b, 8)?,
                backend: u16_at(b, 16)?,
                time_ms: u64_at(b, 18)?,
                blocks,
            })
        })
    }

    /// Appends an event (its `seq` is assigned) and trims the oldest events so
    /// the encoding stays within `max_bytes`; returns the encoding to store.
    pub fn append(
        mut self,
        origin: u64,
        backend: u16,
        time_ms: u64,
        blocks: &[u64],
        max_bytes: usize,
    ) -> Vec<u8> {
        // An event larger than half the log would evict everything else: keep its head.
        let room = (max_bytes.saturating_sub(HEADER) / 2).saturating_sub(EVENT_HEADER) / 8;
        let blocks = &blocks[..blocks.len().min(room)];
        let seq = self.next_seq;
        let event_len = EVENT_HEADER + blocks.len() * 8;
        let mut keep_from = 0;
        let mut size = HEADER + event_len + self.events.iter().map(|(s, e)| e - s).sum::<usize>();
        while size > max_bytes && keep_from < self.events.len() {
            let (s, e) = self.events[keep_from];
            size -= e - s;
            keep_from += 1;
        }
        let kept = &self.events[keep_from..];
        let first_seq = match kept.first() {
            Some(&(s, _)) => u64_at(&self.bytes, s).unwrap_or(seq),
            None => seq,
        };
        let mut out = Vec::with_capacity(size);
        out.push(LOG_VERSION);
        out.extend_from_slice(&first_seq.to_le_bytes());
        out.extend_from_slice(&(seq + 1).to_le_bytes());
        if let (Some(&(s, _)), Some(&(_, e))) = (kept.first(), kept.last()) {
            out.extend_from_slice(&self.bytes[s..e]);
        }
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&origin.to_le_bytes());
        out.extend_from_slice(&backend.to_le_bytes());
        out.extend_from_slice(&time_ms.to_le_bytes());
        out.extend_from_slice(&(blocks.len() as u32).to_le_bytes());
        for h in blocks {
            out.extend_from_slice(&h.to_le_bytes());
        }
        self.bytes.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn lens(ix: &Index, blocks: &[u64], now: u64) -> Vec<u32> {
        let mut out = Vec::new();
        ix.match_lengths(blocks, now, &mut out);
        out
    }

    #[test]
    fn longest_prefix_per_backend() {
        let mut ix = Index::new(3, 1 << 16, 60_000);
        ix.record(&[1, 2, 3, 4], 0, 0);
        ix.record(&[1, 2], 1, 0);
        assert_eq!(lens(&ix, &[1, 2, 3, 9], 10), vec![3, 2, 0]);
        assert_eq!(lens(&ix, &[7, 2, 3], 10), vec![0, 0, 0]);
    }

    #[test]
    fn entries_age_out() {
        let mut ix = Index::new(1, 1 << 16, 1000);
        ix.record(&[1, 2], 0, 0);
        assert_eq!(lens(&ix, &[1, 2], 1000), vec![2]);
        assert_eq!(lens(&ix, &[1, 2], 1001), vec![0]);
        ix.expire(5000);
        assert!(ix.is_empty());
    }

    #[test]
    fn capacity_evicts_least_recently_used() {
        let mut ix = Index::new(1, 4096, 1 << 40);
        ix.set_capacities(&[Some(4)]);
        ix.record(&[1, 2], 0, 0);
        ix.record(&[3, 4], 0, 5000);
        ix.record(&[1, 2], 0, 10_000); // refresh: now 3,4 are the oldest
        ix.record(&[5, 6], 0, 15_000);
        assert_eq!(ix.len_of(0), 4);
        assert_eq!(lens(&ix, &[1, 2], 20_000), vec![2]);
        assert_eq!(lens(&ix, &[3, 4], 20_000), vec![0]);
        assert_eq!(lens(&ix, &[5, 6], 20_000), vec![2]);
    }

    #[test]
    fn memory_stays_bounded_under_churn() {
        let mut ix = Index::new(2, 2048, 1 << 40);
        for i in 0..50_000u64 {
            ix.record(&[i * 3, i * 3 + 1, i * 3 + 2], (i % 2) as usize, i * 2000);
        }
        assert!(ix.len() <= 2048);
        assert!(ix
            .lru
            .iter()
            .all(|l| l.queue.len() <= 2 * l.live + 1024 + 3));
        assert!(ix.map.len() <= 2048);
    }

    #[test]
    fn capacities_never_exceed_the_bound() {
        let mut ix = Index::new(2, 2048, 1000);
        ix.set_capacities(&[Some(10_000), None]);
        assert!(ix.capacity(0) + ix.capacity(1) <= 2048);
        assert!(ix.capacity(0) > ix.capacity(1));
    }

    #[test]
    fn log_round_trip_and_trim() {
        let mut bytes = Vec::new();
        for i in 0..10u64 {
            bytes = Log::decode(bytes).append(7, i as u16, i * 10, &[i, i + 1, i + 2], 300);
        }
        let log = Log::decode(bytes);
        assert_eq!(log.next_seq, 10);
        assert!(log.first_seq > 0, "trimmed");
        let evs: Vec<Event> = log.since(0).collect();
        assert_eq!(evs.last().map(|e| e.seq), Some(9));
        assert_eq!(evs.last().map(|e| e.blocks.clone()), Some(vec![9, 10, 11]));
        assert_eq!(evs.first().map(|e| e.seq), Some(log.first_seq));
        assert_eq!(log.since(9).count(), 1);
    }

    #[test]
    fn oversized_event_is_cut_to_fit() {
        let blocks: Vec<u64> = (0..10_000).collect();
        let bytes = Log::decode(Vec::new()).append(1, 0, 0, &blocks, 4096);
        assert!(bytes.len() <= 4096);
        let log = Log::decode(bytes);
        let ev: Vec<Event> = log.since(0).collect();
        assert_eq!(ev[0].blocks[..3], [0, 1, 2]);
    }

    #[test]
    fn garbage_log_reads_as_empty() {
        for junk in [vec![], vec![9u8; 40], vec![1u8, 0, 0], {
            let mut v = Log::decode(Vec::new()).append(1, 0, 0, &[1, 2, 3], 4096);
            v.truncate(v.len() - 3);
            v
        }] {
            let log = Log::decode(junk);
            assert_eq!(log.since(0).count(), 0);
        }
    }
}
