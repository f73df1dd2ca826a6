//! The approximate picture of each backend's prefix cache.
//!
//! ## Shape
//! Every Envoy worker runs its own VM, so the index lives twice:
//! - **the truth that all workers share** is a *change log* in proxy-wasm
//!   shared data ([`crate::routing::index_log`]): a ring of events "backend b
//!   received these block hashes at time t", appended at one slot write per
//!   routed request;
//! - **each VM's replica** ([`Index`]) applies the events it has not seen.
//!   A longest-prefix lookup is then local memory only: one hash-map probe per
//!   sampled position, with early exit, and no host call per block — the only
//!   host calls per request are reading the ledger, the slots of events other
//!   VMs appended since, and the append.
//!
//! ## Forgetting like the backend does
//! Entries are `(block, backend) → last use`, one flat hash-map slot each
//! (16 bytes, no allocation per block): at capacity every new block evicts an
//! old one, so recording a long unseen prompt is a stream of cache misses,
//! and the smaller the table the fewer. Each backend has an LRU queue
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
//! | `log_bytes`  | 1 MiB   | shared-data budget of the log ([`crate::routing::index_log`]): the ring must hold the events appended between two requests of the slowest worker, and a slot the chain of a long prompt |
//!
//! ## Sampled positions
//! A chain's hash at block `i` names the whole prefix up to `i`, so the index
//! need not hold every position to tell how far a prompt matches. It holds
//! the first [`DENSE`] blocks (8 KB) one by one, then 16 positions per
//! doubling of the length (every 2nd block up to 64, every 4th up to 128,
//! ..., every 32nd up to 1024), plus the last block of every recorded
//! prompt. A lookup checks the same positions and, for a backend that stops
//! matching, the positions since the previous sampled one, newest first:
//! that finds where an earlier turn of the conversation ended to the block.
//! A match between two prompts that part ways elsewhere is under-counted by
//! less than 1/16 of its length. A 128 KB prompt (512 blocks) then costs
//! about 100 entries instead of 512: recording an unseen long prompt into an
//! index at capacity (an insert and an eviction per entry, both cache misses)
//! was most of the filter's work on it after parsing. A sampled entry counts
//! the blocks since the previous sampled position against the backend's
//! capacity; a prompt's last block off the sample counts one block, not its
//! stretch: the next turn usually extends it and its samples count that
//! stretch (counting both added up a stride per turn: 30% of a pod's capacity
//! on the agent bench), but counting nothing would let prompts that share a
//! prefix and differ only past the last sample grow the index without bound
//! (one uncounted entry each, until the TTL).
//!
//! Memory: every entry counts at least one block, so each backend holds at
//! most `capacity` entries and `max_blocks` bounds the whole map; the LRU
//! queue holds at most one stale record per live one (plus 1024) before it is
//! compacted, so compaction is amortised O(1) per record. The map grows, to
//! twice its size, before more than half of it is live, so it is as large as
//! it gets once the index is full. A removal from hashbrown's table mostly
//! leaves a tombstone; when they have used up its spare slots it clears them
//! in place if at most half the table is live, else it doubles. A map its own
//! growth left between half and 7/8 full therefore doubled under eviction
//! churn long after the index filled (within about five capacities of churn
//! on wasm32, whose 8-slot probe groups leave more tombstones than SSE2's 16).
//! Each entry takes 2.3 to 4.6 slots of 17 bytes: 18 MB for the default
//! `max_blocks` filled with one-block entries, what churn grew it to anyway.
//!
//! ## Whole prompts
//! An engine that keeps whole prompts rather than blocks (llama.cpp's server: one
//! prompt per slot and a RAM cache of prompts) holds far fewer conversations than
//! its tokens suggest. With a [`PromptModel`] the index also keeps, per backend,
//! the prompts recorded for it and evicts a backend's least recent prompt's
//! entries when it holds more than the engine can ([`prompts`]); without one
//! (vLLM, SGLang) it forgets by blocks alone.
//!
//! ## First blocks
//! The index also counts, per chain's first block, the backends holding an
//! entry for it (incremented when such an entry is created, decremented when
//! any entry goes: the unsalted hash of an entry at a later position is no
//! first block's, barring a 2^-64 collision). A prompt whose first block no
//! backend holds, every new conversation, matches nowhere, and its lookup
//! probes no backend instead of each one once. One map slot per distinct
//! first block held, at most one per entry.
//!
//! Cost: lookup O(1) for a prompt no backend holds the first block of, else
//! O(backends + matched entries): one probe per backend at the first block,
//! then one per sampled position for each backend still matching (a system
//! prompt every pod holds costs a probe per pod per sampled position of it);
//! record O(entries) amortised.

