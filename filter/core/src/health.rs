//! Each backend's health as the scraping VM publishes it to every worker:
//! the last good scrape, and whether the backend is in rotation.
//!
//! ```text
//! good scrape:   scrape := it, scraped_ms := now, failures := 0, down := false
//! failed scrape: failures += 1;  down := failures ≥ unhealthy_after
//! ```
//! `unhealthy_after` consecutive failures take a backend out of rotation (for
//! every strategy); one good scrape brings it back. A failure is a callout
//! that Envoy failed, a status other than 200, or no reply within
//! `timeout + period` ([`crate::scheduler`]).
//!
//! The record every VM reads at its tick is all backends' [`Health`] in one
//! shared-data value, fixed-width fields ([`crate::codec`]); a value of
//! another length (another fleet, another layout) reads as "no data", so a
//! reconfigured fleet starts from scratch rather than from a stranger's state.

use crate::codec::{put, Reader};
use crate::scrape::Scrape;

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

impl Health {
    /// Folds one scrape outcome (`None`: it failed) into this backend's health.
    pub fn record(&mut self, outcome: Option<Scrape>, now_ms: u64, unhealthy_after: u32) {
        match outcome {
            Some(s) => {
                self.scrape = s;
                self.scraped_ms = now_ms.max(1);
                self.failures = 0;
                self.down = false;
            }
            None => {
                self.failures = self.failures.saturating_add(1);
                if self.failures >= unhealthy_after {
                    self.down = true;
                }
            }
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let s = &self.scrape;
        put(out, self.scraped_ms);
        put(out, self.failures);
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
        let (scraped_ms, failures, down) = (r.get()?, r.get()?, r.get::<u8>()? == 1);
        let (running, waiting, kv_usage, cap) = (r.get()?, r.get()?, r.get()?, r.get::<f64>()?);
        Some(Health {
            scraped_ms,
            failures,
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

const HEALTH_LEN: usize = 8 + 4 + 1 + 8 * 4 + 4;

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
    fn failures_take_a_backend_down_and_a_good_scrape_brings_it_back() {
        let mut h = Health::default();
        h.record(None, 10, 2);
        assert!(!h.down);
        h.record(None, 20, 2);
        assert!(h.down);
        h.record(
            Some(Scrape {
                running: 1.0,
                ..Scrape::default()
            }),
            30,
            2,
        );
        assert!(!h.down);
        assert_eq!((h.failures, h.scraped_ms, h.scrape.running), (0, 30, 1.0));
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
            (any::<u64>(), any::<u32>(), any::<bool>(), scrape()).prop_map(|(t, f, d, s)| Health {
                scraped_ms: t,
                failures: f,
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
}
