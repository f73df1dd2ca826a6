//! Each backend's health as the scraping VM publishes it to every worker:
//! the last good scrape, and whether the backend is in rotation.
//!
//! ```text
//! answered:  scrape := it, scraped_ms := now, failures := 0, successes += 1
//!            down := down ∧ successes < healthy_after
//! failed:    failures += 1, successes := 0, failed_ms := now
//!            down := down ∨ failures ≥ unhealthy_after
//! slow:      as failed, unless the pod answered routed traffic within
//!            stale_after_ms (then no news)
//! in rotation at t ⇔ ¬down ∨ t − failed_ms > stale_after_ms
//! ```
//! | parameter | default | why |
//! |---|---|---|
//! | `unhealthy_after` | 2 | one lost scrape (a GC pause, a dropped packet) is not an outage |
//! | `healthy_after` | 2 | one good scrape of a flapping pod does not pull traffic back |
//! | `stale_after_ms` | 2000 | a verdict nobody renews expires: a pod marked down while scraping stopped (config change, no VM holding the lease) gets traffic again |
//!
//! A *failed* scrape is a callout Envoy refused or failed early (connection
//! refused, no such endpoint in the scrape cluster), or a status other than
//! 200. A *slow* one timed out or never came back ([`crate::fleet::scrape_schedule`]): a
//! `/metrics` handler that is slow under load says little while the pod keeps
//! answering requests, which is Envoy's own view of it ([`crate::fleet::passive`]).
//!
//! The record every VM reads at its tick is all backends' [`Health`] in one
//! shared-data value, fixed-width fields ([`crate::codec`]); a value of
//! another length (another fleet, another layout) reads as "no data", so a
//! reconfigured fleet starts from scratch rather than from a stranger's state.

use crate::codec::{put, Reader};
use crate::config::MetricsConfig;
use crate::fleet::scrape::Scrape;

/// How one scrape ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// A 200 with metrics.
    Answered(Scrape),
    /// Refused, failed early, or a status other than 200.
    Failed,
    /// Timed out, or no reply at all.
    Slow,
}

/// What the tick knows of one backend (shared by all workers).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Health {
    /// Last good scrape, host ms (0 = never).
    pub scraped_ms: u64,
    /// Last failed scrape, host ms (0 = never).
    pub failed_ms: u64,
    /// Consecutive failed scrapes.
    pub failures: u32,
    /// Consecutive good scrapes.
    pub successes: u32,
    /// Whether the last verdict took the backend out of rotation.
    pub down: bool,
    /// Last good scrape.
    pub scrape: Scrape,
}

impl Health {
    /// Folds one scrape outcome into this backend's health; `serving`: the pod
    /// answered routed traffic within `stale_after_ms`.
    pub fn record(&mut self, outcome: Outcome, now_ms: u64, m: &MetricsConfig, serving: bool) {
        match outcome {
            Outcome::Answered(s) => {
                self.scrape = s;
                self.scraped_ms = now_ms.max(1);
                self.failures = 0;
                self.successes = self.successes.saturating_add(1);
                if self.successes >= m.healthy_after {
                    self.down = false;
                }
            }
            Outcome::Slow if serving => {}
            Outcome::Failed | Outcome::Slow => {
                self.failures = self.failures.saturating_add(1);
                self.successes = 0;
                self.failed_ms = now_ms.max(1);
                if self.failures >= m.unhealthy_after {
                    self.down = true;
                }
            }
        }
    }

    /// Whether the backend is in rotation at `now_ms`: not down, or down on a
    /// verdict older than `stale_after_ms`.
    pub fn in_rotation(&self, now_ms: u64, stale_after_ms: u64) -> bool {
        !self.down || now_ms.saturating_sub(self.failed_ms) > stale_after_ms
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let s = &self.scrape;
        put(out, self.scraped_ms);
        put(out, self.failed_ms);
        put(out, self.failures);
        put(out, self.successes);
        put(out, self.down as u8);
        for v in [
            s.running,
            s.waiting,
            s.kv_usage,
            s.capacity_tokens.map_or(-1.0, |c| c as f64),
        ] {
            put(out, v);
        }
        put(out, s.own_inflight);
    }

    fn decode(record: &[u8]) -> Option<Health> {
        let mut r = Reader::new(record);
        let (scraped_ms, failed_ms) = (r.get()?, r.get()?);
        let (failures, successes, down) = (r.get()?, r.get()?, r.get::<u8>()? == 1);
        let (running, waiting, kv_usage, cap) = (r.get()?, r.get()?, r.get()?, r.get::<f64>()?);
        Some(Health {
            scraped_ms,
            failed_ms,
            failures,
            successes,
            down,
            scrape: Scrape {
                running,
                waiting,
                kv_usage,
                capacity_tokens: (cap >= 0.0).then_some(cap as u64),
                own_inflight: r.get()?,
            },
        })
    }
}

const HEALTH_LEN: usize = 8 + 8 + 4 + 4 + 1 + 8 * 4 + 4;

