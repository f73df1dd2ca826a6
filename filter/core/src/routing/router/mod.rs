//! One VM's router: ties the index replica, the shared fleet state and the
//! policies together. Generic over [`Host`], so the same code runs in Envoy
//! and in unit tests that put several "VMs" on one in-memory host.
//!
//! Per routed request the host calls are: read the ledger (in-flight records
//! and the index log's head, see [`crate::fleet::store`]), read the slots of events
//! other VMs appended since, one CAS write of the ledger (the chosen
//! backend's request count, prefill blocks and output tokens, and the
//! reservation of this request's log event) and one slot write — none of them per block, none of
//! them the size of the log. The CAS reuses the read made to decide (a second
//! read only after a lost CAS): in Envoy a host call costs more than deciding
//! on a 1 KB prompt. Releases (a request's end, a streamed response's first
//! byte giving its prefill blocks back) make no host call while the VM has
//! other requests open: they wait for the next ledger write (see
//! [`Router::release`]). Every ledger write carries this VM's heartbeat; the
//! tick writes one while the VM holds requests, and takes back the in-flight
//! share of VMs silent past their lease ([`crate::fleet::store`], "Self-healing").
//!
//! A decision is written only on the ledger it was made on. Two workers
//! deciding at once would otherwise each choose on a ledger without the
//! other's request: in a burst of new prompts both take the pod with the
//! shortest queue. For the strategies that weigh loads, the accounting CAS is
//! tried once against the decision's own read; when another worker wrote in
//! between, the decision is made again on the ledger (and index events) read
//! anew, up to [`MAX_REDECISIONS`] times, then written on the ledger as it is.
//! This costs a read and a decision more, only when workers contend
//! (`warmroute.redecided`); without it the lost CAS re-reads anyway.
//!
//! Health is not read per request: only scrapes change it, and they run in
//! the tick of the VM holding the scrape lease, so each VM re-reads it at its
//! own tick ([`Router::refresh_health`]) and the scraping VM applies its own
//! writes at once ([`Router::record_scrape`]). Another VM sees a scrape at most
//! one tick late, on top of the scrape period it already waits. Each VM also
//! keeps Envoy's own view of how its requests ended ([`crate::fleet::passive`]); a
//! backend is in rotation when Envoy would route to it (a discovered pool's
//! endpoint health, [`crate::fleet::membership`]) and neither view keeps it out.

use crate::config::{Backend, Config, PolicyConfig, Strategy};
use crate::fleet::health::{Health, Outcome};
use crate::fleet::inflight::{Delta, InFlight};
use crate::fleet::lora::Lora;
use crate::fleet::membership::{parse_endpoints, Changes, ReplyError, Slots};
use crate::fleet::passive::{recent, Answer, Passive, SERVED_SLACK};
use crate::fleet::store::{Keys, Store, Writer};
use crate::hash::{address_id, mix, session_hash};
use crate::host::{Host, HostError, Versioned};
use crate::phases::{Split, Step};
use crate::prompt::prefix::PromptKey;
use crate::routing::feedback::{Report, Surplus, TokenRatio, Verdict};
use crate::routing::index::Index;
use crate::routing::index_log::{Head, Kind};
use crate::routing::load::{backend_loads, BackendLoad, Standing};
use crate::routing::models::{narrow, Fit};
use crate::routing::policy::{Chooser, Decision, Reason, RequestKey};
use crate::routing::waiting::{WaitTicket, Waiting};

/// Anchor length for prompts without message structure (completions).
pub const ANCHOR_BYTES: usize = 2048;

/// Most times one request's decision is made again after the ledger changed
/// under it; past them its write goes in on the ledger as it then is.
const MAX_REDECISIONS: u32 = 2;

/// A VM's lease on its in-flight share (see [`crate::fleet::store`], "Self-healing"):
/// three tick periods, at least one second.
pub fn lease_ms(period_ms: u64) -> u64 {
    period_ms.saturating_mul(3).max(1000)
}

/// What the filter learned about one request.
#[derive(Debug, Clone, Default)]
pub struct Request<'a> {
    /// The prompt's key, if the body could be read.
    pub key: Option<&'a PromptKey>,
    /// Value of the session header.
    pub session: Option<&'a str>,
}

/// A routing decision plus what it cost to make.
#[derive(Debug, Clone)]
pub struct Routed {
    /// The choice.
    pub decision: Decision,
    /// Full blocks in the prompt.
    pub blocks: u32,
    /// What the request holds on the primary until released: one request slot,
    /// the blocks it must prefill there (until its first response byte), and
    /// the output tokens it may generate (until it ends).
    pub held: Delta,
    /// Host calls that failed along the way (the decision is still made).
    pub host_errors: u32,
    /// Index events other VMs appended that this VM never saw (log trimmed).
    pub log_gap: bool,
    /// No pod serves the request's model (and every pod says what it serves).
    pub unknown_model: bool,
    /// When the chosen pod last used the deepest block of its match, before
    /// this request (for its cache report to check, [`crate::routing::feedback`]).
    pub last_use_ms: Option<u64>,
    /// The request's prompt waits on the primary until its first response byte
    /// or its end ([`Router::close`]); `None`: nothing kept (not `cache_aware`, no prompt).
    pub waiting: Option<WaitTicket>,
    /// Times the decision was made again because another worker wrote the
    /// ledger between its read and this request's write.
    pub redecided: u32,
}

