//! Envoy's own view of each backend: how the requests routed there ended.
//!
//! ```text
//! answered (status < 500, not reset upstream):  errors_b := 0, served_ms_b := now
//! failed   (502, 503, 504, or reset upstream):  errors_b += 1
//! neither  (another 5xx; Envoy's circuit breaker overflowed; the client left)
//!          errors_b ≥ eject_after_errors  ⇒  ejected_until_b := now + stale_after_ms,
//!                                              errors_b := 0
//! in rotation for this worker at t ⇔ t ≥ ejected_until_b
//! settled_b at t ⇔ errors_c = 0 for every c ∧ served_ms_b > 0 ∧ t − served_ms_b ≤ stale_after_ms / 4
//! ```
//! | parameter | default | why |
//! |---|---|---|
//! | `eject_after_errors` | 3 | a pod that fails every request (a wedged engine with a healthy `/metrics`, a dead pod before its scrape fails) leaves after a handful, not after a scrape period |
//! | ejection | `stale_after_ms` | then real traffic probes it again; `0` errors disables ejection |
//!
//! Only upstream faults count, as Envoy's own outlier detection counts gateway
//! failures: a 500 (or 501, 505...) the pod answered may be what a client's
//! request made it say, and a client that sends such requests in a loop must
//! not eject every pod in turn; a reset for `overflow` is Envoy's own circuit
//! breaker refusing to send, whatever the pod's state. A pod whose engine
//! died answers 500 to everything, and fails its scrape (`/metrics`) too.
//! A 504 for the route's own timeout (`upstream_response_timeout`) counts,
//! as Envoy's outlier detection counts it: an engine that stopped
//! scheduling while its API server still answers `/metrics` shows only that
//! way. A timeout below the longest answer a client may ask for would blame
//! healthy pods for long generations, so the shipped routes set none
//! (`timeout: 0s`; `stream_idle_timeout` catches a silent pod).
//!
//! The backend is the one Envoy last sent the request to (`upstream.address`),
//! not the one the filter picked: a retry that succeeded elsewhere says
//! nothing good about the first pod. A request Envoy never sent anywhere (no
//! upstream address, or one outside the fleet) and a client that went away
//! count for no one.
//!
//! Asking Envoy which upstream served is a host call (~2 µs, a tenth of a
//! small request's cost in the filter), so a success on a *settled* chosen
//! pod skips it: with no streak anywhere in this worker, it could clear none
//! (not even on a pod a retry moved the request to), and it would move
//! `served_ms` by at most a quarter of the window it is judged in, which the
//! judges add to their window ([`SERVED_SLACK`]). A pod a retry moved the
//! request to is credited by its own requests instead. Failures are always
//! read.
//!
//! Kept per worker VM, not written per request: a shared write per request
//! would cost more than the signal is worth, and each worker sees its own
//! share of a failing pod's errors within a few requests. Only `served_ms`
//! leaves the VM, at its tick when it changed ([`crate::fleet::store`], `served`):
//! the scraping VM (often the main thread's, which routes nothing) reads it to
//! tell a pod that is slow to report from one that is gone ([`crate::fleet::health`]).

/// How a routed request ended, as far as its backend is to blame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The backend answered (any status below 500).
    Served,
    /// A 502, 503 or 504, or the upstream connection failed or was reset.
    Failed,
}