use hashbrown::hash_map::Entry;
use hashbrown::HashMap;
use std::collections::VecDeque;

mod prompts;
pub use prompts::PromptModel;

/// Refreshing an entry more often than this buys nothing and grows the LRU queue.
const REFRESH_MS: u64 = 1000;

/// A pod's eviction report forgets at most 1/this of what the index holds for it. The
/// index orders a pod's entries by this gateway's uses only: behind several gateways,
/// a prefix this one last sent long ago may have been kept warm by the others, and
/// forgetting everything older than the lost block dropped such prefixes (the eviction
/// bench behind 3 gateways, docs/decisions/0011-eviction-reports-surplus-rule.md). Reports keep coming while the pod still
/// evicts, so a larger gap is closed over a few of them.
pub const FORGET_SHARE: usize = 8;

/// Leading blocks that each get an entry (8 KB of prompt: system prompts, short chats).
pub const DENSE: usize = 32;

/// Blocks one sampled position stands for: 1 up to [`DENSE`], then doubling with the position.
fn stride(i: usize) -> usize {
    if i < DENSE {
        1
    } else {
        // 16 positions per doubling: [32, 64) every 2nd, [64, 128) every 4th, ...
        1 << (i.ilog2() - 4)
    }
}

/// Whether position `i` of every chain has an entry (the last of each stride).
fn sampled(i: usize) -> bool {
    (i + 1).is_multiple_of(stride(i))
}

/// Whether the index holds position `i` of a chain whose last position is `last`.
fn kept(i: usize, last: usize) -> bool {
    sampled(i) || i == last
}

/// The positions of a chain of `len` blocks the index holds, in order: all an
/// index log event needs to carry of the chain ([`crate::routing::index_log`]).
pub fn kept_positions(len: usize) -> impl Iterator<Item = usize> + Clone {
    let last = len.saturating_sub(1);
    (0..len).filter(move |&i| kept(i, last))
}

/// How many sampled positions lie below `end`: the first [`DENSE`], then 16 per
/// doubling, the last of each stride (`end / stride` of them up to `end` in its doubling).
fn sampled_below(end: usize) -> usize {
    if end <= DENSE {
        return end;
    }
    let octave = (end - 1).ilog2() as usize; // the doubling `end - 1` is in, ≥ 5
    DENSE + 16 * (octave - 5) + (end >> (octave - 4)) - 16
}

/// The `k`-th sampled position (0-based), for `k` below [`sampled_below`] of a `usize`.
fn sampled_at(k: usize) -> usize {
    if k < DENSE {
        return k;
    }
    let (octave, r) = (5 + (k - DENSE) / 16, (k - DENSE) % 16);
    (1 << octave) + ((r + 1) << (octave - 4)) - 1
}

/// The last of the first `n` of [`kept_positions`]`(len)` that lies below `end`, as
/// (its place in that list, its position): what an event cut to `n` hashes says of a
/// prefix ending at `end`, in O(1) rather than a walk along the chain.
pub fn last_kept_below(len: usize, end: usize, n: usize) -> Option<(usize, usize)> {
    let last = len.checked_sub(1)?;
    let sampled_len = sampled_below(len);
    let k = if end > last && !sampled(last) {
        sampled_len // the last block, kept after every sampled position
    } else {
        sampled_below(end.min(len)).checked_sub(1)?
    };
    if k < n {
        Some((
            k,
            if k == sampled_len {
                last
            } else {
                sampled_at(k)
            },
        ))
    } else {
        let k = n.checked_sub(1)?;
        Some((k, sampled_at(k)))
    }
}

/// Blocks an entry at position `i` counts against capacity: a sampled one
/// its stride, a prompt's last block off the sample one (see "Sampled positions").
fn span(i: usize) -> u32 {
    if sampled(i) {
        stride(i) as u32
    } else {
        1
    }
}

/// How many backends hold an entry for each chain's first block (see "First blocks").
type Firsts = HashMap<u64, u32>;

/// One backend fewer holds `block`, if it is a first block.
fn unhold(firsts: &mut Firsts, block: u64) {
    if let Entry::Occupied(mut e) = firsts.entry(block) {
        if *e.get() <= 1 {
            e.remove();
        } else {
            *e.get_mut() -= 1;
        }
    }
}

