//! The tick's callouts and their replies: Envoy's list of a discovered
//! pool's endpoints (→ the slot table, [`crate::fleet::membership`]) and each
//! pod's `/metrics` (→ its health, gauges and LoRA state, shared with every
//! VM).

use super::Worker;
use crate::config::ENDPOINT_HEADER;
use crate::fleet::health::Outcome;
use crate::fleet::membership::{admin_path, MAX_REPLY_BYTES};
use crate::fleet::scrape::{extract_with_lora, with_capacity};
use crate::host::{Callout, Host};

impl Worker {
    /// Asks Envoy for the pool's endpoints, unless a read is under way.
    pub(super) fn read_members<H: Host>(&mut self, host: &H, now: u64) {
        let cfg = self.router.config();
        let Some(pool) = &cfg.pool else { return };
        let lost_after = cfg.metrics.timeout_ms + cfg.metrics.period_ms;
        if self
            .members_call
            .is_some_and(|(_, since)| now.saturating_sub(since) <= lost_after)
        {
            return;
        }
        let names: Vec<&str> = pool.clusters.iter().map(|c| c.name.as_str()).collect();
        let path = admin_path(&names);
        let call = Callout {
            cluster: &pool.admin_cluster,
            headers: vec![
                (":method", "GET"),
                (":path", &path),
                (":authority", "envoy-admin"),
            ],
            timeout_ms: cfg.metrics.timeout_ms,
        };
        self.members_call = match host.dispatch(&call) {
            Ok(token) => Some((token, now)),
            Err(e) => {
                self.members_failed(format_args!("not dispatched: {e:?}"));
                None
            }
        };
    }

    /// Envoy's answer to [`Worker::read_members`].
    pub(super) fn on_members<H: Host>(&mut self, host: &H, num_headers: usize, body_size: usize) {
        let status = (num_headers > 0).then(|| host.callout_status()).flatten();
        if status.as_deref() != Some("200") {
            let status = status.unwrap_or_else(|| "none".into());
            return self.members_failed(format_args!("admin status {status}"));
        }
        // An Envoy that ignores `filter` answers with every cluster: past the bound,
        // not worth copying in.
        if body_size > MAX_REPLY_BYTES {
            return self.members_failed(format_args!(
                "admin reply of {body_size} bytes, over {MAX_REPLY_BYTES}: an Envoy older than \
                 1.38 lists every cluster; use Envoy 1.38 or later, fewer clusters on this \
                 gateway (Istio: a Sidecar's egress or exportTo), or a fixed backends list"
            ));
        }
        let body = host.callout_body(body_size).unwrap_or_default();
        match self.router.members_reply(host, &body, host.now_ms()) {
            Ok(Ok(changes)) => {
                self.members_ok = true;
                for (b, address) in &changes.left {
                    log::info!("warmroute: pod {address} left the pool (slot pod-{b})");
                    self.scheduler.forget(*b);
                }
                for (b, address) in &changes.joined {
                    log::info!("warmroute: pod {address} joined the pool as slot pod-{b}");
                    self.scheduler.forget(*b);
                }
                if changes.other_clusters > 0 && !self.unfiltered_logged {
                    self.unfiltered_logged = true;
                    log::info!(
                        "warmroute: Envoy's admin ignores /clusters?filter= (Envoy older than \
                         1.38): reading every cluster's list ({body_size} bytes, {} other \
                         clusters) at each tick, up to {} bytes",
                        changes.other_clusters,
                        crate::fleet::membership::MAX_REPLY_BYTES
                    );
                }
                if changes.unplaced > 0 {
                    log::warn!(
                        "warmroute: {} pods left out: all {} slots are taken (pool.max_backends)",
                        changes.unplaced,
                        self.router.fleet().slot_count()
                    );
                }
            }
            Ok(Err(e)) => self.members_failed(format_args!("unusable admin reply: {e:?}")),
            Err(e) => self.members_failed(format_args!("slot table not written: {e:?}")),
        }
    }

    /// A read of the pool's endpoints failed: members stay as they were.
    pub(super) fn members_failed(&mut self, why: std::fmt::Arguments<'_>) {
        if std::mem::take(&mut self.members_ok) {
            log::warn!("warmroute: pool endpoints not read ({why}); keeping the last members");
        } else {
            log::debug!("warmroute: pool endpoints not read ({why})");
        }
    }

