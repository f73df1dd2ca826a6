//! `random`: uniform over the healthy pods.

use super::{Chooser, Decision, Reason, RequestKey};

impl Chooser<'_> {
    pub(super) fn random(&self, req: &RequestKey<'_>, healthy: &[usize]) -> Option<Decision> {
        let b = *healthy.get((req.random % healthy.len().max(1) as u64) as usize)?;
        Some(self.finish(b, req.random, req.matched_on(b), Reason::Random))
    }
}
