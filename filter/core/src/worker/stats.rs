//! The filter's Envoy stats (`/stats`, `/stats/prometheus`; Envoy prefixes
//! Wasm-defined names with `wasmcustom.`). Defined once per VM; every VM that
//! defines a name shares the one Envoy stat, so counters add up across workers.
//!
//! Counters bumped on the request path are summed in the VM and added to
//! Envoy's stat by the tick (every `metrics.period_ms`) and when the VM
//! stops: each host call costs microseconds in Envoy, and per request there
//! were four of them (decision, chosen pod, match, outcome), as much as the
//! routing decision itself on a short prompt.
//!
//! Per-model stats (`warmroute.model.decision.<reason>.<model>`,
//! `warmroute.model.{prompt_blocks,matched_blocks}.<model>`) are kept for the
//! names the operator declared (`backends[].models`/`adapters`,
//! `pool.models`/`adapters`, `pool.clusters[]`), never for a name a request
//! brings: a client picks `model`, and a stat per name would let it mint
//! series without bound. Every other request (an undeclared model, none, a
//! body not read) counts under `other`. At most [`MAX_MODEL_STATS`] declared
//! names get series of their own (in the order declared; later ones count as
//! `other`), and only names that are a Prometheus label value as they stand
//! (printable ASCII, no `"` or `\`), so the exporter need escape nothing.
//! Envoy's tag extraction (`stats_config.stats_tags` of the shipped configs)
//! turns the name into the label `model`.

use crate::config::Config;
use crate::fleet::health::Outcome;
use crate::fleet::inflight::InFlight;
use crate::gate::Shed;
use crate::host::{Host, MetricKind};
use crate::routing::feedback::Verdict;
use crate::routing::policy::Reason;
use crate::routing::router::{Continued, Imported};

/// Why a request was routed without reading its prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unread {
    /// Body is not JSON (or truncated, or nested too deep).
    NotJson,
    /// JSON without the fields the endpoint needs.
    BadShape,
    /// Body larger than `max_body_bytes`.
    TooLarge,
    /// `content-encoding` other than identity.
    Compressed,
    /// An inference path without a body.
    NoBody,
}

impl Unread {
    const ALL: [Unread; 5] = [
        Unread::NotJson,
        Unread::BadShape,
        Unread::TooLarge,
        Unread::Compressed,
        Unread::NoBody,
    ];

    /// Stable name used in stats and the debug header.
    pub fn name(self) -> &'static str {
        match self {
            Unread::NotJson => "not_json",
            Unread::BadShape => "bad_shape",
            Unread::TooLarge => "too_large",
            Unread::Compressed => "compressed",
            Unread::NoBody => "no_body",
        }
    }
}

const REASONS: [Reason; 10] = [
    Reason::CacheHit,
    Reason::Placed,
    Reason::Spillover,
    Reason::Replicated,
    Reason::LeastLoaded,
    Reason::RoundRobin,
    Reason::Random,
    Reason::Sticky,
    Reason::StoredResponse,
    Reason::Fallback,
];

/// Most declared models with per-model stats of their own (each one costs
/// 12 Envoy stats per gateway).
pub const MAX_MODEL_STATS: usize = 32;

/// The bucket of every model without stats of its own.
pub const OTHER_MODEL: &str = "other";

/// The declared model and adapter names that get per-model stats, each once,
/// in the order declared: at most [`MAX_MODEL_STATS`], each a label value
/// that needs no escaping.
pub fn stat_models(cfg: &Config) -> Vec<&str> {
    let declared = cfg
        .backends
        .iter()
        .map(|b| &b.serves)
        .chain(
            cfg.pool
                .iter()
                .flat_map(|p| p.clusters.iter().map(|c| &c.serves)),
        )
        .flat_map(|s| s.models.iter().chain(&s.adapters));
    let mut out: Vec<&str> = Vec::new();
    for name in declared {
        let plain = name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\');
        if plain && name != OTHER_MODEL && !out.contains(&name.as_str()) {
            if out.len() == MAX_MODEL_STATS {
                break;
            }
            out.push(name);
        }
    }
    out
}

/// One model's stats (or the [`OTHER_MODEL`] bucket's).
struct ModelStats {
    decisions: Vec<Counter>,
    prompt_blocks: Counter,
    matched_blocks: Counter,
}

