//! A [`WireConfig`] checked section by section into a [`Config`]: each
//! value within its bounds, each name well formed, the sections consistent
//! with each other. A bad field is named in the one [`ConfigError`] returned.

use super::wire::*;
use super::*;
use std::net::SocketAddr;

/// Largest `metrics.capacity_tokens`: 2^40 tokens, far past any pod's KV.
const MAX_CAPACITY_TOKENS: u64 = 1 << 40;

/// Most slots `metrics.prompt_cache.slots` may name: llama.cpp's `-np` is a
/// handful, and the index keeps each held prompt's sampled hashes.
const MAX_PROMPT_SLOTS: u64 = 1024;

/// `metrics.prompt_cache`: only for llama.cpp, whose cache is whole prompts;
/// vLLM and SGLang keep blocks, which the index already models.
fn prompt_cache(
    engine: Engine,
    p: Option<WirePromptCache>,
) -> Result<Option<PromptCache>, ConfigError> {
    let Some(p) = p else { return Ok(None) };
    if engine != Engine::Llamacpp {
        return Err(bad(
            "metrics.prompt_cache",
            "only with engine llamacpp: vLLM and SGLang keep blocks, not whole prompts",
        ));
    }
    let slots = p
        .slots
        .ok_or_else(|| bad("metrics.prompt_cache.slots", "required: llama-server's -np"))?;
    let ram_tokens = p.ram_tokens.ok_or_else(|| {
        bad(
            "metrics.prompt_cache.ram_tokens",
            "required: --cache-ram MiB x 2^20 / the model's KV bytes per token (0: no RAM cache)",
        )
    })?;
    Ok(Some(PromptCache {
        slots: in_range("metrics.prompt_cache.slots", slots, 1, MAX_PROMPT_SLOTS)? as u32,
        ram_tokens: in_range(
            "metrics.prompt_cache.ram_tokens",
            ram_tokens,
            0,
            MAX_CAPACITY_TOKENS,
        )?,
    }))
}

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

/// A quantity an engine may not publish (llama.cpp: KV usage and size): the list may be empty.
fn optional_metric_names(field: &str, names: Vec<String>) -> Result<Vec<String>, ConfigError> {
    if names.iter().any(|n| n.is_empty()) {
        return Err(bad(field, "metric names must not be empty"));
    }
    Ok(names)
}

fn serves(field: &str, models: Vec<String>, adapters: Vec<String>) -> Result<Serves, ConfigError> {
    for (what, list) in [("models", &models), ("adapters", &adapters)] {
        if list
            .iter()
            .any(|m| m.is_empty() || m.len() > MAX_NAME_BYTES)
        {
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
        empty_grace_ms: in_range("pool.empty_grace_ms", p.empty_grace_ms, 0, 3_600_000)?,
    })
}