/// Per-VM routing state.
pub struct Router {
    cfg: Config,
    keys: Keys,
    /// Who holds each slot ([`crate::fleet::membership`]).
    slots: Slots,
    /// Each slot's pod as a backend (name, address, scrape target); `None`: empty.
    fleet: Vec<Option<Backend>>,
    /// Each slot's LoRA adapters as last scraped ([`crate::fleet::lora`]).
    lora: Vec<Option<Lora>>,
    /// Some pod declares what it serves or reported an adapter ([`Router::note_models`]).
    model_aware: bool,
    /// Each backend's rendezvous id (its address, hashed).
    ids: Vec<u64>,
    /// Fleet-unique id of this VM.
    vm_id: u64,
    /// This VM's replica of the prefix index.
    index: Index,
    /// Next log event this VM has not applied.
    applied_seq: u64,
    requests: u64,
    matched: Vec<u32>,
    /// The backends whose match, for the request being decided, was lowered
    /// for what pending prompts bring ([`Waiting::ready`]).
    lowered: Vec<usize>,
    /// Per backend, for the request being decided: another request this VM sent
    /// there waits for its first token and shares its prompt up to the last
    /// block of that backend's match.
    shared: Vec<bool>,
    /// The prompts this VM routed and has seen no response byte of, and the
    /// other workers' the ledger shows not yet prefilled, per pod (`cache_aware`
    /// only): the sole holder's guard and what a match has ready ([`crate::routing::waiting`]).
    waiting: Waiting,
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
    /// Times the steps of a routed request (only with `phase-timing`).
    split: Split,
    /// Prompt bytes per pod token, as the pods' reports show it.
    ratio: TokenRatio,
    /// Whether the pods' recent reports showed cache this index did not credit them with.
    surplus: Surplus,
    /// The ratio the index's capacities were last sized with.
    sized_ratio: f64,
    /// The gate's look at the fleet for a request, which its route (in the
    /// same callback) reuses instead of reading the ledger again.
    admitted: Option<Observed>,
}

/// The fleet as the gate sees it, per slot.
#[derive(Debug, Clone, PartialEq)]
pub struct Capacity {
    /// Typical requests it takes before its knee, if it is a member in rotation.
    pub headroom: Vec<Option<f64>>,
    /// Whether it may serve the request's model (an empty slot may: a pod
    /// that joins it might); health is `headroom`'s business.
    pub eligible: Vec<bool>,
}

impl Capacity {
    /// Requests each pod takes before its knee in one release round; a pod
    /// bounded only by its scrape (∞ headroom) takes one.
    pub fn slots(&self) -> Vec<u32> {
        self.headroom
            .iter()
            .map(|h| match h {
                Some(h) if h.is_infinite() => 1,
                Some(h) if *h > 0.0 => h.ceil().min(f64::from(u16::MAX)) as u32,
                _ => 0,
            })
            .collect()
    }

    /// Whether a pod in rotation may serve the request at all.
    pub fn servable(&self) -> bool {
        self.headroom
            .iter()
            .zip(&self.eligible)
            .any(|(h, &e)| e && h.is_some())
    }

    /// Whether a pod that may serve the request is below its knee.
    pub fn room(&self) -> bool {
        self.headroom
            .iter()
            .zip(&self.eligible)
            .any(|(h, &e)| e && h.is_some_and(|h| h > 0.0))
    }
}

/// What a request saw of the fleet before deciding.
struct Observed {
    loads: Vec<BackendLoad>,
    /// The ledger as read, to seed the accounting CAS.
    ledger: Option<Versioned>,
    log_gap: bool,
    host_errors: u32,
    now: u64,
}

