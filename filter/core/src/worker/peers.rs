//! The worker's side of the exchange between gateway replicas
//! ([`crate::routing::exchange`]): a peer's request answered from this VM's
//! outbox, and, in the VM holding the scrape lease, the peers cluster's
//! endpoints read from Envoy and each peer pulled at the tick.

use super::Worker;
use crate::config::ENDPOINT_HEADER;
use crate::fleet::membership::{admin_path, parse_endpoints};
use crate::fleet::responses::bucket_capacity;
use crate::host::{Callout, Host};
use crate::routing::exchange::{
    answers_of, bytes_of, ring_share, since_of, Pulled, MEMBERS_EVERY_MS,
};
use crate::worker::Step;

const OCTETS: (&str, &str) = ("content-type", "application/octet-stream");

impl Worker {
    /// A request for this replica's events (its path is the peers'): answered
    /// only on the peer listener's port, 404 on every other (a client's).
    pub(super) fn serve_peer<H: Host>(&mut self, host: &H, path: &str) -> Step {
        let Some(p) = self.router.config().peers.clone() else {
            return Step::Continue;
        };
        let replica = self.replica;
        let reply = if host.local_port() != Some(p.port) {
            host.send_response(404, &[OCTETS], b"")
        } else {
            match self.router.serve_peer(
                host,
                replica,
                (since_of(path), answers_of(path)),
                (bytes_of(path), p.max_reply_bytes),
            ) {
                Ok(body) => {
                    self.stats.peer_served();
                    host.send_response(200, &[OCTETS], &body)
                }
                Err(e) => {
                    log::debug!("warmroute: a peer's pull not served: {e:?}");
                    host.send_response(503, &[OCTETS], b"")
                }
            }
        };
        match reply {
            Ok(()) => Step::Replied,
            Err(e) => {
                log::warn!("warmroute: could not answer a peer: {e:?}");
                Step::Continue
            }
        }
    }

    /// At the tick, in the VM holding the lease: reads the peers cluster's
    /// endpoints and pulls every peer that has no pull under way.
    pub(super) fn pull_peers<H: Host>(&mut self, host: &H, now: u64) {
        let Some(p) = self.router.config().peers.clone() else {
            return;
        };
        let Some(peers) = &mut self.peers else { return };
        let lost_after = p.timeout_ms + self.router.config().metrics.period_ms;
        let stale = peers
            .members_read_ms
            .is_none_or(|at| now.saturating_sub(at) >= MEMBERS_EVERY_MS);
        if stale
            && peers
                .members_call
                .is_none_or(|(_, sent)| now.saturating_sub(sent) > lost_after)
        {
            let path = admin_path(&[p.cluster.as_str()]);
            let call = Callout {
                cluster: &p.admin_cluster,
                headers: vec![
                    (":method", "GET"),
                    (":path", &path),
                    (":authority", "envoy-admin"),
                ],
                timeout_ms: p.timeout_ms,
            };
            peers.members_call = host.dispatch(&call).ok().map(|t| (t, now));
        }
        let shape = self.router.fleet().store(host).keys.log_shape();
        let (_, bytes) = ring_share(shape, peers.count());
        let with_answers = bucket_capacity(self.router.config().responses.max_entries) > 0;
        for (address, path) in
            peers.due(now, lost_after, bytes.min(p.max_reply_bytes), with_answers)
        {
            let call = Callout {
                cluster: &p.cluster,
                headers: vec![
                    (":method", "GET"),
                    (":path", &path),
                    (":authority", "warmroute-peer"),
                    (ENDPOINT_HEADER, &address),
                ],
                timeout_ms: p.timeout_ms,
            };
            match host.dispatch(&call) {
                Ok(token) => peers.dispatched(&address, token, now),
                Err(e) => {
                    self.stats.peer_pulled(false);
                    log::debug!("warmroute: pull of peer {address} not dispatched: {e:?}");
                }
            }
        }
    }

    /// A callout reply, if it is one of the exchange's (true: handled).
    pub(super) fn on_peer_reply<H: Host>(
        &mut self,
        host: &H,
        token: u32,
        num_headers: usize,
        body_size: usize,
    ) -> bool {
        let Some(p) = self.router.config().peers.clone() else {
            return false;
        };
        let Some(peers) = &mut self.peers else {
            return false;
        };
        let ok = num_headers > 0 && host.callout_status().as_deref() == Some("200");
        if peers.members_call.is_some_and(|(t, _)| t == token) {
            peers.members_call = None;
            let body = ok.then(|| host.callout_body(body_size)).flatten();
            match body
                .as_deref()
                .map(|b| parse_endpoints(b, &[p.cluster.as_str()]))
            {
                Some(Ok((endpoints, _))) => {
                    peers.members_read_ms = Some(host.now_ms());
                    peers.set_members(
                        endpoints
                            .into_iter()
                            .filter(|e| e.routable)
                            .map(|e| e.address)
                            .collect(),
                    )
                }
                _ => log::debug!("warmroute: the peers' endpoints not read; keeping the last"),
            }
            return true;
        }
        if !peers.is_pull(token) {
            return false;
        }
        let body = (ok && body_size <= p.max_reply_bytes)
            .then(|| host.callout_body(body_size))
            .flatten();
        let now = host.now_ms();
        match peers.answered(token, body.as_deref(), now) {
            Pulled::Events(batch) => {
                let capacity = bucket_capacity(self.router.config().responses.max_entries);
                let shape = self.router.fleet().store(host).keys.log_shape();
                let (slots, _) = ring_share(shape, peers.count());
                let imported = self
                    .router
                    .import_peer(host, &batch, now, (capacity, slots));
                self.stats.peer_pulled(true);
                self.stats.peer_imported(imported);
                let loads = peers.loads(now, self.router.fleet().lease_ms());
                if let Err(e) = self.router.record_peer_loads(host, &loads, now) {
                    log::debug!("warmroute: the peers' load not shared: {e:?}");
                }
            }
            Pulled::Me => {}
            Pulled::Failed => self.stats.peer_pulled(false),
        }
        true
    }
}
