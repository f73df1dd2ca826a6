//! `sticky_session`: rendezvous on the session id over the healthy pods, so a
//! dead pod's sessions move, and only those; a request without a session goes
//! round robin.

use super::{Chooser, Decision, Reason, RequestKey};
use crate::hash::rendezvous;

impl Chooser<'_> {
    pub(super) fn sticky_session(
        &self,
        req: &RequestKey<'_>,
        healthy: &[usize],
    ) -> Option<Decision> {
        match req.session {
            Some(s) => {
                let b = *rendezvous(s, self.ids, healthy.iter().copied()).first()?;
                Some(self.finish(b, s, req.matched_on(b), Reason::Sticky))
            }
            None => self.round_robin(req, healthy),
        }
    }
}
