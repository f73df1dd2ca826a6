//! Whole prompts: the cache of an engine that keeps prompts, not blocks (llama.cpp's server).
//!
//! ## What llama.cpp keeps
//! From its server's source (`tools/server/server-context.cpp`: `get_available_slot`, the
//! task loop; `server-task.cpp`: `server_prompt_cache`):
//! - `-np N` slots, each holding the tokens of the last prompt it served. A task takes the
//!   idle slot whose prompt shares the longest common prefix with it, if that is more than
//!   `--slot-prompt-similarity` (0.1) of the new prompt, else the least recently used idle slot.
//! - A host-RAM prompt cache of `--cache-ram` MiB: a list of whole prompts' KV states. A slot
//!   taken by LRU, or about to keep less than half its prompt, is saved there first (unless an
//!   entry holds it already; entries it contains are dropped), then the entry sharing the most
//!   with the new prompt is loaded into the slot and leaves the list. The list drops its oldest
//!   entries until a new one fits; a prompt larger than the whole cache is never saved.
//! - With `--kv-unified` and `--cache-idle-slots` (its defaults when `-np` is left to it),
//!   every idle slot is saved to the RAM cache and cleared each time a task starts: only the
//!   prompts running, and those finished since a task last started, stay in slots.
//! - None of it is published: `/metrics` has no KV size, `/props` gives `total_slots` and a
//!   slot's `n_ctx`, no endpoint gives `--cache-ram`. So the configuration states it
//!   (`metrics.prompt_cache`, [`crate::config::PromptCache`]).
//!
//! A pod that holds two conversations while the block index, told its tokens, believed four
//! was what `make real-llama` measured: matches over-predicted by 450-600 tokens a request,
//! most reports counted as evictions, and conversations piled on pods that no longer held them.
//!
//! ## The model
//! Per pod, the prompts recorded for it (*chains*) in the order they were last recorded,
//! newest last. A prompt recorded drops every chain it extends (the slot now holds the longer
//! prompt; the RAM cache drops entries a saved prompt contains) and goes last. Then, newest
//! first, chain `c` of `len(c)` blocks at rank `r(c)` is held iff
//!
//! ```text
//!   r(c) < slots
//!   ∨ ( len(c) ≤ ram  ∧  Σ { len(c') : c' newer than c, r(c') ≥ slots, len(c') ≤ ram } + len(c) ≤ ram
//!       ∧ every such c' newer than c is held )
//! ```
//!
//! the `slots` newest whatever their size, then older ones while they fit the RAM budget (a
//! list that drops its oldest to make room keeps a newest run), skipping any larger than the
//! whole budget (never saved). An evicted chain's entries leave the index, except those another
//! held chain of the pod shares (a system prompt). Which slot or entry llama.cpp gives up
//! differs (it takes the most similar slot and saves its prompt to RAM), but the set it keeps
//! is the same: the last prompts, up to the slots and what fits in RAM.
//!
//! Chains carry the hashes of [`super::kept_positions`], so the chains a log event builds
//! ([`super::Index::record_kept`]) are those of the prompt it stands for. "Extends" is judged
//! at the older chain's deepest sampled position, exact to the block where the chain's end is
//! sampled (all of the first 8 KB) and else to its last stride (a prompt that parts from it
//! in that stretch is taken for its extension). A covered chain's own last block, when off the
//! sample, stays in the index as the newer chain's *end* (the next turn matches where that
//! turn ended) and leaves with it.
//!
//! ## A conversation whose history went
//! A prompt that carries earlier turns and that no pod holds past its head is taken for a
//! conversation whose turns another gateway replica served, and goes to the pod that replica
//! most likely chose, believed to hold the history ([`crate::routing::policy`]'s
//! `cache_aware`). When this index evicted that history itself, no pod holds it: the prompt is
//! a new one wherever it goes, and following the anchor only piles conversations onto their
//! first pods (40 of 72 chat turns on one of three llama.cpp replicas, TTFT P95 1.6x round
//! robin's, in one `make real-llama` run). So the index remembers the last [`GHOSTS`] chains
//! it evicted (the hash at each one's deepest sampled position, which names its whole prefix),
//! and [`Index::history_evicted`] tells the router such a prompt is no continuation. A ghost
//! within what some pod still holds (a chain cut inside the system prompt it shared) names
//! no lost history and is passed over.
//!
//! | parameter | default | why |
//! |---|---|---|
//! | `slots` | `metrics.prompt_cache.slots` | `-np`; 1 under `--kv-unified` with `--cache-idle-slots`, which clear idle slots |
//! | `ram` (blocks) | `ram_tokens` × bytes per token / `block_bytes`, at most the pod's index share | `--cache-ram` MiB × 2^20 / the model's KV bytes per token |
//! | [`MAX_CHAINS`] | 1024 | llama.cpp scans its whole list per request too; past it the oldest go (an under-prediction, a hit not taken) |
//! | [`ENDS`] | 8 | covered chains' off-sample ends a chain keeps: a conversation's last turns |
//! | [`GHOSTS`] | 4096 | evicted chains remembered, fleet-wide (64 KB): conversations idle for a few thousand others' turns |
//!
//! Cost: recording a prompt is O(chains) to find those it extends; an eviction O(entries of
//! the evicted chain + the prefix other chains share with it). Memory: a chain is its kept
//! hashes (8 bytes each, about 100 for a 128 KB prompt); a pod holds at most `slots` chains
//! plus those whose blocks fit its index share, and [`MAX_CHAINS`].

