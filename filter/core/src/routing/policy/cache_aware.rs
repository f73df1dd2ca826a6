//! `cache_aware` (the default): the longest prefix the index says a pod holds,
//! weighed against that pod's load and prefill queue, within the bounded load
//! of [`super`].
//!
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
//!   saw it, which is the tail the queue term is there to cut. Pending, not
//!   in flight: a trace replayed open-loop (or a client that does not wait
//!   for the whole answer) sends a turn while the previous one still streams,
//!   and "in flight" would drop the hold for those turns (5-6 of the 154
//!   continuations in a conversation run had their previous turn still
//!   streaming; none still waiting for its first token). The waiting requests
//!   are the ones this worker VM routed and has not seen a response byte of
//!   (their prompts' block hashes are kept per pod, see
//!   [`crate::routing::pending`]); another worker's are not seen, which only leaves the
//!   hold in place. "Shares" is checked at the last block of the pod's match
//!   (one comparison per prompt waiting there). A request stops waiting at its
//!   first response byte, or, answered in one piece (not streamed), at its end;
//!   a request retried on a fallback pod stays waiting on the pod it was sent
//!   to first. A prefix on two or more pods is shared (or a conversation
//!   already moved): its copies compete on their queues too.
//!   Conversation trace, 4 paired rounds against the earlier hold (the queue
//!   alone, for owners of at least 75% of the prompt): hit rate
//!   0.986-1.027x the single-replica reference (median 1.00x) against
//!   0.931-0.991x in the same rounds (0.944x over 23 rounds of that build),
//!   spillovers 6-7 of 800 against 23-32, TTFT P95 the same
//!   (medians 0.56x and 0.55x round robin); agent, chat and
//!   evicting rows unchanged (2 rounds). The spillovers it prevents are the
//!   three kinds a diagnosis build logged before (64 in two runs): 37 lost on
//!   the score (35 with 2-74% of the prompt held), 10 over the warm bound, 17
//!   saturated (`docs/decisions/0007-sole-holder-keeps-its-conversation.md`). A continuation that
//!   this gateway has not seen (placed by its anchor, below) still leaves a
//!   saturated pod: there the hold has no index entry to go on.
//! - the match of a prompt that is not a continuation leaves out the blocks a
//!   prompt still waiting for its prefill on that pod brings
//!   ([`crate::routing::pending`], ready): the pod has not computed them, and a prompt
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
//! - no owner, a second turn (one answer in the prompt), and one pod holding
//!   every full block of the head, its match reaching into the first message
//!   and further than any other's → that pod, within the warm bound: a first
//!   turn that ended inside the head (a short first message after long
//!   instructions) left nothing past the head to match, and only the pod that
//!   answered it holds part of that message (the others at most the
//!   instructions conversations share). Placed by the next rule, such a turn
//!   left a first turn that load had placed off its anchor's pod, and
//!   re-prefilled it (on real vLLM, 6 and 1 of 12 chats in two runs). A second
//!   turn only: behind gateway replicas without the exchange, a later turn may
//!   have gone to the anchor's pod through another replica, and the anchor
//!   keeps them agreeing;
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
//! ## A hot prefix spreads before it hurts
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
//!   each, see `docs/decisions/0008-hot-prefix-spreads.md`). `cost` makes a longer prefix need a
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

use super::{Chooser, Decision, Reason, RequestKey};
use crate::hash::rendezvous;

/// Weight of load against cache share in `cache_aware` scores.
pub const LOAD_WEIGHT: f64 = 0.5;

/// Weight of a pod's extra prefill queue against cache share in `cache_aware` scores.
pub const PREFILL_WEIGHT: f64 = 0.5;

impl Chooser<'_> {
    pub(super) fn cache_aware(
        &self,
        req: &RequestKey<'_>,
        healthy: &[usize],
        cap: f64,
    ) -> Decision {
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
            // A second turn whose first ended inside the head, so no match goes past it:
            // the one pod holding the head's full blocks, into the first message, answered
            // that turn.
            let longest = (req.answers == 1)
                .then(|| healthy.iter().copied().max_by_key(|&b| matched(b)))
                .flatten();
            let first_turn = longest.filter(|&b| {
                matched(b) >= req.head_blocks
                    && matched(b) > req.instructions_blocks
                    && healthy.iter().all(|&c| c == b || matched(c) < matched(b))
            });
            if let Some(b) = first_turn.filter(|&b| self.eligible(b, warm_cap)) {
                return self.finish(b, req.anchor, matched(b), Reason::CacheHit);
            }
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