/// Pops `lru`'s oldest records while `pop` says so, removing the entries
/// they are still current for (the backend's entries are salted with `salt`).
fn pop_oldest(
    map: &mut HashMap<u64, u64>,
    firsts: &mut Firsts,
    salt: u64,
    lru: &mut Lru,
    pop: impl Fn(&Lru, Rec) -> bool,
) {
    while let Some(&r) = lru.queue.front() {
        if !pop(lru, r) {
            break;
        }
        lru.queue.pop_front();
        // A newer record for this entry is further back: this one is stale.
        if let Entry::Occupied(e) = map.entry(r.key) {
            if *e.get() == r.time() {
                e.remove();
                lru.live = lru.live.saturating_sub(r.span());
                unhold(firsts, r.key ^ salt);
            }
        }
    }
}

/// Makes room for one more entry in `map` while keeping at most half of its
/// `capacity` (as of its last growth) live, doubling it when needed (see "Memory").
fn make_room(map: &mut HashMap<u64, u64>, capacity: &mut usize) {
    if map.len().saturating_add(1).saturating_mul(2) > *capacity {
        // More than the spare slots left: hashbrown allocates for the whole
        // `capacity + 1` rather than rehash in place.
        let more = capacity.saturating_add(1).saturating_sub(map.len()).max(1);
        map.reserve(more);
        *capacity = map.capacity();
    }
}

/// One recording of an entry, oldest first in its backend's queue: 16 bytes,
/// like the map slot (a queue holds up to two records per live entry).
#[derive(Debug, Clone, Copy)]
struct Rec {
    key: u64,
    /// Time (ms) in the high 48 bits, span (blocks it counts for) in the low 16.
    stamp: u64,
}

/// Latest time a record can hold (48 bits of ms: the year 10889).
const TIME_MAX: u64 = (1 << 48) - 1;

impl Rec {
    fn new(key: u64, time: u64, span: u32) -> Rec {
        Rec {
            key,
            stamp: time << 16 | u64::from(span.min(u16::MAX.into())),
        }
    }

    fn time(self) -> u64 {
        self.stamp >> 16
    }

    fn span(self) -> usize {
        (self.stamp & 0xffff) as usize
    }
}

#[derive(Debug, Default)]
struct Lru {
    /// Recordings in order; stale ones (the entry was refreshed since) are skipped lazily.
    queue: VecDeque<Rec>,
    /// Blocks the live entries stand for.
    live: usize,
    capacity: usize,
}

/// Per-VM replica of the fleet's prefix picture.
#[derive(Debug)]
pub struct Index {
    /// Entry key (block hash salted by backend, see [`Index::key`]) → last use.
    map: HashMap<u64, u64>,
    /// The map's capacity as of its last growth (no tombstones then): it grows
    /// again before half of that is live (see "Memory").
    map_capacity: usize,
    /// Per-backend salts: block hashes are uniform, so an xor keeps keys distinct.
    salts: Vec<u64>,
    /// Backends holding each chain's first block: a prompt none holds skips the lookup.
    firsts: Firsts,
    lru: Vec<Lru>,
    max_blocks: usize,
    ttl_ms: u64,
    /// The whole prompts each backend holds, for an engine that keeps prompts ([`prompts`]).
    prompts: Option<PromptModel>,
    /// Per backend, the prompts it holds, newest last (empty without a model).
    chains: Vec<VecDeque<prompts::Chain>>,
    /// The chains it evicted last, fleet-wide ([`prompts`]).
    ghosts: prompts::Ghosts,
}

impl Index {
    /// An empty index over `backends` backends.
    pub fn new(backends: usize, max_blocks: usize, ttl_ms: u64) -> Index {
        let mut ix = Index {
            map: HashMap::new(),
            map_capacity: 0,
            firsts: Firsts::new(),
            salts: (0..backends as u64)
                .map(|b| crate::hash::mix(b ^ 0x1de5_a17e))
                .collect(),
            lru: (0..backends).map(|_| Lru::default()).collect(),
            max_blocks,
            ttl_ms,
            prompts: None,
            chains: (0..backends).map(|_| VecDeque::new()).collect(),
            ghosts: prompts::Ghosts::default(),
        };
        ix.set_capacities(&vec![None; backends]);
        ix
    }