impl Answer {
    /// Classifies an ended request from its status and Envoy's
    /// `response.code_details`; `None`: not the backend's doing.
    pub fn of(status: Option<u16>, details: Option<&str>) -> Option<Answer> {
        let details = details.unwrap_or_default();
        if details.contains("downstream") || details.contains("overflow") {
            return None;
        }
        if details.contains("upstream_reset") {
            return Some(Answer::Failed);
        }
        match status? {
            502..=504 => Some(Answer::Failed),
            500.. => None,
            _ => Some(Answer::Served),
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Backend {
    errors: u32,
    served_ms: u64,
    ejected_until_ms: u64,
}

/// How far behind a backend's last answer `served_ms` may be, as a share of
/// the window it is judged in: a settled pod's successes are not read.
pub const SERVED_SLACK: u64 = 4;

/// One worker's passive view of every backend.
#[derive(Debug, Clone, Default)]
pub struct Passive {
    backends: Vec<Backend>,
    /// Backends with a failure streak (`errors > 0`).
    streaks: usize,
    /// A backend answered since [`Passive::served_news`] last ran.
    news: bool,
}

impl Passive {
    /// A view of `n` backends, all in rotation.
    pub fn new(n: usize) -> Passive {
        Passive {
            backends: vec![Backend::default(); n],
            streaks: 0,
            news: false,
        }
    }

    /// Folds one ended request into `backend`'s record; returns true when
    /// this answer ejected it.
    pub fn record(
        &mut self,
        backend: usize,
        answer: Answer,
        now_ms: u64,
        eject_after_errors: u32,
        eject_ms: u64,
    ) -> bool {
        let Some(b) = self.backends.get_mut(backend) else {
            return false;
        };
        let streak_before = b.errors > 0;
        let ejected = match answer {
            Answer::Served => {
                b.errors = 0;
                b.served_ms = now_ms.max(1);
                self.news = true;
                false
            }
            Answer::Failed => {
                b.errors = b.errors.saturating_add(1);
                let eject = eject_after_errors > 0 && b.errors >= eject_after_errors;
                if eject {
                    b.errors = 0;
                    b.ejected_until_ms = now_ms.saturating_add(eject_ms);
                }
                eject
            }
        };
        match (streak_before, b.errors > 0) {
            (false, true) => self.streaks += 1,
            (true, false) => self.streaks = self.streaks.saturating_sub(1),
            _ => {}
        }
        ejected
    }

    /// Forgets `backend`'s record: its slot now stands for another pod.
    pub fn forget(&mut self, backend: usize) {
        if let Some(b) = self.backends.get_mut(backend) {
            if b.errors > 0 {
                self.streaks = self.streaks.saturating_sub(1);
            }
            *b = Backend::default();
        }
    }

    /// Whether this worker keeps `backend` out of rotation at `now_ms`.
    pub fn ejected(&self, backend: usize, now_ms: u64) -> bool {
        self.backends
            .get(backend)
            .is_some_and(|b| now_ms < b.ejected_until_ms)
    }

    /// When each backend last answered (0: never), if any did since the last call.
    pub fn served_news(&mut self) -> Option<Vec<u64>> {
        std::mem::take(&mut self.news).then(|| self.backends.iter().map(|b| b.served_ms).collect())
    }

    /// Whether a success on `backend` would change nothing this worker knows
    /// (`settled` above): no failure streak on any backend, and an answer on
    /// this one within `fresh_ms`.
    pub fn settled(&self, backend: usize, now_ms: u64, fresh_ms: u64) -> bool {
        self.streaks == 0
            && self
                .backends
                .get(backend)
                .is_some_and(|b| recent(b.served_ms, now_ms, fresh_ms))
    }

    /// Whether `backend` answered a request within `window_ms` of `now_ms`.
    pub fn served_within(&self, backend: usize, now_ms: u64, window_ms: u64) -> bool {
        self.backends
            .get(backend)
            .is_some_and(|b| recent(b.served_ms, now_ms, window_ms))
    }
}

/// Whether a last-answered time (0: never) falls within `window_ms` of `now_ms`.
pub fn recent(served_ms: u64, now_ms: u64, window_ms: u64) -> bool {
    served_ms > 0 && now_ms.saturating_sub(served_ms) <= window_ms
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn answers_are_classified_by_who_is_to_blame() {
        let cases = [
            (Some(200), Some("via_upstream"), Some(Answer::Served)),
            (Some(404), Some("via_upstream"), Some(Answer::Served)),
            (Some(503), Some("via_upstream"), Some(Answer::Failed)),
            (
                Some(504),
                Some("upstream_response_timeout"),
                Some(Answer::Failed),
            ),
            // What a client's request may make the pod say: neither blame nor credit.
            (Some(500), Some("via_upstream"), None),
            (Some(501), Some("via_upstream"), None),
            // Envoy's own circuit breaker: not the pod.
            (
                Some(503),
                Some("upstream_reset_before_response_started{overflow}"),
                None,
            ),
            (
                Some(503),
                Some("upstream_reset_before_response_started{remote_connection_failure}"),
                Some(Answer::Failed),
            ),
            (
                Some(200),
                Some("upstream_reset_after_response_started{remote_reset}"),
                Some(Answer::Failed),
            ),
            (Some(200), Some("downstream_remote_disconnect"), None),
            (None, None, None),
        ];
        for (status, details, want) in cases {
            assert_eq!(Answer::of(status, details), want, "{status:?} {details:?}");
        }
    }

    #[test]
    fn consecutive_errors_eject_for_a_while_and_an_answer_resets_the_count() {
        let mut p = Passive::new(2);
        assert!(!p.record(0, Answer::Failed, 10, 3, 2000));
        assert!(!p.record(0, Answer::Failed, 11, 3, 2000));
        assert!(!p.record(0, Answer::Served, 12, 3, 2000));
        assert!(!p.record(0, Answer::Failed, 13, 3, 2000));
        assert!(!p.record(0, Answer::Failed, 14, 3, 2000));
        assert!(!p.ejected(0, 14));
        assert!(p.record(0, Answer::Failed, 15, 3, 2000));
        assert!(p.ejected(0, 2014) && !p.ejected(0, 2015));
        assert!(!p.ejected(1, 20));
        // 0 disables ejection; out-of-range backends are ignored.
        for t in 0..10 {
            assert!(!p.record(1, Answer::Failed, t, 0, 2000));
            assert!(!p.record(7, Answer::Failed, t, 3, 2000));
        }
        assert!(!p.ejected(1, 10));
    }

    #[test]
    fn served_within_a_window() {
        let mut p = Passive::new(1);
        assert!(!p.served_within(0, 100, 1000));
        p.record(0, Answer::Served, 100, 3, 2000);
        assert!(p.served_within(0, 1100, 1000) && !p.served_within(0, 1101, 1000));
        assert_eq!(p.served_news(), Some(vec![100]));
        assert_eq!(p.served_news(), None);
    }
}
