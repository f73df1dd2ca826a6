//! Plugin configuration: a serde wire format, validated into [`Config`].
//!
//! Two phases (the Kuadrant wasm-shim shape): [`wire::WireConfig`] mirrors the
//! JSON exactly (`deny_unknown_fields`, named defaults), and `Config::try_from`
//! ([`validate`], one validator per section) checks every value and names the
//! offending field in the error, so `on_configure` can log one precise line
//! and refuse to start.
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | the validated types, their bounds, [`Config::parse`] |
//! | `wire.rs` | the JSON's serde mirror and its defaults |
//! | `validate.rs` | wire → validated, section by section |
//! | `gate.rs` | the `gate` section's types: the knee and the priority classes |

mod gate;
mod validate;
mod wire;

pub use gate::{Class, GateConfig, Knee, MAX_CLASSES};
use serde::Deserialize;

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

/// What the filter does with the pods' own cache reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedbackConfig {
    /// Read the usage a pod returns on a predicted hit, and forget what it evicted.
    pub enabled: bool,
    /// Ask for usage on streams that did not (`stream_options.include_usage`):
    /// their clients then get one more chunk, with the usage and no choices.
    pub request_usage: bool,
}

/// The record of which pod answered each stored response
/// ([`crate::fleet::responses`]), for follow-ups by `previous_response_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponsesConfig {
    /// Answers remembered (0: none, and follow-ups route as any request).
    pub max_entries: usize,
}

/// Most answers the record of stored responses may keep (6 MB of shared data).
pub const MAX_RESPONSES: usize = 262_144;

/// The Gateway API Inference Extension's header naming a request's objective
/// (an `InferenceObjective`), read after the gate's own header and mapped to a
/// class by `gate.objectives`.
pub const OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";

/// Most clusters one filter discovers pods in.
pub const MAX_POOL_CLUSTERS: usize = 16;

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
    /// KV cache usage, 0..1; empty: the engine publishes none (read as 0).
    pub kv_usage: Vec<String>,
    /// The info gauge whose `num_gpu_blocks` × `block_size` labels give the KV
    /// capacity (vLLM's `cache_config_info`); empty: the engine publishes none.
    pub cache_config: Vec<String>,
}

/// Which engine's metric names `metrics.names` starts from.
///
/// | preset | running | waiting | KV usage | KV capacity |
/// |---|---|---|---|---|
/// | `vllm` (default) | `vllm:num_requests_running`, then SGLang's `sglang:num_running_reqs` | `vllm:num_requests_waiting`, `sglang:num_queue_reqs` | `vllm:kv_cache_usage_perc`, `vllm:gpu_cache_usage_perc`, `sglang:token_usage` | `vllm:cache_config_info` |
/// | `llamacpp` | `llamacpp:requests_processing` (slots busy) | `llamacpp:requests_deferred` (tasks waiting for a slot) | none | none: `metrics.capacity_tokens` |
///
/// llama.cpp's server (`--metrics`, `tools/server/server-task.cpp`:
/// `server_task_result_metrics::to_metrics`) prints unlabelled counters and
/// gauges and no KV usage or size: its context (`n_ctx`, per slot) and host-RAM
/// prompt cache (`--cache-ram`) are on `/props` and `/slots`, which the filter
/// does not scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// vLLM's names (and SGLang's, each after vLLM's).
    #[default]
    Vllm,
    /// llama.cpp's `llama-server --metrics`.
    Llamacpp,
}

