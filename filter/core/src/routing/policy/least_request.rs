//! `least_request`: least work in flight among the healthy pods that are not
//! saturated (all of them when every one is); ties at random. Work, not
//! request count: a pod prefilling one huge prompt is busier than one serving
//! a short chat ([`crate::routing::work`]).

use super::{Chooser, Decision, Reason, RequestKey};

impl Chooser<'_> {
    pub(super) fn least_request(
        &self,
        req: &RequestKey<'_>,
        healthy: &[usize],
    ) -> Option<Decision> {
        let open: Vec<usize> = healthy
            .iter()
            .copied()
            .filter(|&b| !self.loads[b].saturated)
            .collect();
        let among = if open.is_empty() { healthy } else { &open };
        let b = self.least_work(among, req.random)?;
        Some(self.finish(b, req.random, req.matched_on(b), Reason::LeastLoaded))
    }
}
