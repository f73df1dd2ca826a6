//! Prometheus text exposition format (0.0.4) parser, borrowed and panic-free.
//!
//! Handles what real servers emit: `# HELP`/`# TYPE` comments, label sets
//! with escaped quotes/backslashes/newlines, several label sets per metric,
//! integers, floats, exponents, `NaN`, `±Inf`, optional timestamps, CRLF.
//! A line that does not parse is skipped and counted, never fatal.

use std::borrow::Cow;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    /// Metric name, e.g. `vllm:num_requests_running`.
    pub name: &'a str,
    labels: &'a str,
    /// The sample value.
    pub value: f64,
}

impl<'a> Sample<'a> {
    /// The value of label `key`, unescaped.
    pub fn label(&self, key: &str) -> Option<Cow<'a, str>> {
        labels(self.labels).find_map(|l| match l {
            Some((k, v)) if k == key => Some(v),
            _ => None,
        })
    }
}

/// Walks `k="v"` pairs; yields `None` once (and stops) at malformed input.
fn labels(raw: &str) -> impl Iterator<Item = Option<(&str, Cow<'_, str>)>> {
    let mut rest = Some(raw);
    std::iter::from_fn(move || {
        let r = rest?.trim_start_matches([' ', ',']);
        if r.is_empty() {
            rest = None;
            return None;
        }
        let pair = r.find('=').and_then(|eq| {
            let k = r[..eq].trim();
            let (v, after) = quoted(r[eq + 1..].trim_start())?;
            valid_name(k).then_some((k, v, after))
        });
        match pair {
            Some((k, v, after)) => {
                rest = Some(after);
                Some(Some((k, v)))
            }
            None => {
                rest = None;
                Some(None)
            }
        }
    })
}

/// Splits a leading `"..."` off `s`: (unescaped value, rest after the quote).
fn quoted(s: &str) -> Option<(Cow<'_, str>, &str)> {
    let body = s.strip_prefix('"')?;
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match (escaped, c) {
            (true, _) => escaped = false,
            (false, '\\') => escaped = true,
            (false, '"') => {
                let raw = &body[..i];
                let v = if raw.contains('\\') {
                    Cow::Owned(unescape(raw))
                } else {
                    Cow::Borrowed(raw)
                };
                return Some((v, &body[i + 1..]));
            }
            _ => {}
        }
    }
    None
}

fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some(o) => out.push(o),
                None => {}
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Parses a value as Prometheus writes them (`NaN`, `+Inf`, `-Inf`, Go floats).
fn value(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

fn valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

fn sample(line: &str) -> Option<Sample<'_>> {
    let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    let name = &line[..name_end];
    if !valid_name(name) {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut label_set = "";
    if let Some(inner) = rest.strip_prefix('{') {
        // Find the closing brace outside quotes.
        let mut in_quote = false;
        let mut escaped = false;
        let mut close = None;
        for (i, c) in inner.char_indices() {
            match (in_quote, escaped, c) {
                (true, true, _) => escaped = false,
                (true, false, '\\') => escaped = true,
                (_, false, '"') => in_quote = !in_quote,
                (false, _, '}') => {
                    close = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let close = close?;
        label_set = &inner[..close];
        if labels(label_set).any(|l| l.is_none()) {
            return None;
        }
        rest = &inner[close + 1..];
    }
    let mut fields = rest.split_ascii_whitespace();
    let v = value(fields.next()?)?;
    if let Some(ts) = fields.next() {
        ts.parse::<i64>().ok()?;
    }
    if fields.next().is_some() {
        return None;
    }
    Some(Sample {
        name,
        labels: label_set,
        value: v,
    })
}

/// Counts of what a parse saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ParseStats {
    /// Sample lines accepted.
    pub samples: usize,
    /// Lines skipped as unparseable.
    pub garbage: usize,
}

/// Calls `visit` for every sample in `text`.
pub fn parse<'a>(text: &'a str, mut visit: impl FnMut(Sample<'a>)) -> ParseStats {
    let mut stats = ParseStats::default();
    for line in text.lines() {
        let line = line.trim_end_matches('\r').trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match sample(line) {
            Some(s) => {
                stats.samples += 1;
                visit(s)
            }
            None => stats.garbage += 1,
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn all(text: &str) -> (Vec<Sample<'_>>, ParseStats) {
        let mut v = Vec::new();
        let st = parse(text, |s| v.push(s));
        (v, st)
    }

    /// Shape of vLLM 0.10's /metrics (names from its documented metric list).
    const VLLM: &str = "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
# TYPE vllm:num_requests_running gauge\n\
vllm:num_requests_running{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 7.0\n\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 2.0\n\
# TYPE vllm:kv_cache_usage_perc gauge\n\
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.4523\n\
# TYPE vllm:prefix_cache_queries_total counter\n\
vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 1.2e+06\n\
# TYPE vllm:cache_config_info gauge\n\
vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",gpu_memory_utilization=\"0.9\",num_gpu_blocks=\"27064\"} 1.0\n\
vllm:e2e_request_latency_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 12\n";

    /// Shape of SGLang's /metrics.
    const SGLANG: &str = "# HELP sglang:num_running_reqs The number of running requests.\r\n\
# TYPE sglang:num_running_reqs gauge\r\n\
sglang:num_running_reqs{model_name=\"Qwen/Qwen2.5-7B\",tp_rank=\"0\"} 12.0\r\n\
sglang:num_queue_reqs{model_name=\"Qwen/Qwen2.5-7B\",tp_rank=\"0\"} 0.0\r\n\
sglang:token_usage{model_name=\"Qwen/Qwen2.5-7B\",tp_rank=\"0\"} 0.28\r\n";

    #[test]
    fn vllm_sample() {
        let (v, st) = all(VLLM);
        assert_eq!(st.garbage, 0);
        assert_eq!(v[0].name, "vllm:num_requests_running");
        assert_eq!(v[0].value, 7.0);
        assert_eq!(
            v[0].label("model_name").as_deref(),
            Some("meta-llama/Llama-3.1-8B-Instruct")
        );
        assert_eq!(v[3].value, 1.2e6);
        assert_eq!(v[4].label("num_gpu_blocks").as_deref(), Some("27064"));
        assert_eq!(v[5].label("le").as_deref(), Some("+Inf"));
    }

    #[test]
    fn sglang_sample_with_crlf() {
        let (v, st) = all(SGLANG);
        assert_eq!(
            st,
            ParseStats {
                samples: 3,
                garbage: 0
            }
        );
        assert_eq!(v[2].name, "sglang:token_usage");
        assert_eq!(v[2].value, 0.28);
    }

    #[test]
    fn escapes_special_values_and_timestamps() {
        let (v, st) = all(
            "m{a=\"x\\\"}y\",b=\"c\\\\d\\n\"} NaN 1712345678000\nm +Inf\nm -Inf\nm 3\nm{} -1.5e-3\nm{a=\"1\",} 2\n",
        );
        assert_eq!(st.garbage, 0);
        assert!(v[0].value.is_nan());
        assert_eq!(v[0].label("a").as_deref(), Some("x\"}y"));
        assert_eq!(v[0].label("b").as_deref(), Some("c\\d\n"));
        assert_eq!(v[1].value, f64::INFINITY);
        assert_eq!(v[2].value, f64::NEG_INFINITY);
        assert_eq!(v[3].value, 3.0);
        assert_eq!(v[4].value, -1.5e-3);
        assert_eq!(v[5].label("a").as_deref(), Some("1"));
        // Separators inside a quoted value are part of it.
        let (v, _) = all("m{a=\"p, {q} r=\\\"s\\\"\",b=\"t\"} 1\n");
        assert_eq!(v[0].label("a").as_deref(), Some("p, {q} r=\"s\""));
        assert_eq!(v[0].label("b").as_deref(), Some("t"));
    }

    #[test]
    fn garbage_is_counted_not_fatal() {
        let hostile = "}{\nm{a=\"unterminated} 1\nm 1 2 3\nm abc\n9metric 1\n{a=\"b\"} 1\nm{a=b} 1\n\u{0}\u{ffff}\nok 1\n";
        let (v, st) = all(hostile);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].name, "ok");
        assert_eq!(st.garbage, 8);
        let (_, st) = all(&"m{a=\"".repeat(100_000));
        assert_eq!(st.samples, 0);
    }
}