impl Engine {
    /// The preset's names.
    pub fn names(self) -> MetricNames {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect();
        match self {
            Engine::Vllm => MetricNames {
                running: names(&["vllm:num_requests_running", "sglang:num_running_reqs"]),
                waiting: names(&["vllm:num_requests_waiting", "sglang:num_queue_reqs"]),
                kv_usage: names(&[
                    "vllm:kv_cache_usage_perc",
                    "vllm:gpu_cache_usage_perc",
                    "sglang:token_usage",
                ]),
                cache_config: names(&["vllm:cache_config_info"]),
            },
            Engine::Llamacpp => MetricNames {
                running: names(&["llamacpp:requests_processing"]),
                waiting: names(&["llamacpp:requests_deferred"]),
                kv_usage: Vec::new(),
                cache_config: Vec::new(),
            },
        }
    }
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
    /// KV capacity in tokens of a pod whose scrape gives none (an engine
    /// without `cache_config_info`); `None`: such pods size no index share.
    pub capacity_tokens: Option<u64>,
    /// Whole prompts each pod keeps, for an engine that keeps prompts rather
    /// than blocks (llama.cpp); `None`: the index forgets by blocks alone.
    pub prompt_cache: Option<PromptCache>,
}

/// What an engine that keeps whole prompts holds per pod
/// ([`crate::routing::index`], "Whole prompts"): llama.cpp's server keeps the
/// last prompt of each slot and a host-RAM cache of whole prompts, and
/// publishes neither (`/props` gives `total_slots`, no endpoint `--cache-ram`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptCache {
    /// The newest prompts a pod holds whatever their size: `-np`; 1 with
    /// `--kv-unified` and `--cache-idle-slots`, which save and clear every
    /// idle slot each time a task starts.
    pub slots: u32,
    /// Tokens of older prompts its RAM cache holds, newest first:
    /// `--cache-ram` MiB × 2^20 / the model's KV bytes per token.
    pub ram_tokens: u64,
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
    /// How long answers listing no endpoint at all keep the last members
    /// ([`crate::fleet::membership`]).
    pub empty_grace_ms: u64,
}

/// The gateway's other replicas, which this one exchanges index events with
/// ([`crate::routing::exchange`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PeersConfig {
    /// The Envoy cluster of the replicas' peer listeners (`override_host` by address).
    pub cluster: String,
    /// This gateway's peer listener port: only requests arriving on it are served events.
    pub port: u16,
    /// An Envoy cluster pointing at Envoy's own admin (the peers' endpoints).
    pub admin_cluster: String,
    /// A pull's timeout.
    pub timeout_ms: u64,
    /// Largest reply served or read.
    pub max_reply_bytes: usize,
    /// This VM's copy of its replica's recent events for peers, in bytes.
    pub outbox_bytes: usize,
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
    /// The gateway's replicas to exchange index events with.
    pub peers: Option<PeersConfig>,
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
    /// Whether each routed request's route (pod, reason, match) goes into
    /// Envoy's filter state `wasm.warmroute`, for the access log: one host
    /// call per request (about a tenth more Envoy CPU per 1 KB request), so
    /// off unless the operator's log reads it.
    pub route_log: bool,
    /// Priority classes and deadlines while the fleet is past its knee; `None`: never held.
    pub gate: Option<GateConfig>,
    /// The pods' own cache reports.
    pub feedback: FeedbackConfig,
    /// The record of which pod answered each stored `/v1/responses` response.
    pub responses: ResponsesConfig,
}

/// Most backends one filter instance routes over.
pub const MAX_BACKENDS: usize = 1024;

// Bounds that keep one worker VM well inside a wasm32 address space (4 GiB,
// shared by everything the VM holds), whatever the configuration says.

/// Largest body parsed: it is copied into the VM, and decoded strings may copy it again.
pub const MAX_BODY_BYTES: usize = 32 << 20;
/// Longest model or adapter name: in the configuration, in a scrape, in a
/// request (a longer `model` names nothing any pod serves).
pub const MAX_NAME_BYTES: usize = 256;
/// Most index entries per VM: ~50 bytes each with the LRU queue, ~100 MiB at the bound.
pub const MAX_INDEX_BLOCKS: usize = 1 << 21;
/// Largest shared-data budget of the index log (1024 slots of 16 KiB).
pub const MAX_LOG_BYTES: usize = 16 << 20;

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
        let wire: wire::WireConfig =
            serde_path_to_error::deserialize(&mut *de).map_err(serde_error)?;
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