/// Response classes counted per strategy.
const OUTCOMES: [&str; 4] = ["2xx", "4xx", "5xx", "reset"];

/// An Envoy counter whose increments wait in the VM until [`Counter::flush`].
#[derive(Debug, Default)]
struct Counter {
    /// None when the stat failed to define: its counts are dropped.
    id: Option<u32>,
    pending: i64,
}

impl Counter {
    fn new(host: &impl Host, name: String) -> Counter {
        Counter {
            id: host.define_metric(MetricKind::Counter, &name),
            pending: 0,
        }
    }

    fn add(&mut self, by: i64) {
        self.pending = self.pending.saturating_add(by);
    }

    fn flush(&mut self, host: &impl Host) {
        let by = std::mem::take(&mut self.pending);
        if let (Some(id), true) = (self.id, by != 0) {
            host.increment_metric(id, by);
        }
    }
}

fn add_at(counters: &mut [Counter], i: usize, by: i64) {
    if let Some(c) = counters.get_mut(i) {
        c.add(by);
    }
}

/// Metric ids of one VM.
pub struct Stats {
    decisions: Vec<Counter>,
    fallbacks: Vec<Counter>,
    outcomes: Vec<Counter>,
    passthrough: Counter,
    prompt_blocks: Counter,
    matched_blocks: Counter,
    chosen: Vec<Counter>,
    inflight: Vec<Option<u32>>,
    prefill: Vec<Option<u32>>,
    healthy: Vec<Option<u32>>,
    kv_capacity: Vec<Option<u32>>,
    bytes_per_token: Option<u32>,
    scrape_ok: Counter,
    scrape_failed: Counter,
    scrape_slow: Counter,
    ejections: Counter,
    unknown_model: Counter,
    reports: Counter,
    predicted_tokens: Counter,
    reported_tokens: Counter,
    evictions: Counter,
    surpluses: Counter,
    forgets: Counter,
    usage_requested: Counter,
    host_errors: Counter,
    log_gaps: Counter,
    redecided: Counter,
    continued: Vec<Counter>,
    remembered: Counter,
    not_remembered: Counter,
    peer_served: Counter,
    peer_pulls_ok: Counter,
    peer_pulls_failed: Counter,
    peer_imported: Counter,
    peer_dropped: Counter,
    peer_answers: Counter,
    gate: Vec<ClassStats>,
    /// The names of [`stat_models`], whose stats are `models`' first; the
    /// last of `models` is [`OTHER_MODEL`]'s.
    model_names: Vec<String>,
    models: Vec<ModelStats>,
}

/// One priority class's stats at the gate ([`crate::gate`]).
struct ClassStats {
    admitted: Counter,
    held: Counter,
    released: Counter,
    shed_deadline: Counter,
    shed_queue_full: Counter,
    abandoned: Counter,
    wait_ms: Counter,
    queued: Option<u32>,
}

/// What became of a request at the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateEvent {
    /// Routed on arrival.
    Admitted,
    /// Held.
    Held,
    /// Routed after waiting this many milliseconds.
    Released(u64),
    /// Answered 429.
    Shed(Shed),
    /// Its client left while it was held.
    Abandoned,
}

fn set(host: &impl Host, id: Option<u32>, v: u64) {
    if let Some(id) = id {
        host.record_metric(id, v);
    }
}