fn peers_config(p: WirePeers) -> Result<PeersConfig, ConfigError> {
    let Some(cluster) = p.cluster else {
        return Err(bad("peers.cluster", "is required"));
    };
    let Some(port) = p.port.filter(|&port| port > 0) else {
        return Err(bad(
            "peers.port",
            "is required: the peer listener's port (1-65535)",
        ));
    };
    Ok(PeersConfig {
        cluster: cluster_name("peers.cluster", cluster)?,
        port,
        admin_cluster: cluster_name("peers.admin_cluster", p.admin_cluster)?,
        timeout_ms: in_range("peers.timeout_ms", p.timeout_ms, 10, 60_000)?,
        max_reply_bytes: in_range("peers.max_reply_bytes", p.max_reply_bytes, 4096, 16 << 20)?,
        outbox_bytes: in_range("peers.outbox_bytes", p.outbox_bytes, 4096, 64 << 20)?,
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
    // A class named in another field: its rank, or the field named in the error.
    let rank_of = |field: String, class: &str| {
        let class = class.to_ascii_lowercase();
        classes
            .iter()
            .position(|c| c.name == class)
            .ok_or_else(|| bad(field, format!("{class:?} is not a class")))
    };
    let default_class = rank_of("gate.default_class".into(), &g.default_class)?;
    let objectives = g
        .objectives
        .into_iter()
        .map(|(name, class)| {
            Ok((
                name.clone(),
                rank_of(format!("gate.objectives.{name}"), &class)?,
            ))
        })
        .collect::<Result<_, ConfigError>>()?;
    Ok(GateConfig {
        knee,
        classes,
        default_class,
        class_header: header_name("gate.header", g.header)?,
        objectives,
        deadline_header: header_name("gate.deadline_header", g.deadline_header)?,
        // Past 1/2 every release would go to a lower class: priority upside down.
        lower_share: finite_in_range("gate.lower_share", g.lower_share, 0.0, 0.5)?,
        check_ms: in_range("gate.check_ms", g.check_ms, 5, 10_000)?,
        retry_after_s: in_range("gate.retry_after_s", g.retry_after_s, 1, 3600)?,
        max_held_bytes: in_range("gate.max_held_bytes", g.max_held_bytes, 1 << 20, 1 << 36)?,
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

/// `backends` or `pool`, the fleet; also the default scrape path, which a
/// backend's own `metrics_path` overrides.
fn fleet(
    wire: Vec<WireBackend>,
    pool: Option<WirePool>,
    metrics_path: &str,
) -> Result<(Vec<Backend>, Option<PoolConfig>, String), ConfigError> {
    if wire.is_empty() && pool.is_none() {
        return Err(bad(
            "backends",
            "must list at least one backend (or give a pool)",
        ));
    }
    if !wire.is_empty() && pool.is_some() {
        return Err(bad(
            "pool",
            "a fixed backends list and a discovered pool exclude each other",
        ));
    }
    let pool = match pool {
        Some(p) => Some(pool_config(p)?),
        None => None,
    };
    if wire.len() > MAX_BACKENDS {
        return Err(bad("backends", format!("at most {MAX_BACKENDS} backends")));
    }
    let default_path = path("metrics.path", metrics_path.to_string())?;
    let mut backends: Vec<Backend> = Vec::with_capacity(wire.len());
    for (i, b) in wire.into_iter().enumerate() {
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
    Ok((backends, pool, default_path))
}

/// `route`: how the choice reaches Envoy.
fn route(w: WireRoute) -> Result<RouteConfig, ConfigError> {
    let header = match (w.mode, w.header) {
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
    let model_header = match w.model_header {
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
    Ok(RouteConfig {
        mode: w.mode,
        header,
        fallbacks: in_range("route.fallbacks", w.fallbacks, 0, 16)?,
        model_header,
    })
}

/// `index`: the prefix index's bounds.
fn index(w: WireIndex) -> Result<IndexConfig, ConfigError> {
    Ok(IndexConfig {
        max_blocks: in_range("index.max_blocks", w.max_blocks, 1024, MAX_INDEX_BLOCKS)?,
        ttl_ms: in_range("index.ttl_ms", w.ttl_ms, 1000, 7 * 24 * 3_600_000)?,
        log_bytes: in_range("index.log_bytes", w.log_bytes, 4096, MAX_LOG_BYTES)?,
        bytes_per_token: finite_in_range("index.bytes_per_token", w.bytes_per_token, 0.5, 64.0)?,
        learn_bytes_per_token: w.learn_bytes_per_token,
    })
}

/// `balance`, `cache_aware` and `saturation`: the strategies' tuning; token
/// counts are turned into blocks by the index's bytes per token.
fn policy(
    balance: WireBalance,
    cache_aware: WireCacheAware,
    saturation: WireSaturation,
    index: &IndexConfig,
    block_bytes: usize,
) -> Result<PolicyConfig, ConfigError> {
    Ok(PolicyConfig {
        eps: finite_in_range("balance.eps", balance.eps, 0.0, 100.0)?,
        warm_min_cap: f64::from(in_range(
            "balance.warm_min_cap",
            balance.warm_min_cap,
            1,
            1 << 20,
        )?),
        tie_margin: finite_in_range("cache_aware.tie_margin", cache_aware.tie_margin, 0.0, 1.0)?,
        min_match_blocks: in_range(
            "cache_aware.min_match_blocks",
            cache_aware.min_match_blocks,
            1,
            1 << 20,
        )?,
        max_waiting: finite_in_range("saturation.max_waiting", saturation.max_waiting, 0.0, 1e9)?,
        max_kv_usage: finite_in_range(
            "saturation.max_kv_usage",
            saturation.max_kv_usage,
            0.0,
            1.0,
        )?,
        max_inflight: saturation.max_inflight,
        default_output_tokens: in_range(
            "balance.default_output_tokens",
            balance.default_output_tokens,
            1,
            1 << 20,
        )?,
        decode_cost: finite_in_range("balance.decode_cost", balance.decode_cost, 0.0, 1e4)?,
        block_tokens: block_bytes as f64 / index.bytes_per_token,
        prefill_slack_blocks: in_range(
            "cache_aware.prefill_slack_tokens",
            cache_aware.prefill_slack_tokens,
            0,
            1 << 24,
        )? as f64
            * index.bytes_per_token
            / block_bytes as f64,
        replicate_gap: finite_in_range(
            "cache_aware.replicate_gap",
            cache_aware.replicate_gap,
            1.0,
            1e9,
        )?,
    })
}

/// `metrics`: the scrapes and the health verdicts on them.
fn metrics(m: WireMetrics, path: String) -> Result<MetricsConfig, ConfigError> {
    let period_ms = in_range("metrics.period_ms", m.period_ms, 50, 3_600_000)?;
    let timeout_ms = in_range("metrics.timeout_ms", m.timeout_ms, 10, 3_600_000)?;
    if timeout_ms >= period_ms {
        return Err(bad(
            "metrics.timeout_ms",
            "must be shorter than metrics.period_ms",
        ));
    }
    Ok(MetricsConfig {
        enabled: m.enabled,
        cluster: cluster_name("metrics.cluster", m.cluster)?,
        path,
        period_ms,
        timeout_ms,
        unhealthy_after: in_range("metrics.unhealthy_after", m.unhealthy_after, 1, 1000)?,
        healthy_after: in_range("metrics.healthy_after", m.healthy_after, 1, 1000)?,
        eject_after_errors: in_range("metrics.eject_after_errors", m.eject_after_errors, 0, 1000)?,
        // A down verdict is renewed by each failed scrape, which a lost reply
        // reports up to two periods plus the timeout apart: a shorter expiry
        // would let a dead pod flap back between them.
        stale_after_ms: in_range(
            "metrics.stale_after_ms",
            m.stale_after_ms,
            2 * period_ms + timeout_ms,
            86_400_000,
        )?,
        // llama.cpp's series carry no `model_name` label: selecting one would
        // read every pod as idle.
        model_name: match (m.engine, m.model_name) {
            (Engine::Llamacpp, Some(_)) => {
                return Err(bad(
                    "metrics.model_name",
                    "llama.cpp's metrics carry no model_name label: leave it unset with engine llamacpp",
                ))
            }
            (_, name) => name,
        },
        names: {
            let (n, preset) = (m.names, m.engine.names());
            let field = |name| format!("metrics.names.{name}");
            MetricNames {
                running: metric_names(&field("running"), n.running.unwrap_or(preset.running))?,
                waiting: metric_names(&field("waiting"), n.waiting.unwrap_or(preset.waiting))?,
                kv_usage: optional_metric_names(
                    &field("kv_usage"),
                    n.kv_usage.unwrap_or(preset.kv_usage),
                )?,
                cache_config: optional_metric_names(
                    &field("cache_config"),
                    n.cache_config.unwrap_or(preset.cache_config),
                )?,
            }
        },
        capacity_tokens: m
            .capacity_tokens
            .map(|c| in_range("metrics.capacity_tokens", c, 1, MAX_CAPACITY_TOKENS))
            .transpose()?,
        prompt_cache: prompt_cache(m.engine, m.prompt_cache)?,
    })
}

impl TryFrom<WireConfig> for Config {
    type Error = ConfigError;

    /// Each section in turn; the first bad field is the one named.
    fn try_from(w: WireConfig) -> Result<Self, ConfigError> {
        let (backends, pool, default_path) = fleet(w.backends, w.pool, &w.metrics.path)?;
        let block_bytes = in_range("block_bytes", w.block_bytes, 16, 65_536)?;
        let route = route(w.route)?;
        let session_header = w.session_header.to_ascii_lowercase();
        if !valid_header_name(&session_header) {
            return Err(bad("session_header", "is not a valid header name"));
        }
        let index = index(w.index)?;
        let policy = policy(w.balance, w.cache_aware, w.saturation, &index, block_bytes)?;
        if w.feedback.request_usage && !w.feedback.enabled {
            return Err(bad("feedback.request_usage", "needs feedback.enabled"));
        }
        if w.debug_match_counts && !w.debug_header {
            return Err(bad("debug_match_counts", "needs debug_header"));
        }
        let metrics = metrics(w.metrics, default_path)?;
        let peers = w.peers.map(peers_config).transpose()?;
        let gate = w
            .gate
            .map(|g| gate_config(g, metrics.enabled))
            .transpose()?;
        Ok(Config {
            backends,
            pool,
            peers,
            strategy: w.strategy,
            route,
            block_bytes,
            max_body_bytes: in_range("max_body_bytes", w.max_body_bytes, 1024, MAX_BODY_BYTES)?,
            session_header,
            policy,
            index,
            metrics,
            debug_header: w.debug_header,
            route_log: w.route_log,
            debug_match_counts: w.debug_match_counts,
            gate,
            feedback: FeedbackConfig {
                enabled: w.feedback.enabled,
                request_usage: w.feedback.request_usage,
            },
            responses: ResponsesConfig {
                max_entries: in_range(
                    "responses.max_entries",
                    w.responses.max_entries,
                    0,
                    MAX_RESPONSES,
                )?,
            },
        })
    }
}
