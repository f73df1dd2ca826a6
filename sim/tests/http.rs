//! HTTP-level tests: each starts a simulator on an ephemeral loopback port inside the test, with a
//! high `--time-scale` so simulated seconds take wall milliseconds.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{json, Value};
use warmroute_sim::{Args, REPLICA_HEADER, REQUEST_HEADERS_HEADER};

struct Sim {
    base: String,
    client: reqwest::Client,
}

async fn start(extra: &[&str]) -> Sim {
    let mut argv = vec![
        "warmroute-sim",
        "--port",
        "0",
        "--name",
        "test-replica",
        "--time-scale",
        "100",
    ];
    argv.extend_from_slice(extra);
    let args = Args::try_parse_from(&argv).unwrap();
    let listener = warmroute_sim::bind(&args).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(warmroute_sim::serve(args, listener));
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    Sim {
        base: format!("http://{addr}"),
        client,
    }
}

/// A sim serving LoRA adapters `a` and `b`, `max_loras` of them at once.
async fn start_with_adapters_a_b(max_loras: &str, extra: &[&str]) -> Sim {
    let mut args = extra.to_vec();
    args.extend([
        "--enable-lora",
        "--max-loras",
        max_loras,
        "--lora-modules",
        "a=/adapters/a",
        "b=/adapters/b",
    ]);
    start(&args).await
}

impl Sim {
    /// POSTs `body` as JSON to `path`: the response as it starts.
    async fn send(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, reqwest::header::HeaderMap, Value) {
        let res = self.send(path, body).await;
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let text = res.text().await.unwrap();
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad json {e}: {text}"));
        (status, headers, v)
    }

    async fn post_raw(
        &self,
        path: &str,
        body: &'static str,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let res = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let text = res.text().await.unwrap();
        (
            status,
            headers,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn get_text(&self, path: &str) -> (u16, String) {
        let res = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        (res.status().as_u16(), res.text().await.unwrap())
    }

    /// Starts a streamed completion and returns it once its first chunk arrived: from then on
    /// the sequence is running until it is dropped (the engine then aborts it).
    async fn start_stream(&self, model: &str, prefix: &str) -> reqwest::Response {
        let body = json!({"model": model, "prompt": words(prefix, 50), "max_tokens": 100_000, "stream": true});
        let mut res = self.send("/v1/completions", &body).await;
        assert_eq!(res.status().as_u16(), 200);
        let first = res.chunk().await.unwrap().unwrap();
        let first = String::from_utf8_lossy(&first);
        assert!(first.contains(&format!("\"model\":\"{model}\"")), "{first}");
        res
    }

    /// Polls `/metrics` until `pred` holds (the state it waits for is stable once reached).
    async fn metrics_until(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (_, text) = self.get_text("/metrics").await;
            if pred(&text) {
                return text;
            }
            assert!(Instant::now() < deadline, "never saw {what} in\n{text}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Posts `body` to `path` and returns the answer, which must be a 200.
    async fn ok(&self, path: &str, body: &Value) -> Value {
        let (status, _, v) = self.post(path, body).await;
        assert_eq!(status, 200, "{v}");
        v
    }

    async fn get_json(&self, path: &str) -> Value {
        serde_json::from_str(&self.get_text(path).await.1).unwrap()
    }

    async fn metrics(&self) -> HashMap<String, f64> {
        let res = self
            .client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 200);
        parse_prometheus(&res.text().await.unwrap())
    }
}

fn words(prefix: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("{prefix}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

/// Minimal Prometheus text-format (0.0.4) checker: every line is a `# HELP`/`# TYPE` comment or
/// `name{label="value",...} number`, each sample belongs to a family declared by a preceding
/// `# TYPE`. Returns `name -> value` for samples (labels dropped; names are unique here).
fn parse_prometheus(text: &str) -> HashMap<String, f64> {
    fn valid_name(n: &str) -> bool {
        let mut chars = n.chars();
        matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }
    let mut types: HashMap<String, String> = HashMap::new();
    let mut samples = HashMap::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut it = rest.splitn(3, ' ');
            let (kw, name, arg) = (
                it.next().unwrap(),
                it.next().unwrap(),
                it.next().unwrap_or(""),
            );
            assert!(valid_name(name), "bad metric name in {line:?}");
            match kw {
                "HELP" => {}
                "TYPE" => {
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&arg),
                        "{line:?}"
                    );
                    types.insert(name.to_string(), arg.to_string());
                }
                _ => panic!("unknown comment {line:?}"),
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value in {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let name = match series.split_once('{') {
            None => series,
            Some((name, labels)) => {
                let labels = labels
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed labels in {line:?}"));
                for (k, _) in parse_labels(labels) {
                    assert!(valid_name(&k) && !k.contains(':'), "bad label name {k:?}");
                }
                name
            }
        };
        assert!(valid_name(name), "bad metric name in {line:?}");
        assert!(
            types.contains_key(name),
            "sample before its # TYPE: {line:?}"
        );
        // Label sets of one name are summed, as routers read them (vLLM prints every
        // finish reason of `request_success_total` as its own series).
        *samples.entry(name.to_string()).or_insert(0.0) += value;
    }
    samples
}

/// `name="value",...` pairs of a sample (values may hold commas and escapes).
fn parse_labels(labels: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = labels;
    while !rest.is_empty() {
        let (k, after) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("bad labels {labels:?}"));
        let mut value = String::new();
        let mut end = None;
        let mut chars = after.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    other => panic!("bad escape {other:?} in {labels:?}"),
                },
                '"' => {
                    end = Some(i);
                    break;
                }
                c => value.push(c),
            }
        }
        let end = end.unwrap_or_else(|| panic!("unclosed label value in {labels:?}"));
        out.push((k.to_string(), value));
        rest = &after[end + 1..];
        if !rest.is_empty() {
            rest = rest
                .strip_prefix(',')
                .unwrap_or_else(|| panic!("no comma between labels in {labels:?}"));
        }
    }
    out
}

/// The samples of `vllm:lora_requests_info`: labels and value.
fn lora_series(text: &str) -> Vec<(HashMap<String, String>, f64)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("vllm:lora_requests_info{"))
        .map(|l| {
            let (labels, value) = l.rsplit_once("} ").unwrap();
            (
                parse_labels(labels).into_iter().collect(),
                value.parse().unwrap(),
            )
        })
        .collect()
}

