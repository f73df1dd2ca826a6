//! Per-backend load: scraped metrics, health, and the filter's own in-flight count.
//!
//! ## How load is weighed (used by every load-aware strategy)
//! ```text
//! load_b      = inflight_b + max(0, running_b + waiting_b − own_b)   (scrape fresh)
//!             = inflight_b                                          (no fresh scrape)
//! saturated_b = waiting_b >= max_waiting  ∨  kv_usage_b >= max_kv_usage
//!               ∨ (max_inflight > 0 ∧ inflight_b >= max_inflight)
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
//! saturation, not just load. A snapshot older than `stale_after_ms` is
//! ignored: no metrics degrades to in-flight accounting, never to an outage.

use crate::config::{MetricNames, PolicyConfig};
use crate::prometheus::{self, Sample};

/// What one scrape of a backend said.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Scrape {
    /// Requests in the running batch.
    pub running: f64,
    /// Requests queued.
    pub waiting: f64,
    /// KV cache usage, 0..1.
    pub kv_usage: f64,
    /// KV capacity in tokens, from `vllm:cache_config_info`.
    pub capacity_tokens: Option<u64>,
    /// Prefix cache hits (tokens), cumulative.
    pub prefix_hits: f64,
    /// Prefix cache queries (tokens), cumulative.
    pub prefix_queries: f64,
    /// Lines that did not parse.
    pub garbage: u32,
    /// This gateway's in-flight requests on the backend when the scrape answered.
    pub own_inflight: u32,
}

/// The first configured name present wins; label sets are summed, or only the
/// configured `model_name` is taken.
fn pick(samples: &[Sample<'_>], names: &[String], model: Option<&str>, max: bool) -> Option<f64> {
    names.iter().find_map(|n| {
        let mut found = None;
        for s in samples.iter().filter(|s| s.name == n) {
            if let Some(m) = model {
                if s.label("model_name").as_deref() != Some(m) {
                    continue;
                }
            }
            let v = if s.value.is_finite() { s.value } else { 0.0 };
            found = Some(match found {
                None => v,
                Some(f) if max => f64::max(f, v),
                Some(f) => f + v,
            });
        }
        found
    })
}

/// Extracts a [`Scrape`] from Prometheus text.
pub fn extract(text: &str, names: &MetricNames, model: Option<&str>) -> Scrape {
    let mut samples = Vec::new();
    let stats = prometheus::parse(text, |s| {
        if s.name.starts_with("vllm:")
            || s.name.starts_with("sglang:")
            || names_contain(names, s.name)
        {
            samples.push(s)
        }
    });
    let capacity_tokens = samples
        .iter()
        .find(|s| s.name == "vllm:cache_config_info")
        .and_then(|s| {
            let blocks: u64 = s.label("num_gpu_blocks")?.parse().ok()?;
            let size: u64 = s.label("block_size")?.parse().ok()?;
            blocks.checked_mul(size)
        });
    let counter = |n: &str| pick(&samples, &[n.to_string()], model, false).unwrap_or(0.0);
    Scrape {
        running: pick(&samples, &names.running, model, false)
            .unwrap_or(0.0)
            .max(0.0),
        waiting: pick(&samples, &names.waiting, model, false)
            .unwrap_or(0.0)
            .max(0.0),
        kv_usage: pick(&samples, &names.kv_usage, model, true)
            .unwrap_or(0.0)
            .clamp(0.0, 1.0),
        capacity_tokens,
        prefix_hits: counter("vllm:prefix_cache_hits_total"),
        prefix_queries: counter("vllm:prefix_cache_queries_total"),
        garbage: stats.garbage.min(u32::MAX as usize) as u32,
        own_inflight: 0,
    }
}

fn names_contain(names: &MetricNames, n: &str) -> bool {
    [&names.running, &names.waiting, &names.kv_usage]
        .iter()
        .any(|l| l.iter().any(|x| x == n))
}

/// What the tick knows of one backend (shared by all workers).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Health {
    /// Last good scrape, host ms (0 = never).
    pub scraped_ms: u64,
    /// Consecutive failed scrapes.
    pub failures: u32,
    /// Whether the backend is out of rotation.
    pub down: bool,
    /// Last good scrape.
    pub scrape: Scrape,
}

const HEALTH_LEN: usize = 8 + 4 + 1 + 8 * 6 + 4 + 4;

