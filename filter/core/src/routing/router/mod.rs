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
//! [`FleetView::release`]). Every ledger write carries this VM's heartbeat; the
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
//! The fleet is read through this VM's [`FleetView`]: the ledger once per
//! request (a [`crate::fleet::view::Snapshot`]), the slot table, health and
//! LoRA state as the view last mirrored them. What changes in the fleet
//! reaches the index here: a slot whose pod changed starts cold, and each
//! pod's share of the index follows the KV capacity its scrape reports.

use crate::config::{Config, PolicyConfig, Strategy};
use crate::fleet::inflight::Delta;
use crate::fleet::membership::{Changes, ReplyError};
use crate::fleet::view::{FleetView, Snapshot};
use crate::hash::{mix, session_hash};
use crate::host::{Host, HostError};
use crate::phases::{Split, Stage};
use crate::prompt::prefix::PromptKey;
use crate::routing::exchange::Outbox;
use crate::routing::feedback::{Surpluses, TokenRatio};
use crate::routing::index::Index;
use crate::routing::index_log::Kind;
use crate::routing::load::{backend_loads, BackendLoad};
use crate::routing::models::{narrow, Fit};
use crate::routing::pending::{Pending, PendingTicket};
use crate::routing::policy::{Chooser, Decision, Reason, RequestKey};

/// Anchor length for prompts without message structure (completions).
pub const ANCHOR_BYTES: usize = 2048;

/// Most times one request's decision is made again after the ledger changed
/// under it; past them its write goes in on the ledger as it then is.
const MAX_REDECISIONS: u32 = 2;

/// What the filter learned about one request.
#[derive(Debug, Clone, Default)]
pub struct Request<'a> {
    /// The prompt's key, if the body could be read.
    pub key: Option<&'a PromptKey>,
    /// Value of the session header.
    pub session: Option<&'a str>,
    /// For a `/v1/responses` follow-up, who answered its `previous_response_id`
    /// ([`crate::fleet::responses`]).
    pub previous: Option<Previous>,
}

/// Who answered the stored response a follow-up names, by the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Previous {
    /// The record holds no pod for that id.
    Unknown,
    /// The pod that answered it: its address id.
    Answered(u64),
}

/// How a follow-up by `previous_response_id` was routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Continued {
    /// To the pod that answered the response it continues.
    Holder,
    /// As usual: the record holds no pod for its id.
    Unknown,
    /// As usual: the pod that answered it is no member of the pool now.
    HolderGone,
    /// As usual: the pod that answered it is out of rotation (unhealthy).
    HolderDown,
}

impl Continued {
    /// Every outcome, in the stats' order.
    pub const ALL: [Continued; 4] = [
        Continued::Holder,
        Continued::Unknown,
        Continued::HolderGone,
        Continued::HolderDown,
    ];

    /// Stable name used in stats and the debug header.
    pub fn name(self) -> &'static str {
        match self {
            Continued::Holder => "holder",
            Continued::Unknown => "unknown",
            Continued::HolderGone => "holder_gone",
            Continued::HolderDown => "holder_down",
        }
    }
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
    pub claim: Delta,
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
    pub pending: Option<PendingTicket>,
    /// Times the decision was made again because another worker wrote the
    /// ledger between its read and this request's write.
    pub redecided: u32,
    /// For a follow-up by `previous_response_id`: whether it went to the pod
    /// that answered its predecessor, or why not.
    pub continued: Option<Continued>,
}