fn note_reclaimed(vms: &[u64]) {
    for vm in vms {
        log::info!(
            "warmroute: took back the in-flight share of worker VM {vm}, silent past its lease"
        );
    }
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

/// The output tokens a request holds on its pod until it ends: its limit, or
/// the configured default; at most [`crate::routing::work::MAX_OUTPUT_TOKENS`], so no
/// client can make a pod look busier than a context window's worth.
fn output_budget(key: Option<&PromptKey>, policy: &PolicyConfig) -> i32 {
    let limit = key
        .and_then(|k| k.max_output_tokens)
        .unwrap_or(policy.default_output_tokens);
    limit.min(crate::routing::work::MAX_OUTPUT_TOKENS) as i32
}

impl Router {
    /// A router for `cfg`; takes a fleet-unique VM id from shared data.
    pub fn new<H: Host>(cfg: Config, host: &H) -> Router {
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
        // Start reading the log where it is now: older events describe a past we cannot date.
        let applied_seq = store.log_next_seq().unwrap_or(0);
        let index = Index::new(n, cfg.index.max_blocks, cfg.index.ttl_ms);
        let health = store
            .health()
            .unwrap_or_else(|_| vec![Health::default(); n]);
        let mut router = Router {
            keys,
            slots: Slots::empty(n),
            fleet: vec![None; n],
            lora: vec![None; n],
            model_aware: false,
            ids: vec![0; n],
            vm_id,
            index,
            applied_seq,
            requests: 0,
            matched: Vec::with_capacity(n),
            lowered: Vec::new(),
            shared: Vec::with_capacity(n),
            waiting: Waiting::default(),
            health: Vec::new(),
            passive: Passive::new(n),
            unreleased: vec![Delta::default(); n],
            open_requests: 0,
            last_now: host.now_ms(),
            split: Split::default(),
            ratio: TokenRatio::new(cfg.index.bytes_per_token),
            surplus: Surplus::default(),
            sized_ratio: cfg.index.bytes_per_token,
            admitted: None,
            cfg,
        };
        router.set_all_health(health);
        router.apply_slots(slots);
        router
    }

    /// Slots of per-pod state.
    pub fn slot_count(&self) -> usize {
        self.fleet.len()
    }

    /// The rendezvous id of slot `b`'s pod (its address, hashed; 0: empty).
    pub fn pod_id(&self, b: usize) -> u64 {
        self.ids.get(b).copied().unwrap_or(0)
    }

    /// The pod in slot `b`, if any.
    pub fn backend(&self, b: usize) -> Option<&Backend> {
        self.fleet.get(b).and_then(Option::as_ref)
    }

    /// Each slot's pod (`None`: empty).
    pub fn fleet(&self) -> &[Option<Backend>] {
        &self.fleet
    }

    /// The slot's name in stats and logs: the configured name, or `pod-<slot>`.
    pub fn slot_name(cfg: &Config, b: usize) -> String {
        match cfg.backends.get(b) {
            Some(x) if cfg.pool.is_none() => x.name.clone(),
            _ => format!("pod-{b}"),
        }
    }

    /// Makes this VM's view hold `slots`: a slot whose pod changed starts
    /// cold (no index entries, no passive record); returns the changed slots.
    fn apply_slots(&mut self, slots: Slots) -> Vec<usize> {
        let mut changed = Vec::new();
        for (b, m) in slots.members.iter().enumerate() {
            let before = self.slots.members.get(b).cloned().flatten();
            if before.as_ref().map(|x| &x.address) != m.as_ref().map(|x| &x.address) {
                changed.push(b);
                self.index.forget(b);
                self.passive.forget(b);
                self.waiting.forget(b);
                if let Some(l) = self.lora.get_mut(b) {
                    *l = None;
                }
            }
            let backend = m.as_ref().map(|m| match self.cfg.backends.get(b) {
                Some(fixed) if self.cfg.pool.is_none() => fixed.clone(),
                _ => Backend {
                    name: Router::slot_name(&self.cfg, b),
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
            if let Some(f) = self.fleet.get_mut(b) {
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
    /// shared slot table and this VM's view; what is shared per slot (health,
    /// LoRA state, last answer) starts over for a slot whose pod changed.
    pub fn members_reply<H: Host>(
        &mut self,
        host: &H,
        body: &[u8],
        now: u64,
    ) -> Result<Result<Changes, ReplyError>, HostError> {
        let Some(pool) = &self.cfg.pool else {
            return Ok(Err(ReplyError::WrongClusters));
        };
        let names: Vec<&str> = pool.clusters.iter().map(|c| c.name.as_str()).collect();
        let endpoints = match parse_endpoints(body, &names) {
            Ok(e) => e,
            Err(e) => return Ok(Err(e)),
        };
        let n = self.fleet.len();
        let (slots, changes) = self.store(host).update_members(|current| {
            let mut s = current.unwrap_or_else(|| Slots::empty(n));
            let c = s.assign(&endpoints, now);
            (s, c)
        })?;
        let changed = self.apply_slots(slots);
        for &b in &changed {
            if let Some(h) = self.health.get_mut(b) {
                *h = Health::default();
            }
        }
        self.resize_index();
        if let Err(e) = self.store(host).reset_slots(&changed) {
            // The table is written: other VMs follow it; the scrapes refill the rest.
            log::debug!("warmroute: per-slot records of changed pods not reset: {e:?}");
        }
        Ok(Ok(changes))
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
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
            n: self.fleet.len(),
        }
    }

    /// Applies index events other VMs appended before `next` (the log head as
    /// read with the ledger); true if some were lost (overwritten in the ring
    /// before this VM read them).
    fn sync_index<H: Host>(&mut self, host: &H, next: u64) -> Result<bool, HostError> {
        let store = Store {
            host,
            keys: &self.keys,
            n: self.fleet.len(),
        };
        let slots = self.keys.log_shape().slots;
        let mut gap = false;
        if next < self.applied_seq {
            // The log restarted (its record was lost or rewritten): follow it from here.
            self.applied_seq = next;
            return Ok(true);
        }
        if next.saturating_sub(self.applied_seq) > slots {
            gap = true;
            self.applied_seq = next - slots;
        }
        while self.applied_seq < next {
            let seq = self.applied_seq;
            match store.log_event(seq)? {
                Some(ev) if ev.head.seq == seq => {
                    if ev.head.origin != self.vm_id {
                        let b = usize::from(ev.head.backend);
                        match ev.head.kind {
                            // Routed to the slot's previous pod: not this one's cache. Or to
                            // a slot this VM's fleet does not have (a VM configured with
                            // another pool, or a corrupt slot): nothing to keep.
                            Kind::Received
                                if b >= self.fleet.len()
                                    || ev.head.time_ms < self.slots.joined_ms(b) => {}
                            Kind::Received => {
                                let len = ev.len as usize;
                                let from =
                                    self.index.record_kept(len, &ev.blocks, b, ev.head.time_ms);
                                if self.cfg.strategy == Strategy::CacheAware {
                                    self.waiting.keep_foreign(&ev, from);
                                }
                            }
                            Kind::Evicted => self
                                .index
                                .forget_used_before(ev.head.backend as usize, ev.head.time_ms),
                        }
                    }
                }
                Some(ev) if ev.head.seq > seq => gap = true,
                // Reserved but not written yet (its writer runs on another thread):
                // read it next time, unless the ring is about to pass it by.
                _ if next - seq < slots / 2 => break,
                _ => gap = true,
            }
            self.applied_seq = seq + 1;
        }
        Ok(gap)
    }

    /// Routes one request; never fails (host errors degrade to less information).
    pub fn route<H: Host>(&mut self, host: &H, req: &Request<'_>) -> Routed {
        self.split.start(host);
        let routed = self.route_timed(host, req);
        self.split.stop();
        routed
    }

    fn route_timed<H: Host>(&mut self, host: &H, req: &Request<'_>) -> Routed {
        let mut seen = match self.admitted.take() {
            Some(seen) => seen,
            None => self.observe(host, req.key.is_some()),
        };
        let mut redecided = 0;
        loop {
            let last = redecided >= MAX_REDECISIONS || !self.decides_on_load();
            let (host_errors, log_gap) = (seen.host_errors, seen.log_gap);
            match self.decide_and_commit(host, req, seen, last) {
                Some(routed) => {
                    return Routed {
                        redecided,
                        ..routed
                    }
                }
                None => {
                    // Another worker wrote the ledger between this decision's read
                    // and its write: decide again on what it wrote (module doc).
                    redecided += 1;
                    seen = self.observe(host, req.key.is_some());
                    seen.host_errors += host_errors;
                    seen.log_gap |= log_gap;
                }
            }
        }
    }

    /// Whether the strategy's choice depends on the loads (so a decision made
    /// on a ledger that changed before its write is worth making again).
    fn decides_on_load(&self) -> bool {
        !matches!(
            self.cfg.strategy,
            Strategy::RoundRobin | Strategy::Random | Strategy::StickySession
        )
    }

    /// Decides on `seen` and commits the choice; `None` (nothing done) when the
    /// ledger changed since `seen` read it, unless this is the `last` try.
    fn decide_and_commit<H: Host>(
        &mut self,
        host: &H,
        req: &Request<'_>,
        mut seen: Observed,
        last: bool,
    ) -> Option<Routed> {
        let model = req.key.and_then(|k| k.model.as_deref());
        if model.is_some_and(|m| self.narrow_to_model(m, &mut seen.loads) == Fit::Unknown) {
            let decision = Decision {
                order: Vec::new(),
                matched: 0,
                reason: Reason::Fallback,
            };
            let blocks = req.key.map_or(0, |k| k.blocks.len() as u32);
            return self
                .commit(host, req, decision, blocks, seen, true)
                .map(|routed| Routed {
                    unknown_model: true,
                    ..routed
                });
        }
        if self.cfg.gate.is_some() && seen.loads.iter().any(|l| l.healthy && l.headroom > 0.0) {
            // Keep each pod below its knee while any is ([`crate::gate`]).
            for l in seen.loads.iter_mut().filter(|l| l.headroom <= 0.0) {
                l.healthy = false;
            }
        }
        let (decision, blocks) = self.decide(host, req, &mut seen);
        // Only a predicted hit whose answer carries usage is checked against it, and
        // not one lowered for what a pending prompt brings (see `crate::routing::feedback`).
        let last_use_ms = match (req.key, decision.order.first()) {
            (Some(k), Some(&b))
                if self.cfg.feedback.enabled
                    && k.reports_usage
                    && decision.matched > 0
                    && !self.lowered.contains(&b) =>
            {
                self.index.last_use(&k.blocks, decision.matched, b)
            }
            _ => None,
        };
        self.commit(host, req, decision, blocks, seen, last)
            .map(|routed| Routed {
                last_use_ms,
                ..routed
            })
    }

    /// What the gate needs to know of the fleet ([`crate::gate`]): each
    /// slot's headroom before its knee if it is a member in rotation.
    pub fn capacity<H: Host>(&mut self, host: &H) -> Capacity {
        let seen = self.observe(host, false);
        self.capacity_in(&seen, None)
    }

    /// [`Router::capacity`] for the request `req` about to be routed, with
    /// whether each slot's pod may serve its model. The look at the fleet is
    /// kept for its [`Router::route`] (dropped by [`Router::forget_admission`]
    /// when the request is held or shed instead).
    pub fn admit<H: Host>(&mut self, host: &H, req: &Request<'_>) -> Capacity {
        let seen = self.observe(host, req.key.is_some());
        let cap = self.capacity_in(&seen, req.key.and_then(|k| k.model.as_deref()));
        self.admitted = Some(seen);
        cap
    }

    /// The request admitted last is not routed now: its look at the fleet goes.
    pub fn forget_admission(&mut self) {
        self.admitted = None;
    }

    fn capacity_in(&self, seen: &Observed, model: Option<&str>) -> Capacity {
        let headroom = seen
            .loads
            .iter()
            .map(|l| (l.member && l.healthy).then_some(l.headroom))
            .collect();
        let mut loads = seen.loads.clone();
        if let Some(m) = model {
            self.narrow_to_model(m, &mut loads);
        }
        // By model alone: health changes while a request waits, and a slot
        // without a pod now may hold one that serves it by then.
        let eligible = loads
            .iter()
            .zip(&seen.loads)
            .map(|(l, was)| !was.member || l.member)
            .collect();
        Capacity { headroom, eligible }
    }

    /// Host time of this VM's last routed request, tick or look at the fleet.
    pub fn last_now(&self) -> u64 {
        self.last_now
    }

    /// The gate's id for this fleet's held requests.
    pub fn gate_key(&self) -> &str {
        self.keys.gate()
    }

    /// Keeps only the pods that serve `model` (and, for an adapter, those to
    /// prefer) in `loads` ([`crate::routing::models`]). Free when no pod says what it
    /// serves and none reported an adapter.
    fn narrow_to_model(&self, model: &str, loads: &mut [BackendLoad]) -> Fit {
        if !self.model_aware {
            return Fit::Served;
        }
        narrow(
            model,
            |b| self.backend(b).map(|x| &x.serves),
            &self.lora,
            loads,
        )
    }

    /// Whether any pod says what it serves or has reported an adapter: until
    /// one does, every model may go anywhere and requests skip the narrowing.
    fn note_models(&mut self) {
        let declared = |b: &Backend| !b.serves.models.is_empty() || !b.serves.adapters.is_empty();
        self.model_aware =
            self.fleet.iter().flatten().any(declared) || self.lora.iter().any(Option::is_some);
    }

    /// Reads the ledger (and, for a request with a prompt, the index events
    /// other VMs appended since) into this request's load picture.
    fn observe<H: Host>(&mut self, host: &H, with_prompt: bool) -> Observed {
        let now = host.now_ms();
        self.last_now = now;
        let n = self.fleet.len();
        let mut host_errors = 0;
        let read = self.store(host).read_ledger();
        self.split.lap(host, Step::Ledger);
        let (mut inflight, ledger, log_gap) = match read {
            Ok(r) => {
                // Only a request with a prompt looks the index up: only it catches up.
                let log_gap = if with_prompt {
                    self.sync_index(host, r.value.next_seq).unwrap_or_else(|_| {
                        host_errors += 1;
                        false
                    })
                } else {
                    false
                };
                if with_prompt && self.cfg.strategy == Strategy::CacheAware {
                    // What the other workers' prompts still bring ([`crate::routing::waiting`]).
                    self.waiting.settle(|vm, b| r.value.prefill_of(vm, b));
                }
                (r.value.inflight, Some(r.raw), log_gap)
            }
            Err(_) => {
                host_errors += 1;
                (vec![InFlight::default(); n], None, false)
            }
        };
        self.split.lap(host, Step::Sync);
        self.apply_unreleased(&mut inflight);
        let loads = backend_loads(
            &inflight,
            &self.health,
            &self.standing(now),
            now,
            self.cfg.metrics.stale_after_ms,
            &self.cfg.policy,
            self.cfg.gate.as_ref().map(|g| &g.knee),
        );
        self.split.lap(host, Step::Loads);
        Observed {
            loads,
            ledger,
            log_gap,
            host_errors,
            now,
        }
    }

    /// Runs the configured strategy; returns the decision and the prompt's full blocks.
    fn decide<H: Host>(
        &mut self,
        host: &H,
        req: &Request<'_>,
        seen: &mut Observed,
    ) -> (Decision, u32) {
        self.requests = self.requests.wrapping_add(1);
        let random = mix(seen.now ^ self.vm_id.rotate_left(32) ^ self.requests);
        let needs_rotation = match self.cfg.strategy {
            Strategy::RoundRobin => true,
            Strategy::StickySession => req.session.is_none(),
            _ => false,
        };
        let rotation = if needs_rotation {
            self.store(host).next_rotation().unwrap_or_else(|_| {
                seen.host_errors += 1;
                random
            })
        } else {
            0
        };
        let chooser = Chooser {
            cfg: &self.cfg.policy,
            loads: &seen.loads,
            ids: &self.ids,
            fallbacks: self.cfg.route.fallbacks,
        };
        let block = self.cfg.block_bytes.max(1);
        let (decision, blocks) = match req.key {
            Some(key) => {
                self.index
                    .match_lengths(&key.blocks, seen.now, &mut self.matched);
                let head_blocks = (key.anchor_offset / block) as u32;
                self.lowered.clear();
                if !key.continuation {
                    // Not what pending prompts still bring ([`crate::routing::waiting`], ready).
                    self.waiting.ready(
                        &mut self.matched,
                        head_blocks,
                        &key.blocks,
                        &mut self.lowered,
                    );
                }
                self.waiting
                    .shared(&self.matched, head_blocks, &key.blocks, &mut self.shared);
                self.split.lap(host, Step::Match);
                let rk = RequestKey {
                    anchor: key.anchor,
                    matched: &self.matched,
                    blocks: key.blocks.len() as u32,
                    head_blocks,
                    continuation: key.continuation,
                    history_blocks: (key.history_bytes / block) as u32,
                    shared: &self.shared,
                    session: req.session.map(session_hash),
                    rotation,
                    random,
                };
                (
                    chooser.choose(self.cfg.strategy, &rk),
                    key.blocks.len() as u32,
                )
            }
            // These strategies do not need the body: apply them as configured.
            None if matches!(
                self.cfg.strategy,
                Strategy::StickySession | Strategy::RoundRobin
            ) =>
            {
                let rk = RequestKey {
                    session: req.session.map(session_hash),
                    rotation,
                    random,
                    ..Default::default()
                };
                (chooser.choose(self.cfg.strategy, &rk), 0)
            }
            None => (chooser.fallback(random), 0),
        };
        let decision = decision.unwrap_or(Decision {
            order: Vec::new(),
            matched: 0,
            reason: Reason::Fallback,
        });
        self.split.lap(host, Step::Policy);
        (decision, blocks)
    }

    /// Accounts the request and records the prompt on the chosen backend: one
    /// ledger CAS (carrying the releases waiting for it and reserving the log
    /// event) and one slot write. `None`, with nothing accounted or recorded,
    /// when the CAS finds the ledger changed since `seen` read it, unless
    /// `last`: then the write is retried on the fresh ledger as it is.
    fn commit<H: Host>(
        &mut self,
        host: &H,
        req: &Request<'_>,
        decision: Decision,
        blocks: u32,
        seen: Observed,
        last: bool,
    ) -> Option<Routed> {
        let mut host_errors = seen.host_errors;
        let Some(&primary) = decision.order.first() else {
            // No pod to account on: Envoy routes by its fallback policy.
            return Some(Routed {
                decision,
                blocks,
                held: Delta::default(),
                host_errors,
                log_gap: seen.log_gap,
                unknown_model: false,
                last_use_ms: None,
                waiting: None,
                redecided: 0,
            });
        };
        let held = Delta {
            requests: 1,
            prefill_blocks: i32::try_from(blocks.saturating_sub(decision.matched))
                .unwrap_or(i32::MAX),
            decode_tokens: output_budget(req.key, &self.cfg.policy),
        };
        let chain = req.key.map_or(&[][..], |k| &k.blocks[..]);
        if let Some(d) = self.unreleased.get_mut(primary) {
            *d += held;
        }
        // A read of a missing ledger has no CAS token to tell a change by.
        let if_unchanged = !last && seen.ledger.as_ref().is_some_and(|(_, cas)| cas.is_some());
        let accounted = self.account(host, seen.ledger, seen.now, !chain.is_empty(), if_unchanged);
        if if_unchanged && accounted == Err(HostError::CasMismatch) {
            if let Some(d) = self.unreleased.get_mut(primary) {
                *d += -held;
            }
            return None;
        }
        // Record the whole chain: it refreshes recency of the matched part
        // and, after a spillover, replicates a hot prefix to the new pod.
        let from = match chain.is_empty() {
            true => 0,
            false => self.index.record(chain, primary, seen.now),
        };
        let waiting = if self.cfg.strategy == Strategy::CacheAware {
            self.waiting.keep(chain, primary, from)
        } else {
            None
        };
        self.split.lap(host, Step::Record);
        self.open_requests = self.open_requests.saturating_add(1);
        let held = match accounted {
            Ok(seq) => {
                if let Some(seq) = seq.filter(|_| !chain.is_empty()) {
                    let prefill = held.prefill_blocks.unsigned_abs();
                    let head = self.head(Kind::Received, seq, primary, seen.now, prefill);
                    host_errors += u32::from(!self.log(host, head, chain));
                }
                held
            }
            Err(_) => {
                host_errors += 1;
                self.defer(primary, held);
                // A request the ledger never heard of holds nothing there: its release
                // must not take back another request's share.
                Delta::default()
            }
        };
        Some(Routed {
            decision,
            blocks,
            held,
            host_errors,
            log_gap: seen.log_gap,
            unknown_model: false,
            last_use_ms: None,
            waiting,
            redecided: 0,
        })
    }

    /// A routed request got its first response byte (or ended): its prompt no
    /// longer waits on its pod ([`Waiting::close`]).
    pub fn close(&mut self, ticket: WaitTicket) {
        self.waiting.close(ticket);
    }

    /// How many prompts wait on their pods (tests).
    #[cfg(test)]
    pub(crate) fn waiting_prompts(&self) -> usize {
        self.waiting.prompts()
    }

    /// Takes back what a routed request still holds on `backend` when it ends.
    ///
    /// While this VM has other requests open, no host call: the next routed
    /// request carries the release in the ledger write it makes anyway, or
    /// the last open request's end, or the tick ([`Router::tick_ledger`]).
    /// This VM routes on the release at once; the others see it that much
    /// later, which over-counts load only while this worker is busy anyway.
    /// An idle worker writes at once: at low load one phantom request is
    /// enough to tip a bounded-load decision on another worker.
    pub fn release<H: Host>(
        &mut self,
        host: &H,
        backend: usize,
        held: Delta,
    ) -> Result<(), HostError> {
        self.open_requests = self.open_requests.saturating_sub(1);
        self.defer(backend, held);
        if self.open_requests == 0 {
            self.flush_releases(host)
        } else {
            Ok(())
        }
    }

    /// The first response byte arrived, so the prompt is prefilled: takes its
    /// prefill blocks out of `held`, and out of the queue others wait behind
    /// (no host call: the request is still open, see [`Router::release`]).
    pub fn prefilled(&mut self, backend: usize, held: &mut Delta) {
        let blocks = std::mem::take(&mut held.prefill_blocks);
        self.defer(backend, Delta::prefill(blocks));
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

    fn defer(&mut self, backend: usize, held: Delta) {
        if let Some(d) = self.unreleased.get_mut(backend) {
            *d += -held;
        }
    }

    /// Writes the releases no routed request has carried yet (the last open
    /// request's end, and when the VM stops). The heartbeat it writes is as of
    /// this VM's last routed request or tick: no clock read for it.
    pub fn flush_releases<H: Host>(&mut self, host: &H) -> Result<(), HostError> {
        if self.unreleased.iter().all(|d| *d == Delta::default()) {
            return Ok(());
        }
        self.write_ledger(host, None, self.last_now).map(|_| ())
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
        self.write_ledger(host, Some(read.raw), now_ms)
    }

    /// One ledger write of the releases waiting for it (and this VM's
    /// heartbeat), reserving a log slot if `reserve`; `if_unchanged`: only if
    /// the ledger is still as `seed` read it (one CAS). Returns the slot.
    fn account<H: Host>(
        &mut self,
        host: &H,
        seed: Option<Versioned>,
        now: u64,
        reserve: bool,
        if_unchanged: bool,
    ) -> Result<Option<u64>, HostError> {
        let store = Store {
            host,
            keys: &self.keys,
            n: self.fleet.len(),
        };
        let writer = self.writer(now);
        let accounted = match seed {
            Some(seed) if if_unchanged => {
                store.account_if_unchanged(seed, writer, &self.unreleased, reserve)
            }
            seed => store.account(seed, writer, &self.unreleased, reserve),
        };
        self.split.lap(host, Step::Account);
        let accounted = accounted?;
        self.unreleased.fill(Delta::default());
        note_reclaimed(&accounted.reclaimed);
        Ok(accounted.seq)
    }

    /// This VM's log event `seq` about `backend`.
    fn head(&self, kind: Kind, seq: u64, backend: usize, time_ms: u64, prefill: u32) -> Head {
        Head {
            kind,
            seq,
            origin: self.vm_id,
            backend: backend as u16,
            time_ms,
            prefill,
        }
    }

    /// Writes an event to the log slot `head.seq` (reserved by [`Router::account`]);
    /// false if it could not (other VMs miss it, a gap).
    fn log<H: Host>(&mut self, host: &H, head: Head, blocks: &[u64]) -> bool {
        let written = self.store(host).write_event(head, blocks);
        self.split.lap(host, Step::Log);
        // Nothing in between to read: skip our own event instead of reading it back.
        if head.seq == self.applied_seq {
            self.applied_seq = head.seq + 1;
        }
        written.is_ok()
    }

    /// Folds a pod's own cache report for a request into the index: when it
    /// falls clearly short of the `(matched, prompt)` blocks the index
    /// credited `backend` with, what it last used at or before
    /// `last_use_ms` (the deepest predicted block's last use, before this
    /// request) is forgotten there, here and, through the log, in every VM
    /// ([`crate::routing::feedback`]), unless one of this VM's recent reports showed
    /// a pod holding more than this index credited it with (then this index's
    /// order of uses is not the pods'). Returns what the report showed.
    pub fn reported<H: Host>(
        &mut self,
        host: &H,
        backend: usize,
        predicted: (u32, u32),
        report: Report,
        last_use_ms: u64,
    ) -> Verdict {
        let (predicted_blocks, prompt_blocks) = predicted;
        let surplus = report.shows_surplus(predicted_blocks, prompt_blocks);
        let ordered = self.surplus.observe(surplus);
        let shortfall = report.shows_eviction(predicted_blocks, prompt_blocks);
        let verdict = Verdict {
            shortfall,
            surplus,
            forgot: shortfall && ordered,
        };
        if !verdict.forgot {
            return verdict;
        }
        self.index.forget_used_before(backend, last_use_ms);
        match self.account(host, None, host.now_ms(), true, false) {
            Ok(Some(seq))
                if self.log(
                    host,
                    self.head(Kind::Evicted, seq, backend, last_use_ms, 0),
                    &[],
                ) => {}
            Ok(_) => log::debug!("warmroute: eviction not written to the log"),
            Err(e) => log::debug!("warmroute: eviction not shared with other VMs: {e:?}"),
        }
        verdict
    }

    /// A pod's report counted `tokens` for a prompt of `blocks` full blocks:
    /// learns the ratio, and resizes the index once it moved by a tenth.
    pub fn learn_ratio(&mut self, blocks: u32, tokens: u64) {
        if !self.cfg.index.learn_bytes_per_token {
            return;
        }
        self.ratio.observe(blocks, self.cfg.block_bytes, tokens);
        let moved = self.ratio.bytes_per_token() / self.sized_ratio.max(f64::MIN_POSITIVE);
        if !(0.9..=1.1).contains(&moved) {
            self.resize_index();
        }
    }

    /// Prompt bytes per pod token the index's capacities are sized with.
    pub fn bytes_per_token(&self) -> f64 {
        self.sized_ratio
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
        let n = self.fleet.len();
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

    /// Heartbeats this fleet and empties the values of fleets gone silent
    /// (from the tick; see [`crate::fleet::store`], "Fleets that are gone").
    pub fn sweep_fleets<H: Host>(&self, host: &H, now: u64) -> Result<Vec<u64>, HostError> {
        let idle =
            crate::fleet::store::FLEET_IDLE_MS.max(10 * lease_ms(self.cfg.metrics.period_ms));
        self.store(host).sweep_fleets(now, idle)
    }

    /// Shares when this VM last saw each backend answer, if that changed (from the tick).
    pub fn publish_served<H: Host>(&mut self, host: &H) -> Result<(), HostError> {
        match self.passive.served_news() {
            Some(mine) => self.store(host).publish_served(&mine),
            None => Ok(()),
        }
    }

    /// One ledger write of the waiting releases and this VM's heartbeat.
    fn write_ledger<H: Host>(
        &mut self,
        host: &H,
        seed: Option<Versioned>,
        now_ms: u64,
    ) -> Result<Vec<InFlight>, HostError> {
        let writer = self.writer(now_ms);
        let accounted = self
            .store(host)
            .account(seed, writer, &self.unreleased, false)?;
        self.unreleased.fill(Delta::default());
        note_reclaimed(&accounted.reclaimed);
        Ok(accounted.ledger.inflight)
    }

    /// This VM as a ledger writer at `now_ms`.
    fn writer(&self, now_ms: u64) -> Writer {
        Writer {
            vm: self.vm_id,
            now_ms,
            lease_ms: lease_ms(self.cfg.metrics.period_ms),
        }
    }

    /// Drops index entries idle past the TTL (from the tick).
    pub fn expire(&mut self, now_ms: u64) {
        self.index.expire(now_ms);
    }

    /// Every backend's health as this VM routes on it.
    pub fn health(&self) -> &[Health] {
        &self.health
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

    /// The backend at `address` (`ip:port`), if it is one of the fleet's.
    pub fn backend_at(&self, address: &str) -> Option<usize> {
        let id = address_id(address);
        self.ids.iter().position(|&i| i == id)
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

    /// Re-reads every backend's health from shared data (from the tick); on a
    /// failed read the last known health stays.
    pub fn refresh_health<H: Host>(&mut self, host: &H) -> Result<(), HostError> {
        let health = self.store(host).health()?;
        self.set_all_health(health);
        Ok(())
    }

    /// Records one scrape of `backend` in shared data and, at once, in this
    /// VM's view. Returns the backend's new health.
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
        self.resize_index();
        Ok(health)
    }

    fn set_all_health(&mut self, mut health: Vec<Health>) {
        health.resize(self.fleet.len(), Health::default());
        self.health = health;
        self.resize_index();
    }

    /// Sizes the index to each backend's real KV capacity, when known.
    fn resize_index(&mut self) {
        self.sized_ratio = self.ratio.bytes_per_token();
        let blocks_per_token = self.sized_ratio / self.cfg.block_bytes.max(1) as f64;
        let known: Vec<Option<usize>> = self
            .health
            .iter()
            .map(|h| {
                h.scrape
                    .capacity_tokens
                    .map(|t| (t as f64 * blocks_per_token) as usize)
            })
            .collect();
        self.index.set_capacities(&known);
    }
}

#[cfg(test)]
mod tests;
