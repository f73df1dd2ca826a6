//! Routing strategies: pure functions from (request key, backend loads, index
//! matches) to an ordered choice (primary, then fallbacks for retries).
//!
//! ## Bounded load (Mirrokni et al., "Consistent Hashing with Bounded Loads", 2016)
//! Over the healthy set H with total load L, a backend is *eligible* when it is
//! not saturated and `load_b + 1 <= cap`, `cap = ceil((1+eps)·(L+1)/|H|)`.
//! No backend can then be chosen past (1+eps)× the mean (but see the warm floor
//! and the sole holder below) — the per-request guard
//! that replaces SGLang's and the vLLM router's single fleet-wide "imbalanced,
//! so ignore the cache for everyone" switch (which, at their defaults, sends a
//! whole agent workload to one replica).
//!
//! At low load the relative bound is tight: with one request in flight on three
//! pods, `cap` is 1, so a second request for the same pod would leave it while
//! the others idle. For `cache_aware`, a backend holding part of the prompt
//! stays eligible up to `warm_min_cap` requests (this one included) whatever
//! the relative bound: vLLM batches decodes, so a pod running 8 requests
//! decodes each almost as fast as one, while moving a conversation costs its
//! whole prefill. Prefill queued there is still weighed (`queued_b`), and real
//! overload still marks the pod saturated (waiting requests, KV usage). The
//! sole holder of a conversation gets more room still ([`cache_aware`]): up to one
//! warm bound above the least loaded pod that is not full: it is chosen only
//! while `load_b + 1 ≤ least + max(cap, warm_min_cap)`, not (1+eps)× the mean.
//!
//! ## The strategies, one file each
//! | strategy | file | in short |
//! |---|---|---|
//! | `cache_aware` (default) | [`cache_aware`] | longest ready match weighed against load and prefill queue, bounded load, placement of new prompts by rendezvous, a hot prefix copied before it hurts |
//! | `prefix_hash` | [`prefix_hash`] | rendezvous on the prompt's anchor, bounded-load spillover |
//! | `least_request` | [`least_request`] | least work in flight among pods that are not saturated |
//! | `round_robin` | [`round_robin`] | a rotation shared by every VM |
//! | `random` | [`random`] | uniform over healthy pods |
//! | `sticky_session` | [`sticky_session`] | rendezvous on the session id; round robin without one |
//!
//! With no healthy backend, every strategy routes over all members (never an
//! empty slot, see `membership`): our health view may be wrong, and refusing
//! traffic is worse than trying. With no member at all there is no choice, and
//! Envoy's own fallback policy routes.
//!
//! Cost: O(backends) per decision (expected): a few passes over the healthy
//! set (the bound's total load, eligibility, scores) and one rendezvous
//! order, a bucket sort of uniform weights ([`crate::hash::rendezvous`]); the
//! fallbacks are a selection of the first few, not a second sort. Every
//! healthy pod is weighed, matching or not: bounded load and placement need
//! the whole set. About 7 µs at 256 pods, 25 µs at 1024 natively (`bench/decision`).
//! The sole holder's guard costs one comparison per prompt waiting on a pod
//! that matches past the head, and one copy of each routed prompt's chain
//! ([`crate::routing::pending`]).

use crate::config::{PolicyConfig, Strategy};
use crate::hash::rendezvous_top;
use crate::routing::load::BackendLoad;

pub mod cache_aware;
pub mod least_request;
pub mod prefix_hash;
pub mod random;
pub mod round_robin;
pub mod sticky_session;

pub use cache_aware::{LOAD_WEIGHT, PREFILL_WEIGHT};

/// Why a backend was chosen (stats and the debug header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Longest cached prefix (net of load).
    CacheHit,
    /// No cache match: placed by rendezvous among eligible backends.
    Placed,
    /// The cache owner was saturated or over its load bound.
    Spillover,
    /// A hot prefix copied to a less-loaded pod before its warm pods queue.
    Replicated,
    /// Least loaded.
    LeastLoaded,
    /// Round robin rotation.
    RoundRobin,
    /// Random pick.
    Random,
    /// Session affinity.
    Sticky,
    /// The pod that answered the stored response a `/v1/responses` follow-up
    /// continues ([`crate::fleet::responses`]): the only pod that holds it.
    StoredResponse,
    /// Request not understood: load-only choice.
    Fallback,
}

impl Reason {
    /// Stable name used in stats and the debug header.
    pub fn name(self) -> &'static str {
        match self {
            Reason::CacheHit => "cache_hit",
            Reason::Placed => "placed",
            Reason::Spillover => "spillover",
            Reason::Replicated => "replicated",
            Reason::LeastLoaded => "least_loaded",
            Reason::RoundRobin => "round_robin",
            Reason::Random => "random",
            Reason::Sticky => "sticky",
            Reason::StoredResponse => "stored_response",
            Reason::Fallback => "fallback",
        }
    }
}