/// Per-VM routing state.
pub struct Router {
    /// This VM's view of the fleet (which holds the configuration).
    fleet: FleetView,
    /// This VM's replica of the prefix index.
    index: Index,
    /// Next log event this VM has not applied.
    applied_seq: u64,
    requests: u64,
    matched: Vec<u32>,
    /// The backends whose match, for the request being decided, was lowered
    /// for what pending prompts bring ([`Pending::ready`]).
    lowered: Vec<usize>,
    /// Per backend, for the request being decided: another request this VM sent
    /// there waits for its first token and shares its prompt up to the last
    /// block of that backend's match.
    shared: Vec<bool>,
    /// The prompts this VM routed and has seen no response byte of, and the
    /// other workers' the ledger shows not yet prefilled, per pod (`cache_aware`
    /// only): the sole holder's guard and what a match has ready ([`crate::routing::pending`]).
    pending: Pending,
    /// Times the steps of a routed request (only with `phase-timing`).
    split: Split,
    /// Prompt bytes per pod token, as the pods' reports show it.
    ratio: TokenRatio,
    /// Whether each pod's recent reports showed cache this index did not credit it with.
    surplus: Surpluses,
    /// The ratio the index's capacities were last sized with.
    sized_ratio: f64,
    /// This replica's own recent events, for its peers (with `peers` only).
    outbox: Option<Outbox>,
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

/// The gate's look at the fleet for one request ([`Router::admit`]).
#[derive(Debug)]
pub struct Look(Observed);

/// What a request saw of the fleet before deciding.
#[derive(Debug)]
struct Observed {
    loads: Vec<BackendLoad>,
    /// The ledger as read, to seed the accounting CAS.
    ledger: Option<crate::host::Versioned>,
    log_gap: bool,
    host_errors: u32,
    now: u64,
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
        let index = Index::new(cfg.slot_count(), cfg.index.max_blocks, cfg.index.ttl_ms);
        let bytes_per_token = cfg.index.bytes_per_token;
        let outbox = cfg.peers.as_ref().map(|p| Outbox::new(p.outbox_bytes));
        let fleet = FleetView::new(cfg, host);
        let n = fleet.slot_count();
        // Start reading the log where it is now: older events describe a past we cannot date.
        let applied_seq = fleet.store(host).log_next_seq().unwrap_or(0);
        let mut router = Router {
            fleet,
            index,
            applied_seq,
            requests: 0,
            matched: Vec::with_capacity(n),
            lowered: Vec::new(),
            shared: Vec::with_capacity(n),
            pending: Pending::default(),
            split: Split::default(),
            ratio: TokenRatio::new(bytes_per_token),
            surplus: Surpluses::default(),
            sized_ratio: bytes_per_token,
            outbox,
        };
        router.resize_index();
        router
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        self.fleet.config()
    }

    /// This VM's view of the fleet.
    pub fn fleet(&self) -> &FleetView {
        &self.fleet
    }

    /// This VM's view of the fleet, for what changes nothing the index keeps:
    /// releases, answers, LoRA state, the tick's ledger work. What changes
    /// members or health goes through the router ([`Router::refresh_members`],
    /// [`Router::members_reply`], [`Router::update_fleet`]).
    pub fn fleet_mut(&mut self) -> &mut FleetView {
        &mut self.fleet
    }

    /// A slot whose pod changed starts cold: no index entries, no waiting prompts.
    fn forget_slots(&mut self, changed: &[usize]) {
        for &b in changed {
            self.index.forget(b);
            self.pending.forget(b);
        }
    }

    /// Re-reads the slot table the scraping VM published (from the tick; a
    /// fixed fleet has nothing to read). Returns the slots whose pod changed.
    pub fn refresh_members<H: Host>(&mut self, host: &H) -> Result<Vec<usize>, HostError> {
        let changed = self.fleet.refresh_members(host)?;
        self.forget_slots(&changed);
        Ok(changed)
    }

