//! A pod's work in flight, measured in requests of typical size, so that
//! balancing by load is balancing by work rather than by request count.
//!
//! ```text
//! tokens_b = prefill_blocks_b · block_tokens + decode_cost · decode_tokens_b
//! unit     = block_tokens + decode_cost · default_output_tokens       (a typical request)
//! work_b   = tokens_b / unit + others_b
//! others_b = max(0, running_b + waiting_b − own_requests_b)  from a fresh scrape, else 0
//! ```
//! `tokens_b` is GPU time in prefilled-token equivalents: the prompt tokens
//! this gateway sent `b` and has not seen answered (its prefill queue, see
//! [`crate::routing::load`]), plus the output tokens its requests there may still
//! generate (their `max_tokens`, or `default_output_tokens`, held until each
//! ends: [`crate::fleet::inflight`]). Dividing by a typical request keeps the bounded
//! load's `cap` and `eps` in the units they were tuned in, and lets requests
//! seen only in a pod's scrape (other gateways') count as typical ones.
//!
//! | parameter | default | why |
//! |---|---|---|
//! | `balance.decode_cost` | 8 | a vLLM decode step (12 ms + 0.15 ms per sequence on an H100-class GPU, as the simulator models it) yields one token per running sequence: 0.9 ms per token at 16 sequences, 0.34 ms at 64, against 0.06 ms per prefilled token; 8 sits between |
//! | `balance.default_output_tokens` | 256 | a chat answer; a request that sets no limit is assumed typical |
//! | [`MAX_OUTPUT_TOKENS`] | 131072 | a context window: no client makes a pod look busier than one long generation |
//!
//! Used by `least_request` and the load-only fallback: a small request avoids
//! a pod busy with one huge prompt or one long generation although request
//! counts are equal. The bounded loads of `cache_aware` and `prefix_hash`
//! stay in requests, because every work-based bound measured lost or changed
//! nothing (`docs/decisions/0006-bounds-count-requests.md` has the paired rounds):
//! - with the prefill part, an agent step's tool output still prefilling
//!   (up to 16k tokens: several typical requests) makes its pod look full,
//!   and the bound pushes that agent's next steps off the pod holding its
//!   context, even with a request's weight capped at a few typical ones.
//!   `cache_aware` weighs the prefill queue in its score instead, against the
//!   cache that leaving would lose: a short prompt already flees a pod
//!   prefilling a huge one ([`crate::routing::policy`]).
//! - the decode part alone moved nothing on `cache_aware` and cost
//!   `prefix_hash` conversation hit rate. In the simulator a decode step barely
//!   slows with the batch (0.15 ms per sequence on a 12 ms step), so a long
//!   generation holds a slot longer but hardly delays the others; a bench
//!   where it does would be needed to argue for it.

use crate::config::PolicyConfig;
use crate::fleet::inflight::InFlight;

/// Largest output budget one request holds on its pod.
pub const MAX_OUTPUT_TOKENS: u32 = 131_072;

/// `work_b` for one pod; `others` are requests only its scrape sees.
pub fn work(inflight: &InFlight, others: f64, policy: &PolicyConfig) -> f64 {
    let tokens = f64::from(inflight.prefill_blocks) * policy.block_tokens
        + policy.decode_cost * f64::from(inflight.decode_tokens);
    tokens / unit(policy) + others.max(0.0)
}

/// A typical request's GPU time in prefilled-token equivalents (`unit` above, never 0).
pub fn unit(policy: &PolicyConfig) -> f64 {
    (policy.block_tokens + policy.decode_cost * f64::from(policy.default_output_tokens))
        .max(f64::MIN_POSITIVE)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_typical_request_is_one_unit_and_a_huge_prompt_many() {
        let p = crate::testing::config(1).policy;
        let typical = InFlight {
            requests: 1,
            prefill_blocks: 1,
            decode_tokens: p.default_output_tokens,
        };
        assert!((work(&typical, 0.0, &p) - 1.0).abs() < 1e-9);
        // One 100k-token prompt still prefilling weighs as dozens of typical requests.
        let huge = InFlight {
            requests: 1,
            prefill_blocks: (100_000.0 / p.block_tokens) as u32,
            decode_tokens: 16,
        };
        assert!(work(&huge, 0.0, &p) > 40.0, "{}", work(&huge, 0.0, &p));
        assert_eq!(work(&InFlight::default(), 3.0, &p), 3.0);
        assert_eq!(work(&InFlight::default(), -2.0, &p), 0.0);
    }
}
