//! One backend's `/metrics` reply → a [`Scrape`]: the gauges the load formula
//! ([`crate::routing::load`]) and the index's sizing use.
//!
//! For each quantity the configured names are tried in order and the first
//! one present wins (vLLM's current name before its older one, then
//! SGLang's); a metric with several label sets (one per model) is summed, or
//! only the configured `model_name` is taken. Values are clamped to their
//! meaning (counts ≥ 0, usage in 0..1, NaN and ±Inf read as 0): a hostile or
//! broken `/metrics` can make a pod look busy or idle, never break routing.
//! KV capacity comes from `vllm:cache_config_info`'s labels
//! (`num_gpu_blocks × block_size` tokens), summed over its `engine` label: a
//! data-parallel pod runs one engine per rank, each with its own cache and
//! its own series (one series per engine, the first kept); LoRA adapters from
//! `vllm:lora_requests_info` ([`crate::fleet::lora`]).
//!
//! The names are the configured ones, from an engine preset
//! ([`crate::config::Engine`]). llama.cpp's server publishes no KV usage and
//! no KV size: its KV usage reads 0 (no pod is full by KV), and its capacity
//! is `metrics.capacity_tokens`, which the scrape's reader puts in
//! ([`with_capacity`]).

use crate::config::MetricNames;
use crate::fleet::lora::Lora;
use crate::fleet::prometheus::{self, Sample};

/// Most data-parallel engines of one pod counted: a `/metrics` listing more
/// costs its scraper no more than this many comparisons per series.
const MAX_ENGINES: usize = 64;

/// What one scrape of a backend said.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Scrape {
    /// Requests in the running batch.
    pub running: f64,
    /// Requests queued.
    pub waiting: f64,
    /// KV cache usage, 0..1.
    pub kv_usage: f64,
    /// KV capacity in tokens, from the info gauge `metrics.names.cache_config`
    /// names (vLLM's `vllm:cache_config_info`), else `metrics.capacity_tokens`.
    pub capacity_tokens: Option<u64>,
    /// This gateway's in-flight requests on the backend when the scrape answered.
    pub own_inflight: u32,
}

