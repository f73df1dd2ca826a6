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
//! sole holder of a conversation gets more room still (see below): up to one
//! warm bound above the least loaded pod that is not full: it is chosen only
//! while `load_b + 1 ≤ least + max(cap, warm_min_cap)`, not (1+eps)× the mean.
//!
//! ## cache_aware (default)
//! ```text
//! ratio_b  = matched_blocks_b / prompt_blocks    (0 unless the match goes past the
//!                                                  head and reaches min_match_blocks;
//!                                                  matched: what is ready, see below)
//! queued_b = max(0, prefill_b − min_prefill − slack) / prompt_blocks
//!            (0 when b holds the prompt's history alone, see below)
//! eligible_b = ¬full_b ∧ load_b + 1 ≤ least + max(cap, warm_min_cap)   if holds_b,
//!              the bounds above otherwise (least: the least load over healthy
//!              pods that are not full; full: see `load`)
//! score_b  = value_b − prefill_weight · queued_b
//!                    − load_weight · (load_b − min_load) / cap              for b ∈ eligible
//! value_b  = max(ratio_b, history_blocks / prompt_blocks)  for the owner of a continuation,
//!            ratio_b otherwise
//! ```
//! - a continuation's owner (the backend with the longest match) is taken to
//!   hold the whole conversation so far. Behind several gateway replicas this
//!   index misses the turns the others sent, and would otherwise see a 30%
//!   match where the pod holds 90%, and give the conversation up for a small
//!   load difference. On one gateway the index holds the history already.
//! - `prefill_b` (see `load`) is the prompt blocks already sent to b and not yet
//!   answered: vLLM prefills in arrival order, so that is how long this prompt's
//!   first token waits there. Both terms are in units of this prompt, so a pod
//!   is left for a colder one when its extra queue costs more than twice the
//!   prefill its cache saves: a short prompt flees a pod busy prefilling a
//!   long one, a long prompt with a warm pod accepts some queue. Twice,
//!   because a request that leaves its cache adds that prefill to another
//!   pod's queue, delaying everyone behind it there. On the Mooncake
//!   conversation trace the queue term took cache_aware's TTFT P95 from ~0.8x
//!   to 0.52-0.67x round robin's in paired runs; at weight 0.5 rather than 1 it also keeps
//!   ~2 points more hit rate (fewer spillovers). Request counts alone cannot
//!   see that a pod with one 90k-token prompt answers later than a pod with
//!   three chats.
//!   `slack` is `prefill_slack_tokens` in blocks.
//! - the *sole holder* of a conversation keeps it whatever its prefill queue
//!   or waiting requests, up to one warm bound above the least loaded pod and
//!   short of a full pod (KV usage, the operator's in-flight cap); the load
//!   term still applies:
//!   ```text
//!   holds_b = b is the owner
//!           ∧ no other healthy pod within tie_margin of ratio_b
//!           ∧ no other request waiting on b for its first token shares the
//!             prompt up to b's match
//!   ```
//!   Such a prompt is one conversation's history, which only that pod holds:
//!   moving it re-prefills that history on another pod, whose queue then
//!   grows by that much (on the Mooncake conversation trace prefill is most of
//!   the pods' time, so each spillover fed the queues that caused the next).
//!   Any share beyond `tie_margin` counts (the others' match must be that far
//!   behind): a turn that adds a long document to a short history
//!   re-prefills that history wherever else it goes, and adds all of it to
//!   that pod's queue. A waiting queue (`max_waiting`) is a wait, which the
//!   history is still worth; a full pod cannot admit it without preempting.
//!   The bound stays relative to the fleet, so a pod's conversations cannot
//!   pile onto it while the others idle: the first to exceed it spill.
//!   New conversations, which every pod holds equally little of, already take
//!   the shortest queue (placement), so they route around the owner's queue.
//!   A conversation's next turn carries the previous answer, so it comes after
//!   that answer started; a prefix that another request still waiting for its
//!   first token there shares (a document or few-shot block many users send,
//!   arriving together) is not one conversation's, and its requests compete on
//!   queues like any other prompt: held, they would all queue on the one pod that first
//!   saw it, which is the tail the queue term is there to cut. Waiting, not
//!   in flight: a trace replayed open-loop (or a client that does not wait
//!   for the whole answer) sends a turn while the previous one still streams,
//!   and "in flight" would drop the hold for those turns (5-6 of the 154
//!   continuations in a conversation run had their previous turn still
//!   streaming; none still waiting for its first token). The waiting requests
//!   are the ones this worker VM routed and has not seen a response byte of
//!   (their prompts' block hashes are kept per pod, see
//!   [`crate::routing::waiting`]); another worker's are not seen, which only leaves the
//!   hold in place. "Shares" is checked at the last block of the pod's match
//!   (one comparison per prompt waiting there). A request stops waiting at its
//!   first response byte, or, answered in one piece (not streamed), at its end;
//!   a request retried on a fallback pod stays waiting on the pod it was sent
//!   to first. A prefix on two or more pods is shared (or a conversation
//!   already moved): its copies compete on their queues too.
//!   Conversation trace, 4 paired rounds against the hold of session 17 (the
//!   queue alone, for owners of at least 75% of the prompt): hit rate
//!   0.986-1.027x the single-replica reference (median 1.00x) against
//!   0.931-0.991x in the same rounds (0.944x over all 23 rounds of that build
//!   this session), spillovers 6-7 of 800 against 23-32, TTFT P95 the same
//!   (medians 0.56x and 0.55x round robin); agent, chat and
//!   evicting rows unchanged (2 rounds). The spillovers it prevents are the
//!   three kinds a diagnosis build logged before (64 in two runs): 37 lost on
//!   the score (35 with 2-74% of the prompt held), 10 over the warm bound, 17
//!   saturated (`bench/notes.md`, sessions 17, 19 and 20). A continuation that
//!   this gateway has not seen (placed by its anchor, below) still leaves a
//!   saturated pod: there the hold has no index entry to go on.
//! - the match of a prompt that is not a continuation leaves out the blocks a
//!   prompt still waiting for its prefill on that pod brings
//!   ([`crate::routing::waiting`], ready): the pod has not computed them, and a prompt
//!   admitted with it gets no hit from them. Counted, a request sharing a
//!   prefix with one sent just before stayed on a pod deep in prefill and was
//!   accounted a few blocks where it cost a whole prompt, so the next new
//!   prompt joined it too (guidellm's opening burst: a fourth full prefill on
//!   one pod, ~870 ms against ~650, in 7 of 15 replays; 0 of 15 with this).
//! - a match inside the head (shared instructions, see `prefix`) does not
//!   count: otherwise whichever pod first saw a popular system prompt would
//!   attract every new conversation up to the load bound — a hotspot. The
//!   head is prefilled once per pod instead, and conversations spread.
//! - no eligible backend matches → *placement*: the first eligible backend
//!   with `queued_b = 0`, in rendezvous order of the prompt's anchor
//!   (deterministic while queues are within the slack, so independent gateway
//!   replicas place a new conversation on the same pod);
//! - nothing matches anywhere but the prompt carries earlier turns (a
//!   conversation whose turns went through other gateway replicas) → the first
//!   backend in rendezvous order within the warm bound (`max(cap,
//!   warm_min_cap)`), not the relative one: this gateway's in-flight counts are
//!   its own share of the load, and agreeing with the other replicas on the
//!   pod that holds the conversation is worth more than its guess at balance;
//!   but a forged continuation (any client can send one) gets no more than a
//!   real one;
//! - otherwise the best score wins; scores within `tie_margin` of the best
//!   are ties, broken by rendezvous order (again for cross-gateway agreement);
//! - if the backend with the longest match overall was not chosen, the request
//!   *spilled over*; the caller records the prefix on the new backend too, so a
//!   hot prefix ends up replicated on more than one pod.
//!
//! ### A hot prefix spreads before it hurts
//! The warm floor keeps a pod that holds part of the prompt eligible up to
//! `warm_min_cap` requests. Right for a conversation, whose context only its
//! pod holds; wrong for a prefix that every request shares (guidellm's
//! synthetic `prefix_tokens`, a long shared document): the two pods that first
//! held it kept 4 requests each at concurrency 8 while the third idled, and
//! requests that ended together came back together, prefilled in one step
//! (TTFT 1.7x round robin's). Two rules, for requests that are not
//! continuations and whose chosen pod `w` holds a match past the head:
//! ```text
//! copies    = healthy pods whose ratio is within tie_margin of ratio_w
//! c         = the least-loaded eligible pod below that (first in rendezvous order)
//! cost      = (matched_w − matched_c) · block_tokens / unit   (the copy's prefill, in
//!             typical requests; unit = block_tokens + decode_cost · default_output_tokens)
//! replicate = copies ≥ 2
//!           ∧ matched_w − matched_c ≤ slack                   (one prefill step at most)
//!           ∧ load_c + 1 ≤ mean load of the eligible pods      (c has room to spare)
//!           ∧ min load of the copies ≥ load_c + replicate_gap + cost
//! ```
//! - **replicate**: the request goes to `c` (`replicated`), which prefills the
//!   prefix once; every later request can then use three copies instead of two.
//!   `copies ≥ 2` is the evidence that many requests share the prefix: it
//!   already outgrew one pod (a spillover). A prefix on one pod is one
//!   conversation or a prefix used a few times, whose copy would cost its
//!   prefill and cache room for little: with 40 distinct 3000-word prefixes
//!   (each used ~6 times), copying them on load alone (without `copies`)
//!   cost 5-11 points of hit rate and raised the TTFT tail (one guidellm run
//!   each, see `bench/notes.md`). `cost` makes a longer prefix need a
//!   larger imbalance, `slack` caps it: an agent's 50k-token context is never
//!   copied this way (nor is a continuation at all).
//! - **spread over the copies**: among eligible pods whose ratio is within
//!   `tie_margin` of `w`'s, the one with the shortest prefill queue wins
//!   (then the best score). Equally warm copies differ only in what each must
//!   prefill before this prompt, and the score's queue term ignores queues
//!   within the slack; without this, requests that ended together (same
//!   output length) were re-sent to the pod that had just emptied, least
//!   loaded, and shared one prefill step there.
//!
//! Placement (no eligible pod matches) also avoids a queue half as deep as the
//! prompt itself, even within the slack: waiting behind it makes this prompt's
//! time to first token half its own prefill longer than the shortest queue
//! gives, 1.5x when that queue is empty (40 prefixes: new 3500-token prompts
//! queued two or three deep on one pod, the TTFT tail). Half, not a whole
//! prompt: in a burst of prompts of about one size the queues differ by whole
//! prompts, and a bound of one prompt sat on that edge: a queue one prompt
//! deeper, made of prompts a block or two shorter than this one, passed as not
//! waiting (guidellm's opening burst of 8 prompts of 77-79 blocks put a third
//! and a fourth on one pod).
//!
//! | parameter      | default | why |
//! |----------------|---------|-----|
//! | `eps`          | 0.5     | Envoy's bounded-load default (hash_balance_factor 150): tighter bounds spill conversations at loads a vLLM pod does not feel |
//! | `warm_min_cap` | 8       | agent bench, 3 replicas: at 1 (the relative bound alone) 10-15 spillovers and 81-84% hit rate; at 8, 1-2 and 86% (the single-replica reference: 86.7%); 16 did no better |
//! | `prefill_weight` | 0.5   | a leaving request's prefill delays others too (see above) |
//! | `load_weight`  | 0.5     | a full-cap load difference costs half a prompt of cache: prefill dominates TTFT until queues form |
//! | `tie_margin`   | 0.05    | 5% of a prompt: below the noise of block granularity |
//! | `replicate_gap` | 2    | requests a hot prefix's least-loaded copy must carry beyond the spare pod's (plus the copy's cost): guidellm's hot shape at concurrency 8 holds its two copies at 4 and 3 requests against the idle pod's 0; one request of difference is load noise. The only value tried |
//! | `prefill_slack_tokens` | 8192 | a common vLLM per-step token budget (`max_num_batched_tokens`): a queue shorter than one chunked-prefill step delays a prompt by about one step, not worth breaking placement agreement for |
//!
//! ## The others
//! - `prefix_hash`: rendezvous order on the anchor; first eligible (bounded-load
//!   spillover), the bound over requests: over work, one agent step's prompt
//!   still prefilling pushed that agent's next steps off their pod and cost
//!   agent hit rate, even with a request's weight capped (see [`crate::routing::work`]).
//! - `least_request`: least work in flight among non-saturated healthy
//!   backends; ties random. Work, not request count: a pod prefilling one huge
//!   prompt is busier than one serving a short chat.
//! - `round_robin`: shared rotation over healthy backends.
//! - `random`: uniform over healthy backends.
//! - `sticky_session`: rendezvous on the session id over healthy backends (a
//!   dead backend's sessions move, and only those); no session → round robin.
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
//! ([`crate::routing::waiting`]).

