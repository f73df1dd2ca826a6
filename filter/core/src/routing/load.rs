//! Per-backend load: scraped metrics, health, and the filter's own in-flight count.
//!
//! ## How load is weighed (the bounds of `cache_aware` and `prefix_hash`; `least_request` weighs work: [`crate::routing::work`])
//! ```text
//! load_b      = inflight_b + max(0, running_b + waiting_b − own_b)   (scrape fresh)
//!             = inflight_b                                          (no fresh scrape)
//! full_b      = kv_usage_b >= max_kv_usage  ∨  (max_inflight > 0 ∧ inflight_b >= max_inflight)
//! saturated_b = full_b  ∨  waiting_b >= max_waiting
//! gate_load_b = max(0, inflight_b + running_b + waiting_b − own_b)    (scrape fresh; the knee's count)
//! prefill_b   = prompt blocks this gateway sent to b whose first answer byte
//!               has not come back yet (minus what b was believed to hold)
//! ```
//! `prefill_b` is the queue a new prompt's prefill waits behind: vLLM
//! prefills in arrival order, so a pod holding one unanswered 30k-token prompt
//! answers a short one later than a pod holding three short ones, though its
//! request count is lower. Counted by the filter alone: no server exports it.
//!
//! `own_b` is this gateway's in-flight count when the scrape answered: what
//! the scrape says beyond it is other gateways' traffic. This gateway's own
//! share is always its current count, never a scrape's: a scrape taken while
//! a conversation's previous turn ran would otherwise count that finished turn
//! for a whole scrape period and push the next turn off its pod.
//! In-flight counts react instantly (between scrapes); scraped running+waiting
//! also see traffic from other gateway replicas. A queue (`waiting > 0`) means
//! the server already hit `max_num_seqs` or its KV capacity, so it counts as
//! saturation, not just load. A *full* pod is past a hard limit: its KV cache
//! cannot admit more without preempting, or it runs the operator's in-flight
//! cap; a queue alone is a wait, which a conversation's sole holder may still
//! be worth (see `policy`). A snapshot older than `stale_after_ms` is
//! ignored: no metrics degrades to in-flight accounting, never to an outage.
//!
//! The gate's count ([`crate::gate`]) also believes a fresh scrape that shows
//! *fewer* requests than this gateway had in flight when it answered: a
//! stream whose client stopped reading stays in flight here after the pod has
//! finished it, and a few dozen such clients would hold every pod at its knee
//! for as long as they keep their connections. The difference is taken back
//! until the next scrape: requests that end meanwhile count as ended twice,
//! and requests sent but not yet in the pod's gauges when it answered (in its
//! HTTP queue, being tokenized) count as ended: an under-count of at most one
//! scrape period, which lets a burst past the knee by that many.

use crate::config::Knee;
use crate::config::PolicyConfig;
use crate::fleet::health::Health;
use crate::fleet::inflight::InFlight;
use crate::fleet::view::Standing;
use crate::routing::work::work;

/// The load picture of one backend at decision time.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BackendLoad {
    /// A pod holds this slot.
    pub member: bool,
    /// In rotation.
    pub healthy: bool,
    /// Requests, per the formula at the top of this module.
    pub load: f64,
    /// Not eligible for cache affinity or bounded-load placement: full, or
    /// queueing (a `cache_aware` sole holder still is, unless full).
    pub saturated: bool,
    /// Past a hard limit (KV usage, the in-flight cap): chosen only when every
    /// pod is out of bounds.
    pub full: bool,
    /// Prompt blocks queued for prefill ahead of a new request.
    pub prefill: f64,
    /// Work in flight, in typical requests ([`crate::routing::work`]).
    pub work: f64,
    /// Typical requests it takes before its knee ([`crate::gate`]); ∞ without a gate.
    pub headroom: f64,
}

