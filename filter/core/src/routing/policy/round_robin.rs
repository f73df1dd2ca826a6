//! `round_robin`: the healthy pods in turn, by a rotation counter every VM
//! shares (one CAS on it per request), so two workers do not both start at
//! the first pod.

use super::{Chooser, Decision, Reason, RequestKey};

impl Chooser<'_> {
    pub(super) fn round_robin(&self, req: &RequestKey<'_>, healthy: &[usize]) -> Option<Decision> {
        let b = *healthy.get((req.rotation % healthy.len().max(1) as u64) as usize)?;
        Some(self.finish(b, req.rotation, req.matched_on(b), Reason::RoundRobin))
    }
}
