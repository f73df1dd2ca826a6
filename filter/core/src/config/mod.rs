//! Plugin configuration: a serde wire format, validated into [`Config`].
//!
//! Two phases (the Kuadrant wasm-shim shape): [`WireConfig`] mirrors the JSON
//! exactly (`deny_unknown_fields`, named defaults), and `Config::try_from`
//! checks every value and names the offending field in the error, so
//! `on_configure` can log one precise line and refuse to start.

mod gate;

pub use gate::{Class, GateConfig, Knee, MAX_CLASSES};
use serde::Deserialize;
use std::net::SocketAddr;

/// Why a configuration was rejected; `field` is the JSON path of the culprit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// JSON path of the offending field, e.g. `backends[1].address`.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)
    }
}

fn bad(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        problem: problem.into(),
    }
}

/// Routing strategy; `cache_aware` is the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Longest cached prefix weighed against load, per request, under a load bound.
    #[default]
    CacheAware,
    /// Rendezvous hashing on the prompt prefix with bounded-load spillover.
    PrefixHash,
    /// Fewest in-flight requests (refined by scraped queue depth).
    LeastRequest,
    /// One rotation shared by all worker threads.
    RoundRobin,
    /// Uniformly random healthy backend.
    Random,
    /// Session header hashed onto a backend; round robin without it.
    StickySession,
}

impl Strategy {
    /// Stable name used in stats and logs.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::CacheAware => "cache_aware",
            Strategy::PrefixHash => "prefix_hash",
            Strategy::LeastRequest => "least_request",
            Strategy::RoundRobin => "round_robin",
            Strategy::Random => "random",
            Strategy::StickySession => "sticky_session",
        }
    }
}

/// How the choice reaches Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RouteMode {
    /// `x-gateway-destination-endpoint: ip:port[,ip:port...]` for Envoy's `override_host` policy.
    #[default]
    Endpoint,
    /// A header carrying the backend name, matched by Envoy routes / Istio subsets.
    Header,
    /// `:authority` rewritten to the backend host.
    Authority,
}

/// Header used by Envoy's `override_host` policy and the Gateway API Inference Extension.
pub const ENDPOINT_HEADER: &str = "x-gateway-destination-endpoint";
/// Default header for the `header` route mode.
pub const BACKEND_HEADER: &str = "x-warmroute-backend";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireBackend {
    name: String,
    address: String,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    metrics_path: Option<String>,
    #[serde(default)]
    models: Vec<String>,
    #[serde(default)]
    adapters: Vec<String>,
}

// The wire structs below take every missing field from their `Default`: each
// default is declared once, there, and documented in the README's table.

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct WireRoute {
    mode: RouteMode,
    header: Option<String>,
    fallbacks: usize,
    model_header: Option<String>,
}