/// The current series of `vllm:lora_requests_info` (the latest value), as
/// `(running_lora_adapters, waiting_lora_adapters, max_lora)`.
fn latest_lora(text: &str) -> Option<(String, String, String)> {
    lora_series(text)
        .into_iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(l, _)| {
            (
                l["running_lora_adapters"].clone(),
                l["waiting_lora_adapters"].clone(),
                l["max_lora"].clone(),
            )
        })
}

#[tokio::test]
async fn repeated_prompt_hits_prefix_cache() {
    let sim = start(&[]).await;
    let body = json!({
        "model": "sim-llama-8b",
        "messages": [{"role": "system", "content": "You are a test."}, {"role": "user", "content": words("w", 500)}],
        "max_tokens": 8,
    });
    let (status, headers, first) = sim.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(headers[REPLICA_HEADER], "test-replica");
    assert_eq!(first["object"], "chat.completion");
    assert_eq!(cached(&first), 0);
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        prompt_tokens,
        5 + 501 + 1,
        "<|system|> You are a test. / <|user|> 500 words / <|assistant|>"
    );
    assert_eq!(first["usage"]["completion_tokens"], 8);
    let content = first["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(content.split_whitespace().count(), 8);

    let (_, _, second) = sim.post("/v1/chat/completions", &body).await;
    assert!(cached(&second) > 0);
    assert_eq!(cached(&second), (prompt_tokens - 1) / 16 * 16);
    assert_eq!(
        second["choices"][0]["message"]["content"], content,
        "deterministic output"
    );
}

#[tokio::test]
async fn shared_prefix_reports_shared_blocks() {
    let sim = start(&[]).await;
    let a = words("a", 300);
    let (_, _, first) = sim
        .post("/v1/completions", &json!({"prompt": a, "max_tokens": 2}))
        .await;
    assert_eq!(cached(&first), 0);
    assert_eq!(first["object"], "text_completion");
    // Shares the first 6 blocks (96 words) and 10 more words, then diverges.
    let b = format!("{} {}", words("a", 106), words("b", 200));
    let (_, _, second) = sim
        .post("/v1/completions", &json!({"prompt": b, "max_tokens": 2}))
        .await;
    assert_eq!(cached(&second), 6 * 16);
    assert_eq!(second["usage"]["prompt_tokens"], 306);
}

#[tokio::test]
async fn multi_turn_chat_hits_previous_turn_and_answer() {
    let sim = start(&[]).await;
    let mut messages = vec![json!({"role": "user", "content": words("q", 100)})];
    let (_, _, t1) = sim
        .post(
            "/v1/chat/completions",
            &json!({"messages": messages, "max_tokens": 40}),
        )
        .await;
    let answer = t1["choices"][0]["message"]["content"].clone();
    messages.push(json!({"role": "assistant", "content": answer}));
    messages.push(json!({"role": "user", "content": "and then?"}));
    let (_, _, t2) = sim
        .post(
            "/v1/chat/completions",
            &json!({"messages": messages, "max_tokens": 4}),
        )
        .await;
    // Turn 1 = 102 prompt + 40 output tokens = 142 tokens -> 8 full blocks, all reused.
    assert_eq!(cached(&t2), 128);
}