impl Stats {
    /// Defines every stat for this configuration; `names`: each slot's name.
    pub fn define(cfg: &Config, names: &[String], host: &impl Host) -> Stats {
        let strategy = cfg.strategy.name();
        let gauges = |what: &str| {
            names
                .iter()
                .map(|name| {
                    host.define_metric(
                        MetricKind::Gauge,
                        &format!("warmroute.backend.{name}.{what}"),
                    )
                })
                .collect()
        };
        let counter = |name: String| Counter::new(host, name);
        let model_names: Vec<String> = stat_models(cfg).into_iter().map(String::from).collect();
        let models = model_names
            .iter()
            .map(String::as_str)
            .chain([OTHER_MODEL])
            .map(|m| ModelStats {
                decisions: REASONS
                    .iter()
                    .map(|r| counter(format!("warmroute.model.decision.{}.{m}", r.name())))
                    .collect(),
                prompt_blocks: counter(format!("warmroute.model.prompt_blocks.{m}")),
                matched_blocks: counter(format!("warmroute.model.matched_blocks.{m}")),
            })
            .collect();
        Stats {
            model_names,
            models,
            decisions: REASONS
                .iter()
                .map(|r| counter(format!("warmroute.decision.{}", r.name())))
                .collect(),
            fallbacks: Unread::ALL
                .iter()
                .map(|f| counter(format!("warmroute.fallback.{}", f.name())))
                .collect(),
            outcomes: OUTCOMES
                .iter()
                .map(|o| counter(format!("warmroute.requests.{strategy}.{o}")))
                .collect(),
            passthrough: counter("warmroute.passthrough".into()),
            prompt_blocks: counter("warmroute.prompt_blocks".into()),
            matched_blocks: counter("warmroute.matched_blocks".into()),
            chosen: names
                .iter()
                .map(|name| counter(format!("warmroute.backend.{name}.chosen")))
                .collect(),
            inflight: gauges("inflight"),
            prefill: gauges("prefill_blocks"),
            healthy: gauges("healthy"),
            kv_capacity: gauges("kv_capacity_tokens"),
            bytes_per_token: host
                .define_metric(MetricKind::Gauge, "warmroute.index.bytes_per_token_milli"),
            scrape_ok: counter("warmroute.scrape.ok".into()),
            scrape_failed: counter("warmroute.scrape.failed".into()),
            scrape_slow: counter("warmroute.scrape.slow".into()),
            ejections: counter("warmroute.ejections".into()),
            unknown_model: counter("warmroute.unknown_model".into()),
            reports: counter("warmroute.feedback.reports".into()),
            predicted_tokens: counter("warmroute.feedback.predicted_tokens".into()),
            reported_tokens: counter("warmroute.feedback.reported_tokens".into()),
            evictions: counter("warmroute.feedback.evictions".into()),
            surpluses: counter("warmroute.feedback.surpluses".into()),
            forgets: counter("warmroute.feedback.forgets".into()),
            usage_requested: counter("warmroute.feedback.usage_requested".into()),
            host_errors: counter("warmroute.host_errors".into()),
            log_gaps: counter("warmroute.index.log_gaps".into()),
            redecided: counter("warmroute.redecided".into()),
            continued: Continued::ALL
                .iter()
                .map(|c| counter(format!("warmroute.responses.{}", c.name())))
                .collect(),
            remembered: counter("warmroute.responses.remembered".into()),
            not_remembered: counter("warmroute.responses.not_remembered".into()),
            peer_served: counter("warmroute.peers.served".into()),
            peer_pulls_ok: counter("warmroute.peers.pulls_ok".into()),
            peer_pulls_failed: counter("warmroute.peers.pulls_failed".into()),
            peer_imported: counter("warmroute.peers.events_imported".into()),
            peer_dropped: counter("warmroute.peers.events_dropped".into()),
            peer_answers: counter("warmroute.peers.answers_imported".into()),
            gate: cfg
                .gate
                .iter()
                .flat_map(|g| &g.classes)
                .map(|c| {
                    let name = |what: &str| format!("warmroute.gate.{}.{what}", c.name);
                    ClassStats {
                        admitted: counter(name("admitted")),
                        held: counter(name("held")),
                        released: counter(name("released")),
                        shed_deadline: counter(name("shed_deadline")),
                        shed_queue_full: counter(name("shed_queue_full")),
                        abandoned: counter(name("abandoned")),
                        wait_ms: counter(name("wait_ms")),
                        queued: host.define_metric(MetricKind::Gauge, &name("queued")),
                    }
                })
                .collect(),
        }
    }

    /// A request of class `rank` at the gate.
    pub fn gate(&mut self, rank: usize, event: GateEvent) {
        let Some(c) = self.gate.get_mut(rank) else {
            return;
        };
        match event {
            GateEvent::Admitted => c.admitted.add(1),
            GateEvent::Held => c.held.add(1),
            GateEvent::Released(waited_ms) => {
                c.released.add(1);
                c.wait_ms.add(i64::try_from(waited_ms).unwrap_or(i64::MAX));
            }
            GateEvent::Shed(Shed::Deadline) => c.shed_deadline.add(1),
            GateEvent::Shed(Shed::QueueFull) => c.shed_queue_full.add(1),
            GateEvent::Abandoned => c.abandoned.add(1),
        }
    }

