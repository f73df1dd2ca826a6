//! One VM's view of the fleet: which pod holds each slot, how each answers
//! (its scraped health and Envoy's own view of its answers), the LoRA
//! adapters it reported, and what this gateway has in flight on it.
//!
//! Every worker VM keeps one. The shared records ([`crate::fleet::store`])
//! are the truth; the view mirrors the slow ones (slot table, health, LoRA
//! state) and re-reads them at the VM's tick, while the VM holding the
//! scrape lease applies its own writes at once: another VM sees a scrape at
//! most one tick late, on top of the scrape period it already waits. The in-flight ledger changes
//! with every request, so it is read per request, as a [`Snapshot`], never
//! mirrored; what this VM's ended requests gave back waits here until the
//! next ledger write carries it (see [`FleetView::release`]).
//!
//! A pod is in rotation when Envoy would route to it (a discovered pool's
//! endpoint health, [`crate::fleet::membership`]) and neither its scraped
//! health nor this VM's view of its answers ([`crate::fleet::passive`])
//! keeps it out. Routing ([`crate::routing`]) reads the view; the view knows
//! nothing of routing: what a slot whose pod changed means for the index is
//! the router's business, from the slots [`FleetView`] says changed.

use crate::config::{Backend, Config, Strategy};
use crate::fleet::health::{Health, Outcome};
use crate::fleet::inflight::{Delta, InFlight};
use crate::fleet::lora::Lora;
use crate::fleet::membership::{parse_endpoints, Changes, ReplyError, Slots};
use crate::fleet::passive::{recent, Answer, Passive, SERVED_SLACK};
use crate::fleet::store::{Accounted, Keys, Ledger, Read, Store, Writer, FLEET_IDLE_MS, PEERS_VM};
use crate::hash::{address_id, mix};
use crate::host::{Host, HostError, Versioned};

/// Where a slot stands in the fleet at decision time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// No pod holds the slot: never routed to.
    Absent,
    /// A member that the health verdicts keep out of rotation (routed to
    /// only when every member is out).
    Out,
    /// A member in rotation.
    In,
}

/// A VM's lease on its in-flight share (see [`crate::fleet::store`],
/// "Self-healing"): three tick periods, at least one second.
pub fn lease_ms(period_ms: u64) -> u64 {
    period_ms.saturating_mul(3).max(1000)
}

/// The fleet's identity: the shared-data key space of everything this
/// configuration's VMs share: a fixed list's addresses, or a discovered pool's
/// cluster and slot count (its members come and go within it). The block size
/// and the log's geometry are part of it: VMs of another shape must not read
/// each other's records.
fn fleet_id(cfg: &Config) -> u64 {
    let fleet = match &cfg.pool {
        Some(p) => p
            .clusters
            .iter()
            .fold(p.max_backends as u64, |h, c| mix(h ^ address_id(&c.name))),
        None => cfg
            .backends
            .iter()
            .fold(0, |h, b| mix(h ^ address_id(&b.address))),
    };
    mix(mix(fleet ^ cfg.block_bytes as u64) ^ cfg.index.log_bytes as u64)
}

fn note_reclaimed(vms: &[u64]) {
    for vm in vms {
        if *vm == PEERS_VM {
            log::info!(
                "warmroute: dropped the other gateway replicas' in-flight share: no pull \
                 renewed it within its lease"
            );
        } else {
            log::info!(
                "warmroute: took back the in-flight share of worker VM {vm}, silent past its lease"
            );
        }
    }
}

/// The fleet as one request sees it: the ledger read once, with this VM's
/// releases the ledger has not heard of applied.
#[derive(Debug)]
pub struct Snapshot {
    /// The ledger as read (`None`: the read failed), to seed the accounting CAS.
    pub ledger: Option<Read<Ledger>>,
    /// What this gateway has in flight per slot.
    pub inflight: Vec<InFlight>,
    /// Where each slot stands at `now`.
    pub standing: Vec<Standing>,
    /// Host time of the read.
    pub now: u64,
}