/// What a strategy needs to know about one request.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestKey<'a> {
    /// Rendezvous key for placement (prefix anchor).
    pub anchor: u64,
    /// Per backend: leading prompt blocks it holds.
    pub matched: &'a [u32],
    /// Full blocks in the prompt.
    pub blocks: u32,
    /// Leading blocks shared with other conversations (before the anchor).
    pub head_blocks: u32,
    /// The prompt carries earlier turns (assistant or tool messages).
    pub continuation: bool,
    /// Leading blocks an earlier turn of the conversation sent (all but the last message).
    pub history_blocks: u32,
    /// Leading blocks of instructions alone, before the conversation's first message.
    pub instructions_blocks: u32,
    /// Assistant messages the prompt carries: its conversation's turns answered so far.
    pub answers: u32,
    /// Per backend: another request this gateway worker sent there still waits
    /// for its first token and shares the prompt up to the last block of that
    /// backend's match (missing: none does).
    pub shared: &'a [bool],
    /// Hash of the session header, if any.
    pub session: Option<u64>,
    /// Shared round-robin counter value for this request.
    pub rotation: u64,
    /// A random number for this request.
    pub random: u64,
}

impl RequestKey<'_> {
    /// Blocks of the prompt backend `b` is believed to hold.
    fn matched_on(&self, b: usize) -> u32 {
        self.matched.get(b).copied().unwrap_or(0)
    }
}

/// The outcome of a strategy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Backend indices: primary first, then fallbacks.
    pub order: Vec<usize>,
    /// Blocks of the prompt the primary is believed to hold.
    pub matched: u32,
    /// Why the primary was chosen.
    pub reason: Reason,
}

/// Decides where one request goes.
pub struct Chooser<'a> {
    /// Tuning.
    pub cfg: &'a PolicyConfig,
    /// Per backend load picture.
    pub loads: &'a [BackendLoad],
    /// Stable per-backend ids (hash of the address) for rendezvous hashing.
    pub ids: &'a [u64],
    /// How many fallbacks to list after the primary.
    pub fallbacks: usize,
}

impl Chooser<'_> {
    /// The healthy members, or every member when none is healthy.
    fn healthy(&self) -> Vec<usize> {
        let h: Vec<usize> = (0..self.loads.len())
            .filter(|&b| self.loads[b].healthy)
            .collect();
        if h.is_empty() {
            (0..self.loads.len())
                .filter(|&b| self.loads[b].member)
                .collect()
        } else {
            h
        }
    }

    /// The bounded-load cap over request counts.
    fn cap(&self, healthy: &[usize]) -> f64 {
        let total: f64 = healthy.iter().map(|&b| self.loads[b].load).sum();
        ((1.0 + self.cfg.eps) * (total + 1.0) / healthy.len().max(1) as f64).ceil()
    }

    fn eligible(&self, b: usize, cap: f64) -> bool {
        let l = &self.loads[b];
        !l.saturated && l.load + 1.0 <= cap
    }

    /// Least load among `among` (ties by `tiebreak`).
    fn least_loaded(&self, among: &[usize], tiebreak: u64) -> Option<usize> {
        self.least_by(among, tiebreak, |l| l.load)
    }

    /// Least work in flight among `among` (ties by `tiebreak`).
    fn least_work(&self, among: &[usize], tiebreak: u64) -> Option<usize> {
        self.least_by(among, tiebreak, |l| l.work)
    }

    fn least_by(
        &self,
        among: &[usize],
        tiebreak: u64,
        measure: impl Fn(&BackendLoad) -> f64,
    ) -> Option<usize> {
        let min = among
            .iter()
            .map(|&b| measure(&self.loads[b]))
            .fold(f64::INFINITY, f64::min);
        let ties: Vec<usize> = among
            .iter()
            .copied()
            .filter(|&b| measure(&self.loads[b]) <= min)
            .collect();
        ties.get((tiebreak % ties.len().max(1) as u64) as usize)
            .copied()
    }

    /// Primary first, then fallbacks in rendezvous order of `key`.
    fn finish(&self, primary: usize, key: u64, matched: u32, reason: Reason) -> Decision {
        let mut order = vec![primary];
        let others = self.healthy().into_iter().filter(|&b| b != primary);
        order.extend(rendezvous_top(key, self.ids, others, self.fallbacks));
        Decision {
            order,
            matched,
            reason,
        }
    }

    /// Runs `strategy` for one request.
    pub fn choose(&self, strategy: Strategy, req: &RequestKey<'_>) -> Option<Decision> {
        let healthy = self.healthy();
        if healthy.is_empty() {
            return None;
        }
        let cap = self.cap(&healthy);
        match strategy {
            Strategy::CacheAware => Some(self.cache_aware(req, &healthy, cap)),
            Strategy::PrefixHash => self.prefix_hash(req, &healthy, cap),
            Strategy::LeastRequest => self.least_request(req, &healthy),
            Strategy::RoundRobin => self.round_robin(req, &healthy),
            Strategy::Random => self.random(req, &healthy),
            Strategy::StickySession => self.sticky_session(req, &healthy),
        }
    }

    /// The load-only choice for requests whose prompt could not be read.
    pub fn fallback(&self, random: u64) -> Option<Decision> {
        let healthy = self.healthy();
        let open: Vec<usize> = healthy
            .iter()
            .copied()
            .filter(|&b| !self.loads[b].saturated)
            .collect();
        let among = if open.is_empty() { &healthy } else { &open };
        let b = self.least_work(among, random)?;
        Some(self.finish(b, random, 0, Reason::Fallback))
    }
}

#[cfg(test)]
mod tests;
