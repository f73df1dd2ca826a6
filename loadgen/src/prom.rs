//! Backends' prefix-cache counters from `/metrics` and the fleet hit rate.
//!
//! We scrape each backend's `/metrics` before and after a run and compute
//!
//! ```text
//! hit_rate = Σ_b (hits_b,after − hits_b,before) / Σ_b (queries_b,after − queries_b,before)
//! ```
//!
//! with `hits = vllm:prefix_cache_hits_total` and
//! `queries = vllm:prefix_cache_queries_total` (both in tokens), each summed over
//! all label sets (e.g. several `model_name`s). Summing deltas before dividing
//! weights every backend by its traffic, which is the fleet-level number users
//! quote ("share of prompt tokens served from cache"). A counter that went
//! backwards (server restart) contributes its after-value, as Prometheus'
//! `increase()` would.
//!
//! Parsing is `warmroute_core::fleet::prometheus`, the parser the filter scrapes
//! backends with, so loadgen and the router read a metrics page the same way.
//! Malformed lines are skipped, never fatal: a metrics page is foreign input.

use std::collections::BTreeMap;

use warmroute_core::fleet::prometheus::parse;

/// vLLM prefix-cache hit counter (tokens).
pub const HITS: &str = "vllm:prefix_cache_hits_total";
/// vLLM prefix-cache query counter (tokens).
pub const QUERIES: &str = "vllm:prefix_cache_queries_total";

/// Sum of all samples named `name` in a metrics page (over label sets); `None` if absent.
pub fn sum_metric(text: &str, name: &str) -> Option<f64> {
    let mut found = false;
    let mut total = 0.0;
    parse(text, |s| {
        if s.name == name {
            found = true;
            total += s.value;
        }
    });
    found.then_some(total)
}

/// Prefix-cache counters of one backend at one instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheCounters {
    /// Σ `vllm:prefix_cache_hits_total`.
    pub hits: f64,
    /// Σ `vllm:prefix_cache_queries_total`.
    pub queries: f64,
}

impl CacheCounters {
    /// Extract from a metrics page; `None` if either counter is missing.
    pub fn from_text(text: &str) -> Option<Self> {
        Some(Self {
            hits: sum_metric(text, HITS)?,
            queries: sum_metric(text, QUERIES)?,
        })
    }
}

/// Counter increase, tolerating resets (like PromQL `increase`).
pub fn increase(before: f64, after: f64) -> f64 {
    if after >= before {
        after - before
    } else {
        after
    }
}

/// Per-backend result of the before/after comparison.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BackendDelta {
    /// Backend base URL.
    pub url: String,
    /// Δhits (tokens), `None` if a scrape failed.
    pub hits: Option<f64>,
    /// Δqueries (tokens), `None` if a scrape failed.
    pub queries: Option<f64>,
    /// Δhits/Δqueries for this backend.
    pub hit_rate: Option<f64>,
    /// Scrape error, if any.
    pub error: Option<String>,
}

impl BackendDelta {
    /// Compare two scrapes of one backend.
    pub fn compute(
        url: &str,
        before: Result<CacheCounters, String>,
        after: Result<CacheCounters, String>,
    ) -> Self {
        match (before, after) {
            (Ok(b), Ok(a)) => {
                let hits = increase(b.hits, a.hits);
                let queries = increase(b.queries, a.queries);
                Self {
                    url: url.to_string(),
                    hits: Some(hits),
                    queries: Some(queries),
                    hit_rate: (queries > 0.0).then(|| hits / queries),
                    error: None,
                }
            }
            (Err(e), _) | (_, Err(e)) => Self {
                url: url.to_string(),
                hits: None,
                queries: None,
                hit_rate: None,
                error: Some(e),
            },
        }
    }
}

/// Fleet hit rate Σhits/Σqueries over backends whose scrapes succeeded.
pub fn fleet_hit_rate(deltas: &[BackendDelta]) -> Option<f64> {
    let (h, q) = deltas
        .iter()
        .filter_map(|d| Some((d.hits?, d.queries?)))
        .fold((0.0, 0.0), |(h, q), (dh, dq)| (h + dh, q + dq));
    (q > 0.0).then(|| h / q)
}

/// The `/metrics` URL for a backend given as a base URL (or already a metrics URL).
pub fn metrics_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/metrics") {
        base.to_string()
    } else {
        format!("{base}/metrics")
    }
}

/// Group helper for summaries: value of label `key` → summed value, for metric
/// `name` in a metrics page; samples without the label group under `""`.
pub fn by_label(text: &str, name: &str, key: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    parse(text, |s| {
        if s.name == name {
            let v = s.label(key).map(|v| v.into_owned()).unwrap_or_default();
            *out.entry(v).or_insert(0.0) += s.value;
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="sim-llama-8b"} 1200.0
vllm:prefix_cache_queries_total{engine="0",model_name="other"} 800
vllm:prefix_cache_queries_created{engine="0",model_name="sim-llama-8b"} 1.7e9
# HELP vllm:prefix_cache_hits_total Prefix cache hits
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{model_name="sim-llama-8b",note="a \"quoted\", {odd} value"} 600 1712345678000
vllm:prefix_cache_hits_total{model_name="other"} 2e2
vllm:num_requests_running{model_name="sim-llama-8b"} 3
process_open_fds 12
garbage line without value
"#;

    #[test]
    fn parses_counters_with_labels() {
        assert_eq!(sum_metric(PAGE, QUERIES), Some(2000.0));
        assert_eq!(sum_metric(PAGE, HITS), Some(800.0));
        assert_eq!(sum_metric(PAGE, "process_open_fds"), Some(12.0));
        assert_eq!(sum_metric(PAGE, "nope"), None);
        let by_note = by_label(PAGE, HITS, "note");
        assert_eq!(by_note.get("a \"quoted\", {odd} value"), Some(&600.0));
        assert_eq!(by_note.get(""), Some(&200.0));
        let by_model = by_label(PAGE, QUERIES, "model_name");
        assert_eq!(by_model.get("other"), Some(&800.0));
        assert_eq!(
            CacheCounters::from_text(PAGE),
            Some(CacheCounters {
                hits: 800.0,
                queries: 2000.0
            })
        );
        assert_eq!(CacheCounters::from_text("process_open_fds 1"), None);
    }

    #[test]
    fn fleet_rate_sums_deltas_before_dividing() {
        let c = |h, q| {
            Ok(CacheCounters {
                hits: h,
                queries: q,
            })
        };
        let d = vec![
            BackendDelta::compute("a", c(100.0, 1000.0), c(1000.0, 2000.0)), // 900/1000
            BackendDelta::compute("b", c(0.0, 0.0), c(0.0, 3000.0)),         // 0/3000
            BackendDelta::compute("c", Err("down".into()), c(5.0, 5.0)),
        ];
        assert_eq!(d[0].hit_rate, Some(0.9));
        assert_eq!(d[2].error.as_deref(), Some("down"));
        assert_eq!(fleet_hit_rate(&d), Some(900.0 / 4000.0));
        assert_eq!(fleet_hit_rate(&d[2..]), None);
        assert_eq!(increase(50.0, 10.0), 10.0);
        assert_eq!(metrics_url("http://h:1/"), "http://h:1/metrics");
        assert_eq!(metrics_url("http://h:1/metrics"), "http://h:1/metrics");
    }
}