    /// Dispatches the scrapes that are due (this VM holds the lease).
    pub(super) fn scrape<H: Host>(&mut self, host: &H, now: u64) {
        let m = &self.router.config().metrics;
        let lost_after = m.timeout_ms + m.period_ms;
        let due = self.scheduler.due(now, lost_after);
        for b in due.lost {
            self.scraped(host, b, Outcome::Slow, now);
        }
        for b in due.scrape {
            let cfg = self.router.config();
            let Some(backend) = self.router.fleet().backend(b) else {
                continue;
            };
            let call = Callout {
                cluster: &cfg.metrics.cluster,
                headers: vec![
                    (":method", "GET"),
                    (":path", &backend.metrics_path),
                    (":authority", &backend.host),
                    (ENDPOINT_HEADER, &backend.address),
                ],
                timeout_ms: cfg.metrics.timeout_ms,
            };
            match host.dispatch(&call) {
                Ok(token) => self.scheduler.dispatched(b, token, now),
                Err(e) => {
                    log::debug!(
                        "warmroute: scrape of {} not dispatched: {e:?}",
                        backend.name
                    );
                    self.scraped(host, b, Outcome::Failed, now);
                }
            }
        }
    }

    /// A callout reply (`num_headers == 0`: Envoy failed or timed it out).
    pub fn on_scrape<H: Host>(
        &mut self,
        host: &H,
        token: u32,
        num_headers: usize,
        body_size: usize,
    ) {
        if self.on_peer_reply(host, token, num_headers, body_size) {
            return;
        }
        if self.members_call.is_some_and(|(t, _)| t == token) {
            self.members_call = None;
            return self.on_members(host, num_headers, body_size);
        }
        let Some((b, sent_ms)) = self.scheduler.completed(token) else {
            return;
        };
        let now = host.now_ms();
        let mut lora_seen = None;
        let status = (num_headers > 0).then(|| host.callout_status()).flatten();
        let cfg = &self.router.config().metrics;
        let outcome = match status.as_deref() {
            Some("200") => host
                .callout_body(body_size)
                .map_or(Outcome::Failed, |body| {
                    let (sc, lora) = extract_with_lora(
                        &String::from_utf8_lossy(&body),
                        &cfg.names,
                        cfg.model_name.as_deref(),
                    );
                    let mut sc = with_capacity(sc, cfg.capacity_tokens);
                    lora_seen = Some(lora);
                    // What the scrape counts of this gateway's own traffic (see `load`).
                    let inflight = self.router.fleet().inflight(host).unwrap_or_default();
                    sc.own_inflight = inflight.get(b).map_or(0, |f| f.requests);
                    Outcome::Answered(sc)
                }),
            // Envoy answers a callout past its timeout with its own 504 (or, on some
            // paths, no headers at all); either one that lasted the whole timeout (less
            // a tenth, for the clock's granularity) timed out.
            Some("504") | None
                if now.saturating_sub(sent_ms) >= cfg.timeout_ms - cfg.timeout_ms / 10 =>
            {
                Outcome::Slow
            }
            _ => Outcome::Failed,
        };
        if let Some(lora) = lora_seen {
            if let Err(e) = self.router.fleet_mut().record_lora(host, b, lora) {
                log::debug!("warmroute: LoRA state not shared: {e:?}");
            }
        }
        self.scraped(host, b, outcome, now);
    }

    /// Records a scrape's outcome: stats, shared health, and a log line when
    /// the backend leaves or rejoins the rotation.
    pub(super) fn scraped<H: Host>(&mut self, host: &H, b: usize, outcome: Outcome, now: u64) {
        self.stats.scraped(&outcome);
        // This VM holds the scrape lease, so its own view is the last health written.
        let was_down = self.router.fleet().health().get(b).map(|x| x.down);
        let result = self
            .router
            .update_fleet(|f| f.record_scrape(host, b, outcome, now));
        let name = self
            .router
            .fleet()
            .backend(b)
            .map_or("", |x| x.name.as_str());
        match result {
            Ok(h) if h.down && was_down == Some(false) => {
                log::warn!(
                    "warmroute: backend {name} out of rotation after {} failed scrapes",
                    h.failures
                )
            }
            Ok(h) if !h.down && was_down == Some(true) => {
                log::info!(
                    "warmroute: backend {name} back in rotation after {} good scrapes",
                    h.successes
                )
            }
            Ok(_) => {}
            Err(e) => log::debug!("warmroute: health update for {name} lost: {e:?}"),
        }
    }
}