    /// Sizes each backend's share: its known capacity in blocks, else (`None`)
    /// an equal share of the members' (`Some(0)`: an empty slot, which holds
    /// nothing and takes no share). When they add up to more than
    /// `max_blocks`, the bound is filled max-min fairly: each backend gets what
    /// it asks up to an equal share of what those asking less left over. A
    /// scraped capacity is foreign input: a pod that claims a vast cache takes
    /// at most an equal share of the bound from the others, never theirs.
    pub fn set_capacities(&mut self, known: &[Option<usize>]) {
        let members = (0..self.lru.len())
            .filter(|&b| known.get(b).copied().flatten() != Some(0))
            .count();
        let share = self.max_blocks / members.max(1);
        let wanted: Vec<usize> = (0..self.lru.len())
            .map(|b| {
                known
                    .get(b)
                    .copied()
                    .flatten()
                    .unwrap_or(share)
                    .clamp(1, self.max_blocks.max(1))
            })
            .collect();
        let mut order: Vec<usize> = (0..wanted.len()).collect();
        order.sort_by_key(|&b| wanted[b]);
        let mut left = self.max_blocks;
        for (i, &b) in order.iter().enumerate() {
            let fair = left / (order.len() - i);
            let got = wanted[b].min(fair).max(1);
            left = left.saturating_sub(got);
            if let Some(lru) = self.lru.get_mut(b) {
                lru.capacity = got;
            }
        }
    }

    /// Capacity in blocks of one backend's share.
    pub fn capacity(&self, backend: usize) -> usize {
        self.lru.get(backend).map_or(0, |l| l.capacity)
    }

    /// Blocks one backend's live entries stand for.
    pub fn len_of(&self, backend: usize) -> usize {
        self.lru.get(backend).map_or(0, |l| l.live)
    }

