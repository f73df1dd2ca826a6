//! What a pod knows about a request before it arrives: its longest cached prefix and the time to
//! its first token, predicted by the engine's own scheduler and cost model. Serves the debug
//! endpoint (`/debug/state`, [`crate::api`]) that the bench's oracle router reads; warmroute never
//! reads it (a real vLLM has no such endpoint), and the engine never calls it.
//!
//! # The prediction
//! The probe is the request as the engine would queue it: its prompt's block hashes (base model,
//! [`crate::cache::block_hashes`]), its prompt length and its `max_tokens`. On copies of the
//! engine's counts (no cache, no tokens), the forecast runs [`Engine::schedule`] and
//! [`Engine::complete`]'s rules step by step with no other arrival, the probe appended to the
//! waiting queue, until the step that finishes the probe's prefill; the predicted TTFT is the sum
//! of those steps' costs (`base_ms + prefill_tokens * prefill_ms_per_token + batch_seqs *
//! decode_ms_per_seq`) plus what is left of the step in flight, in simulated milliseconds.
//!
//! | state | how it is counted |
//! |---|---|
//! | step in flight | its sequences' scheduled tokens are applied when it ends, `in_flight_ms` from now |
//! | running sequence | remaining prefill (chunked into the 8192-token budget first), then one token a step until `max_tokens` |
//! | waiting request | admitted in FIFO order while `running < max_num_seqs`, budget is left and its blocks fit; its hit is the cache's longest prefix now, capped at `prompt - 1` tokens |
//! | KV blocks | available = capacity - pinned - private; admission takes `private + newly pinned` (cached blocks no sequence pins); a finishing sequence gives back its private blocks and the blocks only it pins |
//!
//! # Where it is approximate
//! * Hits are those of the cache now: a request ahead of the probe that computes blocks the probe
//!   shares, or an eviction before the probe is admitted, is not foreseen.
//! * Blocks shared by several running sequences are given back by none of them (an
//!   under-estimate of what frees up when all of them finish).
//! * LoRA's `max_loras` skip is not modelled (the bench sends no adapter requests), nor a
//!   request that skips cache reads.
//!
//! # Cost
//! O(steps × sequences) with no allocation per step beyond the copies: microseconds for the
//! bench's queues (the endpoint reports its own time, `predict_us`).

use super::{Engine, Seq};
use crate::cache::BlockHash;

/// A request as the pod would see it.
#[derive(Debug, Clone, Copy)]
pub struct Probe<'a> {
    /// The prompt's full-block hashes (base model).
    pub hashes: &'a [BlockHash],
    pub prompt_len: usize,
    pub max_tokens: usize,
}

/// The pod's answer for one probe.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// Cached blocks the probe would hit now (capped as admission caps them).
    pub match_blocks: usize,
    /// Blocks of the probe's prefix the pod holds now or held and evicted
    /// ([`crate::cache::PrefixCache::held_prefix`]), uncapped.
    pub held_blocks: usize,
    /// Time to the probe's first token in simulated ms; `None` when it could never be admitted
    /// (more blocks than the cache has).
    pub ttft_ms: Option<f64>,
    /// Steps the forecast ran.
    pub steps: usize,
    /// Prompt tokens queued ahead of the probe and not cached: the running sequences' remaining
    /// prefill and the waiting requests' uncached prompts.
    pub queue_prefill_tokens: usize,
}

/// One sequence in the forecast.
#[derive(Debug, Clone, Copy)]
struct V {
    prompt_len: usize,
    computed: usize,
    generated: usize,
    max_tokens: usize,
    /// Blocks given back when it finishes.
    frees: usize,
    scheduled: usize,
    probe: bool,
}

impl V {
    fn prefilling(&self) -> bool {
        self.computed < self.prompt_len
    }
}

/// A waiting request in the forecast: its hit and the blocks its admission takes.
#[derive(Debug, Clone, Copy)]
struct W {
    prompt_len: usize,
    max_tokens: usize,
    hit: usize,
    need: usize,
    probe: bool,
}

/// Forecast steps at most (a pod whose queue never drains in this many steps is far past
/// anything the bench runs): the answer is then `None`.
const MAX_STEPS: usize = 1_000_000;

impl Engine {
    /// Blocks the cache holds for `hashes`: (hit, newly pinned) as admission would count them.
    fn admission_of(&self, hashes: &[BlockHash], prompt_len: usize) -> (usize, usize) {
        let max_hit = prompt_len.saturating_sub(1) / self.cfg.block_size;
        let hit = self.cache.match_prefix(hashes).min(max_hit);
        let unpinned = hashes
            .iter()
            .take(hit)
            .filter(|h| self.cache.refs(**h) == Some(0))
            .count();
        (hit, unpinned)
    }