impl Default for WireRoute {
    fn default() -> Self {
        WireRoute {
            mode: RouteMode::default(),
            header: None,
            fallbacks: 2,
            model_header: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct WireBalance {
    eps: f64,
    warm_min_cap: u32,
    default_output_tokens: u32,
    decode_cost: f64,
}

impl Default for WireBalance {
    fn default() -> Self {
        // warm_min_cap: see `policy`'s parameter table; the other two: `work`'s.
        WireBalance {
            eps: 0.5,
            warm_min_cap: 8,
            default_output_tokens: 256,
            decode_cost: 8.0,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct WireCacheAware {
    tie_margin: f64,
    min_match_blocks: u32,
    prefill_slack_tokens: u32,
    replicate_gap: f64,
}

impl Default for WireCacheAware {
    fn default() -> Self {
        WireCacheAware {
            tie_margin: 0.05,
            min_match_blocks: 1,
            prefill_slack_tokens: 8192,
            replicate_gap: 2.0,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct WireSaturation {
    max_waiting: f64,
    max_kv_usage: f64,
    max_inflight: u32,
}

impl Default for WireSaturation {
    fn default() -> Self {
        WireSaturation {
            max_waiting: 4.0,
            max_kv_usage: 0.98,
            max_inflight: 0,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct WireIndex {
    max_blocks: usize,
    ttl_ms: u64,
    log_bytes: usize,
    bytes_per_token: f64,
    learn_bytes_per_token: bool,
}

impl Default for WireIndex {
    fn default() -> Self {
        WireIndex {
            max_blocks: 262_144,
            ttl_ms: 600_000,
            log_bytes: 1 << 20,
            bytes_per_token: 4.0,
            learn_bytes_per_token: true,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct WireMetricNames {
    running: Vec<String>,
    waiting: Vec<String>,
    kv_usage: Vec<String>,
}

impl Default for WireMetricNames {
    fn default() -> Self {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect();
        WireMetricNames {
            running: names(&["vllm:num_requests_running", "sglang:num_running_reqs"]),
            waiting: names(&["vllm:num_requests_waiting", "sglang:num_queue_reqs"]),
            kv_usage: names(&[
                "vllm:kv_cache_usage_perc",
                "vllm:gpu_cache_usage_perc",
                "sglang:token_usage",
            ]),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct WireMetrics {
    enabled: bool,
    cluster: String,
    path: String,
    period_ms: u64,
    timeout_ms: u64,
    unhealthy_after: u32,
    healthy_after: u32,
    eject_after_errors: u32,
    stale_after_ms: u64,
    model_name: Option<String>,
    names: WireMetricNames,
}

impl Default for WireMetrics {
    fn default() -> Self {
        WireMetrics {
            enabled: true,
            cluster: "pool".into(),
            path: "/metrics".into(),
            period_ms: 500,
            timeout_ms: 400,
            unhealthy_after: 2,
            healthy_after: 2,
            eject_after_errors: 3,
            stale_after_ms: 2000,
            model_name: None,
            names: WireMetricNames::default(),
        }
    }
}

/// A pool whose endpoints Envoy knows (EDS keeps them current).
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct WirePool {
    cluster: Option<String>,
    clusters: Vec<WirePoolCluster>,
    admin_cluster: String,
    max_backends: usize,
    models: Vec<String>,
    adapters: Vec<String>,
}

impl Default for WirePool {
    fn default() -> Self {
        WirePool {
            cluster: None,
            clusters: Vec::new(),
            admin_cluster: "envoy-admin".into(),
            max_backends: 64,
            models: Vec::new(),
            adapters: Vec::new(),
        }
    }
}

/// One of several discovered pools (one per model, typically).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WirePoolCluster {
    cluster: String,
    #[serde(default)]
    models: Vec<String>,
    #[serde(default)]
    adapters: Vec<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct WireKnee {
    requests: Option<f64>,
    work: Option<f64>,
    waiting: Option<f64>,
    kv_usage: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireClass {
    name: String,
    #[serde(default)]
    aliases: Vec<String>,
    max_wait_ms: u64,
    max_queue: u32,
}

/// Priority classes and deadlines at the gate ([`crate::gate`]); off unless given.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct WireGate {
    knee: WireKnee,
    classes: Vec<WireClass>,
    default_class: String,
    header: String,
    deadline_header: String,
    lower_share: f64,
    check_ms: u64,
    retry_after_s: u32,
}

impl Default for WireGate {
    fn default() -> Self {
        let class = |name: &str, alias: &str, max_wait_ms, max_queue| WireClass {
            name: name.into(),
            aliases: vec![alias.into()],
            max_wait_ms,
            max_queue,
        };
        // The aliases are the Gateway API Inference Extension's criticality values. A held
        // request counts against Envoy's request_timeout (60 s in the shipped configs, armed
        // until the request goes upstream): no default waits that long.
        WireGate {
            knee: WireKnee::default(),
            classes: vec![
                class("interactive", "critical", 5_000, 256),
                class("standard", "standard", 30_000, 256),
                class("batch", "sheddable", 55_000, 512),
            ],
            default_class: "standard".into(),
            header: "x-warmroute-priority".into(),
            deadline_header: "x-warmroute-deadline-ms".into(),
            lower_share: 0.1,
            check_ms: 50,
            retry_after_s: 1,
        }
    }
}

/// The pods' own cache reports ([`crate::routing::feedback`]).
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct WireFeedback {
    enabled: bool,
    request_usage: bool,
}

impl Default for WireFeedback {
    fn default() -> Self {
        WireFeedback {
            enabled: true,
            request_usage: false,
        }
    }
}

/// What the filter does with the pods' own cache reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedbackConfig {
    /// Read the usage a pod returns on a predicted hit, and forget what it evicted.
    pub enabled: bool,
    /// Ask for usage on streams that did not (`stream_options.include_usage`):
    /// their clients then get one more chunk, with the usage and no choices.
    pub request_usage: bool,
}

/// The Gateway API Inference Extension's header naming a request's objective,
/// read after the gate's own header.
pub const OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";

/// Most clusters one filter discovers pods in.
pub const MAX_POOL_CLUSTERS: usize = 16;

/// `backends` has no useful default: an empty list (without a `pool`) is
/// rejected by validation, which names the field.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct WireConfig {
    backends: Vec<WireBackend>,
    pool: Option<WirePool>,
    strategy: Strategy,
    route: WireRoute,
    block_bytes: usize,
    max_body_bytes: usize,
    session_header: String,
    balance: WireBalance,
    cache_aware: WireCacheAware,
    saturation: WireSaturation,
    index: WireIndex,
    metrics: WireMetrics,
    debug_header: bool,
    debug_match_counts: bool,
    gate: Option<WireGate>,
    feedback: WireFeedback,
}

impl Default for WireConfig {
    fn default() -> Self {
        WireConfig {
            backends: Vec::new(),
            pool: None,
            strategy: Strategy::default(),
            route: WireRoute::default(),
            block_bytes: 256,
            max_body_bytes: 8 * 1024 * 1024,
            session_header: "x-session-id".into(),
            balance: WireBalance::default(),
            cache_aware: WireCacheAware::default(),
            saturation: WireSaturation::default(),
            index: WireIndex::default(),
            metrics: WireMetrics::default(),
            debug_header: false,
            debug_match_counts: false,
            gate: None,
            feedback: WireFeedback::default(),
        }
    }
}

/// One inference server the filter may route to.
#[derive(Debug, Clone, PartialEq)]
pub struct Backend {
    /// Unique name (stats, `header` route mode).
    pub name: String,
    /// `ip:port`, written to the endpoint header and used for scrapes.
    pub address: String,
    /// `:authority` in `authority` mode and for scrapes.
    pub host: String,
    /// Path of the Prometheus endpoint.
    pub metrics_path: String,
    /// What the pod serves.
    pub serves: Serves,
}

/// The model names a pod serves, as the operator declared them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Serves {
    /// Served model names; empty: not declared (any model may go there).
    pub models: Vec<String>,
    /// LoRA adapters it can load (vLLM's `--lora-modules`).
    pub adapters: Vec<String>,
}

impl Serves {
    /// Whether `model` is one of its base models or adapters; with no
    /// declared models, unknown (`None`).
    pub fn knows(&self, model: &str) -> Option<bool> {
        if self.models.is_empty() && self.adapters.is_empty() {
            return None;
        }
        Some(self.models.iter().chain(&self.adapters).any(|m| m == model))
    }
}

/// Where and how the choice is written.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    /// Which of the three route modes.
    pub mode: RouteMode,
    /// Header written (unused in `authority` mode).
    pub header: String,
    /// Extra endpoints listed for Envoy retries (endpoint mode).
    pub fallbacks: usize,
    /// Header the request's `model` is published in, for routes that match
    /// on it (e.g. `x-gateway-model-name`); clients' copies are stripped.
    pub model_header: Option<String>,
}

/// Tuning of the load bound and the cache/load weighing.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyConfig {
    /// Bounded-load slack: cap = ceil((1+eps) * (total+1) / healthy).
    pub eps: f64,
    /// The bound a backend holding part of the prompt never falls below.
    pub warm_min_cap: f64,
    /// Scores closer than this are ties, broken by rendezvous order.
    pub tie_margin: f64,
    /// Fewer matched blocks than this count as no match.
    pub min_match_blocks: u32,
    /// Prefill queues differing by less than this many prompt blocks count as equal.
    pub prefill_slack_blocks: f64,
    /// A hot prefix is copied to a pod this many requests less loaded than its warm pods.
    pub replicate_gap: f64,
    /// A backend with this many waiting requests is saturated (not full:
    /// a conversation's sole holder keeps it, see `policy`).
    pub max_waiting: f64,
    /// A backend with KV usage at or above this is saturated and full.
    pub max_kv_usage: f64,
    /// In-flight requests per backend at which it is saturated and full (0 = off).
    pub max_inflight: u32,
    /// Output tokens assumed for a request that sets no limit ([`crate::routing::work`]).
    pub default_output_tokens: u32,
    /// GPU time of one decoded token, in prefilled tokens ([`crate::routing::work`]).
    pub decode_cost: f64,
    /// Prompt tokens per index block (`block_bytes / index.bytes_per_token`).
    pub block_tokens: f64,
}

/// Bounds of the approximate prefix index.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexConfig {
    /// Most (block, backend) entries kept, fleet-wide.
    pub max_blocks: usize,
    /// Entries unused for this long are forgotten.
    pub ttl_ms: u64,
    /// Shared-data budget of the change log replicating the index across workers.
    pub log_bytes: usize,
    /// Prompt bytes per KV-cache token, to size the index from a backend's capacity in
    /// tokens (≈4 for English BPE tokenizers; the simulator's word tokens are ≈7).
    pub bytes_per_token: f64,
    /// Start from `bytes_per_token` and follow the pods' usage reports ([`crate::routing::feedback`]).
    pub learn_bytes_per_token: bool,
}

/// Names of the scraped gauges; the first name present wins.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricNames {
    /// Running requests.
    pub running: Vec<String>,
    /// Queued requests.
    pub waiting: Vec<String>,
    /// KV cache usage, 0..1.
    pub kv_usage: Vec<String>,
}

/// The companion tick's scrape settings.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    /// Whether backends are scraped at all.
    pub enabled: bool,
    /// Envoy cluster the scrape calls go through.
    pub cluster: String,
    /// Tick and scrape period.
    pub period_ms: u64,
    /// Callout timeout, shorter than the period.
    pub timeout_ms: u64,
    /// Consecutive failed scrapes that take a backend out of rotation.
    pub unhealthy_after: u32,
    /// Consecutive good scrapes that bring it back.
    pub healthy_after: u32,
    /// Consecutive failed responses (5xx, upstream reset) that take a backend
    /// out of one worker's rotation for `stale_after_ms`; 0: never.
    pub eject_after_errors: u32,
    /// Prometheus path of pods the pool discovers.
    pub path: String,
    /// Snapshots older than this are not trusted, and neither is a verdict of
    /// `down` that no failed scrape has renewed for this long.
    pub stale_after_ms: u64,
    /// Label value of `model_name` to select; `None` sums all label sets.
    pub model_name: Option<String>,
    /// Metric names per quantity.
    pub names: MetricNames,
}

/// Where the fleet's members come from when no static list is given.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolConfig {
    /// The Envoy clusters whose endpoints are the fleet (those `override_host`
    /// routes in), with what their pods serve.
    pub clusters: Vec<PoolCluster>,
    /// An Envoy cluster pointing at Envoy's own admin interface; no route may name it.
    pub admin_cluster: String,
    /// Slots: most pods the fleet holds at once ([`crate::fleet::membership`]).
    pub max_backends: usize,
}

/// One Envoy cluster of a discovered pool.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolCluster {
    /// The cluster's name.
    pub name: String,
    /// What every pod in it serves.
    pub serves: Serves,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The fleet, in configured order (indices are stable ids); empty with a `pool`.
    pub backends: Vec<Backend>,
    /// The pool Envoy discovers, when the fleet is not a fixed list.
    pub pool: Option<PoolConfig>,
    /// Active strategy.
    pub strategy: Strategy,
    /// How the choice reaches Envoy.
    pub route: RouteConfig,
    /// Prefix block size in bytes.
    pub block_bytes: usize,
    /// Largest body parsed.
    pub max_body_bytes: usize,
    /// Header naming a session (lower-case).
    pub session_header: String,
    /// Policy tuning.
    pub policy: PolicyConfig,
    /// Index bounds.
    pub index: IndexConfig,
    /// Scraping.
    pub metrics: MetricsConfig,
    /// Whether to add the `x-warmroute` response header.
    pub debug_header: bool,
    /// Whether that header says how much of the prompt the pod held and why
    /// it was chosen: off by default, since either tells any client whether
    /// someone sent that prefix recently.
    pub debug_match_counts: bool,
    /// Priority classes and deadlines while the fleet is past its knee; `None`: never held.
    pub gate: Option<GateConfig>,
    /// The pods' own cache reports.
    pub feedback: FeedbackConfig,
}

/// Most backends one filter instance routes over.
pub const MAX_BACKENDS: usize = 1024;

// Bounds that keep one worker VM well inside a wasm32 address space (4 GiB,
// shared by everything the VM holds), whatever the configuration says.

/// Largest body parsed: it is copied into the VM, and decoded strings may copy it again.
pub const MAX_BODY_BYTES: usize = 32 << 20;
/// Most index entries per VM: ~50 bytes each with the LRU queue, ~100 MiB at the bound.
pub const MAX_INDEX_BLOCKS: usize = 1 << 21;
/// Largest shared-data budget of the index log (1024 slots of 16 KiB).
pub const MAX_LOG_BYTES: usize = 16 << 20;

fn valid_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

fn in_range<T: PartialOrd + std::fmt::Display + Copy>(
    field: &str,
    v: T,
    lo: T,
    hi: T,
) -> Result<T, ConfigError> {
    if v >= lo && v <= hi {
        Ok(v)
    } else {
        Err(bad(field, format!("{v} is out of range {lo}..={hi}")))
    }
}

fn finite_in_range(field: &str, v: f64, lo: f64, hi: f64) -> Result<f64, ConfigError> {
    if v.is_finite() {
        in_range(field, v, lo, hi)
    } else {
        Err(bad(field, "must be a finite number"))
    }
}

fn metric_names(field: &str, names: Vec<String>) -> Result<Vec<String>, ConfigError> {
    if names.is_empty() || names.iter().any(|n| n.is_empty()) {
        return Err(bad(field, "must list at least one non-empty metric name"));
    }
    Ok(names)
}

fn serves(field: &str, models: Vec<String>, adapters: Vec<String>) -> Result<Serves, ConfigError> {
    for (what, list) in [("models", &models), ("adapters", &adapters)] {
        if list.iter().any(|m| m.is_empty() || m.len() > 256) {
            return Err(bad(
                format!("{field}.{what}"),
                "names must be 1-256 characters",
            ));
        }
    }
    Ok(Serves { models, adapters })
}

fn pool_config(p: WirePool) -> Result<PoolConfig, ConfigError> {
    let single = p.cluster.is_some() || !p.models.is_empty() || !p.adapters.is_empty();
    let clusters = if p.clusters.is_empty() {
        vec![PoolCluster {
            name: cluster_name("pool.cluster", p.cluster.unwrap_or_else(|| "pool".into()))?,
            serves: serves("pool", p.models, p.adapters)?,
        }]
    } else if single {
        return Err(bad(
            "pool.clusters",
            "give either cluster (with models, adapters) or clusters",
        ));
    } else if p.clusters.len() > MAX_POOL_CLUSTERS {
        return Err(bad(
            "pool.clusters",
            format!("at most {MAX_POOL_CLUSTERS} clusters"),
        ));
    } else {
        let mut out: Vec<PoolCluster> = Vec::with_capacity(p.clusters.len());
        for (i, c) in p.clusters.into_iter().enumerate() {
            let field = format!("pool.clusters[{i}]");
            let name = cluster_name(&format!("{field}.cluster"), c.cluster)?;
            if out.iter().any(|o| o.name == name) {
                return Err(bad(
                    format!("{field}.cluster"),
                    format!("duplicate cluster {name:?}"),
                ));
            }
            out.push(PoolCluster {
                serves: serves(&field, c.models, c.adapters)?,
                name,
            });
        }
        out
    };
    Ok(PoolConfig {
        clusters,
        admin_cluster: cluster_name("pool.admin_cluster", p.admin_cluster)?,
        max_backends: in_range("pool.max_backends", p.max_backends, 1, MAX_BACKENDS)?,
    })
}

fn header_name(field: &str, h: String) -> Result<String, ConfigError> {
    let h = h.to_ascii_lowercase();
    if valid_header_name(&h) {
        Ok(h)
    } else {
        Err(bad(field, format!("{h:?} is not a valid header name")))
    }
}

fn gate_config(g: WireGate, scraping: bool) -> Result<GateConfig, ConfigError> {
    let limit = |field: &str, v: Option<f64>, hi: f64| {
        v.map(|v| finite_in_range(&format!("gate.knee.{field}"), v, f64::MIN_POSITIVE, hi))
            .transpose()
    };
    let knee = Knee {
        requests: limit("requests", g.knee.requests, 1e9)?,
        work: limit("work", g.knee.work, 1e9)?,
        waiting: limit("waiting", g.knee.waiting, 1e9)?,
        kv_usage: limit("kv_usage", g.knee.kv_usage, 1.0)?,
    };
    if knee == Knee::default() {
        return Err(bad(
            "gate.knee",
            "must set at least one of requests, work, waiting, kv_usage",
        ));
    }
    if !scraping && knee.requests.is_none() && knee.work.is_none() {
        return Err(bad(
            "gate.knee",
            "waiting and kv_usage come from scrapes: with metrics.enabled false, set requests or work",
        ));
    }
    if g.classes.is_empty() || g.classes.len() > MAX_CLASSES {
        return Err(bad(
            "gate.classes",
            format!("must list 1-{MAX_CLASSES} classes, highest first"),
        ));
    }
    let mut classes: Vec<Class> = Vec::with_capacity(g.classes.len());
    for (i, c) in g.classes.into_iter().enumerate() {
        let field = format!("gate.classes[{i}]");
        let name = c.name.to_ascii_lowercase();
        let aliases: Vec<String> = c.aliases.iter().map(|a| a.to_ascii_lowercase()).collect();
        for n in std::iter::once(&name).chain(&aliases) {
            if !valid_name(n) {
                return Err(bad(
                    format!("{field}.name"),
                    "names and aliases must be 1-128 characters of [A-Za-z0-9._-]",
                ));
            }
            if classes
                .iter()
                .any(|o| &o.name == n || o.aliases.contains(n))
            {
                return Err(bad(
                    format!("{field}.name"),
                    format!("{n:?} already names another class"),
                ));
            }
        }
        classes.push(Class {
            name,
            aliases,
            max_wait_ms: in_range(&format!("{field}.max_wait_ms"), c.max_wait_ms, 1, 3_600_000)?,
            max_queue: in_range(&format!("{field}.max_queue"), c.max_queue, 1, 4096)?,
        });
    }
    let default = g.default_class.to_ascii_lowercase();
    let default_class = classes
        .iter()
        .position(|c| c.name == default)
        .ok_or_else(|| bad("gate.default_class", format!("{default:?} is not a class")))?;
    Ok(GateConfig {
        knee,
        classes,
        default_class,
        class_headers: vec![
            header_name("gate.header", g.header)?,
            OBJECTIVE_HEADER.to_string(),
        ],
        deadline_header: header_name("gate.deadline_header", g.deadline_header)?,
        // Past 1/2 every release would go to a lower class: priority upside down.
        lower_share: finite_in_range("gate.lower_share", g.lower_share, 0.0, 0.5)?,
        check_ms: in_range("gate.check_ms", g.check_ms, 5, 10_000)?,
        retry_after_s: in_range("gate.retry_after_s", g.retry_after_s, 1, 3600)?,
    })
}

fn cluster_name(field: &str, c: String) -> Result<String, ConfigError> {
    if c.is_empty() || c.contains(char::is_whitespace) {
        Err(bad(field, "must name an Envoy cluster"))
    } else {
        Ok(c)
    }
}

fn path(field: &str, p: String) -> Result<String, ConfigError> {
    if p.starts_with('/') {
        Ok(p)
    } else {
        Err(bad(field, "must start with '/'"))
    }
}

impl TryFrom<WireConfig> for Config {
    type Error = ConfigError;

    fn try_from(w: WireConfig) -> Result<Self, ConfigError> {
        if w.backends.is_empty() && w.pool.is_none() {
            return Err(bad(
                "backends",
                "must list at least one backend (or give a pool)",
            ));
        }
        if !w.backends.is_empty() && w.pool.is_some() {
            return Err(bad(
                "pool",
                "a fixed backends list and a discovered pool exclude each other",
            ));
        }
        let pool = match w.pool {
            Some(p) => Some(pool_config(p)?),
            None => None,
        };
        if w.backends.len() > MAX_BACKENDS {
            return Err(bad("backends", format!("at most {MAX_BACKENDS} backends")));
        }
        let default_path = path("metrics.path", w.metrics.path.clone())?;
        let mut backends: Vec<Backend> = Vec::with_capacity(w.backends.len());
        for (i, b) in w.backends.into_iter().enumerate() {
            if !valid_name(&b.name) {
                return Err(bad(
                    format!("backends[{i}].name"),
                    "must be 1-128 characters of [A-Za-z0-9._-]",
                ));
            }
            if backends.iter().any(|o| o.name == b.name) {
                return Err(bad(
                    format!("backends[{i}].name"),
                    format!("duplicate name {:?}", b.name),
                ));
            }
            if b.address.parse::<SocketAddr>().is_err() {
                return Err(bad(
                    format!("backends[{i}].address"),
                    format!("{:?} is not ip:port", b.address),
                ));
            }
            if backends.iter().any(|o| o.address == b.address) {
                return Err(bad(
                    format!("backends[{i}].address"),
                    format!("duplicate address {:?}", b.address),
                ));
            }
            let host = match b.host {
                Some(h) if h.is_empty() || h.contains(char::is_whitespace) => {
                    return Err(bad(
                        format!("backends[{i}].host"),
                        "must be a non-empty host[:port]",
                    ))
                }
                Some(h) => h,
                None => b.address.clone(),
            };
            let metrics_path = match b.metrics_path {
                Some(p) => path(&format!("backends[{i}].metrics_path"), p)?,
                None => default_path.clone(),
            };
            backends.push(Backend {
                serves: serves(&format!("backends[{i}]"), b.models, b.adapters)?,
                name: b.name,
                address: b.address,
                host,
                metrics_path,
            });
        }
        let header = match (w.route.mode, w.route.header) {
            (_, Some(h)) => {
                let h = h.to_ascii_lowercase();
                if !valid_header_name(&h) {
                    return Err(bad(
                        "route.header",
                        format!("{h:?} is not a valid header name"),
                    ));
                }
                h
            }
            (RouteMode::Header, None) => BACKEND_HEADER.to_string(),
            (_, None) => ENDPOINT_HEADER.to_string(),
        };
        let block_bytes = in_range("block_bytes", w.block_bytes, 16, 65_536)?;
        let model_header = match w.route.model_header {
            Some(h) => {
                let h = h.to_ascii_lowercase();
                if !valid_header_name(&h) || h == header {
                    return Err(bad(
                        "route.model_header",
                        "must be a valid header name other than route.header",
                    ));
                }
                Some(h)
            }
            None => None,
        };
        let route = RouteConfig {
            mode: w.route.mode,
            header,
            fallbacks: in_range("route.fallbacks", w.route.fallbacks, 0, 16)?,
            model_header,
        };
        let session_header = w.session_header.to_ascii_lowercase();
        if !valid_header_name(&session_header) {
            return Err(bad("session_header", "is not a valid header name"));
        }
        let index = IndexConfig {
            max_blocks: in_range(
                "index.max_blocks",
                w.index.max_blocks,
                1024,
                MAX_INDEX_BLOCKS,
            )?,
            ttl_ms: in_range("index.ttl_ms", w.index.ttl_ms, 1000, 7 * 24 * 3_600_000)?,
            log_bytes: in_range("index.log_bytes", w.index.log_bytes, 4096, MAX_LOG_BYTES)?,
            bytes_per_token: finite_in_range(
                "index.bytes_per_token",
                w.index.bytes_per_token,
                0.5,
                64.0,
            )?,
            learn_bytes_per_token: w.index.learn_bytes_per_token,
        };
        let policy = PolicyConfig {
            eps: finite_in_range("balance.eps", w.balance.eps, 0.0, 100.0)?,
            warm_min_cap: f64::from(in_range(
                "balance.warm_min_cap",
                w.balance.warm_min_cap,
                1,
                1 << 20,
            )?),
            tie_margin: finite_in_range(
                "cache_aware.tie_margin",
                w.cache_aware.tie_margin,
                0.0,
                1.0,
            )?,
            min_match_blocks: in_range(
                "cache_aware.min_match_blocks",
                w.cache_aware.min_match_blocks,
                1,
                1 << 20,
            )?,
            max_waiting: finite_in_range(
                "saturation.max_waiting",
                w.saturation.max_waiting,
                0.0,
                1e9,
            )?,
            max_kv_usage: finite_in_range(
                "saturation.max_kv_usage",
                w.saturation.max_kv_usage,
                0.0,
                1.0,
            )?,
            max_inflight: w.saturation.max_inflight,
            default_output_tokens: in_range(
                "balance.default_output_tokens",
                w.balance.default_output_tokens,
                1,
                1 << 20,
            )?,
            decode_cost: finite_in_range("balance.decode_cost", w.balance.decode_cost, 0.0, 1e4)?,
            block_tokens: block_bytes as f64 / index.bytes_per_token,
            prefill_slack_blocks: in_range(
                "cache_aware.prefill_slack_tokens",
                w.cache_aware.prefill_slack_tokens,
                0,
                1 << 24,
            )? as f64
                * index.bytes_per_token
                / block_bytes as f64,
            replicate_gap: finite_in_range(
                "cache_aware.replicate_gap",
                w.cache_aware.replicate_gap,
                1.0,
                1e9,
            )?,
        };
        if w.feedback.request_usage && !w.feedback.enabled {
            return Err(bad("feedback.request_usage", "needs feedback.enabled"));
        }
        if w.debug_match_counts && !w.debug_header {
            return Err(bad("debug_match_counts", "needs debug_header"));
        }
        let m = w.metrics;
        let period_ms = in_range("metrics.period_ms", m.period_ms, 50, 3_600_000)?;
        let timeout_ms = in_range("metrics.timeout_ms", m.timeout_ms, 10, 3_600_000)?;
        if timeout_ms >= period_ms {
            return Err(bad(
                "metrics.timeout_ms",
                "must be shorter than metrics.period_ms",
            ));
        }
        let metrics = MetricsConfig {
            enabled: m.enabled,
            cluster: cluster_name("metrics.cluster", m.cluster)?,
            path: default_path,
            period_ms,
            timeout_ms,
            unhealthy_after: in_range("metrics.unhealthy_after", m.unhealthy_after, 1, 1000)?,
            healthy_after: in_range("metrics.healthy_after", m.healthy_after, 1, 1000)?,
            eject_after_errors: in_range(
                "metrics.eject_after_errors",
                m.eject_after_errors,
                0,
                1000,
            )?,
            // A down verdict is renewed by each failed scrape, which a lost reply
            // reports up to two periods plus the timeout apart: a shorter expiry
            // would let a dead pod flap back between them.
            stale_after_ms: in_range(
                "metrics.stale_after_ms",
                m.stale_after_ms,
                2 * period_ms + timeout_ms,
                86_400_000,
            )?,
            model_name: m.model_name,
            names: MetricNames {
                running: metric_names("metrics.names.running", m.names.running)?,
                waiting: metric_names("metrics.names.waiting", m.names.waiting)?,
                kv_usage: metric_names("metrics.names.kv_usage", m.names.kv_usage)?,
            },
        };
        let gate = w
            .gate
            .map(|g| gate_config(g, metrics.enabled))
            .transpose()?;
        Ok(Config {
            backends,
            pool,
            strategy: w.strategy,
            route,
            block_bytes,
            max_body_bytes: in_range("max_body_bytes", w.max_body_bytes, 1024, MAX_BODY_BYTES)?,
            session_header,
            policy,
            index,
            metrics,
            debug_header: w.debug_header,
            debug_match_counts: w.debug_match_counts,
            gate,
            feedback: FeedbackConfig {
                enabled: w.feedback.enabled,
                request_usage: w.feedback.request_usage,
            },
        })
    }
}

/// Names the field from the JSON path serde was at; an unknown or missing
/// key is named in the message rather than the path, so it is appended.
fn serde_error(e: serde_path_to_error::Error<serde_json::Error>) -> ConfigError {
    let path = e.path().to_string();
    let msg = e.inner().to_string();
    let position = || format!("line {} column {}", e.inner().line(), e.inner().column());
    let key = msg
        .split('`')
        .nth(1)
        .filter(|_| msg.starts_with("unknown field") || msg.starts_with("missing field"));
    let field = match (path.as_str(), key) {
        // An empty key names nothing: the object holding it does.
        (p, Some("")) => p.strip_suffix('.').unwrap_or(p).to_string(),
        ("." | "", Some(k)) => k.to_string(),
        (p, Some(k)) if !p.ends_with(k) => format!("{p}.{k}"),
        ("." | "", None) => position(),
        (p, _) => p.to_string(),
    };
    let field = if field.is_empty() { position() } else { field };
    bad(field, msg)
}

impl Config {
    /// The fleet in a few words, for logs: its backends, or its pool.
    pub fn describe_fleet(&self) -> String {
        match &self.pool {
            Some(p) => {
                let names: Vec<&str> = p.clusters.iter().map(|c| c.name.as_str()).collect();
                format!(
                    "a pool of up to {} pods from {}",
                    p.max_backends,
                    names.join(", ")
                )
            }
            None => format!("{} backends", self.backends.len()),
        }
    }

    /// Slots of per-pod state: the fixed list's length, or the pool's `max_backends`.
    pub fn slot_count(&self) -> usize {
        self.pool
            .as_ref()
            .map_or(self.backends.len(), |p| p.max_backends)
    }

    /// Parse and validate the plugin configuration bytes.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let wire: WireConfig = serde_path_to_error::deserialize(&mut *de).map_err(serde_error)?;
        // Trailing text after the object is a broken config, not a comment.
        de.end().map_err(|e| {
            bad(
                format!("line {} column {}", e.line(), e.column()),
                e.to_string(),
            )
        })?;
        Config::try_from(wire)
    }
}

#[cfg(test)]
mod tests;
