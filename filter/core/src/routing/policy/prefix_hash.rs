//! `prefix_hash`: rendezvous order on the prompt's anchor; the first eligible
//! pod (bounded-load spillover), else the least loaded. The bound is over
//! requests: over work, one agent step's prompt still prefilling pushed that
//! agent's next steps off their pod and cost agent hit rate, even with a
//! request's weight capped (see [`crate::routing::work`]).

use super::{Chooser, Decision, Reason, RequestKey};
use crate::hash::rendezvous;

impl Chooser<'_> {
    pub(super) fn prefix_hash(
        &self,
        req: &RequestKey<'_>,
        healthy: &[usize],
        cap: f64,
    ) -> Option<Decision> {
        let order = rendezvous(req.anchor, self.ids, healthy.iter().copied());
        let owner = *order.first()?;
        let (b, reason) = match order.iter().copied().find(|&b| self.eligible(b, cap)) {
            Some(b) if b == owner => (b, Reason::Placed),
            Some(b) => (b, Reason::Spillover),
            None => (self.least_loaded(healthy, req.random)?, Reason::Spillover),
        };
        Some(self.finish(b, req.anchor, req.matched_on(b), reason))
    }
}