    fn waiting_of(
        &self,
        hashes: &[BlockHash],
        prompt_len: usize,
        max_tokens: usize,
        probe: bool,
    ) -> W {
        let (hit, unpinned) = self.admission_of(hashes, prompt_len);
        let need = self.blocks_for(prompt_len + max_tokens).saturating_sub(hit) + unpinned;
        W {
            prompt_len,
            max_tokens,
            hit,
            need,
            probe,
        }
    }

    fn running_of(&self, s: &Seq) -> V {
        let exclusive = s
            .pinned
            .iter()
            .filter(|h| self.cache.refs(**h) == Some(1))
            .count();
        V {
            prompt_len: s.prompt_len(),
            computed: s.computed,
            generated: s.generated,
            max_tokens: s.req.max_tokens,
            frees: s.private + exclusive,
            scheduled: s.scheduled,
            probe: false,
        }
    }

    /// The probe's longest cached prefix and predicted time to first token (module docs).
    /// `in_flight_ms`: simulated ms left of the step in flight (0 when none is).
    pub fn predict(&self, probe: Probe<'_>, in_flight_ms: f64) -> Prediction {
        let bs = self.cfg.block_size;
        let held_blocks = self.cache.held_prefix(probe.hashes);
        let mut running: Vec<V> = self.running.iter().map(|s| self.running_of(s)).collect();
        let mut waiting: std::collections::VecDeque<W> = self
            .waiting
            .iter()
            .map(|s| {
                if s.req.skip_reading_prefix_cache {
                    self.waiting_of(&[], s.prompt_len(), s.req.max_tokens, false)
                } else {
                    self.waiting_of(&s.prompt_hashes, s.prompt_len(), s.req.max_tokens, false)
                }
            })
            .collect();
        let queue_prefill_tokens = running
            .iter()
            .map(|v| v.prompt_len - v.computed.min(v.prompt_len))
            .chain(
                waiting
                    .iter()
                    .map(|w| w.prompt_len - (w.hit * bs).min(w.prompt_len)),
            )
            .sum();
        let mine = self.waiting_of(probe.hashes, probe.prompt_len, probe.max_tokens, true);
        let match_blocks = mine.hit;
        let answer = |ttft_ms, steps| Prediction {
            match_blocks,
            held_blocks,
            ttft_ms,
            steps,
            queue_prefill_tokens,
        };
        if self.blocks_for(probe.prompt_len + probe.max_tokens) > self.cfg.num_blocks
            || probe.prompt_len == 0
        {
            return answer(None, 0);
        }
        waiting.push_back(mine);
        let mut available = self.cache.available();
        let mut t = 0.0;
        if running.iter().any(|v| v.scheduled > 0) {
            t += in_flight_ms.max(0.0);
            // Only the probe's own step ends its forecast, and the probe is not in this one.
            let _ = finish_step(&mut running, &mut available);
        }
        for step in 1..=MAX_STEPS {
            let mut budget = self.cfg.max_num_batched_tokens;
            let mut prefill = 0;
            for v in &mut running {
                v.scheduled = 0;
                if budget == 0 {
                    continue;
                }
                let chunk = if v.prefilling() {
                    (v.prompt_len - v.computed).min(budget)
                } else {
                    1
                };
                v.scheduled = chunk;
                budget -= chunk;
                if v.prefilling() {
                    prefill += chunk;
                }
            }
            while budget > 0 && running.len() < self.cfg.max_num_seqs {
                let Some(w) = waiting.front().copied() else {
                    break;
                };
                if w.need > available {
                    break;
                }
                waiting.pop_front();
                available -= w.need;
                let computed = w.hit * bs;
                let chunk = (w.prompt_len - computed).min(budget);
                budget -= chunk;
                prefill += chunk;
                running.push(V {
                    prompt_len: w.prompt_len,
                    computed,
                    generated: 0,
                    max_tokens: w.max_tokens,
                    frees: w.need,
                    scheduled: chunk,
                    probe: w.probe,
                });
            }
            let batch = running.iter().filter(|v| v.scheduled > 0).count();
            if batch == 0 {
                return answer(None, step);
            }
            t += self.cfg.base_ms
                + prefill as f64 * self.cfg.prefill_ms_per_token
                + batch as f64 * self.cfg.decode_ms_per_seq;
            if finish_step(&mut running, &mut available) {
                return answer(Some(t), step);
            }
        }
        answer(None, MAX_STEPS)
    }
}

/// Applies a step's scheduled tokens as [`Engine::complete`] does; finished sequences give
/// their blocks back. True when the probe's prefill finished in it (its first token).
fn finish_step(running: &mut Vec<V>, available: &mut usize) -> bool {
    let mut first_token = false;
    running.retain_mut(|v| {
        if v.scheduled == 0 {
            return true;
        }
        if v.prefilling() {
            v.computed += v.scheduled;
            if !v.prefilling() {
                v.generated += 1;
                first_token |= v.probe;
            }
        } else {
            v.generated += 1;
        }
        v.scheduled = 0;
        let done = v.generated >= v.max_tokens && !v.prefilling();
        if done {
            *available += v.frees;
        }
        !done
    });
    first_token
}