    /// Blocks all live entries stand for.
    pub fn len(&self) -> usize {
        self.lru.iter().map(|l| l.live).sum()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn key(&self, block: u64, backend: usize) -> u64 {
        block ^ self.salts.get(backend).copied().unwrap_or(0)
    }

    fn fresh(&self, block: u64, backend: usize, now_ms: u64) -> bool {
        self.map
            .get(&self.key(block, backend))
            .is_some_and(|&t| now_ms.saturating_sub(t) <= self.ttl_ms)
    }

    /// For each backend, how many leading blocks of `blocks` it holds (see
    /// "Sampled positions": exact where an earlier prompt ended, else rounded down).
    /// Each backend's length is written once, when it stops matching.
    pub fn match_lengths(&self, blocks: &[u64], now_ms: u64, out: &mut Vec<u32>) {
        out.clear();
        out.resize(self.lru.len(), 0);
        let Some(last) = blocks.len().checked_sub(1) else {
            return;
        };
        // No backend holds the first block: none matches (see "First blocks").
        if blocks.first().is_none_or(|h| !self.firsts.contains_key(h)) {
            return;
        }
        // Chains are prefix-closed: only holders of position i can hold a later one.
        let mut alive: Vec<usize> = (0..self.lru.len()).collect();
        // The previous sampled position, and the blocks its holders hold.
        let (mut prev, mut reached) = (0, 0);
        for (i, &h) in blocks.iter().enumerate() {
            if alive.is_empty() {
                break;
            }
            if !kept(i, last) {
                continue;
            }
            alive.retain(|&b| {
                if self.fresh(h, b, now_ms) {
                    return true;
                }
                // Stopped between two sampled positions: an earlier prompt may end there.
                let ended = (prev + 1..i)
                    .rev()
                    .find(|&j| blocks.get(j).is_some_and(|&hj| self.fresh(hj, b, now_ms)));
                if let Some(m) = out.get_mut(b) {
                    *m = ended.map_or(reached, |j| (j + 1) as u32);
                }
                false
            });
            prev = i;
            reached = (i + 1) as u32;
        }
        for &b in &alive {
            if let Some(m) = out.get_mut(b) {
                *m = reached;
            }
        }
    }

    /// Records that `backend` now holds `blocks` (as of `now_ms`): the sampled
    /// positions and the last block. Returns the first position it did not
    /// hold before (`blocks.len()` if it held them all): the blocks the prompt
    /// brings start there, to a sampling stride.
    pub fn record(&mut self, blocks: &[u64], backend: usize, now_ms: u64) -> u32 {
        let held = kept_positions(blocks.len()).filter_map(|i| Some((i, *blocks.get(i)?)));
        let first_new = self
            .record_positions(held, backend, now_ms)
            .unwrap_or(blocks.len()) as u32;
        if self.prompts.is_some() {
            let kept: Vec<u64> = kept_positions(blocks.len())
                .filter_map(|i| blocks.get(i).copied())
                .collect();
            self.hold_prompt(backend, blocks.len(), &kept, now_ms);
        }
        first_new
    }

    /// Records a chain of `len` blocks given only its hashes at [`kept_positions`],
    /// in order (an index log event's form; a cut list stands for the chain's head).
    /// Returns what [`Index::record`] does.
    pub fn record_kept(&mut self, len: usize, kept: &[u64], backend: usize, now_ms: u64) -> u32 {
        let held = kept_positions(len).zip(kept.iter().copied());
        let first_new = self.record_positions(held, backend, now_ms).unwrap_or(len) as u32;
        self.hold_prompt(backend, len, kept, now_ms);
        first_new
    }

    /// Records `held` (position, hash); the first position not held before.
    fn record_positions(
        &mut self,
        held: impl Iterator<Item = (usize, u64)>,
        backend: usize,
        now_ms: u64,
    ) -> Option<usize> {
        let (Some(&salt), Some(lru)) = (self.salts.get(backend), self.lru.get_mut(backend)) else {
            return None;
        };
        let mut first_new = None;
        let ttl_ms = self.ttl_ms;
        // The map and the queue must agree on the time, which a record keeps in 48 bits.
        let now_ms = now_ms.min(TIME_MAX);
        for (i, h) in held {
            let key = h ^ salt;
            let span = span(i);
            make_room(&mut self.map, &mut self.map_capacity);
            match self.map.entry(key) {
                Entry::Occupied(mut e) => {
                    let idle = now_ms.saturating_sub(*e.get());
                    if idle > ttl_ms {
                        // Gone by the TTL, though not yet evicted: brought anew.
                        first_new = first_new.or(Some(i));
                    }
                    if idle < REFRESH_MS {
                        continue;
                    }
                    e.insert(now_ms);
                }
                Entry::Vacant(e) => {
                    e.insert(now_ms);
                    first_new = first_new.or(Some(i));
                    lru.live += span as usize;
                    if i == 0 {
                        *self.firsts.entry(h).or_insert(0) += 1;
                    }
                }
            }
            lru.queue.push_back(Rec::new(key, now_ms, span));
        }
        self.evict(backend, now_ms);
        first_new
    }

    /// Drops entries past their TTL or beyond capacity, oldest first.
    fn evict(&mut self, backend: usize, now_ms: u64) {
        let (Some(&salt), Some(lru)) = (self.salts.get(backend), self.lru.get_mut(backend)) else {
            return;
        };
        let ttl_ms = self.ttl_ms;
        pop_oldest(&mut self.map, &mut self.firsts, salt, lru, |lru, r| {
            lru.live > lru.capacity || now_ms.saturating_sub(r.time()) > ttl_ms
        });
        if lru.queue.len() > 2 * lru.live + 1024 {
            let map = &self.map;
            lru.queue.retain(|r| map.get(&r.key) == Some(&r.time()));
        }
    }

    /// When `backend` last used `blocks[len − 1]` (the deepest block of a
    /// match of `len` blocks), if the index holds it.
    pub fn last_use(&self, blocks: &[u64], len: u32, backend: usize) -> Option<u64> {
        let h = *blocks.get((len as usize).checked_sub(1)?)?;
        self.map.get(&self.key(h, backend)).copied()
    }

    /// Forgets what `backend` last used at or before `before_ms`, at most a
    /// [`FORGET_SHARE`] of what it holds: its own report showed a block of
    /// that age gone, and a pod evicts least recently used first
    /// ([`crate::routing::feedback`]).
    pub fn forget_used_before(&mut self, backend: usize, before_ms: u64) {
        let (Some(&salt), Some(lru)) = (self.salts.get(backend), self.lru.get_mut(backend)) else {
            return;
        };
        let keep = lru.live.saturating_sub((lru.live / FORGET_SHARE).max(1));
        // The queue is in recording order, so its front holds the oldest uses.
        pop_oldest(&mut self.map, &mut self.firsts, salt, lru, |lru, r| {
            r.time() <= before_ms && lru.live > keep
        });
    }

    /// Forgets everything `backend` held: its slot now stands for another pod.
    pub fn forget(&mut self, backend: usize) {
        let (Some(&salt), Some(lru)) = (self.salts.get(backend), self.lru.get_mut(backend)) else {
            return;
        };
        pop_oldest(&mut self.map, &mut self.firsts, salt, lru, |_, _| true);
        lru.live = 0;
        if let Some(chains) = self.chains.get_mut(backend) {
            chains.clear();
        }
    }

    /// Ages every backend's share out (called from the tick).
    pub fn expire(&mut self, now_ms: u64) {
        for b in 0..self.lru.len() {
            self.evict(b, now_ms);
            self.expire_chains(b, now_ms);
        }
    }
}

#[cfg(test)]
mod tests;