    /// Folds Envoy's list of the pool's endpoints (an admin reply) into the
    /// fleet ([`FleetView::members_reply`]); a slot whose pod changed starts cold.
    pub fn members_reply<H: Host>(
        &mut self,
        host: &H,
        body: &[u8],
        now: u64,
    ) -> Result<Result<Changes, ReplyError>, HostError> {
        let (changes, changed) = match self.fleet.members_reply(host, body, now)? {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        self.forget_slots(&changed);
        self.resize_index();
        Ok(Ok(changes))
    }

    /// Changes the fleet's health or capacity through `change` (a scrape's
    /// outcome, the tick's re-read of every backend's health), then sizes the
    /// index to the capacity the fleet now reports: the one door for such
    /// changes, so the index never keeps blocks a pod no longer has room for.
    /// A failed host read changes nothing, so the index stays as sized.
    pub fn update_fleet<T>(
        &mut self,
        change: impl FnOnce(&mut FleetView) -> Result<T, HostError>,
    ) -> Result<T, HostError> {
        let out = change(&mut self.fleet)?;
        self.resize_index();
        Ok(out)
    }

    /// Routes one request; never fails (host errors degrade to less information).
    pub fn route<H: Host>(&mut self, host: &H, req: &Request<'_>) -> Routed {
        self.route_admitted(host, req, None)
    }

    /// [`Router::route`] for a request the gate admitted on `look`, its look
    /// at the fleet in the same callback ([`Router::admit`]), which the
    /// decision reuses instead of reading the ledger again.
    pub fn route_admitted<H: Host>(
        &mut self,
        host: &H,
        req: &Request<'_>,
        look: Option<Look>,
    ) -> Routed {
        self.split.start(host);
        let routed = self.route_timed(host, req, look);
        self.split.stop();
        routed
    }

    fn route_timed<H: Host>(&mut self, host: &H, req: &Request<'_>, look: Option<Look>) -> Routed {
        let mut seen = match look {
            Some(Look(seen)) => seen,
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
            self.fleet.config().strategy,
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
        // Judged on the fleet as it is, before narrowing by model or knee.
        let holder = req.previous.map(|p| self.holder(p, &seen.loads));
        let continued = holder.map(|h| h.err().unwrap_or(Continued::Holder));
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
                    continued,
                    ..routed
                });
        }
        if let Some(Ok(b)) = holder {
            // Only that pod holds the response it continues: no load bound, no fallback.
            let (matched, blocks) = match req.key {
                Some(k) => {
                    self.index
                        .match_lengths(&k.blocks, seen.now, &mut self.matched);
                    (
                        self.matched.get(b).copied().unwrap_or(0),
                        k.blocks.len() as u32,
                    )
                }
                None => (0, 0),
            };
            let decision = Decision {
                order: vec![b],
                matched,
                reason: Reason::StoredResponse,
            };
            return self
                .commit(host, req, decision, blocks, seen, last)
                .map(|routed| Routed {
                    continued,
                    ..routed
                });
        }
        if self.fleet.config().gate.is_some()
            && seen.loads.iter().any(|l| l.healthy && l.headroom > 0.0)
        {
            // Keep each pod below its knee while any is ([`crate::gate`]).
            for l in seen.loads.iter_mut().filter(|l| l.headroom <= 0.0) {
                l.healthy = false;
            }
        }
        let drawn = self.draw(host, req, &mut seen);
        let (decision, blocks) = self.decide(host, req, &seen, drawn);
        // Only a predicted hit whose answer carries usage is checked against it; not
        // one lowered for what a pending prompt brings, nor one the pod computes again
        // whatever it holds (see `crate::routing::feedback`).
        let last_use_ms = match (req.key, decision.order.first()) {
            (Some(k), Some(&b))
                if self.fleet.config().feedback.enabled
                    && k.reports_usage
                    && !k.skips_cache_reads
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
                continued,
                ..routed
            })
    }

    /// The slot of the pod that answered a follow-up's predecessor, if it is a
    /// member in rotation ([`crate::fleet::responses`]); otherwise why not.
    fn holder(&self, previous: Previous, loads: &[BackendLoad]) -> Result<usize, Continued> {
        let Previous::Answered(pod) = previous else {
            return Err(Continued::Unknown);
        };
        let slot = self
            .fleet
            .ids()
            .iter()
            .zip(loads)
            .position(|(&id, l)| id == pod && l.member)
            .ok_or(Continued::HolderGone)?;
        match loads.get(slot) {
            Some(l) if l.healthy => Ok(slot),
            _ => Err(Continued::HolderDown),
        }
    }

    /// What the gate needs to know of the fleet ([`crate::gate`]): each
    /// slot's headroom before its knee if it is a member in rotation.
    pub fn capacity<H: Host>(&mut self, host: &H) -> Capacity {
        let seen = self.observe(host, false);
        self.capacity_in(&seen, None)
    }

    /// [`Router::capacity`] for the request `req` about to be routed, with
    /// whether each slot's pod may serve its model, and the look at the fleet
    /// it was judged on, for [`Router::route_admitted`] if the request goes now.
    pub fn admit<H: Host>(&mut self, host: &H, req: &Request<'_>) -> (Capacity, Look) {
        let seen = self.observe(host, req.key.is_some());
        let cap = self.capacity_in(&seen, req.key.and_then(|k| k.model.as_deref()));
        (cap, Look(seen))
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

    /// Keeps only the pods that serve `model` (and, for an adapter, those to
    /// prefer) in `loads` ([`crate::routing::models`]). Free when no pod says what it
    /// serves and none reported an adapter.
    fn narrow_to_model(&self, model: &str, loads: &mut [BackendLoad]) -> Fit {
        if !self.fleet.model_aware() {
            return Fit::Served;
        }
        narrow(
            model,
            |b| self.fleet.backend(b).map(|x| &x.serves),
            self.fleet.lora(),
            loads,
        )
    }

    /// Reads the ledger (and, for a request with a prompt, the index events
    /// other VMs appended since) into this request's load picture.
    fn observe<H: Host>(&mut self, host: &H, with_prompt: bool) -> Observed {
        let Snapshot {
            ledger,
            inflight,
            standing,
            now,
        } = self.fleet.snapshot(host, host.now_ms());
        self.split.lap(host, Stage::Ledger);
        let mut host_errors = 0;
        let (ledger, log_gap) = match ledger {
            Some(r) => {
                // Only a request with a prompt looks the index up: only it catches up.
                let log_gap = if with_prompt {
                    self.sync_index(host, r.value.next_seq).unwrap_or_else(|_| {
                        host_errors += 1;
                        false
                    })
                } else {
                    false
                };
                if with_prompt && self.fleet.config().strategy == Strategy::CacheAware {
                    // What the other workers' prompts still bring ([`crate::routing::pending`]).
                    self.pending.settle(|vm, b| r.value.prefill_of(vm, b));
                }
                (Some(r.raw), log_gap)
            }
            None => {
                host_errors += 1;
                (None, false)
            }
        };
        self.split.lap(host, Stage::Sync);
        let loads = backend_loads(
            &inflight,
            self.fleet.health(),
            &standing,
            now,
            self.fleet.config().metrics.stale_after_ms,
            &self.fleet.config().policy,
            self.fleet.config().gate.as_ref().map(|g| &g.knee),
        );
        self.split.lap(host, Stage::Loads);
        Observed {
            loads,
            ledger,
            log_gap,
            host_errors,
            now,
        }
    }

    /// This request's random number and, for a strategy that takes turns,
    /// its turn of the rotation every VM shares: the one host call a decision
    /// needs beyond the ledger (a failed one takes the random number instead).
    fn draw<H: Host>(&mut self, host: &H, req: &Request<'_>, seen: &mut Observed) -> (u64, u64) {
        self.requests = self.requests.wrapping_add(1);
        let random = mix(seen.now ^ self.fleet.vm_id().rotate_left(32) ^ self.requests);
        let needs_rotation = match self.fleet.config().strategy {
            Strategy::RoundRobin => true,
            Strategy::StickySession => req.session.is_none(),
            _ => false,
        };
        let rotation = if needs_rotation {
            self.fleet.store(host).next_rotation().unwrap_or_else(|_| {
                seen.host_errors += 1;
                random
            })
        } else {
            0
        };
        (random, rotation)
    }

    /// Runs the configured strategy on what `seen` and the index show; returns
    /// the decision and the prompt's full blocks. No host call but the timer's.
    fn decide<H: Host>(
        &mut self,
        host: &H,
        req: &Request<'_>,
        seen: &Observed,
        (random, rotation): (u64, u64),
    ) -> (Decision, u32) {
        let chooser = Chooser {
            cfg: &self.fleet.config().policy,
            loads: &seen.loads,
            ids: self.fleet.ids(),
            fallbacks: self.fleet.config().route.fallbacks,
        };
        let block = self.fleet.config().block_bytes.max(1);
        let (decision, blocks) = match req.key {
            Some(key) => {
                self.index
                    .match_lengths(&key.blocks, seen.now, &mut self.matched);
                let head_blocks = (key.anchor_offset / block) as u32;
                // A continuation whose history this index evicted (an engine that keeps whole
                // prompts) is no pod's: a new prompt, not one another gateway placed.
                let continuation = key.continuation
                    && !self
                        .index
                        .history_evicted(&key.blocks, &self.matched, head_blocks);
                self.lowered.clear();
                if !continuation {
                    // Not what pending prompts still bring ([`crate::routing::pending`], ready).
                    self.pending.ready(
                        &mut self.matched,
                        head_blocks,
                        &key.blocks,
                        &mut self.lowered,
                    );
                }
                self.pending
                    .shared(&self.matched, head_blocks, &key.blocks, &mut self.shared);
                self.split.lap(host, Stage::Match);
                let rk = RequestKey {
                    anchor: key.anchor,
                    matched: &self.matched,
                    blocks: key.blocks.len() as u32,
                    head_blocks,
                    continuation,
                    history_blocks: (key.history_bytes / block) as u32,
                    instructions_blocks: (key.instructions_bytes / block) as u32,
                    answers: key.answers,
                    shared: &self.shared,
                    session: req.session.map(session_hash),
                    rotation,
                    random,
                };
                (
                    chooser.choose(self.fleet.config().strategy, &rk),
                    key.blocks.len() as u32,
                )
            }
            // These strategies do not need the body: apply them as configured.
            None if matches!(
                self.fleet.config().strategy,
                Strategy::StickySession | Strategy::RoundRobin
            ) =>
            {
                let rk = RequestKey {
                    session: req.session.map(session_hash),
                    rotation,
                    random,
                    ..Default::default()
                };
                (chooser.choose(self.fleet.config().strategy, &rk), 0)
            }
            None => (chooser.fallback(random), 0),
        };
        let decision = decision.unwrap_or(Decision {
            order: Vec::new(),
            matched: 0,
            reason: Reason::Fallback,
        });
        self.split.lap(host, Stage::Policy);
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
                claim: Delta::default(),
                host_errors,
                log_gap: seen.log_gap,
                unknown_model: false,
                last_use_ms: None,
                pending: None,
                redecided: 0,
                continued: None,
            });
        };
        let claim = Delta {
            requests: 1,
            prefill_blocks: i32::try_from(blocks.saturating_sub(decision.matched))
                .unwrap_or(i32::MAX),
            decode_tokens: output_budget(req.key, &self.fleet.config().policy),
        };
        let chain = req.key.map_or(&[][..], |k| &k.blocks[..]);
        self.fleet.hold(primary, claim);
        // A read of a missing ledger has no CAS token to tell a change by.
        let if_unchanged = !last && seen.ledger.as_ref().is_some_and(|(_, cas)| cas.is_some());
        let accounted = self.account(host, seen.ledger, seen.now, !chain.is_empty(), if_unchanged);
        if if_unchanged && accounted == Err(HostError::CasMismatch) {
            self.fleet.defer(primary, claim);
            return None;
        }
        // Record the whole chain: it refreshes recency of the matched part
        // and, after a spillover, replicates a hot prefix to the new pod.
        let from = match chain.is_empty() {
            true => 0,
            false => self.index.record(chain, primary, seen.now),
        };
        let pending = if self.fleet.config().strategy == Strategy::CacheAware {
            self.pending.keep(chain, primary, from)
        } else {
            None
        };
        self.split.lap(host, Stage::Record);
        self.fleet.opened();
        let claim = match accounted {
            Ok(seq) => {
                if let Some(seq) = seq.filter(|_| !chain.is_empty()) {
                    let prefill = claim.prefill_blocks.unsigned_abs();
                    let head = self.head(Kind::Received, seq, primary, seen.now, prefill);
                    host_errors += u32::from(!self.log(host, head, chain));
                }
                claim
            }
            Err(_) => {
                host_errors += 1;
                self.fleet.defer(primary, claim);
                // A request the ledger never heard of holds nothing there: its release
                // must not take back another request's share.
                Delta::default()
            }
        };
        Some(Routed {
            decision,
            blocks,
            claim,
            host_errors,
            log_gap: seen.log_gap,
            unknown_model: false,
            last_use_ms: None,
            pending,
            redecided: 0,
            continued: None,
        })
    }

    /// A routed request got its first response byte (or ended): its prompt no
    /// longer waits on its pod ([`Pending::close`]).
    pub fn close(&mut self, ticket: PendingTicket) {
        self.pending.close(ticket);
    }

    /// How many prompts wait on their pods (tests).
    #[cfg(test)]
    pub(crate) fn pending_prompts(&self) -> usize {
        self.pending.prompts()
    }

    /// One ledger write ([`FleetView::account`]), timed as its step.
    fn account<H: Host>(
        &mut self,
        host: &H,
        seed: Option<crate::host::Versioned>,
        now: u64,
        reserve: bool,
        if_unchanged: bool,
    ) -> Result<Option<u64>, HostError> {
        let accounted = self.fleet.account(host, seed, now, reserve, if_unchanged);
        self.split.lap(host, Stage::Account);
        accounted.map(|a| a.seq)
    }
}

mod peers;
mod replica;

pub use peers::Imported;
#[cfg(test)]
mod tests;