    /// Sets each class's queue length, gateway-wide.
    pub fn queued(&self, host: &impl Host, per_class: impl Iterator<Item = u32>) {
        for (c, n) in self.gate.iter().zip(per_class) {
            set(host, c.queued, n.into());
        }
    }

    /// One routing decision for a request of `model` (none: its body was
    /// not read, or named none): `matched` of the prompt's `blocks` were
    /// cached on the chosen pod.
    pub fn decided(
        &mut self,
        reason: Reason,
        backend: Option<usize>,
        model: Option<&str>,
        (matched, blocks): (u32, u32),
        (host_errors, log_gap, redecided): (u32, bool, u32),
    ) {
        let own = model.and_then(|m| self.model_names.iter().position(|n| n == m));
        // The last of `models` is the other models' bucket.
        let per_model = own.unwrap_or(self.model_names.len());
        if let Some(i) = REASONS.iter().position(|r| *r == reason) {
            add_at(&mut self.decisions, i, 1);
            if let Some(m) = self.models.get_mut(per_model) {
                add_at(&mut m.decisions, i, 1);
            }
        }
        if let Some(m) = self.models.get_mut(per_model) {
            m.prompt_blocks.add(blocks.into());
            m.matched_blocks.add(matched.min(blocks).into());
        }
        if let Some(b) = backend {
            add_at(&mut self.chosen, b, 1);
        }
        self.prompt_blocks.add(blocks.into());
        self.matched_blocks.add(matched.min(blocks).into());
        self.host_errors.add(host_errors.into());
        self.log_gaps.add(log_gap.into());
        self.redecided.add(redecided.into());
    }

    /// A request whose prompt could not be read.
    pub fn fell_back(&mut self, why: Unread) {
        if let Some(i) = Unread::ALL.iter().position(|f| *f == why) {
            add_at(&mut self.fallbacks, i, 1);
        }
    }

    /// A request to a non-inference path.
    pub fn passed_through(&mut self) {
        self.passthrough.add(1);
    }

    /// How a routed request ended; `status` is the response `:status`, if any.
    pub fn finished(&mut self, status: Option<u32>) {
        let i = match status {
            Some(200..=399) => 0,
            Some(400..=499) => 1,
            Some(_) => 2,
            None => 3,
        };
        add_at(&mut self.outcomes, i, 1);
    }

