//! The filter's Envoy stats (`/stats`, `/stats/prometheus`; Envoy prefixes
//! Wasm-defined names with `wasmcustom.`). Defined once per VM; every VM that
//! defines a name shares the one Envoy stat, so counters add up across workers.
//!
//! Counters bumped on the request path are summed in the VM and added to
//! Envoy's stat by the tick (every `metrics.period_ms`) and when the VM
//! stops: each host call costs microseconds in Envoy, and per request there
//! were four of them (decision, chosen pod, match, outcome), as much as the
//! routing decision itself on a short prompt.

use crate::config::Config;
use crate::load::InFlight;
use crate::policy::Reason;
use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;
use std::cell::Cell;

/// Why a request was routed without reading its prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
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

impl Fallback {
    const ALL: [Fallback; 5] = [
        Fallback::NotJson,
        Fallback::BadShape,
        Fallback::TooLarge,
        Fallback::Compressed,
        Fallback::NoBody,
    ];

    /// Stable name used in stats and the debug header.
    pub fn name(self) -> &'static str {
        match self {
            Fallback::NotJson => "not_json",
            Fallback::BadShape => "bad_shape",
            Fallback::TooLarge => "too_large",
            Fallback::Compressed => "compressed",
            Fallback::NoBody => "no_body",
        }
    }
}

const REASONS: [Reason; 8] = [
    Reason::CacheHit,
    Reason::Placed,
    Reason::Spillover,
    Reason::LeastLoaded,
    Reason::RoundRobin,
    Reason::Random,
    Reason::Sticky,
    Reason::Fallback,
];

/// Response classes counted per strategy.
const OUTCOMES: [&str; 4] = ["2xx", "4xx", "5xx", "reset"];

fn define(kind: MetricType, name: &str) -> Option<u32> {
    hostcalls::define_metric(kind, name).ok()
}

/// An Envoy counter whose increments wait in the VM until [`Counter::flush`].
#[derive(Debug, Default)]
struct Counter {
    /// None when the stat failed to define: its counts are dropped.
    id: Option<u32>,
    pending: Cell<i64>,
}

impl Counter {
    fn new(name: String) -> Counter {
        Counter {
            id: define(MetricType::Counter, &name),
            pending: Cell::new(0),
        }
    }

    fn add(&self, by: i64) {
        self.pending.set(self.pending.get().saturating_add(by));
    }

    fn flush(&self) {
        let by = self.pending.replace(0);
        if let (Some(id), true) = (self.id, by != 0) {
            let _ = hostcalls::increment_metric(id, by);
        }
    }
}

fn add_at(counters: &[Counter], i: usize, by: i64) {
    if let Some(c) = counters.get(i) {
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
    scrape_ok: Counter,
    scrape_failed: Counter,
    host_errors: Counter,
    log_gaps: Counter,
}

fn set(id: Option<u32>, v: u64) {
    if let Some(id) = id {
        let _ = hostcalls::record_metric(id, v);
    }
}

impl Stats {
    /// Defines every stat for this configuration.
    pub fn define(cfg: &Config) -> Stats {
        let strategy = cfg.strategy.name();
        let per_backend = |kind: MetricType, what: &str| {
            cfg.backends
                .iter()
                .map(|b| define(kind, &format!("warmroute.backend.{}.{what}", b.name)))
                .collect()
        };
        Stats {
            decisions: REASONS
                .iter()
                .map(|r| Counter::new(format!("warmroute.decision.{}", r.name())))
                .collect(),
            fallbacks: Fallback::ALL
                .iter()
                .map(|f| Counter::new(format!("warmroute.fallback.{}", f.name())))
                .collect(),
            outcomes: OUTCOMES
                .iter()
                .map(|o| Counter::new(format!("warmroute.requests.{strategy}.{o}")))
                .collect(),
            passthrough: Counter::new("warmroute.passthrough".into()),
            prompt_blocks: Counter::new("warmroute.prompt_blocks".into()),
            matched_blocks: Counter::new("warmroute.matched_blocks".into()),
            chosen: cfg
                .backends
                .iter()
                .map(|b| Counter::new(format!("warmroute.backend.{}.chosen", b.name)))
                .collect(),
            inflight: per_backend(MetricType::Gauge, "inflight"),
            prefill: per_backend(MetricType::Gauge, "prefill_blocks"),
            healthy: per_backend(MetricType::Gauge, "healthy"),
            scrape_ok: Counter::new("warmroute.scrape.ok".into()),
            scrape_failed: Counter::new("warmroute.scrape.failed".into()),
            host_errors: Counter::new("warmroute.host_errors".into()),
            log_gaps: Counter::new("warmroute.index.log_gaps".into()),
        }
    }

    /// One routing decision: `matched` of the prompt's `blocks` were cached on the chosen pod.
    pub fn decided(
        &self,
        reason: Reason,
        backend: usize,
        (matched, blocks): (u32, u32),
        host_errors: u32,
        log_gap: bool,
    ) {
        if let Some(i) = REASONS.iter().position(|r| *r == reason) {
            add_at(&self.decisions, i, 1);
        }
        add_at(&self.chosen, backend, 1);
        self.prompt_blocks.add(blocks.into());
        self.matched_blocks.add(matched.min(blocks).into());
        self.host_errors.add(host_errors.into());
        self.log_gaps.add(log_gap.into());
    }

    /// A request whose prompt could not be read.
    pub fn fell_back(&self, why: Fallback) {
        if let Some(i) = Fallback::ALL.iter().position(|f| *f == why) {
            add_at(&self.fallbacks, i, 1);
        }
    }

    /// A request to a non-inference path.
    pub fn passed_through(&self) {
        self.passthrough.add(1);
    }

    /// How a routed request ended; `status` is the response `:status`, if any.
    pub fn finished(&self, status: Option<u32>) {
        let i = match status {
            Some(200..=399) => 0,
            Some(400..=499) => 1,
            Some(_) => 2,
            None => 3,
        };
        add_at(&self.outcomes, i, 1);
    }

    /// A scrape result.
    pub fn scraped(&self, ok: bool) {
        if ok {
            self.scrape_ok.add(1);
        } else {
            self.scrape_failed.add(1);
        }
    }

    /// Adds every counter's pending increments to Envoy's stats.
    pub fn flush(&self) {
        let lists = [
            &self.decisions,
            &self.fallbacks,
            &self.outcomes,
            &self.chosen,
        ];
        let singles = [
            &self.passthrough,
            &self.prompt_blocks,
            &self.matched_blocks,
            &self.scrape_ok,
            &self.scrape_failed,
            &self.host_errors,
            &self.log_gaps,
        ];
        lists
            .into_iter()
            .flatten()
            .chain(singles)
            .for_each(Counter::flush);
    }

    /// Refreshes per-backend gauges.
    pub fn gauges(&self, inflight: &[InFlight], healthy: &[bool]) {
        for (b, v) in inflight.iter().enumerate() {
            set(self.inflight.get(b).copied().flatten(), v.requests as u64);
            set(
                self.prefill.get(b).copied().flatten(),
                v.prefill_blocks as u64,
            );
        }
        for (b, &h) in healthy.iter().enumerate() {
            set(self.healthy.get(b).copied().flatten(), h as u64);
        }
    }
}
