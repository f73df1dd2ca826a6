//! `/metrics` in Prometheus text format, with vLLM's metric names and layout.
//!
//! vLLM exports through `prometheus_client` (Python), so this mimics its output: `# HELP` and
//! `# TYPE` before each family, float values written like Python's `repr` (`3.0`), counters named
//! with the `_total` suffix in HELP/TYPE too, each followed by its `_created` gauge (the Unix time
//! the series was created, as `prometheus_client` adds to every counter). Every engine series
//! carries the labels `engine` (the data-parallel rank, `"0"` here) and `model_name`, in that
//! (sorted) order. Routers (warmroute's scraper, llm-d's, the Gateway API inference extension's)
//! read the gauges `vllm:num_requests_running`, `vllm:num_requests_waiting` and
//! `vllm:kv_cache_usage_perc`.
//!
//! Checked against vLLM 0.32.0 (CPU build) by `make real`; its `/metrics` is kept in
//! `bench/real/fixtures/vllm-metrics.txt`, and `tests/real_vllm.rs` holds the families printed
//! here to its names and label names. What vLLM 0.32 no longer prints is not printed either:
//! `vllm:gpu_cache_usage_perc`, `vllm:num_requests_swapped`, `vllm:gpu_prefix_cache_*`.
//!
//! Prefix-cache counters count *tokens*, like vLLM V1: `queries` grows by the prompt length of
//! each admitted request, `hits` by its cached tokens.
//!
//! With LoRA enabled, `vllm:lora_requests_info` is exported as vLLM's `PrometheusStatLogger`
//! does (`vllm/v1/metrics/loggers.py`): a gauge with the labels `max_lora` (`--max-loras`),
//! `running_lora_adapters` and `waiting_lora_adapters` (adapter names joined by `,`, empty when
//! none), whose value is the Unix time the combination was last seen. Every combination seen since
//! start stays exported, as `prometheus_client` keeps every child of a labelled gauge: readers
//! (the Gateway API inference extension, llm-d) take the series with the latest value. Before the
//! first engine step the family has no sample, as in vLLM.

use std::fmt::Write;

use crate::engine::{LoraInfo, Snapshot};

/// Static labels of `vllm:cache_config_info`.
#[derive(Debug, Clone)]
pub struct CacheInfo {
    pub block_size: usize,
    pub num_gpu_blocks: usize,
    /// `--max-model-len`: vLLM prints the KV's concurrency at that length.
    pub max_model_len: usize,
}