/// The per-VM view of the fleet (module doc).
pub struct FleetView {
    cfg: Config,
    keys: Keys,
    /// Fleet-unique id of this VM.
    vm_id: u64,
    /// Who holds each slot ([`crate::fleet::membership`]).
    slots: Slots,
    /// Each slot's pod as a backend (name, address, scrape target); `None`: empty.
    backends: Vec<Option<Backend>>,
    /// Each backend's rendezvous id (its address, hashed).
    ids: Vec<u64>,
    /// Each slot's LoRA adapters as last scraped ([`crate::fleet::lora`]).
    lora: Vec<Option<Lora>>,
    /// Some pod declares what it serves or reported an adapter ([`FleetView::model_aware`]).
    model_aware: bool,
    /// Every backend's health as of this VM's last tick (or its own last scrape).
    health: Vec<Health>,
    /// How the requests this VM routed ended, per backend.
    passive: Passive,
    /// What this VM's ended requests gave back, per backend, that the ledger
    /// does not know yet: the next request's ledger write carries it (or the tick).
    unreleased: Vec<Delta>,
    /// Requests this VM routed that have not ended.
    open_requests: u32,
    /// Host time of this VM's last routed request or tick.
    last_now: u64,
    /// Since when the pool's endpoint reads have listed none (`pool.empty_grace_ms`).
    pool_empty_since: Option<u64>,
}

impl FleetView {
    /// The view of `cfg`'s fleet; takes a fleet-unique VM id from shared data
    /// and creates the shared values this configuration uses.
    pub fn new<H: Host>(cfg: Config, host: &H) -> FleetView {
        let keys = Keys::new(fleet_id(&cfg), cfg.index.log_bytes);
        let n = cfg.slot_count();
        let store = Store {
            host,
            keys: &keys,
            n,
        };
        let slots = match cfg.pool {
            Some(_) => store
                .members()
                .ok()
                .flatten()
                .unwrap_or_else(|| Slots::empty(n)),
            None => Slots::fixed(cfg.backends.iter().map(|b| b.address.as_str())),
        };
        // Without shared data an id from the clock still keeps VMs apart.
        let vm_id = store.new_vm_id().unwrap_or_else(|_| mix(host.now_ms()));
        let rotating = matches!(cfg.strategy, Strategy::RoundRobin | Strategy::StickySession);
        if let Err(e) = store.create_shared(rotating) {
            log::debug!("warmroute: shared values not created: {e:?}");
        }
        let health = store
            .health()
            .unwrap_or_else(|_| vec![Health::default(); n]);
        let mut view = FleetView {
            keys,
            vm_id,
            slots: Slots::empty(n),
            backends: vec![None; n],
            ids: vec![0; n],
            lora: vec![None; n],
            model_aware: false,
            health: Vec::new(),
            passive: Passive::new(n),
            unreleased: vec![Delta::default(); n],
            open_requests: 0,
            last_now: host.now_ms(),
            pool_empty_since: None,
            cfg,
        };
        view.set_all_health(health);
        view.apply_slots(slots);
        view
    }

