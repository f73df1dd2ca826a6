//! Prometheus text-format parsing and the fleet prefix-cache hit rate.
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
//! The parser accepts the text exposition format: `# ` comment/HELP/TYPE lines
//! are skipped, label values may contain escaped quotes, commas and braces, an
//! optional timestamp after the value is ignored. Malformed lines are skipped,
//! never fatal: a metrics page is foreign input.

use std::collections::BTreeMap;

/// vLLM prefix-cache hit counter (tokens).
pub const HITS: &str = "vllm:prefix_cache_hits_total";
/// vLLM prefix-cache query counter (tokens).
pub const QUERIES: &str = "vllm:prefix_cache_queries_total";

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Label pairs in order of appearance.
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

/// Parse a Prometheus text page; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    if name.is_empty() {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, remaining) = parse_labels(after)?;
        labels = parsed;
        rest = remaining;
    }
    let value_str = rest.split_whitespace().next()?;
    let value = parse_value(value_str)?;
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

/// Parse `k="v",k2="v2"}` (after the opening brace); returns labels and the rest after `}`.
fn parse_labels(s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = rest.find('=')?;
        let key = rest[..eq].trim().to_string();
        rest = rest[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break i,
                other => value.push(other),
            }
        };
        labels.push((key, value));
        rest = &rest[end + 1..];
    }
}

/// Sum of all samples named `name` (over label sets); `None` if absent.
pub fn sum_metric(samples: &[Sample], name: &str) -> Option<f64> {
    let mut found = false;
    let mut total = 0.0;
    for s in samples.iter().filter(|s| s.name == name) {
        found = true;
        total += s.value;
    }
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
        let samples = parse(text);
        Some(Self {
            hits: sum_metric(&samples, HITS)?,
            queries: sum_metric(&samples, QUERIES)?,
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

/// Group helper for summaries: value of label `key` → summed value, for metric `name`.
pub fn by_label(samples: &[Sample], name: &str, key: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name == name) {
        let v = s
            .labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        *out.entry(v).or_insert(0.0) += s.value;
    }
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
        let s = parse(PAGE);
        assert_eq!(sum_metric(&s, QUERIES), Some(2000.0));
        assert_eq!(sum_metric(&s, HITS), Some(800.0));
        assert_eq!(sum_metric(&s, "process_open_fds"), Some(12.0));
        assert_eq!(sum_metric(&s, "nope"), None);
        let hit = s.iter().find(|x| x.name == HITS).unwrap();
        assert_eq!(
            hit.labels,
            vec![
                ("model_name".into(), "sim-llama-8b".into()),
                ("note".into(), "a \"quoted\", {odd} value".into())
            ]
        );
        let by_model = by_label(&s, QUERIES, "model_name");
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