    /// A scrape result.
    pub fn scraped(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Answered(_) => self.scrape_ok.add(1),
            Outcome::Failed => self.scrape_failed.add(1),
            Outcome::Slow => self.scrape_slow.add(1),
        }
    }

    /// A pod's own cache report on a predicted hit: what the index predicted,
    /// what the pod reported, and what the report showed.
    pub fn reported(&mut self, predicted_tokens: u64, reported_tokens: u64, verdict: Verdict) {
        self.reports.add(1);
        let count = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.predicted_tokens.add(count(predicted_tokens));
        self.reported_tokens.add(count(reported_tokens));
        self.evictions.add(verdict.shortfall.into());
        self.surpluses.add(verdict.surplus.into());
        self.forgets.add(verdict.forgot.into());
    }

    /// A stream the filter asked to end with its usage (`feedback.request_usage`).
    pub fn asked_usage(&mut self) {
        self.usage_requested.add(1);
    }

    /// How a follow-up by `previous_response_id` was routed.
    pub fn continued(&mut self, how: Continued) {
        if let Some(i) = Continued::ALL.iter().position(|c| *c == how) {
            add_at(&mut self.continued, i, 1);
        }
    }

    /// A stored response's answer: whether the record now holds its pod
    /// (not: no id in its first bytes, no upstream to name, or a failed write).
    pub fn remembered(&mut self, done: bool) {
        match done {
            true => self.remembered.add(1),
            false => self.not_remembered.add(1),
        }
    }

    /// A host call that failed outside a routing decision.
    pub fn host_error(&mut self) {
        self.host_errors.add(1);
    }

    /// A request for a model no pod serves, answered 404.
    pub fn unknown_model(&mut self) {
        self.unknown_model.add(1);
    }

    /// A backend left this worker's rotation on its failed answers.
    pub fn ejected(&mut self) {
        self.ejections.add(1);
    }

    /// The tick read the index log; `gap`: some events were lost to this VM.
    pub fn log_read(&mut self, gap: bool) {
        self.log_gaps.add(gap.into());
    }

    /// A peer replica's pull answered ([`crate::routing::exchange`]).
    pub fn peer_served(&mut self) {
        self.peer_served.add(1);
    }

    /// A pull of a peer replica: a usable reply or not.
    pub fn peer_pulled(&mut self, ok: bool) {
        if ok {
            self.peer_pulls_ok.add(1);
        } else {
            self.peer_pulls_failed.add(1);
        }
    }

    /// A peer's events written to this replica's log, those left out, and
    /// its stored responses' answers written to this Envoy's record.
    pub fn peer_imported(&mut self, i: Imported) {
        self.peer_imported.add(i.events.into());
        self.peer_dropped.add(i.dropped.into());
        self.peer_answers.add(i.answers.into());
    }

    /// Adds every counter's pending increments to Envoy's stats.
    pub fn flush(&mut self, host: &impl Host) {
        let lists = [
            &mut self.decisions,
            &mut self.fallbacks,
            &mut self.outcomes,
            &mut self.chosen,
            &mut self.continued,
        ];
        let singles = [
            &mut self.passthrough,
            &mut self.prompt_blocks,
            &mut self.matched_blocks,
            &mut self.scrape_ok,
            &mut self.scrape_failed,
            &mut self.scrape_slow,
            &mut self.ejections,
            &mut self.unknown_model,
            &mut self.reports,
            &mut self.predicted_tokens,
            &mut self.reported_tokens,
            &mut self.evictions,
            &mut self.surpluses,
            &mut self.forgets,
            &mut self.usage_requested,
            &mut self.host_errors,
            &mut self.log_gaps,
            &mut self.redecided,
            &mut self.remembered,
            &mut self.not_remembered,
            &mut self.peer_served,
            &mut self.peer_pulls_ok,
            &mut self.peer_pulls_failed,
            &mut self.peer_imported,
            &mut self.peer_dropped,
            &mut self.peer_answers,
        ];
        lists
            .into_iter()
            .flatten()
            .chain(singles)
            .for_each(|c| c.flush(host));
        for m in &mut self.models {
            let ModelStats {
                decisions,
                prompt_blocks,
                matched_blocks,
            } = m;
            for c in decisions.iter_mut().chain([prompt_blocks, matched_blocks]) {
                c.flush(host);
            }
        }
        for c in &mut self.gate {
            for counter in [
                &mut c.admitted,
                &mut c.held,
                &mut c.released,
                &mut c.shed_deadline,
                &mut c.shed_queue_full,
                &mut c.abandoned,
                &mut c.wait_ms,
            ] {
                counter.flush(host);
            }
        }
    }

    /// Refreshes per-backend gauges.
    pub fn gauges(&self, host: &impl Host, inflight: &[InFlight], healthy: &[bool]) {
        for (b, v) in inflight.iter().enumerate() {
            set(
                host,
                self.inflight.get(b).copied().flatten(),
                v.requests as u64,
            );
            set(
                host,
                self.prefill.get(b).copied().flatten(),
                v.prefill_blocks as u64,
            );
        }
        for (b, &h) in healthy.iter().enumerate() {
            set(host, self.healthy.get(b).copied().flatten(), h as u64);
        }
    }

    /// What the index is sized with: each pod's KV capacity as its scrape
    /// said (0: not known), and the prompt bytes per token (× 1000).
    pub fn index_gauges(&self, host: &impl Host, capacity: &[Option<u64>], bytes_per_token: f64) {
        for (b, c) in capacity.iter().enumerate() {
            set(
                host,
                self.kv_capacity.get(b).copied().flatten(),
                c.unwrap_or(0),
            );
        }
        set(
            host,
            self.bytes_per_token,
            (bytes_per_token * 1000.0) as u64,
        );
    }
}