    /// When slot `b`'s pod joined it (0: a fixed fleet's, or an empty slot).
    pub fn joined_ms(&self, b: usize) -> u64 {
        self.slots.joined_ms(b)
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Slots of per-pod state.
    pub fn slot_count(&self) -> usize {
        self.backends.len()
    }

    /// This VM's fleet-unique id.
    pub fn vm_id(&self) -> u64 {
        self.vm_id
    }

    /// Typed access to shared fleet state.
    pub fn store<'h, H: Host>(&'h self, host: &'h H) -> Store<'h, H> {
        Store {
            host,
            keys: &self.keys,
            n: self.backends.len(),
        }
    }

    /// How long this VM's records outlive its last write: its ledger share,
    /// its beat in the gate's queue.
    pub fn lease_ms(&self) -> u64 {
        lease_ms(self.cfg.metrics.period_ms)
    }

    /// The gate's id for this fleet's held requests.
    pub fn gate_key(&self) -> &str {
        self.keys.gate()
    }

    /// The rendezvous id of slot `b`'s pod (its address, hashed; 0: empty).
    pub fn pod_id(&self, b: usize) -> u64 {
        self.ids.get(b).copied().unwrap_or(0)
    }

    /// Every slot's rendezvous id.
    pub fn ids(&self) -> &[u64] {
        &self.ids
    }

    /// The pod in slot `b`, if any.
    pub fn backend(&self, b: usize) -> Option<&Backend> {
        self.backends.get(b).and_then(Option::as_ref)
    }

    /// Each slot's pod (`None`: empty).
    pub fn backends(&self) -> &[Option<Backend>] {
        &self.backends
    }

    /// The backend at `address` (`ip:port`), if it is one of the fleet's.
    pub fn backend_at(&self, address: &str) -> Option<usize> {
        let id = address_id(address);
        self.ids.iter().position(|&i| i == id)
    }

    /// The slot's name in stats and logs: the configured name, or `pod-<slot>`.
    pub fn slot_name(cfg: &Config, b: usize) -> String {
        match cfg.backends.get(b) {
            Some(x) if cfg.pool.is_none() => x.name.clone(),
            _ => format!("pod-{b}"),
        }
    }

    /// Makes this view hold `slots`: a slot whose pod changed starts cold here
    /// (no passive record, no LoRA state); returns the changed slots.
    fn apply_slots(&mut self, slots: Slots) -> Vec<usize> {
        let mut changed = Vec::new();
        for (b, m) in slots.members.iter().enumerate() {
            let before = self.slots.members.get(b).cloned().flatten();
            if before.as_ref().map(|x| &x.address) != m.as_ref().map(|x| &x.address) {
                changed.push(b);
                self.passive.forget(b);
                if let Some(l) = self.lora.get_mut(b) {
                    *l = None;
                }
            }
            let backend = m.as_ref().map(|m| match self.cfg.backends.get(b) {
                Some(fixed) if self.cfg.pool.is_none() => fixed.clone(),
                _ => Backend {
                    name: FleetView::slot_name(&self.cfg, b),
                    address: m.address.clone(),
                    host: m.address.clone(),
                    metrics_path: self.cfg.metrics.path.clone(),
                    serves: self
                        .cfg
                        .pool
                        .as_ref()
                        .and_then(|p| p.clusters.get(usize::from(m.cluster)))
                        .map(|c| c.serves.clone())
                        .unwrap_or_default(),
                },
            });
            if let Some(id) = self.ids.get_mut(b) {
                *id = m.as_ref().map_or(0, |m| address_id(&m.address));
            }
            if let Some(f) = self.backends.get_mut(b) {
                *f = backend;
            }
        }
        self.slots = slots;
        self.note_models();
        changed
    }

    /// Re-reads the slot table the scraping VM published (from the tick; a
    /// fixed fleet has nothing to read). Returns the slots whose pod changed.
    pub fn refresh_members<H: Host>(&mut self, host: &H) -> Result<Vec<usize>, HostError> {
        if self.cfg.pool.is_none() {
            return Ok(Vec::new());
        }
        match self.store(host).members()? {
            Some(s) if s != self.slots => Ok(self.apply_slots(s)),
            _ => Ok(Vec::new()),
        }
    }

    /// Folds Envoy's list of the pool's endpoints (an admin reply) into the
    /// shared slot table and this view; what is shared per slot (health,
    /// LoRA state, last answer) starts over for a slot whose pod changed.
    /// Returns the reply's changes and the slots whose pod changed here.
    #[allow(clippy::type_complexity)]
    pub fn members_reply<H: Host>(
        &mut self,
        host: &H,
        body: &[u8],
        now: u64,
    ) -> Result<Result<(Changes, Vec<usize>), ReplyError>, HostError> {
        let Some(pool) = &self.cfg.pool else {
            return Ok(Err(ReplyError::WrongClusters));
        };
        let names: Vec<&str> = pool.clusters.iter().map(|c| c.name.as_str()).collect();
        let (endpoints, other_clusters) = match parse_endpoints(body, &names) {
            Ok(e) => e,
            Err(e) => return Ok(Err(e)),
        };
        if endpoints.is_empty() {
            let since = *self.pool_empty_since.get_or_insert(now);
            if now.saturating_sub(since) < pool.empty_grace_ms {
                let kept = Changes {
                    other_clusters,
                    ..Changes::default()
                };
                return Ok(Ok((kept, Vec::new())));
            }
        } else {
            self.pool_empty_since = None;
        }
        let n = self.backends.len();
        let (slots, mut changes) = self.store(host).update_members(|current| {
            let mut s = current.unwrap_or_else(|| Slots::empty(n));
            let c = s.assign(&endpoints, now);
            (s, c)
        })?;
        changes.other_clusters = other_clusters;
        let changed = self.apply_slots(slots);
        for &b in &changed {
            if let Some(h) = self.health.get_mut(b) {
                *h = Health::default();
            }
        }
        if let Err(e) = self.store(host).reset_slots(&changed) {
            // The table is written: other VMs follow it; the scrapes refill the rest.
            log::debug!("warmroute: per-slot records of changed pods not reset: {e:?}");
        }
        Ok(Ok((changes, changed)))
    }

    /// Whether any pod says what it serves or has reported an adapter: until
    /// one does, every model may go anywhere and requests skip the narrowing.
    pub fn model_aware(&self) -> bool {
        self.model_aware
    }

    fn note_models(&mut self) {
        let declared = |b: &Backend| !b.serves.models.is_empty() || !b.serves.adapters.is_empty();
        self.model_aware =
            self.backends.iter().flatten().any(declared) || self.lora.iter().any(Option::is_some);
    }

    /// Each slot's LoRA state as last scraped.
    pub fn lora(&self) -> &[Option<Lora>] {
        &self.lora
    }

    /// Records the LoRA state a scrape of `backend` reported, in shared data
    /// when it changed (from the scraping VM).
    pub fn record_lora<H: Host>(
        &mut self,
        host: &H,
        backend: usize,
        lora: Option<Lora>,
    ) -> Result<(), HostError> {
        if self.lora.get(backend) == Some(&lora) {
            return Ok(());
        }
        let n = self.backends.len();
        let all = self.store(host).update_lora(n, |all| {
            if let Some(l) = all.get_mut(backend) {
                *l = lora.clone();
            }
        })?;
        self.lora = all;
        self.note_models();
        Ok(())
    }

    /// Re-reads every slot's LoRA state (from the tick).
    pub fn refresh_lora<H: Host>(&mut self, host: &H) -> Result<(), HostError> {
        self.lora = self.store(host).lora()?;
        self.note_models();
        Ok(())
    }

    /// Every backend's health as this VM routes on it.
    pub fn health(&self) -> &[Health] {
        &self.health
    }

    /// Re-reads every backend's health from shared data (from the tick); on a
    /// failed read the last known health stays.
    pub fn refresh_health<H: Host>(&mut self, host: &H) -> Result<(), HostError> {
        let health = self.store(host).health()?;
        self.set_all_health(health);
        Ok(())
    }

    fn set_all_health(&mut self, mut health: Vec<Health>) {
        health.resize(self.backends.len(), Health::default());
        self.health = health;
    }

    /// Records one scrape of `backend` in shared data and, at once, in this
    /// view. Returns the backend's new health.
    pub fn record_scrape<H: Host>(
        &mut self,
        host: &H,
        backend: usize,
        outcome: Outcome,
        now: u64,
    ) -> Result<Health, HostError> {
        let m = &self.cfg.metrics;
        // Only a slow scrape asks whether the pod still serves: then the
        // shared view, since the scraping VM may route nothing itself.
        // A settled pod's last answers are not read: its record may lag by the slack.
        let window = m.stale_after_ms + m.stale_after_ms / SERVED_SLACK;
        let serving = outcome == Outcome::Slow
            && (self.passive.served_within(backend, now, window)
                || self
                    .store(host)
                    .served()
                    .is_ok_and(|all| all.get(backend).is_some_and(|&t| recent(t, now, window))));
        let health = self
            .store(host)
            .update_health(backend, |h| h.record(outcome, now, m, serving))?;
        if let Some(h) = self.health.get_mut(backend) {
            *h = health;
        }
        Ok(health)
    }

    /// Where each slot stands for this VM at `now_ms`: a member is in
    /// rotation when Envoy would route to it and its scraped health and this
    /// VM's own view of its answers both allow it.
    pub fn standing(&self, now_ms: u64) -> Vec<Standing> {
        let stale = self.cfg.metrics.stale_after_ms;
        self.slots
            .members
            .iter()
            .enumerate()
            .map(|(b, m)| match m {
                None => Standing::Absent,
                Some(m) => {
                    let scraped = self
                        .health
                        .get(b)
                        .is_none_or(|h| h.in_rotation(now_ms, stale));
                    if m.routable && scraped && !self.passive.ejected(b, now_ms) {
                        Standing::In
                    } else {
                        Standing::Out
                    }
                }
            })
            .collect()
    }

    /// Folds how one routed request ended into this VM's view of `backend`;
    /// returns true when that took it out of this VM's rotation.
    pub fn answered(&mut self, backend: usize, answer: Answer, now_ms: u64) -> bool {
        let m = &self.cfg.metrics;
        self.passive.record(
            backend,
            answer,
            now_ms,
            m.eject_after_errors,
            m.stale_after_ms,
        )
    }

    /// Whether a success on `backend` would change nothing in this worker's
    /// passive view (see [`crate::fleet::passive`], `settled`).
    pub fn settled(&self, backend: usize, now_ms: u64) -> bool {
        self.passive.settled(
            backend,
            now_ms,
            self.cfg.metrics.stale_after_ms / SERVED_SLACK,
        )
    }

    /// Shares when this VM last saw each backend answer, if that changed (from the tick).
    pub fn publish_served<H: Host>(&mut self, host: &H) -> Result<(), HostError> {
        match self.passive.served_news() {
            Some(mine) => self.store(host).publish_served(&mine),
            None => Ok(()),
        }
    }

    /// Heartbeats this fleet and empties the values of fleets gone silent
    /// (from the tick; see [`crate::fleet::store`], "Fleets that are gone").
    pub fn sweep_fleets<H: Host>(&self, host: &H, now: u64) -> Result<Vec<u64>, HostError> {
        let idle = FLEET_IDLE_MS.max(10 * lease_ms(self.cfg.metrics.period_ms));
        self.store(host).sweep_fleets(now, idle)
    }

    /// Host time of this VM's last routed request, tick or look at the fleet.
    pub fn last_now(&self) -> u64 {
        self.last_now
    }

    /// Reads the ledger for one request at host time `now`: what is in flight,
    /// less this VM's releases the ledger has not heard of, and where each
    /// slot stands.
    pub fn snapshot<H: Host>(&mut self, host: &H, now: u64) -> Snapshot {
        self.last_now = now;
        let mut ledger = self.store(host).read_ledger().ok();
        let mut inflight = match &mut ledger {
            // Taken out: the rest of the read seeds the CAS and tells the log's head.
            Some(r) => std::mem::take(&mut r.value.inflight),
            None => vec![InFlight::default(); self.backends.len()],
        };
        self.apply_unreleased(&mut inflight);
        Snapshot {
            ledger,
            inflight,
            standing: self.standing(now),
            now,
        }
    }

    /// What this gateway has in flight per backend: the ledger, less the
    /// releases this VM has not written yet.
    pub fn inflight<H: Host>(&self, host: &H) -> Result<Vec<InFlight>, HostError> {
        let mut inflight = self.store(host).inflight()?;
        self.apply_unreleased(&mut inflight);
        Ok(inflight)
    }

    /// This VM's own ended requests are gone already, though the ledger has not heard.
    fn apply_unreleased(&self, inflight: &mut [InFlight]) {
        for (f, d) in inflight.iter_mut().zip(&self.unreleased) {
            f.apply(*d);
        }
    }

    /// A request is routed to `backend` with `claim` on it: this VM counts
    /// it at once; the ledger when [`FleetView::account`] writes.
    pub fn hold(&mut self, backend: usize, claim: Delta) {
        if let Some(d) = self.unreleased.get_mut(backend) {
            *d += claim;
        }
    }

    /// A routed request is open until [`FleetView::release`].
    pub fn opened(&mut self) {
        self.open_requests = self.open_requests.saturating_add(1);
    }

    /// Takes back what a routed request still holds on `backend` when it ends.
    ///
    /// While this VM has other requests open, no host call: the next routed
    /// request carries the release in the ledger write it makes anyway, or
    /// the last open request's end, or the tick ([`FleetView::tick_ledger`]).
    /// This VM routes on the release at once; the others see it that much
    /// later, which over-counts load only while this worker is busy anyway.
    /// An idle worker writes at once: at low load one phantom request is
    /// enough to tip a bounded-load decision on another worker.
    pub fn release<H: Host>(
        &mut self,
        host: &H,
        backend: usize,
        claim: Delta,
    ) -> Result<(), HostError> {
        self.open_requests = self.open_requests.saturating_sub(1);
        self.defer(backend, claim);
        if self.open_requests == 0 {
            self.flush_releases(host)
        } else {
            Ok(())
        }
    }

    /// The first response byte arrived, so the prompt is prefilled: takes its
    /// prefill blocks out of `claim`, and out of the queue others wait behind
    /// (no host call: the request is still open, see [`FleetView::release`]).
    pub fn prefilled(&mut self, backend: usize, claim: &mut Delta) {
        let blocks = std::mem::take(&mut claim.prefill_blocks);
        self.defer(backend, Delta::prefill(blocks));
    }

    /// Gives back `claim` on `backend` with the next ledger write.
    pub fn defer(&mut self, backend: usize, claim: Delta) {
        if let Some(d) = self.unreleased.get_mut(backend) {
            *d += -claim;
        }
    }

    /// Writes the releases no routed request has carried yet (the last open
    /// request's end, and when the VM stops). The heartbeat it writes is as of
    /// this VM's last routed request or tick: no clock read for it.
    pub fn flush_releases<H: Host>(&mut self, host: &H) -> Result<(), HostError> {
        if self.unreleased.iter().all(|d| *d == Delta::default()) {
            return Ok(());
        }
        let now = self.last_now;
        self.account(host, None, now, false, false).map(|_| ())
    }

    /// The tick's ledger work at `now_ms`: writes the releases waiting for it,
    /// this VM's heartbeat while it holds requests, and takes back the shares
    /// of VMs silent past their lease. Returns what this gateway has in flight.
    pub fn tick_ledger<H: Host>(
        &mut self,
        host: &H,
        now_ms: u64,
    ) -> Result<Vec<InFlight>, HostError> {
        self.last_now = now_ms;
        let read = self.store(host).read_ledger()?;
        let pending = self.unreleased.iter().any(|d| *d != Delta::default());
        if !pending && self.open_requests == 0 && !read.value.has_abandoned(&self.writer(now_ms)) {
            return Ok(read.value.inflight);
        }
        self.account(host, Some(read.raw), now_ms, false, false)
            .map(|a| a.ledger.inflight)
    }

    /// One ledger write of the releases waiting for it (and this VM's
    /// heartbeat), reserving a log slot if `reserve`; `if_unchanged`: only if
    /// the ledger is still as `seed` read it (one CAS). This VM's releases
    /// are in the ledger once it succeeds.
    pub fn account<H: Host>(
        &mut self,
        host: &H,
        seed: Option<Versioned>,
        now: u64,
        reserve: bool,
        if_unchanged: bool,
    ) -> Result<Accounted, HostError> {
        let writer = self.writer(now);
        let store = self.store(host);
        let accounted = match seed {
            Some(seed) if if_unchanged => {
                store.account_if_unchanged(seed, writer, &self.unreleased, reserve)
            }
            seed => store.account(seed, writer, &self.unreleased, reserve),
        }?;
        self.unreleased.fill(Delta::default());
        note_reclaimed(&accounted.reclaimed);
        Ok(accounted)
    }

    /// This VM as a ledger writer at `now_ms`.
    fn writer(&self, now_ms: u64) -> Writer {
        Writer {
            vm: self.vm_id,
            now_ms,
            lease_ms: lease_ms(self.cfg.metrics.period_ms),
        }
    }
}