/// Encodes every backend's health for shared data.
pub fn encode_health(all: &[Health]) -> Vec<u8> {
    let mut out = Vec::with_capacity(all.len() * HEALTH_LEN);
    for h in all {
        h.encode(&mut out);
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
        .map(|c| Health::decode(c).unwrap_or_default())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// A pod down after two failures, whose last scrape said this.
    fn down_pod(kv_usage: f64, capacity_tokens: u64) -> Health {
        Health {
            scraped_ms: 5,
            failed_ms: 6,
            failures: 2,
            successes: 1,
            down: true,
            scrape: Scrape {
                running: 1.0,
                waiting: 2.0,
                kv_usage,
                capacity_tokens: Some(capacity_tokens),
                own_inflight: 3,
            },
        }
    }

    #[test]
    fn health_round_trips_and_rejects_foreign_blobs() {
        let h = vec![down_pod(0.3, 99), Health::default()];
        assert_eq!(decode_health(&encode_health(&h), 2), h);
        assert_eq!(
            decode_health(&encode_health(&h), 3),
            vec![Health::default(); 3]
        );
    }

    fn metrics() -> MetricsConfig {
        crate::testing::config(1).metrics
    }

    fn answered(running: f64) -> Outcome {
        Outcome::Answered(Scrape {
            running,
            ..Scrape::default()
        })
    }

    #[test]
    fn failures_take_a_backend_down_and_good_scrapes_bring_it_back() {
        let m = metrics();
        assert_eq!((m.unhealthy_after, m.healthy_after), (2, 2));
        let mut h = Health::default();
        h.record(Outcome::Failed, 10, &m, false);
        assert!(!h.down);
        h.record(Outcome::Failed, 20, &m, false);
        assert!(h.down && !h.in_rotation(20, m.stale_after_ms));
        // One good scrape of a flapping pod is not enough.
        h.record(answered(1.0), 30, &m, false);
        assert!(h.down);
        h.record(answered(2.0), 40, &m, false);
        assert!(!h.down);
        assert_eq!((h.failures, h.scraped_ms, h.scrape.running), (0, 40, 2.0));
        // A failure in between starts the count again.
        h.record(Outcome::Failed, 50, &m, false);
        h.record(Outcome::Failed, 60, &m, false);
        h.record(answered(1.0), 70, &m, false);
        h.record(Outcome::Failed, 80, &m, false);
        h.record(answered(1.0), 90, &m, false);
        assert!(h.down);
    }

    #[test]
    fn a_slow_scrape_of_a_serving_pod_is_no_news() {
        let m = metrics();
        let mut h = Health::default();
        for t in 1..10 {
            h.record(Outcome::Slow, t * 500, &m, true);
        }
        assert_eq!((h.down, h.failures), (false, 0));
        // Without traffic to vouch for it, slow is as good as failed.
        h.record(Outcome::Slow, 6000, &m, false);
        h.record(Outcome::Slow, 6500, &m, false);
        assert!(h.down);
    }

    #[test]
    fn a_down_verdict_nobody_renews_expires() {
        let m = metrics();
        let mut h = Health::default();
        h.record(Outcome::Failed, 1000, &m, false);
        h.record(Outcome::Failed, 1500, &m, false);
        assert!(!h.in_rotation(1500 + m.stale_after_ms, m.stale_after_ms));
        assert!(h.in_rotation(1501 + m.stale_after_ms, m.stale_after_ms));
        // While scrapes keep failing, the verdict is renewed.
        h.record(Outcome::Failed, 3400, &m, false);
        assert!(!h.in_rotation(3501, m.stale_after_ms));
    }

    #[cfg(not(target_arch = "wasm32"))]
    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn scrape() -> impl Strategy<Value = Scrape> {
            let gauges = (0.0..1e12f64, 0.0..1e12f64, 0.0..=1.0f64);
            let cap = proptest::option::of(0u64..1 << 50);
            (gauges, cap, any::<u32>()).prop_map(|((r, w, kv), cap, own)| Scrape {
                running: r,
                waiting: w,
                kv_usage: kv,
                capacity_tokens: cap,
                own_inflight: own,
            })
        }

        fn health() -> impl Strategy<Value = Health> {
            let times = (any::<u64>(), any::<u64>());
            let counts = (any::<u32>(), any::<u32>());
            (times, counts, any::<bool>(), scrape()).prop_map(|((t, ft), (f, ok), d, s)| Health {
                scraped_ms: t,
                failed_ms: ft,
                failures: f,
                successes: ok,
                down: d,
                scrape: s,
            })
        }

        proptest! {
            #![proptest_config(crate::testing::proptest_config())]

            #[test]
            fn decode_inverts_encode(all in proptest::collection::vec(health(), 0..20)) {
                prop_assert_eq!(decode_health(&encode_health(&all), all.len()), all);
            }
        }
    }

    #[test]
    fn the_record_keeps_its_layout() {
        let h = down_pod(0.5, 4096);
        assert_eq!(
            crate::testing::hex(&encode_health(&[h, Health::default()])),
            "05000000000000000600000000000000020000000100000001000000000000f03f0000000000000040000000000000e03f000000000000b0400300000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000f0bf00000000",
            "health.v2"
        );
    }
}
