//! The configuration as it arrives: serde mirrors of the JSON, every field
//! with its default, and unknown fields refused. Nothing here is checked;
//! [`super::validate`] turns a [`WireConfig`] into a [`super::Config`].

use super::{Engine, RouteMode, Strategy};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WireBackend {
    pub(super) name: String,
    pub(super) address: String,
    #[serde(default)]
    pub(super) host: Option<String>,
    #[serde(default)]
    pub(super) metrics_path: Option<String>,
    #[serde(default)]
    pub(super) models: Vec<String>,
    #[serde(default)]
    pub(super) adapters: Vec<String>,
}

// The wire structs below take every missing field from their `Default`: each
// default is declared once, there, and documented in docs/configuration.md.

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct WireRoute {
    pub(super) mode: RouteMode,
    pub(super) header: Option<String>,
    pub(super) fallbacks: usize,
    pub(super) model_header: Option<String>,
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
pub(super) struct WireBalance {
    pub(super) eps: f64,
    pub(super) warm_min_cap: u32,
    pub(super) default_output_tokens: u32,
    pub(super) decode_cost: f64,
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
pub(super) struct WireCacheAware {
    pub(super) tie_margin: f64,
    pub(super) min_match_blocks: u32,
    pub(super) prefill_slack_tokens: u32,
    pub(super) replicate_gap: f64,
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
pub(super) struct WireSaturation {
    pub(super) max_waiting: f64,
    pub(super) max_kv_usage: f64,
    pub(super) max_inflight: u32,
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
pub(super) struct WireIndex {
    pub(super) max_blocks: usize,
    pub(super) ttl_ms: u64,
    pub(super) log_bytes: usize,
    pub(super) bytes_per_token: f64,
    pub(super) learn_bytes_per_token: bool,
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

/// Each list left out takes the engine preset's ([`super::Engine::names`]).
#[derive(Debug, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub(super) struct WireMetricNames {
    pub(super) running: Option<Vec<String>>,
    pub(super) waiting: Option<Vec<String>>,
    pub(super) kv_usage: Option<Vec<String>>,
    pub(super) cache_config: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct WireMetrics {
    pub(super) enabled: bool,
    pub(super) cluster: String,
    pub(super) path: String,
    pub(super) period_ms: u64,
    pub(super) timeout_ms: u64,
    pub(super) unhealthy_after: u32,
    pub(super) healthy_after: u32,
    pub(super) eject_after_errors: u32,
    pub(super) stale_after_ms: u64,
    pub(super) model_name: Option<String>,
    pub(super) engine: Engine,
    pub(super) names: WireMetricNames,
    pub(super) capacity_tokens: Option<u64>,
    pub(super) prompt_cache: Option<WirePromptCache>,
}

/// An engine that keeps whole prompts ([`super::PromptCache`]); both fields must be given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WirePromptCache {
    pub(super) slots: Option<u64>,
    pub(super) ram_tokens: Option<u64>,
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
            engine: Engine::default(),
            names: WireMetricNames::default(),
            capacity_tokens: None,
            prompt_cache: None,
        }
    }
}

/// A pool whose endpoints Envoy knows (EDS keeps them current).
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct WirePool {
    pub(super) cluster: Option<String>,
    pub(super) clusters: Vec<WirePoolCluster>,
    pub(super) admin_cluster: String,
    pub(super) max_backends: usize,
    pub(super) empty_grace_ms: u64,
    pub(super) models: Vec<String>,
    pub(super) adapters: Vec<String>,
}

impl Default for WirePool {
    fn default() -> Self {
        WirePool {
            cluster: None,
            clusters: Vec::new(),
            admin_cluster: "envoy-admin".into(),
            max_backends: 64,
            empty_grace_ms: 30_000,
            models: Vec::new(),
            adapters: Vec::new(),
        }
    }
}

/// The gateway's replicas, which exchange index events ([`crate::routing::exchange`]).
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct WirePeers {
    pub(super) cluster: Option<String>,
    pub(super) port: Option<u16>,
    pub(super) admin_cluster: String,
    pub(super) timeout_ms: u64,
    pub(super) max_reply_bytes: usize,
    pub(super) outbox_bytes: usize,
}

impl Default for WirePeers {
    fn default() -> Self {
        WirePeers {
            cluster: None,
            port: None,
            admin_cluster: "envoy-admin".into(),
            timeout_ms: 500,
            max_reply_bytes: 1 << 20,
            outbox_bytes: 1 << 20,
        }
    }
}

/// One of several discovered pools (one per model, typically).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WirePoolCluster {
    pub(super) cluster: String,
    #[serde(default)]
    pub(super) models: Vec<String>,
    #[serde(default)]
    pub(super) adapters: Vec<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub(super) struct WireKnee {
    pub(super) requests: Option<f64>,
    pub(super) work: Option<f64>,
    pub(super) waiting: Option<f64>,
    pub(super) kv_usage: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WireClass {
    pub(super) name: String,
    #[serde(default)]
    pub(super) aliases: Vec<String>,
    pub(super) max_wait_ms: u64,
    pub(super) max_queue: u32,
}

/// Priority classes and deadlines at the gate ([`crate::gate`]); off unless given.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct WireGate {
    pub(super) knee: WireKnee,
    pub(super) classes: Vec<WireClass>,
    pub(super) default_class: String,
    pub(super) header: String,
    pub(super) deadline_header: String,
    pub(super) lower_share: f64,
    pub(super) check_ms: u64,
    pub(super) retry_after_s: u32,
    pub(super) max_held_bytes: u64,
    pub(super) objectives: std::collections::BTreeMap<String, String>,
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
            max_held_bytes: 128 << 20,
            objectives: std::collections::BTreeMap::new(),
        }
    }
}

/// The pods' own cache reports ([`crate::routing::feedback`]).
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct WireFeedback {
    pub(super) enabled: bool,
    pub(super) request_usage: bool,
}

impl Default for WireFeedback {
    fn default() -> Self {
        WireFeedback {
            enabled: true,
            request_usage: false,
        }
    }
}

/// The record of which pod answered each stored response ([`crate::fleet::responses`]).
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct WireResponses {
    pub(super) max_entries: usize,
}

impl Default for WireResponses {
    fn default() -> Self {
        WireResponses {
            max_entries: 16_384,
        }
    }
}

/// `backends` has no useful default: an empty list (without a `pool`) is
/// rejected by validation, which names the field.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct WireConfig {
    pub(super) backends: Vec<WireBackend>,
    pub(super) pool: Option<WirePool>,
    pub(super) peers: Option<WirePeers>,
    pub(super) strategy: Strategy,
    pub(super) route: WireRoute,
    pub(super) block_bytes: usize,
    pub(super) max_body_bytes: usize,
    pub(super) session_header: String,
    pub(super) balance: WireBalance,
    pub(super) cache_aware: WireCacheAware,
    pub(super) saturation: WireSaturation,
    pub(super) index: WireIndex,
    pub(super) metrics: WireMetrics,
    pub(super) debug_header: bool,
    pub(super) route_log: bool,
    pub(super) debug_match_counts: bool,
    pub(super) gate: Option<WireGate>,
    pub(super) feedback: WireFeedback,
    pub(super) responses: WireResponses,
}

impl Default for WireConfig {
    fn default() -> Self {
        WireConfig {
            backends: Vec::new(),
            pool: None,
            peers: None,
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
            route_log: false,
            debug_match_counts: false,
            gate: None,
            feedback: WireFeedback::default(),
            responses: WireResponses::default(),
        }
    }
}
