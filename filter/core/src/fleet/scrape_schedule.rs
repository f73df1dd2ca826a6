//! When each backend's `/metrics` is due: the tick's scrape state machine.
//!
//! Per backend: idle → pending(token, since) → idle. Every reply, failure or
//! timeout clears `pending`; a reply that never comes (lost callout) is given
//! up after `timeout + period` and counted as slow, so the backend is scraped
//! again on a later tick. One VM per Envoy holds a lease in shared
//! data and is the only one that scrapes; the others only read the snapshot.
//! What a reply does to health is [`crate::fleet::health`]'s job.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pending {
    token: u32,
    since_ms: u64,
}

/// Scrape bookkeeping of one VM.
#[derive(Debug, Clone, Default)]
pub struct Scheduler {
    pending: Vec<Option<Pending>>,
}

/// What the tick should do now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Due {
    /// Backends to scrape.
    pub scrape: Vec<usize>,
    /// Backends whose previous scrape got no reply in time (a failure).
    pub lost: Vec<usize>,
}

impl Scheduler {
    /// Bookkeeping for `n` backends.
    pub fn new(n: usize) -> Scheduler {
        Scheduler {
            pending: vec![None; n],
        }
    }

    /// Idle backends are due; pending ones older than `lost_after_ms` are lost (and due).
    pub fn due(&mut self, now_ms: u64, lost_after_ms: u64) -> Due {
        let mut due = Due::default();
        for (b, p) in self.pending.iter_mut().enumerate() {
            match p {
                None => due.scrape.push(b),
                Some(q) if now_ms.saturating_sub(q.since_ms) > lost_after_ms => {
                    *p = None;
                    due.lost.push(b);
                    due.scrape.push(b);
                }
                Some(_) => {}
            }
        }
        due
    }

    /// A callout for `backend` was dispatched with `token`.
    pub fn dispatched(&mut self, backend: usize, token: u32, now_ms: u64) {
        if let Some(p) = self.pending.get_mut(backend) {
            *p = Some(Pending {
                token,
                since_ms: now_ms,
            });
        }
    }

    /// The callout `token` finished; returns its backend and when it was sent.
    pub fn completed(&mut self, token: u32) -> Option<(usize, u64)> {
        let b = self
            .pending
            .iter()
            .position(|p| p.is_some_and(|q| q.token == token))?;
        let since = self.pending[b].take().map_or(0, |p| p.since_ms);
        Some((b, since))
    }

    /// Forgets a pending scrape of `backend` (its slot now stands for another pod).
    pub fn forget(&mut self, backend: usize) {
        if let Some(p) = self.pending.get_mut(backend) {
            *p = None;
        }
    }

    /// Forgets everything pending (lease lost).
    pub fn reset(&mut self) {
        self.pending.iter_mut().for_each(|p| *p = None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn pending_blocks_rescrape_until_reply_or_loss() {
        let mut s = Scheduler::new(2);
        assert_eq!(s.due(0, 900).scrape, vec![0, 1]);
        s.dispatched(0, 7, 0);
        s.dispatched(1, 8, 0);
        assert_eq!(s.due(500, 900), Due::default());
        assert_eq!(s.completed(7), Some((0, 0)));
        assert_eq!(s.completed(7), None);
        let d = s.due(1000, 900);
        assert_eq!(d.scrape, vec![0, 1]);
        assert_eq!(d.lost, vec![1]);
    }
}
