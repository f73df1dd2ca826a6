//! The worker's tick: the ledger's heartbeat and releases, the fleet's
//! slow records re-read, the index aged, and, in the VM holding the scrape
//! lease, the pool's endpoints read and the scrapes that are due sent
//! ([`super::callouts`]). With a gate, the gate's check runs at every tick.

use super::Worker;
use crate::fleet::view::Standing;
use crate::host::Host;
use crate::routing::exchange::Peers;

impl Worker {
    /// The root context's tick: flushes stats; writes pending releases and this
    /// VM's heartbeat, and takes back silent VMs' in-flight shares; ages the
    /// index, re-reads the slot table and health, refreshes the gauges and, in
    /// the VM holding the lease, reads the pool's endpoints from Envoy and
    /// dispatches the scrapes that are due.
    ///
    /// With a gate, the tick runs every `gate.check_ms`: the rest of the work
    /// every `metrics.period_ms` (within half a check), the gate's check
    /// ([`Worker::check_gate`]) every time, last.
    pub fn tick<H: Host>(&mut self, host: &H) {
        let now = host.now_ms();
        let half_check = self.router.config().gate.as_ref().map(|g| g.check_ms / 2);
        let due = half_check.is_none_or(|half| now.saturating_add(half) >= self.next_tick_ms);
        if due {
            self.next_tick_ms = now.saturating_add(self.router.config().metrics.period_ms);
            self.periodic(host, now);
        }
        if self.holding.is_some() {
            self.check_gate(host, now);
        }
    }

    fn periodic<H: Host>(&mut self, host: &H, now: u64) {
        self.stats.flush(host);
        let inflight = self
            .router
            .fleet_mut()
            .tick_ledger(host, now)
            .unwrap_or_else(|e| {
                log::debug!("warmroute: in-flight releases wait for the next tick: {e:?}");
                self.router.fleet().inflight(host).unwrap_or_default()
            });
        self.router.expire(now);
        if self.router.config().peers.is_some() {
            match self.router.catch_up(host) {
                Ok(gap) => self.stats.log_read(gap),
                Err(e) => log::debug!("warmroute: the index log not read at the tick: {e:?}"),
            }
        }
        match self.router.fleet().sweep_fleets(host, now) {
            Ok(gone) => gone.iter().for_each(|id| {
                log::info!(
                    "warmroute: emptied the shared data of fleet {id:016x}, silent since long"
                )
            }),
            Err(e) => log::debug!("warmroute: fleet registry not updated: {e:?}"),
        }
        if let Err(e) = self.router.fleet_mut().publish_served(host) {
            log::debug!("warmroute: answered-request times not shared: {e:?}");
        }
        match self.router.refresh_members(host) {
            Ok(changed) => changed.into_iter().for_each(|b| self.scheduler.forget(b)),
            Err(e) => log::debug!("warmroute: slot table not refreshed: {e:?}"),
        }
        if let Err(e) = self.router.update_fleet(|f| f.refresh_health(host)) {
            log::debug!("warmroute: health not refreshed: {e:?}");
        }
        if let Err(e) = self.router.fleet_mut().refresh_lora(host) {
            log::debug!("warmroute: LoRA state not refreshed: {e:?}");
        }
        let in_rotation: Vec<bool> = self
            .router
            .fleet()
            .standing(now)
            .into_iter()
            .map(|s| s == Standing::In)
            .collect();
        self.stats.gauges(host, &inflight, &in_rotation);
        let capacity: Vec<Option<u64>> = self
            .router
            .fleet()
            .health()
            .iter()
            .map(|h| h.scrape.capacity_tokens)
            .collect();
        self.stats
            .index_gauges(host, &capacity, self.router.bytes_per_token());
        let cfg = self.router.config();
        if !cfg.metrics.enabled && cfg.pool.is_none() && cfg.peers.is_none() {
            return;
        }
        let vm = self.router.fleet().vm_id();
        if !self
            .router
            .fleet()
            .store(host)
            .try_lease(vm, 3 * cfg.metrics.period_ms)
            .unwrap_or(false)
        {
            self.scheduler.reset();
            self.members_call = None;
            if let Some(p) = &mut self.peers {
                *p = Peers::new(self.replica);
            }
            return;
        }
        self.read_members(host, now);
        if self.router.config().metrics.enabled {
            self.scrape(host, now);
        }
        self.pull_peers(host, now);
    }

    /// The VM is going away (reconfiguration, drain): what waits for the tick goes now.
    pub fn on_done<H: Host>(&mut self, host: &H) {
        self.release_all(host);
        self.stats.flush(host);
        if let Err(e) = self.router.fleet_mut().flush_releases(host) {
            log::warn!("warmroute: in-flight releases lost at shutdown: {e:?}");
        }
    }
}