/// Encodes every backend's health for shared data.
pub fn encode_health(all: &[Health]) -> Vec<u8> {
    let mut out = Vec::with_capacity(all.len() * HEALTH_LEN);
    for h in all {
        out.extend_from_slice(&h.scraped_ms.to_le_bytes());
        out.extend_from_slice(&h.failures.to_le_bytes());
        out.push(h.down as u8);
        let s = &h.scrape;
        for v in [
            s.running,
            s.waiting,
            s.kv_usage,
            s.capacity_tokens.map_or(-1.0, |c| c as f64),
            s.prefix_hits,
            s.prefix_queries,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&s.garbage.to_le_bytes());
        out.extend_from_slice(&s.own_inflight.to_le_bytes());
    }
    out
}

/// Decodes health for `n` backends; a mismatched blob (another fleet) reads as "no data".
pub fn decode_health(bytes: &[u8], n: usize) -> Vec<Health> {
    if bytes.len() != n * HEALTH_LEN {
        return vec![Health::default(); n];
    }
    bytes
        .chunks_exact(HEALTH_LEN)
        .map(|c| {
            let f = |at: usize| {
                c.get(at..at + 8)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0.0, f64::from_le_bytes)
            };
            let u64_ = c
                .get(0..8)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u64::from_le_bytes);
            let u32_ = |at: usize| {
                c.get(at..at + 4)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, u32::from_le_bytes)
            };
            let cap = f(13 + 24);
            Health {
                scraped_ms: u64_,
                failures: u32_(8),
                down: c.get(12) == Some(&1),
                scrape: Scrape {
                    running: f(13),
                    waiting: f(21),
                    kv_usage: f(29),
                    capacity_tokens: (cap >= 0.0).then_some(cap as u64),
                    prefix_hits: f(45),
                    prefix_queries: f(53),
                    garbage: u32_(61),
                    own_inflight: u32_(65),
                },
            }
        })
        .collect()
}

/// What this gateway's workers sent one backend and have not seen answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InFlight {
    /// Requests not finished.
    pub requests: u32,
    /// Prompt blocks not yet prefilled (released at the first response byte).
    pub prefill_blocks: u32,
}

impl InFlight {
    /// Adds `d`, each field saturating at 0.
    pub fn apply(&mut self, d: Delta) {
        self.requests = self.requests.saturating_add_signed(d.requests);
        self.prefill_blocks = self.prefill_blocks.saturating_add_signed(d.prefill_blocks);
    }
}

/// A change to one backend's [`InFlight`] record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Delta {
    /// Change in requests.
    pub requests: i32,
    /// Change in prompt blocks waiting for prefill.
    pub prefill_blocks: i32,
}

impl Delta {
    /// One more or one fewer request, and nothing else.
    pub const fn requests(requests: i32) -> Delta {
        Delta {
            requests,
            prefill_blocks: 0,
        }
    }

    /// Prompt blocks waiting for prefill, and nothing else.
    pub const fn prefill(prefill_blocks: i32) -> Delta {
        Delta {
            requests: 0,
            prefill_blocks,
        }
    }
}

impl std::ops::AddAssign for Delta {
    fn add_assign(&mut self, d: Delta) {
        self.requests = self.requests.saturating_add(d.requests);
        self.prefill_blocks = self.prefill_blocks.saturating_add(d.prefill_blocks);
    }
}

impl std::ops::Neg for Delta {
    type Output = Delta;
    fn neg(self) -> Delta {
        Delta {
            requests: -self.requests,
            prefill_blocks: -self.prefill_blocks,
        }
    }
}

const INFLIGHT_LEN: usize = 8;

/// Bytes [`encode_inflight`] writes for `n` backends.
pub const fn inflight_len(n: usize) -> usize {
    n * INFLIGHT_LEN
}

/// Appends every backend's in-flight record, as shared data holds it, to `out`.
pub fn encode_inflight(all: &[InFlight], out: &mut Vec<u8>) {
    for f in all {
        out.extend_from_slice(&f.requests.to_le_bytes());
        out.extend_from_slice(&f.prefill_blocks.to_le_bytes());
    }
}

/// Decodes `n` in-flight records; None for a blob of another length (another layout).
pub fn decode_inflight(bytes: &[u8], n: usize) -> Option<Vec<InFlight>> {
    let word = |c: &[u8], at: usize| {
        c.get(at..at + 4)
            .and_then(|w| w.try_into().ok())
            .map_or(0, u32::from_le_bytes)
    };
    (bytes.len() == inflight_len(n)).then(|| {
        bytes
            .chunks_exact(INFLIGHT_LEN)
            .map(|c| InFlight {
                requests: word(c, 0),
                prefill_blocks: word(c, 4),
            })
            .collect()
    })
}

/// The load picture of one backend at decision time.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BackendLoad {
    /// In rotation.
    pub healthy: bool,
    /// Requests, per the formula at the top of this module.
    pub load: f64,
    /// Not eligible for cache affinity or bounded-load placement.
    pub saturated: bool,
    /// Prompt blocks queued for prefill ahead of a new request.
    pub prefill: f64,
}