/// The first configured name present wins; label sets are summed (or the
/// largest taken, with `max`), or only the configured `model_name` is taken.
fn pick(samples: &[Sample<'_>], names: &[String], model: Option<&str>, max: bool) -> Option<f64> {
    names.iter().find_map(|n| {
        let mut found = None;
        for s in samples.iter().filter(|s| s.name == n) {
            if let Some(m) = model {
                if s.label("model_name").as_deref() != Some(m) {
                    continue;
                }
            }
            let v = if s.value.is_finite() { s.value } else { 0.0 };
            found = Some(match found {
                None => v,
                Some(f) if max => f64::max(f, v),
                Some(f) => f + v,
            });
        }
        found
    })
}

/// Extracts a [`Scrape`] from Prometheus text.
pub fn extract(text: &str, names: &MetricNames, model: Option<&str>) -> Scrape {
    extract_with_lora(text, names, model).0
}

/// Extracts a [`Scrape`] and the pod's LoRA state from Prometheus text, in one pass.
pub fn extract_with_lora(
    text: &str,
    names: &MetricNames,
    model: Option<&str>,
) -> (Scrape, Option<Lora>) {
    let mut samples = Vec::new();
    prometheus::parse(text, |s| {
        if s.name == "vllm:lora_requests_info" || names_contain(names, s.name) {
            samples.push(s)
        }
    });
    let lora = Lora::from_samples(samples.iter());
    let mut engines: Vec<(Option<String>, u64)> = Vec::new();
    // The first configured info gauge present (as for the other quantities).
    let info = names
        .cache_config
        .iter()
        .find(|n| samples.iter().any(|s| s.name == n.as_str()));
    for s in samples
        .iter()
        .filter(|s| info.is_some_and(|n| s.name == n.as_str()))
    {
        if engines.len() == MAX_ENGINES {
            break;
        }
        let engine = s.label("engine").map(|e| e.into_owned());
        if engines.iter().any(|(e, _)| *e == engine) {
            continue;
        }
        let tokens = (|| {
            let blocks: u64 = s.label("num_gpu_blocks")?.parse().ok()?;
            let size: u64 = s.label("block_size")?.parse().ok()?;
            blocks.checked_mul(size)
        })();
        if let Some(t) = tokens {
            engines.push((engine, t));
        }
    }
    let capacity_tokens = (!engines.is_empty()).then(|| {
        engines
            .iter()
            .fold(0u64, |sum, (_, t)| sum.saturating_add(*t))
    });
    let scrape = Scrape {
        running: pick(&samples, &names.running, model, false)
            .unwrap_or(0.0)
            .max(0.0),
        waiting: pick(&samples, &names.waiting, model, false)
            .unwrap_or(0.0)
            .max(0.0),
        kv_usage: pick(&samples, &names.kv_usage, model, true)
            .unwrap_or(0.0)
            .clamp(0.0, 1.0),
        capacity_tokens,
        own_inflight: 0,
    };
    (scrape, lora)
}

/// The configured capacity of a pod whose scrape gave none (an engine that
/// publishes no KV size); a capacity the engine publishes wins.
pub fn with_capacity(mut scrape: Scrape, configured: Option<u64>) -> Scrape {
    scrape.capacity_tokens = scrape.capacity_tokens.or(configured);
    scrape
}

fn names_contain(names: &MetricNames, n: &str) -> bool {
    [
        &names.running,
        &names.waiting,
        &names.kv_usage,
        &names.cache_config,
    ]
    .iter()
    .any(|l| l.iter().any(|x| x == n))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn names() -> MetricNames {
        crate::testing::config(1).metrics.names
    }

    #[test]
    fn extracts_vllm_and_sums_label_sets() {
        let names = names();
        let text = "vllm:num_requests_running{model_name=\"a\"} 3\nvllm:num_requests_running{model_name=\"b\"} 4\n\
vllm:num_requests_waiting{model_name=\"a\"} 1\nvllm:gpu_cache_usage_perc{model_name=\"a\"} 0.5\n\
vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1.0\n\
vllm:prefix_cache_hits_total{model_name=\"a\"} 10\nvllm:prefix_cache_queries_total{model_name=\"a\"} 40\n";
        let s = extract(text, &names, None);
        assert_eq!((s.running, s.waiting, s.kv_usage), (7.0, 1.0, 0.5));
        assert_eq!(s.capacity_tokens, Some(16_000));
        let only_b = extract(text, &names, Some("b"));
        assert_eq!(only_b.running, 4.0);
    }

    #[test]
    fn extracts_sglang_and_newer_name_wins() {
        let names = names();
        let s = extract(
            "sglang:num_running_reqs 2\nsglang:num_queue_reqs 5\nsglang:token_usage 0.9\n",
            &names,
            None,
        );
        assert_eq!((s.running, s.waiting, s.kv_usage), (2.0, 5.0, 0.9));
        let both = extract(
            "vllm:kv_cache_usage_perc 0.2\nvllm:gpu_cache_usage_perc 0.7\n",
            &names,
            None,
        );
        assert_eq!(both.kv_usage, 0.2);
    }

    #[test]
    fn a_data_parallel_pods_capacity_is_every_engines() {
        let names = crate::testing::config(1).metrics.names;
        let text =
            "vllm:cache_config_info{block_size=\"32\",engine=\"0\",num_gpu_blocks=\"100\"} 1.0\n\
vllm:cache_config_info{block_size=\"32\",engine=\"1\",num_gpu_blocks=\"100\"} 1.0\n\
vllm:cache_config_info{block_size=\"32\",engine=\"1\",num_gpu_blocks=\"999\"} 1.0\n";
        assert_eq!(extract(text, &names, None).capacity_tokens, Some(6400));
        let one = "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"10\"} 1.0\n";
        assert_eq!(extract(one, &names, None).capacity_tokens, Some(160));
        assert_eq!(extract("", &names, None).capacity_tokens, None);
    }

    /// llama.cpp's `/metrics` as `llama-server --metrics` printed it (the
    /// version in docs/real-engine.md), mid-request.
    const LLAMACPP: &str = "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens\n\
# TYPE llamacpp:prompt_tokens_total counter\n\
llamacpp:prompt_tokens_total 5412\n\
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache\n\
# TYPE llamacpp:prompt_tokens_cached_total counter\n\
llamacpp:prompt_tokens_cached_total 3270\n\
# HELP llamacpp:requests_processing Number of requests processing\n\
# TYPE llamacpp:requests_processing gauge\n\
llamacpp:requests_processing 2\n\
# HELP llamacpp:requests_deferred Number of requests deferred\n\
# TYPE llamacpp:requests_deferred gauge\n\
llamacpp:requests_deferred 3\n\
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call\n\
# TYPE llamacpp:n_busy_slots_per_decode gauge\n\
llamacpp:n_busy_slots_per_decode 1.23456\n";

    #[test]
    fn llamacpp_names_read_its_slots_and_deferred_tasks() {
        let llama = crate::config::Engine::Llamacpp.names();
        let s = extract(LLAMACPP, &llama, None);
        assert_eq!((s.running, s.waiting, s.kv_usage), (2.0, 3.0, 0.0));
        assert_eq!(s.capacity_tokens, None);
        // vLLM's names find nothing in it: the pod would look idle whatever it did.
        let vllm = extract(LLAMACPP, &names(), None);
        assert_eq!((vllm.running, vllm.waiting), (0.0, 0.0));
    }

    #[test]
    fn the_configured_info_gauge_sizes_the_pod() {
        let text = "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"10\"} 1.0\n\
other:cache_info{block_size=\"32\",num_gpu_blocks=\"10\"} 1.0\n";
        let mut n = names();
        n.cache_config = vec!["other:cache_info".into(), "vllm:cache_config_info".into()];
        assert_eq!(extract(text, &n, None).capacity_tokens, Some(320));
        n.cache_config.clear();
        assert_eq!(extract(text, &n, None).capacity_tokens, None);
    }

    #[test]
    fn a_configured_capacity_fills_in_only_where_the_engine_gave_none() {
        let llama = crate::config::Engine::Llamacpp.names();
        let s = with_capacity(extract(LLAMACPP, &llama, None), Some(12_288));
        assert_eq!(s.capacity_tokens, Some(12_288));
        let one = "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"10\"} 1.0\n";
        let v = with_capacity(extract(one, &names(), None), Some(12_288));
        assert_eq!(v.capacity_tokens, Some(160));
    }
}