/// Formats a sample value as `prometheus_client`'s `floatToGoString` does: Python's `repr`
/// (`3.0`, `0.25`), except that a positive value with more than six integer digits switches to
/// Go's exponent form (`1234567.0` -> `1.234567e+06`, a Unix time -> `1.7395575657589855e+09`).
pub fn num(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    let s = python_repr(v);
    match s.find('.') {
        Some(dot) if v > 0.0 && dot > 6 => {
            // Same string surgery as floatToGoString: the digits around the dot become the
            // mantissa, with trailing zeros and dot stripped, then `e+0` and the exponent.
            let (int, frac) = (&s[..dot], &s[dot + 1..]);
            let mantissa = format!("{}.{}{}", &int[..1], &int[1..], frac);
            let mantissa = mantissa.trim_end_matches(['0', '.']);
            format!("{mantissa}e+0{}", dot - 1)
        }
        _ => s,
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip (as Rust's `Debug`), written in
/// positional form with a trailing `.0` for exponents in -4..16 and as `1e+16`/`1.5e-05` outside.
fn python_repr(v: f64) -> String {
    if v == 0.0 {
        return if v.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // `{:e}` gives the shortest round-trip digits with an explicit exponent: `1.2345e3`.
    let sci = format!("{v:e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let plain = format!("{v}");
        if plain.contains('.') {
            plain
        } else {
            format!("{plain}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mant}e{sign}{:02}", exp.unsigned_abs())
    }
}

/// Escapes a label value (backslash, double quote, newline), per the exposition format.
pub fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn family(out: &mut String, name: &str, kind: &str, help: &str, labels: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name}{{{labels}}} {}", num(value));
}

/// A counter as `prometheus_client` writes it: `<base>_total`, then `<base>_created`, one
/// sample per label set, both families with the same help.
fn counter(out: &mut String, base: &str, help: &str, samples: &[(String, f64)], created: f64) {
    for (suffix, kind) in [("_total", "counter"), ("_created", "gauge")] {
        let _ = writeln!(out, "# HELP {base}{suffix} {help}");
        let _ = writeln!(out, "# TYPE {base}{suffix} {kind}");
        for (labels, value) in samples {
            let v = if suffix == "_total" { *value } else { created };
            let _ = writeln!(out, "{base}{suffix}{{{labels}}} {}", num(v));
        }
    }
}

/// Renders the whole `/metrics` body; `created` is the Unix time the engine started.
pub fn render(
    model: &str,
    s: &Snapshot,
    cache_info: Option<&CacheInfo>,
    lora: Option<&LoraInfo>,
    created: f64,
) -> String {
    let m = format!("engine=\"0\",model_name=\"{}\"", escape_label(model));
    let c = &s.counters;
    let mut out = String::with_capacity(4096);
    family(
        &mut out,
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        &m,
        s.running as f64,
    );
    family(
        &mut out,
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        &m,
        s.waiting as f64,
    );
    let _ = writeln!(
        out,
        "# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason. Reason labels: \
         'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints \
         (LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting."
    );
    let _ = writeln!(out, "# TYPE vllm:num_requests_waiting_by_reason gauge");
    // Every queued request is counted as waiting for capacity, those the max_loras limit
    // holds back too (vLLM counts those as `deferred`: a known difference, see docs/real-engine.md).
    for (reason, v) in [("capacity", s.waiting as f64), ("deferred", 0.0)] {
        let _ = writeln!(
            out,
            "vllm:num_requests_waiting_by_reason{{{m},reason=\"{reason}\"}} {}",
            num(v)
        );
    }
    family(
        &mut out,
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        &m,
        s.kv_usage,
    );
    let one = |v: u64| vec![(m.clone(), v as f64)];
    counter(
        &mut out,
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        &one(c.prefix_cache_queries),
        created,
    );
    counter(
        &mut out,
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        &one(c.prefix_cache_hits),
        created,
    );
    counter(
        &mut out,
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        &one(0),
        created,
    );
    counter(
        &mut out,
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        &one(c.prompt_tokens),
        created,
    );
    counter(
        &mut out,
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        &one(c.generation_tokens),
        created,
    );
    // Every finish reason vLLM 0.32 knows is a label set from start; the simulator's
    // sequences all end at max_tokens.
    let model_label = escape_label(model);
    let success: Vec<(String, f64)> = ["stop", "length", "abort", "error", "repetition"]
        .iter()
        .map(|r| {
            let v = if *r == "length" { c.request_success } else { 0 };
            (
                format!("engine=\"0\",finished_reason=\"{r}\",model_name=\"{model_label}\""),
                v as f64,
            )
        })
        .collect();
    counter(
        &mut out,
        "vllm:request_success",
        "Count of successfully processed requests.",
        &success,
        created,
    );
    if let Some(info) = lora {
        let name = "vllm:lora_requests_info";
        let _ = writeln!(out, "# HELP {name} Running stats on lora requests.");
        let _ = writeln!(out, "# TYPE {name} gauge");
        // prometheus_client writes a sample's labels sorted by name.
        for series in &info.series {
            let _ = writeln!(
                out,
                "{name}{{max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"}} {}",
                info.max_loras,
                escape_label(&series.running),
                escape_label(&series.waiting),
                num(series.last_seen)
            );
        }
    }
    if let Some(ci) = cache_info {
        // vLLM 0.32's label set, sorted as printed (`_` first); the values of what the
        // simulator does not model are vLLM's defaults. Readers take `block_size` and
        // `num_gpu_blocks` (or `kv_cache_size_tokens`).
        let tokens = ci.num_gpu_blocks * ci.block_size;
        let concurrency = tokens as f64 / ci.max_model_len.max(1) as f64;
        let labels = format!(
            "_block_size_resolved=\"True\",block_size=\"{bs}\",cache_dtype=\"auto\",\
             cache_hit_alignment_tokens=\"None\",effective_attention_block_size=\"{bs}\",\
             enable_mamba_shared_prefix_checkpoint=\"False\",enable_prefix_caching=\"True\",engine=\"0\",\
             gpu_memory_utilization=\"0.9\",hash_block_size=\"None\",is_attention_free=\"False\",\
             kv_cache_dtype_skip_layers=\"[]\",kv_cache_layout=\"None\",kv_cache_max_concurrency=\"{concurrency:?}\",\
             kv_cache_memory_bytes=\"None\",kv_cache_size_tokens=\"{tokens}\",kv_offloading_backend=\"native\",\
             kv_offloading_size=\"None\",kv_sharing_fast_prefill=\"False\",mamba_block_size=\"None\",\
             mamba_cache_dtype=\"auto\",mamba_cache_mode=\"none\",mamba_page_size_padded=\"None\",\
             mamba_ssm_cache_dtype=\"auto\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{blocks}\",\
             num_gpu_blocks_override=\"None\",prefix_cache_retention_interval=\"0\",\
             prefix_caching_hash_algo=\"sha256\",prefix_match_unit=\"None\",replayssm_buffer_len=\"16\",\
             skip_page_size_padded=\"None\",sliding_window=\"None\",swa_bounded_replay=\"True\",\
             use_kda_recoverssm=\"False\",use_replayssm=\"False\",user_specified_block_size=\"True\"",
            bs = ci.block_size,
            blocks = ci.num_gpu_blocks,
        );
        family(
            &mut out,
            "vllm:cache_config_info",
            "gauge",
            "Information of the LLMEngine CacheConfig",
            &labels,
            1.0,
        );
    }
    // Simulator-only extras (not in vLLM), handy for benchmarks.
    family(
        &mut out,
        "sim:evictable_blocks",
        "gauge",
        "Cached blocks with no running user (evictable).",
        &m,
        s.evictable_blocks as f64,
    );
    family(
        &mut out,
        "sim:evicted_blocks_total",
        "counter",
        "Blocks evicted from the prefix cache.",
        &m,
        s.evictions as f64,
    );
    family(
        &mut out,
        "sim:engine_steps_total",
        "counter",
        "Engine steps executed.",
        &m,
        c.steps as f64,
    );
    family(
        &mut out,
        "sim:aborted_requests_total",
        "counter",
        "Requests aborted because the client went away.",
        &m,
        c.aborted as f64,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Counters, LoraSeries};

    #[test]
    fn values_format_like_prometheus_client() {
        for (v, want) in [
            (0.0, "0.0"),
            (3.0, "3.0"),
            (0.25, "0.25"),
            (600.0, "600.0"),
            (999_999.0, "999999.0"),
            (1_234_567.0, "1.234567e+06"),
            (10_000_000.0, "1e+07"),
            (1_739_557_565.758_985_5, "1.7395575657589855e+09"),
            (1e16, "1e+16"),
            (0.000_015, "1.5e-05"),
            (0.0001, "0.0001"),
            (-2.5, "-2.5"),
            (f64::INFINITY, "+Inf"),
        ] {
            assert_eq!(num(v), want, "{v:?}");
        }
    }

    #[test]
    fn renders_vllm_style() {
        let s = Snapshot {
            running: 3,
            waiting: 1,
            kv_usage: 0.25,
            num_blocks: 25000,
            block_size: 16,
            evictable_blocks: 0,
            evictions: 0,
            counters: Counters {
                prefix_cache_hits: 32,
                ..Counters::default()
            },
        };
        let out = render(
            "m\"x",
            &s,
            Some(&CacheInfo {
                block_size: 16,
                num_gpu_blocks: 25000,
                max_model_len: 100_000,
            }),
            None,
            1_795_785_374.25,
        );
        let m = "engine=\"0\",model_name=\"m\\\"x\"";
        assert!(out.contains(&format!("vllm:num_requests_running{{{m}}} 3.0\n")));
        assert!(out.contains(&format!(
            "vllm:num_requests_waiting_by_reason{{{m},reason=\"capacity\"}} 1.0\n"
        )));
        assert!(out.contains(&format!("vllm:kv_cache_usage_perc{{{m}}} 0.25\n")));
        assert!(out.contains("# TYPE vllm:prefix_cache_hits_total counter\n"));
        assert!(out.contains(&format!("vllm:prefix_cache_hits_total{{{m}}} 32.0\n")));
        assert!(out.contains(&format!(
            "# TYPE vllm:prefix_cache_hits_created gauge\nvllm:prefix_cache_hits_created{{{m}}} 1.79578537425e+09\n"
        )));
        assert!(out.contains("num_gpu_blocks=\"25000\""));
        assert!(out.contains("kv_cache_size_tokens=\"400000\""));
        assert!(out.contains("kv_cache_max_concurrency=\"4.0\""));
        assert!(
            !out.contains("gpu_cache_usage_perc"),
            "vLLM 0.32 prints no such family"
        );
        assert!(!render("m", &s, None, None, 0.0).contains("cache_config_info"));
        assert!(!out.contains("lora"));
        let lora = LoraInfo {
            max_loras: 2,
            series: vec![
                LoraSeries {
                    running: String::new(),
                    waiting: String::new(),
                    last_seen: 1_739_557_565.758_985_5,
                },
                LoraSeries {
                    running: "sql,chat".into(),
                    waiting: "x".into(),
                    last_seen: 1_739_557_572.394_936_8,
                },
            ],
        };
        let out = render("m", &s, None, Some(&lora), 0.0);
        assert!(out.contains(
            "# HELP vllm:lora_requests_info Running stats on lora requests.\n\
             # TYPE vllm:lora_requests_info gauge\n\
             vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} 1.7395575657589855e+09\n\
             vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"sql,chat\",waiting_lora_adapters=\"x\"} 1.7395575723949368e+09\n"
        ), "{out}");
        let empty = render("m", &s, None, Some(&LoraInfo::default()), 0.0);
        assert!(empty.contains("# TYPE vllm:lora_requests_info gauge\n"));
        assert!(!empty.contains("vllm:lora_requests_info{"));
    }
}