/// Combines in-flight counts and health into per-backend load.
pub fn backend_loads(
    inflight: &[InFlight],
    health: &[Health],
    now_ms: u64,
    stale_after_ms: u64,
    policy: &PolicyConfig,
) -> Vec<BackendLoad> {
    inflight
        .iter()
        .enumerate()
        .map(|(b, f)| {
            let h = health.get(b).copied().unwrap_or_default();
            let fresh = h.scraped_ms > 0 && now_ms.saturating_sub(h.scraped_ms) <= stale_after_ms;
            let inf = f.requests as f64;
            let (load, sat) = if fresh {
                let s = h.scrape;
                (
                    inf + (s.running + s.waiting - s.own_inflight as f64).max(0.0),
                    s.waiting >= policy.max_waiting.max(f64::MIN_POSITIVE)
                        || s.kv_usage >= policy.max_kv_usage,
                )
            } else {
                (inf, false)
            };
            BackendLoad {
                healthy: !h.down,
                load,
                saturated: sat || (policy.max_inflight > 0 && inf >= policy.max_inflight as f64),
                prefill: f.prefill_blocks as f64,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn cfg() -> Config {
        Config::parse(br#"{"backends":[{"name":"a","address":"127.0.0.1:1"},{"name":"b","address":"127.0.0.1:2"}]}"#)
            .unwrap()
    }

    #[test]
    fn extracts_vllm_and_sums_label_sets() {
        let c = cfg();
        let text = "vllm:num_requests_running{model_name=\"a\"} 3\nvllm:num_requests_running{model_name=\"b\"} 4\n\
vllm:num_requests_waiting{model_name=\"a\"} 1\nvllm:gpu_cache_usage_perc{model_name=\"a\"} 0.5\n\
vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1.0\n\
vllm:prefix_cache_hits_total{model_name=\"a\"} 10\nvllm:prefix_cache_queries_total{model_name=\"a\"} 40\n";
        let s = extract(text, &c.metrics.names, None);
        assert_eq!((s.running, s.waiting, s.kv_usage), (7.0, 1.0, 0.5));
        assert_eq!(s.capacity_tokens, Some(16_000));
        assert_eq!((s.prefix_hits, s.prefix_queries), (10.0, 40.0));
        let only_b = extract(text, &c.metrics.names, Some("b"));
        assert_eq!(only_b.running, 4.0);
    }

    #[test]
    fn extracts_sglang_and_newer_name_wins() {
        let c = cfg();
        let s = extract(
            "sglang:num_running_reqs 2\nsglang:num_queue_reqs 5\nsglang:token_usage 0.9\n",
            &c.metrics.names,
            None,
        );
        assert_eq!((s.running, s.waiting, s.kv_usage), (2.0, 5.0, 0.9));
        let both = extract(
            "vllm:kv_cache_usage_perc 0.2\nvllm:gpu_cache_usage_perc 0.7\n",
            &c.metrics.names,
            None,
        );
        assert_eq!(both.kv_usage, 0.2);
    }

    #[test]
    fn health_round_trips_and_rejects_foreign_blobs() {
        let h = vec![
            Health {
                scraped_ms: 5,
                failures: 2,
                down: true,
                scrape: Scrape {
                    running: 1.0,
                    waiting: 2.0,
                    kv_usage: 0.3,
                    capacity_tokens: Some(99),
                    prefix_hits: 4.0,
                    prefix_queries: 8.0,
                    garbage: 1,
                    own_inflight: 3,
                },
            },
            Health::default(),
        ];
        assert_eq!(decode_health(&encode_health(&h), 2), h);
        assert_eq!(
            decode_health(&encode_health(&h), 3),
            vec![Health::default(); 3]
        );
    }

    #[test]
    fn stale_scrapes_are_ignored_and_queues_saturate() {
        let c = cfg();
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
        };
        let at = |now| {
            backend_loads(
                &[one, one],
                &[busy, Health::default()],
                now,
                2000,
                &c.policy,
            )
        };
        let l = at(1500);
        assert_eq!(l[0].load, 16.0);
        assert!(l[0].saturated);
        assert_eq!((l[1].load, l[1].prefill), (1.0, 7.0));
        let stale = at(5000);
        assert_eq!(stale[0].load, 1.0);
        assert!(!stale[0].saturated);
    }

    #[test]
    fn a_scrape_counts_only_other_gateways_traffic() {
        let c = cfg();
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
            1100,
            2000,
            &c.policy,
        );
        assert_eq!(l[0].load, 0.0, "our finished request is not load");
        assert_eq!(l[1].load, 3.0, "three requests from other gateways are");
    }
}
