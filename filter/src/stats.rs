//! The filter's Envoy stats (`/stats`, `/stats/prometheus`; Envoy prefixes
//! Wasm-defined names with `wasmcustom.`). Defined once per VM; every VM that
//! defines a name shares the one Envoy stat, so counters add up across workers.

use crate::config::Config;
use crate::load::InFlight;
use crate::policy::Reason;
use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

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

fn counter(name: String) -> Option<u32> {
    define(MetricType::Counter, &name)
}

/// Metric ids of one VM.
pub struct Stats {
    decisions: Vec<Option<u32>>,
    fallbacks: Vec<Option<u32>>,
    outcomes: Vec<Option<u32>>,
    passthrough: Option<u32>,
    match_blocks: Option<u32>,
    chosen: Vec<Option<u32>>,
    inflight: Vec<Option<u32>>,
    prefill: Vec<Option<u32>>,
    healthy: Vec<Option<u32>>,
    scrape_ok: Option<u32>,
    scrape_failed: Option<u32>,
    host_errors: Option<u32>,
    log_gaps: Option<u32>,
}

/// Adds to a counter; a stat that failed to define is skipped.
fn bump(id: Option<u32>, by: i64) {
    if let Some(id) = id {
        let _ = hostcalls::increment_metric(id, by);
    }
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
                .map(|r| counter(format!("warmroute.decision.{}", r.name())))
                .collect(),
            fallbacks: Fallback::ALL
                .iter()
                .map(|f| counter(format!("warmroute.fallback.{}", f.name())))
                .collect(),
            outcomes: OUTCOMES
                .iter()
                .map(|o| counter(format!("warmroute.requests.{strategy}.{o}")))
                .collect(),
            passthrough: counter("warmroute.passthrough".into()),
            match_blocks: define(MetricType::Histogram, "warmroute.prefix_match_blocks"),
            chosen: per_backend(MetricType::Counter, "chosen"),
            inflight: per_backend(MetricType::Gauge, "inflight"),
            prefill: per_backend(MetricType::Gauge, "prefill_blocks"),
            healthy: per_backend(MetricType::Gauge, "healthy"),
            scrape_ok: counter("warmroute.scrape.ok".into()),
            scrape_failed: counter("warmroute.scrape.failed".into()),
            host_errors: counter("warmroute.host_errors".into()),
            log_gaps: counter("warmroute.index.log_gaps".into()),
        }
    }

    /// One routing decision.
    pub fn decided(
        &self,
        reason: Reason,
        backend: usize,
        matched: u32,
        host_errors: u32,
        log_gap: bool,
    ) {
        if let Some(i) = REASONS.iter().position(|r| *r == reason) {
            bump(self.decisions.get(i).copied().flatten(), 1);
        }
        bump(self.chosen.get(backend).copied().flatten(), 1);
        set(self.match_blocks, matched as u64);
        if host_errors > 0 {
            bump(self.host_errors, host_errors as i64);
        }
        if log_gap {
            bump(self.log_gaps, 1);
        }
    }

    /// A request whose prompt could not be read.
    pub fn fell_back(&self, why: Fallback) {
        if let Some(i) = Fallback::ALL.iter().position(|f| *f == why) {
            bump(self.fallbacks.get(i).copied().flatten(), 1);
        }
    }

    /// A request to a non-inference path.
    pub fn passed_through(&self) {
        bump(self.passthrough, 1);
    }

    /// How a routed request ended; `status` is the response `:status`, if any.
    pub fn finished(&self, status: Option<u32>) {
        let i = match status {
            Some(200..=399) => 0,
            Some(400..=499) => 1,
            Some(_) => 2,
            None => 3,
        };
        bump(self.outcomes.get(i).copied().flatten(), 1);
    }

    /// A scrape result.
    pub fn scraped(&self, ok: bool) {
        bump(
            if ok {
                self.scrape_ok
            } else {
                self.scrape_failed
            },
            1,
        );
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