use crate::config::{PolicyConfig, Strategy};
use crate::hash::{rendezvous, rendezvous_top};
use crate::routing::load::BackendLoad;

/// Weight of load against cache share in `cache_aware` scores.
pub const LOAD_WEIGHT: f64 = 0.5;

/// Weight of a pod's extra prefill queue against cache share in `cache_aware` scores.
pub const PREFILL_WEIGHT: f64 = 0.5;

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
        let matched = |b: usize| req.matched.get(b).copied().unwrap_or(0);
        match strategy {
            Strategy::CacheAware => Some(self.cache_aware(req, &healthy, cap)),
            Strategy::PrefixHash => {
                let order = rendezvous(req.anchor, self.ids, healthy.iter().copied());
                let owner = *order.first()?;
                let (b, reason) = match order.iter().copied().find(|&b| self.eligible(b, cap)) {
                    Some(b) if b == owner => (b, Reason::Placed),
                    Some(b) => (b, Reason::Spillover),
                    None => (self.least_loaded(&healthy, req.random)?, Reason::Spillover),
                };
                Some(self.finish(b, req.anchor, matched(b), reason))
            }
            Strategy::LeastRequest => {
                let open: Vec<usize> = healthy
                    .iter()
                    .copied()
                    .filter(|&b| !self.loads[b].saturated)
                    .collect();
                let among = if open.is_empty() { &healthy } else { &open };
                let b = self.least_work(among, req.random)?;
                Some(self.finish(b, req.random, matched(b), Reason::LeastLoaded))
            }
            Strategy::RoundRobin => {
                let b = *healthy.get((req.rotation % healthy.len().max(1) as u64) as usize)?;
                Some(self.finish(b, req.rotation, matched(b), Reason::RoundRobin))
            }
            Strategy::Random => {
                let b = *healthy.get((req.random % healthy.len().max(1) as u64) as usize)?;
                Some(self.finish(b, req.random, matched(b), Reason::Random))
            }
            Strategy::StickySession => match req.session {
                Some(s) => {
                    let b = *rendezvous(s, self.ids, healthy.iter().copied()).first()?;
                    Some(self.finish(b, s, matched(b), Reason::Sticky))
                }
                None => {
                    let b = *healthy.get((req.rotation % healthy.len().max(1) as u64) as usize)?;
                    Some(self.finish(b, req.rotation, matched(b), Reason::RoundRobin))
                }
            },
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

    fn cache_aware(&self, req: &RequestKey<'_>, healthy: &[usize], cap: f64) -> Decision {
        let blocks = req.blocks.max(1) as f64;
        let ratio = |b: usize| {
            let m = req.matched.get(b).copied().unwrap_or(0);
            if m > req.head_blocks && m >= self.cfg.min_match_blocks {
                m as f64 / blocks
            } else {
                0.0
            }
        };
        let order = rendezvous(req.anchor, self.ids, healthy.iter().copied());
        // The backend believed to hold the longest prefix, whatever its load.
        let owner = order
            .iter()
            .copied()
            .max_by(|&a, &b| ratio(a).total_cmp(&ratio(b)).then(b.cmp(&a)))
            .filter(|&b| ratio(b) > 0.0);
        // One conversation's history, which only this pod holds, stays there whatever
        // its prefill queue or waiting requests, up to one warm bound above the least
        // loaded pod: moving it re-prefills that history on a pod whose queue then
        // grows by that much. A prefix that another request still waiting there for
        // its first token shares is not one conversation's: its requests compete on
        // queues and bounds (see the module doc).
        // A pod holding part of the prompt keeps it up to `warm_min_cap` requests
        // even when the relative bound is lower (see the module doc).
        let warm_cap = cap.max(self.cfg.warm_min_cap);
        // The sole holder and its bound (one warm bound above the least loaded pod
        // that is not full), decided once per request: the scores below ask for
        // every eligible pod.
        let holder = owner
            .filter(|&o| {
                !req.shared.get(o).copied().unwrap_or(false)
                    && healthy
                        .iter()
                        .all(|&c| c == o || ratio(c) < ratio(o) - self.cfg.tie_margin)
            })
            .map(|o| {
                let least = healthy
                    .iter()
                    .filter(|&&b| !self.loads[b].full)
                    .map(|&b| self.loads[b].load)
                    .fold(f64::INFINITY, f64::min);
                (o, least + warm_cap)
            });
        let holds = |b: usize| holder.is_some_and(|(h, _)| h == b);
        let eligible: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&b| match holder {
                // Only a hard limit moves it, not a waiting queue.
                Some((h, bound)) if h == b => {
                    let l = &self.loads[b];
                    !l.full && l.load + 1.0 <= bound
                }
                _ => self.eligible(b, if ratio(b) > 0.0 { warm_cap } else { cap }),
            })
            .collect();
        let matched = |b: usize| req.matched.get(b).copied().unwrap_or(0);
        if owner.is_none() && req.continuation {
            // A conversation already under way that this gateway has not seen: another
            // gateway replica served its earlier turns, most likely on the anchor's
            // rendezvous owner. Placing it by the anchor and the (scraped, fleet-wide)
            // saturation state alone, not by this gateway's in-flight view, lets every
            // replica agree on that pod.
            // That pod is then believed to hold the history, which matters for the
            // prefill this request is accounted to queue there. The warm bound still
            // applies: anyone can send a request that looks like a continuation, and a
            // tenant who computed a pod's rendezvous order offline could otherwise pile
            // load on it until the pod itself reports a queue.
            if let Some(b) = order.iter().copied().find(|&b| self.eligible(b, warm_cap)) {
                let held = matched(b).max(req.history_blocks.min(req.blocks));
                return self.finish(b, req.anchor, held, Reason::Placed);
            }
        }
        let Some(&first) = eligible.first() else {
            // Everyone saturated or over the bound: least loaded, deterministic ties.
            let b = self.least_loaded(healthy, 0).unwrap_or(0);
            let reason = if owner.is_some_and(|o| o != b) {
                Reason::Spillover
            } else {
                Reason::Placed
            };
            return self.finish(b, req.anchor, matched(b), reason);
        };
        let min_prefill = eligible
            .iter()
            .map(|&b| self.loads[b].prefill)
            .fold(f64::INFINITY, f64::min);
        // Prefill this prompt would wait for beyond the shortest queue, in units of
        // the prompt itself, so it weighs against the share of it a cache saves.
        let queued = |b: usize| {
            PREFILL_WEIGHT
                * (self.loads[b].prefill - min_prefill - self.cfg.prefill_slack_blocks).max(0.0)
                / blocks
        };
        if eligible.iter().all(|&b| ratio(b) == 0.0) {
            let reason = if owner.is_some() {
                Reason::Spillover
            } else {
                Reason::Placed
            };
            // In rendezvous order, so gateway replicas agree unless a queue is deep:
            // deeper than the slack, or half as deep as this prompt's own prefill
            // (see the module doc).
            let shallow = |b: usize| {
                let ahead = self.loads[b].prefill - min_prefill;
                ahead <= self.cfg.prefill_slack_blocks && ahead < blocks / 2.0
            };
            let b = eligible
                .iter()
                .copied()
                .find(|&b| shallow(b))
                .unwrap_or(first);
            return self.finish(b, req.anchor, matched(b), reason);
        }
        let min_load = eligible
            .iter()
            .map(|&b| self.loads[b].load)
            .fold(f64::INFINITY, f64::min);
        // A continuation's owner is taken to hold the whole history: behind gateway
        // replicas, the turns others sent there are missing from this index.
        let history = if req.continuation {
            req.history_blocks.min(req.blocks) as f64 / blocks
        } else {
            0.0
        };
        let value = |b: usize| {
            if Some(b) == owner {
                ratio(b).max(history)
            } else {
                ratio(b)
            }
        };
        let score = |b: usize| {
            let queue = if holds(b) { 0.0 } else { queued(b) };
            value(b) - queue - LOAD_WEIGHT * (self.loads[b].load - min_load) / cap.max(1.0)
        };
        let best = eligible
            .iter()
            .map(|&b| score(b))
            .fold(f64::NEG_INFINITY, f64::max);
        // `eligible` is in rendezvous order, so the first near-best is the tie-break.
        let b = eligible
            .iter()
            .copied()
            .find(|&b| score(b) >= best - self.cfg.tie_margin)
            .unwrap_or(first);
        if let Some(c) = self.replica_for(req, healthy, &eligible, b, &ratio) {
            return self.finish(c, req.anchor, matched(c), Reason::Replicated);
        }
        // Among equally warm copies of a shared prefix, the shortest prefill queue
        // (then the best score): requests arriving together spread over the copies
        // instead of sharing one pod's prefill step.
        let b = if req.continuation || ratio(b) == 0.0 {
            b
        } else {
            eligible
                .iter()
                .copied()
                .filter(|&c| ratio(c) >= ratio(b) - self.cfg.tie_margin)
                .fold(b, |a, c| {
                    let (pa, pc) = (self.loads[a].prefill, self.loads[c].prefill);
                    if pc < pa || (pc == pa && score(c) > score(a) + self.cfg.tie_margin) {
                        c
                    } else {
                        a
                    }
                })
        };
        let reason = match owner {
            Some(o) if o != b && ratio(o) > ratio(b) => Reason::Spillover,
            _ => Reason::CacheHit,
        };
        self.finish(b, req.anchor, matched(b), reason)
    }

    /// Hot-prefix replication (see the module doc): the less-loaded colder pod
    /// that should take a copy of the prefix `chosen` holds, if any.
    fn replica_for(
        &self,
        req: &RequestKey<'_>,
        healthy: &[usize],
        eligible: &[usize],
        chosen: usize,
        ratio: &impl Fn(usize) -> f64,
    ) -> Option<usize> {
        if req.continuation || ratio(chosen) == 0.0 {
            return None;
        }
        let warm_floor = ratio(chosen) - self.cfg.tie_margin;
        // Evidence that many requests share it: the prefix outgrew one pod already.
        let copies = healthy.iter().filter(|&&b| ratio(b) >= warm_floor).count();
        if copies < 2 {
            return None;
        }
        let (warm, colder): (Vec<usize>, Vec<usize>) =
            eligible.iter().partition(|&&b| ratio(b) >= warm_floor);
        let least_warm = warm
            .iter()
            .map(|&b| self.loads[b].load)
            .fold(f64::INFINITY, f64::min);
        let matched = |b: usize| f64::from(req.matched.get(b).copied().unwrap_or(0));
        // `colder` is in rendezvous order: the first of the least loaded, so
        // gateway replicas that see the same loads pick the same pod.
        let c = colder
            .iter()
            .copied()
            .fold(None, |best: Option<usize>, b| match best {
                Some(a) if self.loads[a].load <= self.loads[b].load => Some(a),
                _ => Some(b),
            })?;
        let extra = matched(chosen) - matched(c);
        let p = self.cfg;
        let cost = extra * p.block_tokens / crate::routing::work::unit(p);
        let mean = eligible.iter().map(|&b| self.loads[b].load).sum::<f64>()
            / eligible.len().max(1) as f64;
        let spare = self.loads[c].load;
        (extra <= p.prefill_slack_blocks
            && spare + 1.0 <= mean
            && least_warm >= spare + p.replicate_gap + cost)
            .then_some(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn policy() -> PolicyConfig {
        crate::testing::config(1).policy
    }

    fn loads(v: &[f64]) -> Vec<BackendLoad> {
        v.iter()
            .map(|&l| BackendLoad {
                member: true,
                healthy: true,
                load: l,
                work: l,
                saturated: false,
                full: false,
                prefill: 0.0,
                headroom: f64::INFINITY,
            })
            .collect()
    }

    fn with_prefill(mut l: Vec<BackendLoad>, prefill: &[f64]) -> Vec<BackendLoad> {
        for (l, &p) in l.iter_mut().zip(prefill) {
            l.prefill = p;
        }
        l
    }

    const IDS: [u64; 4] = [11, 22, 33, 44];

    fn pick(strategy: Strategy, loads: &[BackendLoad], req: RequestKey<'_>) -> Decision {
        let cfg = policy();
        let c = Chooser {
            cfg: &cfg,
            loads,
            ids: &IDS[..loads.len()],
            fallbacks: 2,
        };
        c.choose(strategy, &req).unwrap()
    }

    #[test]
    fn cache_aware_follows_the_longest_match() {
        let l = loads(&[0.0, 0.0, 0.0]);
        let d = pick(
            Strategy::CacheAware,
            &l,
            RequestKey {
                matched: &[2, 9, 0],
                blocks: 10,
                anchor: 5,
                ..Default::default()
            },
        );
        assert_eq!(d.order[0], 1);
        assert_eq!(d.reason, Reason::CacheHit);
        assert_eq!(d.matched, 9);
        assert_eq!(d.order.len(), 3);
    }

    #[test]
    fn cache_aware_spills_when_the_owner_is_over_the_bound() {
        // total 12 over 3 → cap = ceil(1.5·13/3) = 7; owner at 10 is not eligible
        // (past least + warm_min_cap = 9 too, so even as the sole holder).
        let l = loads(&[10.0, 1.0, 1.0]);
        let d = pick(
            Strategy::CacheAware,
            &l,
            RequestKey {
                matched: &[9, 0, 0],
                blocks: 10,
                anchor: 5,
                ..Default::default()
            },
        );
        assert_ne!(d.order[0], 0);
        assert_eq!(d.reason, Reason::Spillover);
    }

    #[test]
    fn a_warm_pod_keeps_its_conversation_below_the_warm_floor() {
        // total 2 over 3 → cap = ceil(1.5·3/3) = 2: the relative bound alone would
        // send the third request on pod 0 to a cold pod while the others idle.
        let l = loads(&[2.0, 0.0, 0.0]);
        let warm = RequestKey {
            matched: &[9, 0, 0],
            blocks: 10,
            anchor: 5,
            ..Default::default()
        };
        let d = pick(Strategy::CacheAware, &l, warm);
        assert_eq!((d.order[0], d.reason), (0, Reason::CacheHit));
        // A cold prompt still gets the relative bound.
        for anchor in 0..20 {
            let cold = RequestKey {
                matched: &[0, 0, 0],
                anchor,
                ..warm
            };
            assert_ne!(pick(Strategy::CacheAware, &l, cold).order[0], 0);
        }
        // At the floor, the warm pod is over the bound too.
        let full = loads(&[8.0, 0.0, 0.0]);
        assert_eq!(
            pick(Strategy::CacheAware, &full, warm).reason,
            Reason::Spillover
        );
    }

    #[test]
    fn a_continuation_stays_where_its_history_is_though_this_index_saw_part_of_it() {
        // This gateway saw 3 of the 9 history blocks go to pod 0 (other gateway
        // replicas sent the rest). cap = ceil(1.5·5/3) = 3, load term 0.5·4/3.
        let l = loads(&[4.0, 0.0, 0.0]);
        let partial = RequestKey {
            matched: &[3, 0, 0],
            blocks: 10,
            anchor: 5,
            ..Default::default()
        };
        let continuation = RequestKey {
            continuation: true,
            history_blocks: 9,
            ..partial
        };
        let d = pick(Strategy::CacheAware, &l, continuation);
        assert_eq!((d.order[0], d.reason), (0, Reason::CacheHit));
        // A new prompt with the same partial match is not worth that load.
        assert_eq!(
            pick(Strategy::CacheAware, &l, partial).reason,
            Reason::Spillover
        );
    }

    #[test]
    fn cache_aware_spills_away_from_a_saturated_owner() {
        // Full (a waiting queue alone does not move the sole holder).
        let mut l = loads(&[0.0, 0.0, 0.0]);
        l[1].saturated = true;
        l[1].full = true;
        let d = pick(
            Strategy::CacheAware,
            &l,
            RequestKey {
                matched: &[0, 9, 0],
                blocks: 10,
                anchor: 5,
                ..Default::default()
            },
        );
        assert_ne!(d.order[0], 1);
        assert_eq!(d.reason, Reason::Spillover);
    }

    #[test]
    fn placement_avoids_a_deep_prefill_queue_and_ignores_a_shallow_one() {
        // Defaults: 8192 tokens of slack = 128 blocks of 256 bytes at 4 bytes per token.
        let slack = policy().prefill_slack_blocks;
        assert_eq!(slack, 128.0);
        let order = rendezvous(5, &IDS[..3], 0..3);
        let new_prompt = |l: &[BackendLoad]| {
            pick(
                Strategy::CacheAware,
                l,
                RequestKey {
                    matched: &[0, 0, 0],
                    blocks: 400,
                    anchor: 5,
                    ..Default::default()
                },
            )
        };
        let mut queues = [0.0; 3];
        queues[order[0]] = slack;
        let d = new_prompt(&with_prefill(loads(&[1.0, 1.0, 1.0]), &queues));
        assert_eq!(
            (d.order[0], d.reason),
            (order[0], Reason::Placed),
            "within the slack: rendezvous, so gateways agree"
        );
        queues[order[0]] = slack + 1.0;
        queues[order[1]] = slack + 1.0;
        let d = new_prompt(&with_prefill(loads(&[1.0, 1.0, 1.0]), &queues));
        assert_eq!(
            d.order[0], order[2],
            "queues deeper than the slack: elsewhere"
        );
    }

    #[test]
    fn placement_avoids_a_queue_half_as_deep_as_the_prompt_itself_within_the_slack() {
        // 20 blocks, well within the 128-block slack: waiting behind 20 more would make
        // this 40-block prompt's time to first token 1.5x the shortest queue's.
        let order = rendezvous(5, &IDS[..3], 0..3);
        let place = |ahead: f64| {
            let mut queues = [0.0; 3];
            queues[order[0]] = ahead;
            pick(
                Strategy::CacheAware,
                &with_prefill(loads(&[1.0, 1.0, 1.0]), &queues),
                RequestKey {
                    matched: &[0, 0, 0],
                    blocks: 40,
                    anchor: 5,
                    ..Default::default()
                },
            )
        };
        assert_eq!(place(19.0).order[0], order[0], "shallower: rendezvous");
        let d = place(20.0);
        assert_eq!((d.order[0], d.reason), (order[1], Reason::Placed));
        // A queue one prompt deeper, of prompts a little shorter than this one.
        let d = place(38.0);
        assert_eq!((d.order[0], d.reason), (order[1], Reason::Placed));
    }

    /// A prefix of 16 blocks held by the pods in `warm`, in a 24-block prompt.
    fn shared(warm: &[usize]) -> [u32; 3] {
        let mut m = [0; 3];
        for &b in warm {
            m[b] = 16;
        }
        m
    }

    fn shared_prompt(matched: &[u32]) -> RequestKey<'_> {
        RequestKey {
            matched,
            blocks: 24,
            anchor: 5,
            ..Default::default()
        }
    }

    #[test]
    fn a_hot_prefix_is_copied_to_the_idle_pod_before_its_copies_queue() {
        // Two copies carry 4 and 3 requests within the warm floor; pod 2 idles. The
        // copy costs 16 blocks (1024 tokens, 0.48 typical requests) of prefill, once.
        let m = shared(&[0, 1]);
        let d = pick(
            Strategy::CacheAware,
            &loads(&[4.0, 3.0, 0.0]),
            shared_prompt(&m),
        );
        assert_eq!((d.order[0], d.reason), (2, Reason::Replicated));
        assert_eq!(d.matched, 0, "the copy is prefilled in full");
        // Not while the copies are within replicate_gap + cost of the idle pod.
        let d = pick(
            Strategy::CacheAware,
            &loads(&[3.0, 2.0, 0.0]),
            shared_prompt(&m),
        );
        assert_eq!((d.order[0], d.reason), (1, Reason::CacheHit));
        // Nor when the colder pod is not below the fleet's mean: nothing idles.
        let d = pick(
            Strategy::CacheAware,
            &loads(&[5.0, 5.0, 4.0]),
            shared_prompt(&m),
        );
        assert_ne!(d.reason, Reason::Replicated);
    }

    #[test]
    fn one_pods_prefix_a_conversation_or_a_costly_copy_is_not_replicated() {
        let l = loads(&[4.0, 3.0, 0.0]);
        // One copy: nothing says many requests share it (one conversation, or a prefix
        // used a few times): it stays within the warm floor.
        let one = shared(&[1]);
        let d = pick(Strategy::CacheAware, &l, shared_prompt(&one));
        assert_eq!((d.order[0], d.reason), (1, Reason::CacheHit));
        // A continuation keeps its pod.
        let two = shared(&[0, 1]);
        let cont = RequestKey {
            continuation: true,
            history_blocks: 16,
            ..shared_prompt(&two)
        };
        assert_ne!(
            pick(Strategy::CacheAware, &l, cont).reason,
            Reason::Replicated
        );
        // A copy longer than the prefill slack (128 blocks) is not cheap.
        let long = [200, 200, 0];
        let key = RequestKey {
            matched: &long,
            blocks: 300,
            anchor: 5,
            ..Default::default()
        };
        assert_ne!(
            pick(Strategy::CacheAware, &l, key).reason,
            Reason::Replicated
        );
        // Replication off (a gap no load difference reaches).
        let cfg = PolicyConfig {
            replicate_gap: 1e9,
            ..policy()
        };
        let c = Chooser {
            cfg: &cfg,
            loads: &l,
            ids: &IDS[..3],
            fallbacks: 2,
        };
        let d = c.choose(Strategy::CacheAware, &shared_prompt(&two));
        assert_ne!(d.map(|d| d.reason), Some(Reason::Replicated));
    }

    #[test]
    fn equally_warm_copies_take_the_shortest_prefill_queue() {
        // Requests arriving together spread over the copies instead of sharing a step.
        let order = rendezvous(5, &IDS[..3], 0..3);
        let m = shared(&[0, 1, 2]);
        let mut queues = [0.0; 3];
        queues[order[0]] = 8.0;
        queues[order[2]] = 8.0;
        let d = pick(
            Strategy::CacheAware,
            &with_prefill(loads(&[1.0, 1.0, 1.0]), &queues),
            shared_prompt(&m),
        );
        assert_eq!((d.order[0], d.reason), (order[1], Reason::CacheHit));
    }

    #[test]
    fn a_hot_prefix_at_concurrency_8_reaches_every_pod() {
        // A closed loop of 8 clients sharing one prefix: each step the oldest request
        // ends and its client sends the next one; the index learns the prefix on the
        // pod each request goes to, and a request's prefill is queued until the next
        // step. Before replication, the two pods that first held the prefix kept it
        // at 4 requests each and the third got none.
        let mut held = [0u32; 3];
        let mut l = loads(&[0.0, 0.0, 0.0]);
        let mut open: Vec<usize> = Vec::new();
        let mut served = [0usize; 3];
        for step in 0..200u64 {
            if open.len() == 8 {
                let b = open.remove(0);
                l[b].load -= 1.0;
            }
            for x in l.iter_mut() {
                x.prefill = 0.0;
            }
            let d = pick(
                Strategy::CacheAware,
                &l,
                RequestKey {
                    anchor: 5,
                    random: step,
                    ..shared_prompt(&held)
                },
            );
            let b = d.order[0];
            l[b].load += 1.0;
            l[b].prefill += f64::from(24 - d.matched);
            held[b] = 16;
            open.push(b);
            served[b] += 1;
        }
        assert!(held.iter().all(|&h| h == 16), "{held:?}");
        assert!(served.iter().all(|&n| n >= 40), "{served:?}");
    }

    #[test]
    fn a_cache_hit_leaves_an_owner_whose_prefill_queue_costs_twice_what_the_hit_saves() {
        let slack = policy().prefill_slack_blocks;
        // A prefix that another request waiting there shares: not one conversation's.
        let hit = |queue: f64| {
            pick(
                Strategy::CacheAware,
                &with_prefill(loads(&[1.0, 1.0, 1.0]), &[queue, 0.0, 0.0]),
                RequestKey {
                    matched: &[60, 0, 0],
                    blocks: 100,
                    anchor: 5,
                    shared: &[true, false, false],
                    ..Default::default()
                },
            )
        };
        assert_eq!(
            hit(slack + 100.0).order[0],
            0,
            "1 prompt of queue < twice 60% cached"
        );
        let d = hit(slack + 140.0);
        assert_ne!(d.order[0], 0, "1.4 prompts of queue > twice 60% cached");
        assert_eq!(d.reason, Reason::Spillover);
    }

    #[test]
    fn the_sole_owner_of_a_conversation_keeps_it_whatever_its_prefill_queue() {
        let slack = policy().prefill_slack_blocks;
        let queued = with_prefill(loads(&[1.0, 1.0, 1.0]), &[slack + 1000.0, 0.0, 0.0]);
        // One conversation's next turn: no other open request shares its history.
        let turn = RequestKey {
            matched: &[90, 0, 0],
            blocks: 100,
            anchor: 5,
            shared: &[false, false, false],
            ..Default::default()
        };
        let d = pick(Strategy::CacheAware, &queued, turn);
        assert_eq!((d.order[0], d.reason), (0, Reason::CacheHit));
        // The same match while another open request on that pod shares it: a prefix
        // many requests use, whose queue counts as for any other prompt.
        let busy = RequestKey {
            shared: &[true, false, false],
            ..turn
        };
        let d = pick(Strategy::CacheAware, &queued, busy);
        assert_eq!((d.order[0] != 0, d.reason), (true, Reason::Spillover));
        // Any share counts: a turn that adds a long document to a short history
        // would still re-prefill that history elsewhere.
        let less = RequestKey {
            matched: &[20, 0, 0],
            ..turn
        };
        assert_eq!(pick(Strategy::CacheAware, &queued, less).order[0], 0);
        // On two pods the prefix is shared (or the conversation moved): the shorter queue wins.
        let two = RequestKey {
            matched: &[90, 90, 0],
            ..turn
        };
        assert_eq!(pick(Strategy::CacheAware, &queued, two).order[0], 1);
        // A waiting queue does not move it either; a full pod does.
        let mut saturated = queued.clone();
        saturated[0].saturated = true;
        assert_eq!(pick(Strategy::CacheAware, &saturated, turn).order[0], 0);
        saturated[0].full = true;
        assert_ne!(pick(Strategy::CacheAware, &saturated, turn).order[0], 0);
        // The waiting queue still moves an owner that is not the sole holder: one whose
        // prefix a waiting request shares, or either of two owners (their tie goes by
        // the anchor's rendezvous order: pod 1 here, checked first).
        let idle = loads(&[1.0, 1.0, 1.0]);
        let waiting_on = |b: usize| {
            let mut l = idle.clone();
            l[b].saturated = true;
            l
        };
        assert_eq!(pick(Strategy::CacheAware, &idle, busy).order[0], 0);
        let d = pick(Strategy::CacheAware, &waiting_on(0), busy);
        assert_eq!((d.order[0] != 0, d.reason), (true, Reason::Spillover));
        assert_eq!(pick(Strategy::CacheAware, &idle, two).order[0], 1);
        assert_eq!(pick(Strategy::CacheAware, &waiting_on(1), two).order[0], 0);
    }

    #[test]
    fn a_sole_holder_keeps_its_conversation_up_to_a_warm_bound_above_the_least_loaded() {
        // 8 requests on the owner, 1 on each other pod: cap = ceil(1.5·11/3) = 6 and
        // the warm floor 8 would move this ninth request; the sole holder keeps it up
        // to least + max(cap, warm_min_cap) = 1 + 8 = 9 requests, this one included.
        let key = RequestKey {
            matched: &[9, 0, 0],
            blocks: 10,
            anchor: 5,
            ..Default::default()
        };
        let l = loads(&[8.0, 1.0, 1.0]);
        let d = pick(Strategy::CacheAware, &l, key);
        assert_eq!((d.order[0], d.reason), (0, Reason::CacheHit));
        // Not a prefix that another request waiting there shares.
        let shared = RequestKey {
            shared: &[true, false, false],
            ..key
        };
        assert_eq!(
            pick(Strategy::CacheAware, &l, shared).reason,
            Reason::Spillover
        );
        // One request more and it leaves too.
        let d = pick(Strategy::CacheAware, &loads(&[9.0, 1.0, 1.0]), key);
        assert_eq!(d.reason, Reason::Spillover);
        // The least loaded pod is the least that is not full: a full idle pod does
        // not shrink the bound.
        let mut l = loads(&[8.0, 0.0, 1.0]);
        l[1].saturated = true;
        l[1].full = true;
        assert_eq!(pick(Strategy::CacheAware, &l, key).order[0], 0);
    }

    #[test]
    fn cache_beats_modest_load_difference() {
        let l = loads(&[4.0, 2.0, 2.0]);
        let d = pick(
            Strategy::CacheAware,
            &l,
            RequestKey {
                matched: &[9, 3, 3],
                blocks: 10,
                anchor: 5,
                ..Default::default()
            },
        );
        assert_eq!(d.order[0], 0);
    }

    #[test]
    fn new_prefixes_are_placed_deterministically_and_spread() {
        let l = loads(&[0.0, 0.0, 0.0]);
        let mut seen = [0usize; 3];
        for anchor in 0..300u64 {
            let a = pick(
                Strategy::CacheAware,
                &l,
                RequestKey {
                    matched: &[0, 0, 0],
                    blocks: 4,
                    anchor,
                    ..Default::default()
                },
            );
            let b = pick(
                Strategy::CacheAware,
                &l,
                RequestKey {
                    matched: &[0, 0, 0],
                    blocks: 4,
                    anchor,
                    ..Default::default()
                },
            );
            assert_eq!(a, b);
            assert_eq!(a.reason, Reason::Placed);
            seen[a.order[0]] += 1;
        }
        assert!(seen.iter().all(|&n| n > 70), "{seen:?}");
    }

    #[test]
    fn a_match_inside_the_head_does_not_attract() {
        // Backend 0 holds the shared system prompt (4 blocks) only: new conversations are placed.
        let l = loads(&[0.0, 0.0, 0.0]);
        let mut seen = [0usize; 3];
        for anchor in 0..90u64 {
            let d = pick(
                Strategy::CacheAware,
                &l,
                RequestKey {
                    matched: &[4, 0, 0],
                    blocks: 6,
                    head_blocks: 4,
                    anchor,
                    ..Default::default()
                },
            );
            assert_eq!(d.reason, Reason::Placed);
            seen[d.order[0]] += 1;
        }
        assert!(seen.iter().all(|&n| n > 15), "{seen:?}");
        let cont = pick(
            Strategy::CacheAware,
            &l,
            RequestKey {
                matched: &[5, 0, 0],
                blocks: 6,
                head_blocks: 4,
                anchor: 1,
                ..Default::default()
            },
        );
        assert_eq!((cont.order[0], cont.reason), (0, Reason::CacheHit));
    }

    #[test]
    fn an_unseen_continuation_goes_to_the_anchor_owner_whatever_the_local_load() {
        let l = loads(&[0.0, 0.0, 0.0]);
        let key = |continuation| RequestKey {
            matched: &[0, 0, 0],
            blocks: 8,
            anchor: 77,
            continuation,
            history_blocks: if continuation { 6 } else { 0 },
            ..Default::default()
        };
        let owner = pick(Strategy::CacheAware, &l, key(true)).order[0];
        // This gateway alone sent 3 requests there: a new conversation avoids it...
        let mut busy = l.clone();
        busy[owner].load = 3.0;
        assert_ne!(
            pick(Strategy::CacheAware, &busy, key(false)).order[0],
            owner
        );
        // ...but a conversation under way stays where the other gateways put it,
        let d = pick(Strategy::CacheAware, &busy, key(true));
        assert_eq!((d.order[0], d.reason), (owner, Reason::Placed));
        assert_eq!(
            d.matched, 6,
            "believed to hold the history: only the last message queues for prefill"
        );
        // unless that pod is saturated.
        busy[owner].saturated = true;
        assert_ne!(pick(Strategy::CacheAware, &busy, key(true)).order[0], owner);
    }

    #[test]
    fn never_everything_on_one_replica() {
        // Every request shares a system prompt that only backend 0 holds so far.
        let mut l = loads(&[0.0, 0.0, 0.0]);
        let mut count = [0usize; 3];
        for i in 0..60u64 {
            let d = pick(
                Strategy::CacheAware,
                &l,
                RequestKey {
                    matched: &[4, 0, 0],
                    blocks: 10,
                    anchor: i,
                    ..Default::default()
                },
            );
            l[d.order[0]].load += 1.0;
            count[d.order[0]] += 1;
        }
        // The owner, sole holder of the prefix (no waiting request shares it in this
        // test), takes at most one warm bound ((1+eps)·mean, +1 for rounding) above
        // the least loaded pod; the rest spill.
        let least = *count.iter().min().unwrap_or(&0);
        assert!(count[0] <= least + 31, "{count:?}");
        assert!(count.iter().all(|&c| c >= 10), "{count:?}");
    }

    #[test]
    fn prefix_hash_is_consistent_with_bounded_spillover() {
        let l = loads(&[0.0, 0.0, 0.0]);
        let d = pick(
            Strategy::PrefixHash,
            &l,
            RequestKey {
                anchor: 42,
                ..Default::default()
            },
        );
        let owner = d.order[0];
        let mut hot = loads(&[0.0, 0.0, 0.0]);
        hot[owner].load = 20.0;
        let s = pick(
            Strategy::PrefixHash,
            &hot,
            RequestKey {
                anchor: 42,
                ..Default::default()
            },
        );
        assert_ne!(s.order[0], owner);
        assert_eq!(s.order[0], d.order[1], "spills to the key's next backend");
        assert_eq!(s.reason, Reason::Spillover);
    }

    #[test]
    fn least_request_and_round_robin_and_random() {
        let l = loads(&[3.0, 1.0, 2.0]);
        assert_eq!(
            pick(Strategy::LeastRequest, &l, RequestKey::default()).order[0],
            1
        );
        let rr: Vec<usize> = (0..6)
            .map(|r| {
                pick(
                    Strategy::RoundRobin,
                    &l,
                    RequestKey {
                        rotation: r,
                        ..Default::default()
                    },
                )
                .order[0]
            })
            .collect();
        assert_eq!(rr, vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(
            pick(
                Strategy::Random,
                &l,
                RequestKey {
                    random: 7,
                    ..Default::default()
                }
            )
            .order[0],
            1
        );
    }

    #[test]
    fn sticky_moves_only_the_dead_backends_sessions() {
        let l = loads(&[0.0, 0.0, 0.0, 0.0]);
        let before: Vec<usize> = (0..200)
            .map(|s| {
                pick(
                    Strategy::StickySession,
                    &l,
                    RequestKey {
                        session: Some(s),
                        ..Default::default()
                    },
                )
                .order[0]
            })
            .collect();
        let mut dead = l.clone();
        dead[2].healthy = false;
        for (s, &b) in before.iter().enumerate() {
            let now = pick(
                Strategy::StickySession,
                &dead,
                RequestKey {
                    session: Some(s as u64),
                    ..Default::default()
                },
            )
            .order[0];
            if b != 2 {
                assert_eq!(now, b, "session {s} moved off a live backend");
            } else {
                assert_ne!(now, 2);
            }
        }
        let no_session = pick(
            Strategy::StickySession,
            &l,
            RequestKey {
                rotation: 1,
                ..Default::default()
            },
        );
        assert_eq!(no_session.reason, Reason::RoundRobin);
    }

    #[test]
    fn unhealthy_backends_are_skipped_unless_all_are() {
        let mut l = loads(&[0.0, 0.0]);
        l[0].healthy = false;
        for s in [
            Strategy::CacheAware,
            Strategy::PrefixHash,
            Strategy::LeastRequest,
            Strategy::RoundRobin,
            Strategy::Random,
            Strategy::StickySession,
        ] {
            for r in 0..10 {
                let d = pick(
                    s,
                    &l,
                    RequestKey {
                        anchor: r,
                        rotation: r,
                        random: r,
                        session: Some(r),
                        matched: &[5, 0],
                        blocks: 5,
                        head_blocks: 0,
                        continuation: false,
                        history_blocks: 0,
                        shared: &[],
                    },
                );
                assert_eq!(d.order, vec![1], "{s:?}");
            }
        }
        l[1].healthy = false;
        let d = pick(Strategy::RoundRobin, &l, RequestKey::default());
        assert_eq!(d.order.len(), 2);
        // An empty slot is never chosen, not even when every member is out.
        l.push(BackendLoad::default());
        for r in 0..10 {
            let d = pick(
                Strategy::Random,
                &l,
                RequestKey {
                    random: r,
                    ..RequestKey::default()
                },
            );
            assert!(!d.order.contains(&2), "{:?}", d.order);
        }
        let none = Chooser {
            cfg: &policy(),
            loads: &[BackendLoad::default(); 3],
            ids: &[1, 2, 3],
            fallbacks: 2,
        };
        assert!(none
            .choose(Strategy::Random, &RequestKey::default())
            .is_none());
        assert!(none.fallback(7).is_none());
    }
}