#[tokio::test]
async fn max_num_seqs_queues_requests() {
    let sim = start(&["--max-num-seqs", "2", "--time-scale", "10"]).await;
    let mut tasks = Vec::new();
    for i in 0..5 {
        let client = sim.client.clone();
        let url = format!("{}/v1/completions", sim.base);
        tasks.push(tokio::spawn(async move {
            let body = json!({"prompt": words(&format!("r{i}_"), 2000), "max_tokens": 150});
            let res = client.post(url).json(&body).send().await.unwrap();
            assert_eq!(res.status().as_u16(), 200);
            res.json::<Value>().await.unwrap()
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut max_waiting, mut max_running) = (0.0_f64, 0.0_f64);
    while Instant::now() < deadline && !tasks.iter().all(|t| t.is_finished()) {
        let m = sim.metrics().await;
        max_waiting = max_waiting.max(m["vllm:num_requests_waiting"]);
        max_running = max_running.max(m["vllm:num_requests_running"]);
        assert!(m["vllm:num_requests_running"] <= 2.0);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(max_waiting > 0.0, "waiting never > 0");
    assert_eq!(max_running, 2.0);
    for t in tasks {
        assert_eq!(t.await.unwrap()["usage"]["completion_tokens"], 150);
    }
    let m = sim.metrics().await;
    assert_eq!(m["vllm:num_requests_waiting"], 0.0);
    assert_eq!(m["vllm:num_requests_running"], 0.0);
    assert_eq!(m["vllm:request_success_total"], 5.0);
}

#[tokio::test]
async fn sse_stream_is_valid_and_carries_usage() {
    let sim = start(&["--time-scale", "1"]).await;
    let body = json!({
        "model": "sim-llama-8b",
        "messages": [{"role": "user", "content": [{"type": "text", "text": words("s", 40)}]}],
        "max_tokens": 30,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let t0 = Instant::now();
    let mut res = sim.send("/v1/chat/completions", &body).await;
    assert_eq!(res.status().as_u16(), 200);
    assert!(res.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    assert_eq!(res.headers()[REPLICA_HEADER], "test-replica");
    let mut raw = Vec::new();
    let mut first_chunk_at = None;
    while let Some(chunk) = res.chunk().await.unwrap() {
        first_chunk_at.get_or_insert_with(|| t0.elapsed());
        raw.extend_from_slice(&chunk);
    }
    let total = t0.elapsed();
    // 30 steps of ~12 ms at time-scale 1: the first token comes after one step, not at the end.
    let ttft = first_chunk_at.unwrap();
    assert!(
        ttft * 3 < total,
        "first chunk at {ttft:?} of {total:?}: not streamed"
    );

    let text = String::from_utf8(raw).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let events: Vec<&str> = text.split_terminator("\n\n").collect();
    let mut content = String::new();
    let mut usage = None;
    let mut finish = None;
    for (i, ev) in events.iter().enumerate() {
        let data = ev
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("bad event {ev:?}"));
        assert!(!data.contains('\n'));
        if data == "[DONE]" {
            assert_eq!(i, events.len() - 1);
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["object"], "chat.completion.chunk");
        let choices = v["choices"].as_array().unwrap();
        if choices.is_empty() {
            usage = Some(v["usage"].clone());
            assert_eq!(i, events.len() - 2, "usage chunk is last before [DONE]");
            continue;
        }
        if let Some(c) = choices[0]["delta"]["content"].as_str() {
            content.push_str(c);
        }
        if let Some(r) = choices[0]["finish_reason"].as_str() {
            finish = Some(r.to_string());
        }
    }
    let usage = usage.expect("usage chunk");
    assert_eq!(usage["completion_tokens"], 30);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(finish.as_deref(), Some("length"));
    assert_eq!(content.split_whitespace().count(), 30);

    // The same request without streaming returns the same text, and now hits the cache.
    let mut plain = body.clone();
    plain["stream"] = json!(false);
    plain.as_object_mut().unwrap().remove("stream_options");
    let (_, _, v) = sim.post("/v1/chat/completions", &plain).await;
    assert_eq!(v["choices"][0]["message"]["content"], content.as_str());
    assert_eq!(cached(&v), 32);

    // Without include_usage: no usage chunk; completions endpoint streams text deltas.
    let res = sim
        .client
        .post(format!("{}/v1/completions", sim.base))
        .json(&json!({"prompt": "a b c", "max_tokens": 3, "stream": true}))
        .send()
        .await
        .unwrap();
    let text = res.text().await.unwrap();
    let events: Vec<&str> = text.split_terminator("\n\n").collect();
    assert_eq!(events.len(), 4, "{text}");
    assert_eq!(events[3], "data: [DONE]");
    let v: Value = serde_json::from_str(events[0].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(v["object"], "text_completion");
    assert!(v["choices"][0]["text"].is_string());
}

#[tokio::test]
async fn metrics_parse_and_move_with_load() {
    let sim = start(&["--time-scale", "5"]).await;
    let (_, text) = sim.get_text("/metrics").await;
    for needle in [
        "# TYPE vllm:num_requests_running gauge",
        "vllm:num_requests_running{engine=\"0\",model_name=\"sim-llama-8b\"} 0.0",
        "vllm:num_requests_waiting{engine=\"0\",model_name=\"sim-llama-8b\"} 0.0",
        "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"sim-llama-8b\"} 0.0",
        "# TYPE vllm:prefix_cache_hits_total counter",
        "vllm:prefix_cache_queries_total{",
        "vllm:prompt_tokens_total{",
        "vllm:generation_tokens_total{",
        "vllm:request_success_total{",
        "vllm:cache_config_info{_block_size_resolved=\"True\",block_size=\"16\",",
        "num_gpu_blocks=\"25000\"",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    let m0 = parse_prometheus(&text);
    assert_eq!(m0["vllm:cache_config_info"], 1.0);
    assert!(
        !text.contains("lora"),
        "no LoRA metric without --enable-lora"
    );

    let body = json!({"prompt": words("m", 600), "max_tokens": 60});
    let req = {
        let (client, url, body) = (
            sim.client.clone(),
            format!("{}/v1/completions", sim.base),
            body.clone(),
        );
        tokio::spawn(async move {
            client
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    let mut saw = (0.0_f64, 0.0_f64);
    while !req.is_finished() {
        let m = sim.metrics().await;
        saw.0 = saw.0.max(m["vllm:num_requests_running"]);
        saw.1 = saw.1.max(m["vllm:kv_cache_usage_perc"]);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    req.await.unwrap();
    assert_eq!(saw.0, 1.0, "running > 0 during the request");
    assert!(
        saw.1 > 0.0 && saw.1 < 1.0,
        "kv usage during the request: {}",
        saw.1
    );
    let m1 = sim.metrics().await;
    assert_eq!(m1["vllm:num_requests_running"], 0.0);
    assert_eq!(m1["vllm:kv_cache_usage_perc"], 0.0);
    assert_eq!(m1["vllm:prompt_tokens_total"], 600.0);
    assert_eq!(m1["vllm:generation_tokens_total"], 60.0);
    assert_eq!(m1["vllm:prefix_cache_queries_total"], 600.0);
    assert_eq!(m1["vllm:prefix_cache_hits_total"], 0.0);

    let (_, _, v) = sim.post("/v1/completions", &body).await;
    let m2 = sim.metrics().await;
    assert_eq!(m2["vllm:prefix_cache_hits_total"], cached(&v) as f64);
    assert!(m2["vllm:prefix_cache_hits_total"] > m1["vllm:prefix_cache_hits_total"]);
    assert_eq!(m2["vllm:request_success_total"], 2.0);
}

#[tokio::test]
async fn malformed_requests_get_vllm_errors() {
    let sim = start(&[]).await;
    let check =
        |status: u16, headers: &reqwest::header::HeaderMap, v: &Value, code: u16, kind: &str| {
            assert_eq!(status, code, "{v}");
            assert_eq!(headers[REPLICA_HEADER], "test-replica");
            let e = &v["error"];
            assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{v}");
            assert_eq!(e["type"], kind, "{v}");
            assert_eq!(e["code"], code);
            let param = if code == 404 {
                json!("model")
            } else {
                json!(null)
            };
            assert_eq!(e["param"], param, "{v}");
            assert!(!e["message"].as_str().unwrap().is_empty());
        };
    for raw in ["not json", "", "[1,2]", "{\"messages\": [", "null"] {
        let (s, h, v) = sim.post_raw("/v1/chat/completions", raw).await;
        check(s, &h, &v, 400, "BadRequestError");
    }
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for body in [
        json!({}),
        json!({"messages": "hello"}),
        json!({"messages": [{"role": 1, "content": "x"}]}),
        json!({"messages": [{"role": "user", "content": {"a": 1}}]}),
        json!({"messages": msgs, "max_tokens": "ten"}),
        json!({"messages": msgs, "max_tokens": -1}),
        json!({"messages": msgs, "max_tokens": 0}),
        json!({"messages": msgs, "stream": "yes"}),
        json!({"messages": msgs, "stream_options": 5}),
        json!({"messages": msgs, "model": 7}),
        json!({"messages": msgs, "max_tokens": 10_000_000}),
    ] {
        let (s, h, v) = sim.post("/v1/chat/completions", &body).await;
        check(s, &h, &v, 400, "BadRequestError");
    }
    for body in [
        json!({}),
        json!({"prompt": 5}),
        json!({"prompt": [1, "x"]}),
        json!({"prompt": ""}),
    ] {
        let (s, h, v) = sim.post("/v1/completions", &body).await;
        check(s, &h, &v, 400, "BadRequestError");
    }
    let (s, h, v) = sim
        .post(
            "/v1/chat/completions",
            &json!({"model": "gpt-4", "messages": msgs}),
        )
        .await;
    check(s, &h, &v, 404, "NotFoundError");
    assert_eq!(v["error"]["message"], "The model `gpt-4` does not exist.");

    // Unknown route: FastAPI-style 404, still tagged with the replica.
    let res = sim
        .client
        .get(format!("{}/nope", sim.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 404);
    assert_eq!(res.headers()[REPLICA_HEADER], "test-replica");

    // The server is still fine.
    let (s, _, v) = sim
        .post(
            "/v1/chat/completions",
            &json!({"messages": msgs, "max_completion_tokens": 2}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(v["usage"]["completion_tokens"], 2);
}

#[tokio::test]
async fn models_health_and_multi_prompt() {
    let sim = start(&["--model", "m1"]).await;
    let res = sim
        .client
        .get(format!("{}/health", sim.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(res.headers()[REPLICA_HEADER], "test-replica");
    assert!(res.text().await.unwrap().is_empty());
    let v: Value = sim.get_json("/v1/models").await;
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "m1");
    let (s, _, v) = sim
        .post(
            "/v1/completions",
            &json!({"model": "m1", "prompt": ["a b", "c d e"], "max_tokens": 3}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    assert_eq!(v["choices"][1]["index"], 1);
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    assert_eq!(v["usage"]["completion_tokens"], 6);
    let (s, _, v) = sim
        .post(
            "/v1/completions",
            &json!({"prompt": [17, 42, 42], "max_tokens": 1}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(v["usage"]["prompt_tokens"], 3);
}

#[tokio::test]
async fn default_name_is_sim_port() {
    let args =
        Args::try_parse_from(["warmroute-sim", "--port", "0", "--time-scale", "100"]).unwrap();
    let listener = warmroute_sim::bind(&args).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    assert_eq!(listener.local_addr().unwrap().ip().to_string(), "127.0.0.1");
    tokio::spawn(warmroute_sim::serve(args, listener));
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let res = client
        .get(format!("http://127.0.0.1:{port}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.headers()[REPLICA_HEADER],
        format!("sim-{port}").as_str()
    );
}

#[tokio::test]
async fn client_disconnect_aborts_and_frees_kv() {
    let sim = start(&["--time-scale", "1"]).await;
    let body = json!({"prompt": words("d", 100), "max_tokens": 100_000, "stream": true});
    let mut res = sim.send("/v1/completions", &body).await;
    assert!(res.chunk().await.unwrap().is_some());
    let m = sim.metrics().await;
    assert_eq!(m["vllm:num_requests_running"], 1.0);
    assert!(m["vllm:kv_cache_usage_perc"] > 0.0);
    drop(res);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = sim.metrics().await;
        if m["sim:aborted_requests_total"] == 1.0 {
            assert_eq!(m["vllm:num_requests_running"], 0.0);
            assert_eq!(m["vllm:kv_cache_usage_perc"], 0.0);
            assert_eq!(m["vllm:request_success_total"], 0.0);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "request not aborted after disconnect"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn metrics_can_be_answered_late() {
    let sim = start(&["--metrics-delay-ms", "300"]).await;
    let started = std::time::Instant::now();
    let m = sim.metrics().await;
    assert!(started.elapsed() >= std::time::Duration::from_millis(300));
    assert!(m.contains_key("vllm:num_requests_running"));
    // Requests are not delayed.
    let (status, _, _) = sim
        .post(
            "/v1/completions",
            &json!({"model": "sim-llama-8b", "prompt": "hi", "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn every_served_model_name_answers() {
    let sim = start(&[
        "--model",
        "/models/llama-8b",
        "--served-model-name",
        "alpha",
        "beta",
    ])
    .await;
    let prompt = words("n", 100);
    let a = sim
        .ok(
            "/v1/completions",
            &json!({"model": "alpha", "prompt": prompt, "max_tokens": 2}),
        )
        .await;
    assert_eq!(a["model"], "alpha");
    // Both names are the same base model: one prefix cache.
    let b = sim
        .ok(
            "/v1/completions",
            &json!({"model": "beta", "prompt": prompt, "max_tokens": 2}),
        )
        .await;
    assert_eq!(b["model"], "beta");
    assert_eq!(cached(&b), 96);
    let (s, _, none) = sim
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(none["model"], "alpha", "no model: the first served name");
    // With served names given, the --model path is not one of them (vLLM's is_base_model).
    let (s, _, v) = sim
        .post(
            "/v1/completions",
            &json!({"model": "/models/llama-8b", "prompt": "x", "max_tokens": 1}),
        )
        .await;
    assert_eq!(s, 404, "{v}");

    let text = sim
        .client
        .post(format!("{}/v1/completions", sim.base))
        .json(&json!({"model": "beta", "prompt": "a b", "max_tokens": 2, "stream": true}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let first: Value = serde_json::from_str(
        text.split("\n\n")
            .next()
            .unwrap()
            .strip_prefix("data: ")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first["model"], "beta", "{text}");

    let models: Value = sim.get_json("/v1/models").await;
    let data = models["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["alpha", "beta"]);
    for m in data {
        assert_eq!(m["object"], "model");
        assert_eq!(m["owned_by"], "vllm");
        assert_eq!(m["root"], "/models/llama-8b");
        assert!(m["parent"].is_null());
        assert_eq!(m["max_model_len"], 131_072);
        assert_eq!(m["permission"][0]["object"], "model_permission");
    }

    let (_, metrics) = sim.get_text("/metrics").await;
    assert!(
        metrics.contains(
            "vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"alpha\"} 4.0"
        ),
        "{metrics}"
    );
    assert!(
        !metrics.contains("beta"),
        "metrics carry the first served name only"
    );
}

fn lora(v: (&str, &str, &str)) -> Option<(String, String, String)> {
    Some((v.0.into(), v.1.into(), v.2.into()))
}

#[tokio::test]
async fn lora_adapter_is_served_and_reported_running() {
    let sim = start(&[
        "--time-scale",
        "1",
        "--enable-lora",
        "--lora-modules",
        "sql=/adapters/sql",
    ])
    .await;
    let (_, text) = sim.get_text("/metrics").await;
    assert!(
        text.contains("# TYPE vllm:lora_requests_info gauge\n"),
        "{text}"
    );
    assert!(lora_series(&text).is_empty(), "no step yet, no sample");
    parse_prometheus(&text);

    let running = sim.start_stream("sql", "s").await;
    let text = sim.get_text("/metrics").await.1;
    parse_prometheus(&text);
    assert_eq!(latest_lora(&text), lora(("sql", "", "1")), "{text}");
    let value = lora_series(&text)[0].1;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (now - 60.0..=now + 1.0).contains(&value),
        "the value is a Unix time: {value}"
    );
    drop(running);

    let v = sim
        .ok(
            "/v1/completions",
            &json!({"model": "sql", "prompt": "select one", "max_tokens": 3}),
        )
        .await;
    assert_eq!(v["model"], "sql");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    // The step that finished it leaves nothing in flight; older combinations stay exported.
    let text = sim.get_text("/metrics").await.1;
    assert_eq!(latest_lora(&text), lora(("", "", "1")), "{text}");
    assert!(lora_series(&text)
        .iter()
        .any(|(l, _)| l["running_lora_adapters"] == "sql"));
}

#[tokio::test]
async fn adapters_beyond_max_loras_wait() {
    let sim = start_with_adapters_a_b("1", &["--time-scale", "1"]).await;
    let a = sim.start_stream("a", "a").await;
    let b = {
        let sim = Sim {
            base: sim.base.clone(),
            client: sim.client.clone(),
        };
        tokio::spawn(async move { sim.start_stream("b", "b").await })
    };
    // b is queued behind the one adapter slot, and stays so while a runs.
    let text = sim
        .metrics_until("b waiting", |t| latest_lora(t) == lora(("a", "b", "1")))
        .await;
    let m = parse_prometheus(&text);
    assert_eq!(m["vllm:num_requests_running"], 1.0);
    assert_eq!(m["vllm:num_requests_waiting"], 1.0);

    // A base-model request is not held by the adapter limit: it passes b.
    let (s, _, v) = tokio::time::timeout(
        Duration::from_secs(10),
        sim.post(
            "/v1/completions",
            &json!({"prompt": "base model", "max_tokens": 2}),
        ),
    )
    .await
    .expect("the base request waited behind b");
    assert_eq!(s, 200, "{v}");
    assert!(!b.is_finished());
    let m = sim.metrics().await;
    assert_eq!(m["vllm:num_requests_waiting"], 1.0);

    // Once a is gone, b gets the slot.
    drop(a);
    let b = tokio::time::timeout(Duration::from_secs(10), b)
        .await
        .expect("b never started")
        .unwrap();
    let text = sim.get_text("/metrics").await.1;
    assert_eq!(latest_lora(&text), lora(("b", "", "1")), "{text}");
    drop(b);
}

#[tokio::test]
async fn two_adapters_run_together_under_max_loras_2() {
    let sim = start_with_adapters_a_b("2", &["--time-scale", "1"]).await;
    let a = sim.start_stream("a", "a").await;
    let b = sim.start_stream("b", "b").await;
    let text = sim.get_text("/metrics").await.1;
    assert_eq!(latest_lora(&text), lora(("a,b", "", "2")), "{text}");
    parse_prometheus(&text);
    drop((a, b));
}

#[tokio::test]
async fn adapters_share_no_prefix_blocks_and_unknown_models_404() {
    let sim = start_with_adapters_a_b("2", &[]).await;
    let prompt = words("p", 100);
    let run = async |model: Option<&str>| {
        let mut body = json!({"prompt": prompt, "max_tokens": 2});
        if let Some(m) = model {
            body["model"] = json!(m);
        }
        let (s, _, v) = sim.post("/v1/completions", &body).await;
        assert_eq!(s, 200, "{v}");
        cached(&v)
    };
    assert_eq!(run(Some("a")).await, 0);
    assert_eq!(run(Some("a")).await, 96, "an adapter hits its own blocks");
    assert_eq!(run(Some("b")).await, 0, "not a's");
    assert_eq!(
        run(None).await,
        0,
        "the base model does not hit an adapter's"
    );
    assert_eq!(run(Some("sim-llama-8b")).await, 96);
    assert_eq!(run(Some("b")).await, 96);

    for model in ["c", "/adapters/a"] {
        let (s, _, v) = sim
            .post(
                "/v1/chat/completions",
                &json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(s, 404, "{v}");
        assert_eq!(
            v,
            json!({"error": {
                "message": format!("The model `{model}` does not exist."),
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }})
        );
    }
}

#[tokio::test]
async fn models_list_adapters_with_their_parent() {
    let sim = start(&[
        "--model",
        "/models/llama",
        "--served-model-name",
        "base1",
        "base2",
        "--enable-lora",
        "--lora-modules",
        "a=/adapters/a",
        r#"{"name": "b", "path": "/adapters/b", "base_model_name": "base2"}"#,
        r#"{"name": "c", "path": "/adapters/c", "base_model_name": "not-served"}"#,
    ])
    .await;
    let (s, text) = sim.get_text("/v1/models").await;
    assert_eq!(s, 200);
    let v: Value = serde_json::from_str(&text).unwrap();
    let cards: Vec<(&str, &str, Value, Value)> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert_eq!(m["object"], "model");
            assert_eq!(m["permission"][0]["object"], "model_permission");
            (
                m["id"].as_str().unwrap(),
                m["root"].as_str().unwrap(),
                m["parent"].clone(),
                m["max_model_len"].clone(),
            )
        })
        .collect();
    assert_eq!(
        cards,
        vec![
            ("base1", "/models/llama", Value::Null, json!(131_072)),
            ("base2", "/models/llama", Value::Null, json!(131_072)),
            ("a", "/adapters/a", json!("base1"), Value::Null),
            ("b", "/adapters/b", json!("base2"), Value::Null),
            ("c", "/adapters/c", json!("base1"), Value::Null),
        ]
    );
}

#[tokio::test]
async fn adapters_load_and_unload_at_run_time() {
    let sim = start(&["--enable-lora", "--allow-runtime-lora-updating"]).await;
    let post_text = async |path: &str, body: Value| {
        let res = sim.send(path, &body).await;
        (res.status().as_u16(), res.text().await.unwrap())
    };
    let ask = json!({"model": "new", "prompt": "x y", "max_tokens": 1});
    assert_eq!(sim.post("/v1/completions", &ask).await.0, 404);

    let load = json!({"lora_name": "new", "lora_path": "/adapters/new"});
    assert_eq!(
        post_text("/v1/load_lora_adapter", load.clone()).await,
        (
            200,
            "Success: LoRA adapter 'new' added successfully.".into()
        )
    );
    let (s, _, v) = sim.post("/v1/completions", &ask).await;
    assert_eq!((s, v["model"].clone()), (200, json!("new")), "{v}");
    let (_, models) = sim.get_text("/v1/models").await;
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][1]["id"], "new");
    assert_eq!(models["data"][1]["parent"], "sim-llama-8b");

    let (s, body) = post_text("/v1/load_lora_adapter", load.clone()).await;
    assert_eq!(s, 400, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["type"], "InvalidUserInput");
    let mut in_place = load.clone();
    in_place["lora_path"] = json!("/adapters/new-v2");
    in_place["load_inplace"] = json!(true);
    assert_eq!(post_text("/v1/load_lora_adapter", in_place).await.0, 200);
    let (_, models) = sim.get_text("/v1/models").await;
    assert!(models.contains("/adapters/new-v2"), "{models}");
    let (s, body) = post_text("/v1/load_lora_adapter", json!({"lora_name": "x"})).await;
    assert_eq!(s, 400, "{body}");

    let unload = json!({"lora_name": "new"});
    assert_eq!(
        post_text("/v1/unload_lora_adapter", unload.clone()).await,
        (
            200,
            "Success: LoRA adapter 'new' removed successfully.".into()
        )
    );
    assert_eq!(sim.post("/v1/completions", &ask).await.0, 404);
    let (s, body) = post_text("/v1/unload_lora_adapter", unload).await;
    assert_eq!(s, 404, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["type"], "NotFoundError");

    // Without the flag the routes do not exist; without --enable-lora loading fails.
    let plain = start(&["--enable-lora"]).await;
    let (s, body) = {
        let res = plain.send("/v1/load_lora_adapter", &load).await;
        (res.status().as_u16(), res.text().await.unwrap())
    };
    assert_eq!((s, body.as_str()), (404, r#"{"detail":"Not Found"}"#));
    let no_lora = start(&["--allow-runtime-lora-updating"]).await;
    let res = no_lora.send("/v1/load_lora_adapter", &load).await;
    assert_eq!(res.status().as_u16(), 500);
    let v: Value = res.json().await.unwrap();
    assert_eq!(
        v["error"]["message"],
        "LoRA is not enabled. Use --enable-lora to enable LoRA."
    );
}

#[tokio::test]
async fn lora_modules_need_enable_lora() {
    let args = Args::try_parse_from([
        "warmroute-sim",
        "--port",
        "0",
        "--lora-modules",
        "a=/adapters/a",
    ])
    .unwrap();
    let listener = warmroute_sim::bind(&args).await.unwrap();
    let err = warmroute_sim::serve(args, listener).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("--enable-lora"), "{err}");
}

#[tokio::test]
async fn echoes_request_headers_only_when_asked() {
    let body = json!({"model": "sim-llama-8b", "prompt": "hi", "max_tokens": 1});
    let send = |sim: &Sim| {
        sim.client
            .post(format!("{}/v1/completions", sim.base))
            .header("x-probe", "one\ttwo é")
            .json(&body)
            .send()
    };
    let quiet = start(&[]).await;
    let res = send(&quiet).await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.headers().get(REQUEST_HEADERS_HEADER).is_none());

    let echo = start(&["--echo-request-headers"]).await;
    let res = send(&echo).await.unwrap();
    assert_eq!(res.status(), 200);
    let seen: Vec<(String, String)> =
        serde_json::from_slice(res.headers()[REQUEST_HEADERS_HEADER].as_bytes()).unwrap();
    assert!(
        seen.contains(&("x-probe".into(), "one\ttwo é".into())),
        "{seen:?}"
    );
    assert!(seen.iter().any(|(k, _)| k == "content-type"), "{seen:?}");
    // An error answer carries them as well.
    let res = echo
        .client
        .get(format!("{}/nowhere", echo.base))
        .header("x-probe", "404")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    let seen: Vec<(String, String)> =
        serde_json::from_slice(res.headers()[REQUEST_HEADERS_HEADER].as_bytes()).unwrap();
    assert!(seen.contains(&("x-probe".into(), "404".into())), "{seen:?}");
}

/// The events of a server-sent stream: (event name, data as JSON).
async fn events(sim: &Sim, path: &str, body: &Value) -> Vec<(String, Value)> {
    let res = sim.send(path, body).await;
    assert_eq!(res.status().as_u16(), 200);
    let text = res.text().await.unwrap();
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let field = |name: &str| {
                e.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim_start().to_string())
                    .unwrap_or_default()
            };
            let data = serde_json::from_str(&field("data:")).unwrap_or(Value::Null);
            (field("event:"), data)
        })
        .collect()
}

#[tokio::test]
async fn a_stored_response_is_continued_by_its_id_on_this_instance_only() {
    let holder = start(&["--enable-responses-store"]).await;
    let other = start(&["--enable-responses-store"]).await;
    let first = holder
        .ok(
            "/v1/responses",
            &json!({"model": "sim-llama-8b", "instructions": words("i", 40), "input": words("q", 60), "max_output_tokens": 8}),
        )
        .await;
    let id = first["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("resp_") && id.len() == 21, "{id}");
    assert_eq!(first["object"], "response");
    assert_eq!(first["output"][0]["content"][0]["type"], "output_text");
    let input = first["usage"]["input_tokens"].as_u64().unwrap();
    assert_eq!(first["usage"]["input_tokens_details"]["cached_tokens"], 0);
    // The follow-up holds only its new turn; the instance renders the stored
    // conversation before it, so the whole previous prompt and answer are cached.
    let next = json!({"model": "sim-llama-8b", "instructions": words("i", 40), "previous_response_id": id,
                      "input": words("r", 10), "max_output_tokens": 8});
    let second = holder.ok("/v1/responses", &next).await;
    assert!(second["usage"]["input_tokens"].as_u64().unwrap() > input + 8);
    let cached = second["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= input - 16, "{cached} of {input}");
    // Another instance does not hold it: vLLM's 404.
    let (status, _, err) = other.post("/v1/responses", &next).await;
    assert_eq!(status, 404);
    assert_eq!(err["error"]["param"], "response_id");
    assert_eq!(
        err["error"]["message"],
        format!("Response with id '{id}' not found.")
    );
    // Streamed: the id comes first, in response.created, and is stored too; a client's
    // own request_id names the response.
    let streamed = events(
        &holder,
        "/v1/responses",
        &json!({"model": "sim-llama-8b", "previous_response_id": second["id"], "input": "more",
                "instructions": words("i", 40), "stream": true, "request_id": "resp_mine",
                "max_output_tokens": 4}),
    )
    .await;
    let names: Vec<&str> = streamed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..2], ["response.created", "response.in_progress"]);
    assert_eq!(names.last(), Some(&"response.completed"));
    assert_eq!(
        names
            .iter()
            .filter(|n| **n == "response.output_text.delta")
            .count(),
        4
    );
    assert_eq!(streamed[0].1["response"]["id"], "resp_mine");
    assert_eq!(streamed[0].1["type"], "response.created");
    let done = &streamed.last().unwrap().1["response"];
    assert!(
        done["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    let third = holder
        .ok(
            "/v1/responses",
            &json!({"model": "sim-llama-8b", "previous_response_id": "resp_mine", "input": "go on"}),
        )
        .await;
    assert_eq!(third["previous_response_id"], "resp_mine");
    // store: false, or an instance without the store: nothing to continue.
    let unstored = holder
        .ok("/v1/responses", &json!({"input": "hi", "store": false}))
        .await;
    let (status, _, _) = holder
        .post(
            "/v1/responses",
            &json!({"input": "x", "previous_response_id": unstored["id"]}),
        )
        .await;
    assert_eq!(status, 404);
    let plain = start(&[]).await;
    let kept = plain.ok("/v1/responses", &json!({"input": "hi"})).await;
    let (status, _, _) = plain
        .post(
            "/v1/responses",
            &json!({"input": "x", "previous_response_id": kept["id"]}),
        )
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn messages_turns_extend_each_other_and_report_anthropic_usage() {
    let sim = start(&[]).await;
    let tools = json!([{"name": "read_file", "description": "Reads a file", "input_schema": {"type": "object"}}]);
    let mut messages = vec![json!({"role": "user", "content": words("task", 80)})];
    let mut previous_prompt = 0;
    for turn in 0..4 {
        let body = json!({"model": "sim-llama-8b", "max_tokens": 6, "tools": tools,
                          "system": [{"type": "text", "text": words("sys", 50)}], "messages": messages});
        let v = sim.ok("/v1/messages", &body).await;
        assert_eq!(v["type"], "message");
        assert_eq!(v["stop_reason"], "max_tokens");
        let u = &v["usage"];
        let read = u["cache_read_input_tokens"].as_u64().unwrap();
        let prompt = u["input_tokens"].as_u64().unwrap()
            + read
            + u["cache_creation_input_tokens"].as_u64().unwrap();
        assert!(prompt > previous_prompt);
        if turn > 0 {
            // The previous turn's prompt and answer are cached, to the block.
            assert!(read + 16 >= previous_prompt, "turn {turn}: {u}");
        }
        previous_prompt = prompt;
        let text = v["content"][0]["text"].as_str().unwrap();
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": text},
            {"type": "tool_use", "id": format!("toolu_{turn}"), "name": "read_file", "input": {"path": "a.rs"}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{turn}"), "content": words("out", 20)}]}));
    }
    let streamed = events(
        &sim,
        "/v1/messages",
        &json!({"model": "sim-llama-8b", "max_tokens": 3, "stream": true, "tools": tools,
                "system": [{"type": "text", "text": words("sys", 50)}], "messages": messages}),
    )
    .await;
    let names: Vec<&str> = streamed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let usage = &streamed[6].1["usage"];
    assert!(
        usage["cache_read_input_tokens"].as_u64().unwrap() > 0,
        "{usage}"
    );
    // Errors in Anthropic's shape.
    let (status, _, err) = sim
        .post(
            "/v1/messages",
            &json!({"model": "nope", "messages": messages}),
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(err["type"], "error");
    assert_eq!(err["error"]["type"], "NotFoundError");
    let (status, _, err) = sim.post("/v1/messages", &json!({"messages": []})).await;
    assert_eq!((status, &err["type"]), (400, &json!("error")));
}

#[tokio::test]
async fn error_rate_answers_that_share_500_and_metrics_still_answer() {
    let sim = start(&["--error-rate", "0.5"]).await;
    let body = json!({"model": "sim-llama-8b", "prompt": "hi", "max_tokens": 1});
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let (status, headers, v) = sim.post("/v1/completions", &body).await;
        assert_eq!(headers[REPLICA_HEADER], "test-replica");
        if status == 500 {
            assert_eq!(v["error"]["type"], "InternalServerError", "{v}");
            assert_eq!(v["error"]["code"], 500, "{v}");
        }
        statuses.push(status);
    }
    // Spread evenly: every second request.
    assert_eq!(statuses, [200, 500, 200, 500, 200, 500]);
    let m = sim.metrics().await;
    assert_eq!(m["vllm:request_success_total"], 3.0);
    let health = sim
        .client
        .get(format!("{}/health", sim.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);

    let all = start(&["--error-rate", "1"]).await;
    for _ in 0..3 {
        assert_eq!(
            all.post(
                "/v1/chat/completions",
                &json!({"messages": [{"role": "user", "content": "x"}]})
            )
            .await
            .0,
            500
        );
    }
}

#[tokio::test]
async fn a_stalled_response_sends_its_first_byte_then_waits() {
    let stall = Duration::from_millis(400);
    let sim = start(&["--stall-after-first-byte-ms", "400"]).await;
    for (stream, first) in [(false, b"{"), (true, b"d")] {
        let body =
            json!({"model": "sim-llama-8b", "prompt": "hi", "max_tokens": 2, "stream": stream});
        let before = sim.metrics().await["vllm:request_success_total"];
        let sent = Instant::now();
        let mut res = sim.send("/v1/completions", &body).await;
        assert_eq!(res.status(), 200);
        let head = res.chunk().await.unwrap().unwrap();
        assert_eq!(&head[..], first, "the first byte alone");
        // The engine has finished the request while its client still waits for the rest.
        let m = sim.metrics().await;
        assert_eq!(m["vllm:request_success_total"], before + 1.0);
        assert_eq!(m["vllm:num_requests_running"], 0.0);
        let mut all = head.to_vec();
        while let Some(c) = res.chunk().await.unwrap() {
            all.extend_from_slice(&c);
        }
        // The rest is sent once the stall is over: a lower bound whatever the machine's load.
        assert!(sent.elapsed() >= stall, "{:?}", sent.elapsed());
        let text = String::from_utf8(all).unwrap();
        if stream {
            assert!(
                text.starts_with("data: {") && text.trim_end().ends_with("data: [DONE]"),
                "{text}"
            );
        } else {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");
        }
    }
    // Errors are not stalled.
    let (status, _, _) = sim
        .post("/v1/completions", &json!({"model": "nope", "prompt": "hi"}))
        .await;
    assert_eq!(status, 404);
}

/// What the peer routers (vLLM's router, the SGLang router) ask a vLLM server beside the
/// completions: `/tokenize` for the prompt's ids (vLLM's router, per request), the render
/// endpoints (403 without `--enable-scale-out`), `/ping`, `/version`, and SGLang's probes (404).
#[tokio::test]
async fn tokenize_render_and_the_routers_probes_answer_as_vllm_does() {
    let sim = start(&["--model", "m1", "--max-model-len", "4096"]).await;
    let chat = |msgs: Value| json!({"model": "m1", "messages": msgs});
    let one =
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "a b c"}]);
    let mut two = one.as_array().unwrap().clone();
    two.push(json!({"role": "assistant", "content": "d e"}));
    two.push(json!({"role": "user", "content": "f"}));
    let t1 = sim.ok("/tokenize", &chat(one.clone())).await;
    let t2 = sim.ok("/tokenize", &chat(Value::Array(two))).await;
    assert_eq!(t1["max_model_len"], 4096);
    assert_eq!(t1["token_strs"], Value::Null);
    let (ids1, ids2) = (
        t1["tokens"].as_array().unwrap(),
        t2["tokens"].as_array().unwrap(),
    );
    assert_eq!(t1["count"].as_u64().unwrap() as usize, ids1.len());
    // The rendered prompt is `<|system|> be brief \n <|user|> a b c \n <|assistant|>`: 8 words,
    // the same count the chat endpoint bills.
    let (_, _, done) = sim
        .post(
            "/v1/chat/completions",
            &json!({"model": "m1", "messages": one, "max_tokens": 1}),
        )
        .await;
    assert_eq!(ids1.len(), 8);
    assert_eq!(done["usage"]["prompt_tokens"], 8);
    // The next turn's ids extend this turn's: its answer opens with the same `<|assistant|>`.
    assert_eq!(&ids2[..ids1.len()], &ids1[..]);
    assert!(ids2.len() > ids1.len());
    assert!(ids2.iter().all(|i| i.as_u64().is_some_and(|i| i < 1 << 31)));
    let p = sim.ok("/tokenize", &json!({"prompt": "x y z"})).await;
    assert_eq!(p["count"], 3);
    let (s, _, e) = sim
        .post("/tokenize", &json!({"model": "nope", "prompt": "x"}))
        .await;
    assert_eq!(
        (s, e["error"]["type"].as_str()),
        (404, Some("NotFoundError"))
    );
    for path in ["/v1/chat/completions/render", "/v1/completions/render"] {
        let (s, _, e) = sim.post(path, &chat(one.clone())).await;
        assert_eq!(
            (s, e["error"]["type"].as_str()),
            (403, Some("PermissionDeniedError")),
            "{path}"
        );
    }
    assert_eq!(sim.get_text("/ping").await, (200, String::new()));
    assert_eq!(sim.get_json("/version").await["version"], "0.32.0");
    for path in [
        "/get_server_info",
        "/server_info",
        "/get_model_info",
        "/model_info",
        "/health_generate",
    ] {
        assert_eq!(sim.get_text(path).await.0, 404, "{path}");
    }
}

/// POSTs a probe to `/debug/state`: the body's prompt as `probe_prompt` and `block_hashes`
/// compute it (what the bench's oracle sends).
async fn probe(sim: &Sim, body: &Value, chat: bool) -> (u16, Value) {
    let (tokens, max_tokens) =
        warmroute_sim::api::probe_prompt(body.to_string().as_bytes(), chat, 16).unwrap();
    let hashes: Vec<u8> = warmroute_sim::cache::block_hashes(&tokens, 16)
        .iter()
        .flat_map(|h| h.to_le_bytes())
        .collect();
    let res = sim
        .client
        .post(format!(
            "{}/debug/state?prompt_tokens={}&max_tokens={max_tokens}",
            sim.base,
            tokens.len()
        ))
        .body(hashes)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    let text = res.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test]
async fn debug_state_reports_the_cached_prefix_and_the_predicted_ttft() {
    let sim = start(&["--debug-state"]).await;
    let body = json!({
        "messages": [{"role": "system", "content": "You are a test."}, {"role": "user", "content": words("w", 500)}],
        "max_tokens": 8,
    });
    let (status, cold) = probe(&sim, &body, true).await;
    assert_eq!(status, 200, "{cold}");
    assert_eq!(
        (cold["match_blocks"].as_u64(), cold["running"].as_u64()),
        (Some(0), Some(0))
    );
    // 507 prompt tokens prefilled in one idle step with one sequence (the sim's defaults).
    let idle = 12.0 + 507.0 * 0.06 + 0.15;
    assert!(
        (cold["predicted_ttft_ms"].as_f64().unwrap() - idle).abs() < 1e-6,
        "{cold}"
    );

    let (_, _, first) = sim.post("/v1/chat/completions", &body).await;
    let (_, warm) = probe(&sim, &body, true).await;
    // What the probe says is cached is what the next identical request finds.
    let (_, _, second) = sim.post("/v1/chat/completions", &body).await;
    assert_eq!(cached(&first), 0);
    assert_eq!(warm["cached_tokens"].as_u64(), Some(cached(&second)));
    assert_eq!(warm["cached_tokens"].as_u64(), Some(31 * 16));
    let hit = 12.0 + (507.0 - 496.0) * 0.06 + 0.15;
    assert!(
        (warm["predicted_ttft_ms"].as_f64().unwrap() - hit).abs() < 1e-6,
        "{warm}"
    );

    // A running sequence shows in the queue and in the prediction.
    let _stream = sim.start_stream("sim-llama-8b", "busy").await;
    let (_, busy) = probe(&sim, &body, true).await;
    assert_eq!(busy["running"].as_u64(), Some(1), "{busy}");
    assert!(busy["predicted_ttft_ms"].as_f64().unwrap() > hit, "{busy}");
    let (status, text) = sim.get_text("/debug/state").await;
    assert_eq!(status, 200);
    assert!(text.contains("\"running\":1"), "{text}");

    // Not a multiple of 8 bytes: a 400, never a panic.
    let res = sim
        .client
        .post(format!("{}/debug/state?prompt_tokens=3", sim.base))
        .body(vec![1u8, 2, 3])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 400);
}

#[tokio::test]
async fn debug_state_is_off_by_default() {
    let sim = start(&[]).await;
    assert_eq!(sim.get_text("/debug/state").await.0, 404);
    let (status, _) = probe(&sim, &json!({"prompt": "a b c"}), false).await;
    assert_eq!(status, 404);
}