/// Combines in-flight counts and health into per-backend load.
pub fn backend_loads(
    inflight: &[InFlight],
    health: &[Health],
    standing: &[Standing],
    now_ms: u64,
    stale_after_ms: u64,
    policy: &PolicyConfig,
    knee: Option<&Knee>,
) -> Vec<BackendLoad> {
    inflight
        .iter()
        .enumerate()
        .map(|(b, f)| {
            let h = health.get(b).copied().unwrap_or_default();
            let fresh = h.scraped_ms > 0 && now_ms.saturating_sub(h.scraped_ms) <= stale_after_ms;
            let inf = f.requests as f64;
            let scraped = fresh.then_some(h.scrape);
            let (others, queueing, kv_full) = if fresh {
                let s = h.scrape;
                (
                    (s.running + s.waiting - s.own_inflight as f64).max(0.0),
                    s.waiting >= policy.max_waiting.max(f64::MIN_POSITIVE),
                    s.kv_usage >= policy.max_kv_usage,
                )
            } else {
                (0.0, false, false)
            };
            let full = kv_full || (policy.max_inflight > 0 && inf >= policy.max_inflight as f64);
            let work = work(f, others, policy);
            BackendLoad {
                member: standing.get(b).is_some_and(|&s| s != Standing::Absent),
                healthy: standing.get(b) == Some(&Standing::In),
                load: inf + others,
                saturated: full || queueing,
                full,
                prefill: f.prefill_blocks as f64,
                work,
                headroom: knee.map_or(f64::INFINITY, |k| {
                    let load = scraped.map_or(inf, |s| {
                        (inf + s.running + s.waiting - s.own_inflight as f64).max(0.0)
                    });
                    k.headroom(
                        load,
                        work,
                        scraped.map(|s| s.waiting),
                        scraped.map(|s| s.kv_usage),
                    )
                }),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::scrape::Scrape;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn stale_scrapes_are_ignored_and_queues_saturate() {
        let c = crate::testing::config(2);
        let busy = Health {
            scraped_ms: 1000,
            scrape: Scrape {
                running: 10.0,
                waiting: 6.0,
                own_inflight: 1,
                ..Scrape::default()
            },
            ..Health::default()
        };
        let one = InFlight {
            requests: 1,
            prefill_blocks: 7,
            decode_tokens: 0,
        };
        let at = |now| {
            backend_loads(
                &[one, one],
                &[busy, Health::default()],
                &[Standing::In, Standing::In],
                now,
                2000,
                &c.policy,
                None,
            )
        };
        let l = at(1500);
        assert_eq!(l[0].load, 16.0);
        // A queue saturates; it is not a hard limit.
        assert!(l[0].saturated && !l[0].full);
        assert_eq!((l[1].load, l[1].prefill), (1.0, 7.0));
        let stale = at(5000);
        assert_eq!(stale[0].load, 1.0);
        assert!(!stale[0].saturated);
    }

    #[test]
    fn a_full_kv_cache_or_the_inflight_cap_is_a_hard_limit() {
        let mut c = crate::testing::config(1);
        let kv = Health {
            scraped_ms: 1000,
            scrape: Scrape {
                kv_usage: 0.99,
                ..Scrape::default()
            },
            ..Health::default()
        };
        let two = InFlight {
            requests: 2,
            ..InFlight::default()
        };
        let at = |health: Health, policy: &PolicyConfig| {
            backend_loads(&[two], &[health], &[Standing::In], 1500, 2000, policy, None)[0]
        };
        let l = at(kv, &c.policy);
        assert!(l.full && l.saturated);
        c.policy.max_inflight = 2;
        let l = at(Health::default(), &c.policy);
        assert!(l.full && l.saturated);
        c.policy.max_inflight = 3;
        assert!(!at(Health::default(), &c.policy).full);
    }

    #[test]
    fn a_scrape_counts_only_other_gateways_traffic() {
        let c = crate::testing::config(2);
        // Scraped while this gateway's request ran there; that request has ended since.
        let scraped = |running: f64| Health {
            scraped_ms: 1000,
            scrape: Scrape {
                running,
                own_inflight: 1,
                ..Scrape::default()
            },
            ..Health::default()
        };
        let idle = InFlight::default();
        let l = backend_loads(
            &[idle, idle],
            &[scraped(1.0), scraped(4.0)],
            &[Standing::In, Standing::In],
            1100,
            2000,
            &c.policy,
            None,
        );
        assert_eq!(l[0].load, 0.0, "our finished request is not load");
        assert_eq!(l[1].load, 3.0, "three requests from other gateways are");
    }

    #[test]
    fn the_knee_believes_a_fresh_scrape_that_shows_streams_finished() {
        let c = crate::testing::config(1);
        let knee = Knee {
            requests: Some(2.0),
            ..Knee::default()
        };
        // Two streams in flight here whose clients stopped reading: the pod has finished both.
        let two = InFlight {
            requests: 2,
            ..InFlight::default()
        };
        let scraped = |running: f64, at: u64| Health {
            scraped_ms: at,
            scrape: Scrape {
                running,
                own_inflight: 2,
                ..Scrape::default()
            },
            ..Health::default()
        };
        let at = |h: Health, now: u64| {
            backend_loads(
                &[two],
                &[h],
                &[Standing::In],
                now,
                2000,
                &c.policy,
                Some(&knee),
            )[0]
        };
        assert_eq!(at(scraped(0.0, 1000), 1100).headroom, 2.0);
        // Routing still weighs this gateway's count.
        assert_eq!(at(scraped(0.0, 1000), 1100).load, 2.0);
        // Both still running there, or no fresh scrape: at the knee.
        assert_eq!(at(scraped(2.0, 1000), 1100).headroom, 0.0);
        assert_eq!(at(scraped(0.0, 1000), 5000).headroom, 0.0);
    }
}