use super::{sampled, sampled_at, sampled_below, span, unhold, Index};
use std::collections::VecDeque;

/// Most chains a pod keeps.
pub const MAX_CHAINS: usize = 1024;

/// Off-sample ends of covered chains a chain keeps, newest last.
pub const ENDS: usize = 8;

/// Evicted chains remembered (see "A conversation whose history went").
pub const GHOSTS: usize = 4096;

/// The chains the index evicted last: the hash at each one's deepest sampled position.
#[derive(Debug, Default)]
pub(super) struct Ghosts {
    set: hashbrown::HashSet<u64>,
    order: VecDeque<u64>,
}

impl Ghosts {
    fn add(&mut self, hash: u64) {
        if self.set.insert(hash) {
            self.order.push_back(hash);
            while self.order.len() > GHOSTS {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
}

/// The whole prompts each pod holds, in blocks (see the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptModel {
    /// The newest chains held whatever their size.
    pub slots: usize,
    /// Blocks of older chains held, newest first.
    pub ram_blocks: usize,
}

/// One prompt a pod holds.
#[derive(Debug)]
pub(super) struct Chain {
    /// Blocks.
    len: usize,
    /// Hashes at [`super::kept_positions`]`(len)`.
    kept: Vec<u64>,
    /// Last blocks of chains this one covered, off the sample: (position, hash), oldest first.
    ends: Vec<(usize, u64)>,
    /// When it was last recorded (ms).
    used_ms: u64,
}

impl Chain {
    /// Its sampled positions (those of `kept` before an off-sample last block).
    fn sampled(&self) -> usize {
        sampled_below(self.len).min(self.kept.len())
    }

    /// Its last block, when off the sample.
    fn off_end(&self) -> Option<(usize, u64)> {
        if self.kept.len() > self.sampled() {
            Some((self.len - 1, *self.kept.last()?))
        } else {
            None
        }
    }

    /// Whether `self` holds `(pos, hash)`.
    fn holds(&self, pos: usize, hash: u64) -> bool {
        if pos >= self.len {
            return false;
        }
        if sampled(pos) {
            let k = sampled_below(pos + 1) - 1;
            self.kept.get(k) == Some(&hash)
        } else {
            self.off_end() == Some((pos, hash)) || self.ends.contains(&(pos, hash))
        }
    }

    /// Whether `newer` extends `self`: same hash at `self`'s deepest sampled position, and at
    /// its off-sample end when `newer` ends there too.
    fn covered_by(&self, newer: &Chain) -> bool {
        if self.len > newer.len {
            return false;
        }
        let s = self.sampled();
        let Some(k) = s.checked_sub(1) else {
            return false;
        };
        if self.kept.get(k) != newer.kept.get(k) {
            return false;
        }
        match self.off_end() {
            Some((p, h)) if p == newer.len - 1 => newer.off_end() == Some((p, h)),
            _ => true,
        }
    }
}

/// A chain of `len` blocks from its kept hashes; a cut list stands for the chain's head
/// (up to its last sampled position). `None` for an empty one.
fn chain(len: usize, kept: &[u64], now_ms: u64) -> Option<Chain> {
    let full = sampled_below(len) + usize::from(len > 0 && !sampled(len - 1));
    let (len, kept) = if kept.len() >= full {
        (len, kept.get(..full)?)
    } else {
        (sampled_at(kept.len().checked_sub(1)?) + 1, kept)
    };
    (len > 0).then(|| Chain {
        len,
        kept: kept.to_vec(),
        ends: Vec::new(),
        used_ms: now_ms,
    })
}

impl Index {
    /// Sets the whole-prompt model of every backend (`None`: blocks alone, as for vLLM),
    /// and evicts what no longer fits.
    pub fn set_prompt_model(&mut self, model: Option<PromptModel>) {
        if self.prompts == model {
            return;
        }
        self.prompts = model;
        if model.is_none() {
            self.chains.iter_mut().for_each(VecDeque::clear);
            return;
        }
        for b in 0..self.chains.len() {
            self.fit_chains(b);
        }
    }

    /// The whole-prompt model in force.
    pub fn prompt_model(&self) -> Option<PromptModel> {
        self.prompts
    }

    /// Whether `blocks` extends a prompt this index evicted under the whole-prompt model
    /// while no backend holds more than its first `head` blocks (`matched`, per backend):
    /// its history is nowhere (see "A conversation whose history went"). Only a ghost past
    /// what some backend still holds counts: an evicted chain's deepest sampled position
    /// may lie in a system prompt every conversation shares, which names no lost history.
    pub fn history_evicted(&self, blocks: &[u64], matched: &[u32], head: u32) -> bool {
        if self.ghosts.set.is_empty() || matched.iter().any(|&m| m > head) {
            return false;
        }
        let held = matched.iter().copied().max().unwrap_or(0) as usize;
        super::kept_positions(blocks.len())
            .filter(|&i| i >= held)
            .any(|i| blocks.get(i).is_some_and(|h| self.ghosts.set.contains(h)))
    }

    /// The chains `backend` holds.
    pub fn chains_of(&self, backend: usize) -> usize {
        self.chains.get(backend).map_or(0, VecDeque::len)
    }

    /// `backend` was sent a prompt of `len` blocks with these kept hashes: it holds it now.
    pub(super) fn hold_prompt(&mut self, backend: usize, len: usize, kept: &[u64], now_ms: u64) {
        if self.prompts.is_none() {
            return;
        }
        let Some(mut new) = chain(len, kept, now_ms) else {
            return;
        };
        let Some(chains) = self.chains.get_mut(backend) else {
            return;
        };
        let mut dropped_ends = Vec::new();
        let mut i = 0;
        while i < chains.len() {
            if chains.get(i).is_some_and(|c| c.covered_by(&new)) {
                if let Some(c) = chains.remove(i) {
                    new.ends.extend(c.ends.iter().filter(|e| e.0 < new.len - 1));
                    if let Some(e) = c.off_end().filter(|e| e.0 < new.len - 1) {
                        new.ends.push(e);
                    }
                }
            } else {
                i += 1;
            }
        }
        new.ends.dedup();
        if new.ends.len() > ENDS {
            dropped_ends.extend(new.ends.drain(..new.ends.len() - ENDS));
        }
        chains.push_back(new);
        for (pos, hash) in dropped_ends {
            self.drop_entry_unless_held(backend, pos, hash);
        }
        self.fit_chains(backend);
    }

    /// Evicts `backend`'s chains past the model (see "The model").
    fn fit_chains(&mut self, backend: usize) {
        let Some(model) = self.prompts else { return };
        let ram = model.ram_blocks.min(self.capacity(backend));
        let Some(chains) = self.chains.get_mut(backend) else {
            return;
        };
        let mut evicted = Vec::new();
        let mut used = 0usize;
        // Newest first; `cut`: every chain at or below this index goes.
        let mut cut = None;
        let mut too_large = Vec::new();
        for (rank, i) in (0..chains.len()).rev().enumerate() {
            if rank < model.slots {
                continue;
            }
            let len = chains.get(i).map_or(0, |c| c.len);
            if len > ram {
                too_large.push(i);
                continue;
            }
            if used + len > ram {
                cut = Some(i);
                break;
            }
            used += len;
        }
        // `too_large` is newest first, all above `cut`: remove from the back without shifting the rest.
        for i in too_large {
            evicted.extend(chains.remove(i));
        }
        if let Some(i) = cut {
            evicted.extend(chains.drain(..=i));
        }
        while chains.len() > MAX_CHAINS {
            evicted.extend(chains.pop_front());
        }
        for c in evicted {
            self.drop_chain(backend, &c);
        }
    }

    /// Removes `c`'s entries from `backend`'s share, except those its held chains share.
    fn drop_chain(&mut self, backend: usize, c: &Chain) {
        if let Some(&deepest) = c.sampled().checked_sub(1).and_then(|k| c.kept.get(k)) {
            self.ghosts.add(deepest);
        }
        // Chains are prefix-closed: what another chain shares with `c` is a run of leading
        // sampled positions.
        let shared = self.chains.get(backend).map_or(0, |chains| {
            chains
                .iter()
                .map(|d| {
                    c.kept
                        .iter()
                        .take(c.sampled())
                        .zip(d.kept.iter().take(d.sampled()))
                        .take_while(|(a, b)| a == b)
                        .count()
                })
                .max()
                .unwrap_or(0)
        });
        for k in shared..c.sampled() {
            if let Some(&h) = c.kept.get(k) {
                self.drop_entry(backend, sampled_at(k), h);
            }
        }
        for (pos, hash) in c.off_end().into_iter().chain(c.ends.iter().copied()) {
            self.drop_entry_unless_held(backend, pos, hash);
        }
    }

    fn drop_entry_unless_held(&mut self, backend: usize, pos: usize, hash: u64) {
        let held = self
            .chains
            .get(backend)
            .is_some_and(|chains| chains.iter().any(|d| d.holds(pos, hash)));
        if !held {
            self.drop_entry(backend, pos, hash);
        }
    }

    /// Removes the entry of `hash` at `pos` from `backend`'s share, if it is there. Its
    /// queue record goes stale and is skipped when it reaches the front.
    fn drop_entry(&mut self, backend: usize, pos: usize, hash: u64) {
        let (Some(&salt), Some(lru)) = (self.salts.get(backend), self.lru.get_mut(backend)) else {
            return;
        };
        if self.map.remove(&(hash ^ salt)).is_some() {
            lru.live = lru.live.saturating_sub(span(pos) as usize);
            unhold(&mut self.firsts, hash);
        }
    }

    /// Drops chains recorded longer than `ttl_ms` before `now_ms` (their entries age out
    /// of the index by the same TTL).
    pub(super) fn expire_chains(&mut self, backend: usize, now_ms: u64) {
        let ttl_ms = self.ttl_ms;
        if let Some(chains) = self.chains.get_mut(backend) {
            chains.retain(|c| now_ms.saturating_sub(c.used_ms) <= ttl_ms);
        }
    }
}
