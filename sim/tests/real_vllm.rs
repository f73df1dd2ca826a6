//! The simulator against what real vLLM printed: `bench/real/fixtures/` holds the `/metrics`
//! and answers of vLLM 0.32.0 (CPU build) as `make real` captured them (`run.py --fixtures`).
//! Every `vllm:` family the simulator prints must be one vLLM prints, with the same label
//! names in the same order, and its usage report must carry the same fields.

use std::collections::{BTreeMap, BTreeSet};

use clap::Parser;
use serde_json::{json, Value};
use warmroute_sim::Args;

const REAL_METRICS: &str = include_str!("../../bench/real/fixtures/vllm-metrics.txt");
const REAL_CHAT: &str = include_str!("../../bench/real/fixtures/vllm-chat.json");
const REAL_RESPONSES: &str = include_str!("../../bench/real/fixtures/vllm-responses.json");
const REAL_RESPONSES_STREAM: &str =
    include_str!("../../bench/real/fixtures/vllm-responses-stream.sse");
const REAL_MESSAGES: &str = include_str!("../../bench/real/fixtures/vllm-messages.json");
const REAL_MESSAGES_STREAM: &str =
    include_str!("../../bench/real/fixtures/vllm-messages-stream.sse");

/// Family name -> label names of its first sample, and the TYPE line's kind.
fn families(text: &str) -> BTreeMap<String, (Vec<String>, String)> {
    let mut kinds = BTreeMap::new();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            kinds.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || !line.starts_with("vllm:") {
            continue;
        }
        let (name, labels) = match line.split_once('{') {
            Some((n, rest)) => (n, rest.rsplit_once('}').unwrap().0),
            None => (line.split_once(' ').unwrap().0, ""),
        };
        let names = labels
            .split("\",")
            .filter(|kv| kv.contains('='))
            .map(|kv| kv.split_once('=').unwrap().0.to_string())
            .collect();
        out.entry(name.to_string())
            .or_insert((names, kinds.get(name).cloned().unwrap_or_default()));
    }
    out
}

async fn sim() -> String {
    let args = Args::try_parse_from([
        "warmroute-sim",
        "--port",
        "0",
        "--time-scale",
        "100",
        "--enable-responses-store",
    ])
    .unwrap();
    let listener = warmroute_sim::bind(&args).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(warmroute_sim::serve(args, listener));
    format!("http://{addr}")
}

#[tokio::test]
async fn every_vllm_family_the_sim_prints_is_printed_so_by_vllm() {
    let base = sim().await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let real = families(REAL_METRICS);
    let ours = families(&text);
    assert!(ours.len() >= 17, "{ours:?}");
    for (name, (labels, kind)) in &ours {
        let Some((real_labels, real_kind)) = real.get(name) else {
            panic!("{name}: vLLM 0.32 prints no such family");
        };
        assert_eq!(labels, real_labels, "{name}: label names");
        assert_eq!(kind, real_kind, "{name}: TYPE");
    }
    // What the filter reads is among them.
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
    ] {
        assert!(ours.contains_key(name), "{name} missing");
    }
}

#[tokio::test]
async fn the_usage_report_has_vllms_fields() {
    let real: Value = serde_json::from_str(REAL_CHAT).unwrap();
    let base = sim().await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let body = json!({"model": "sim-llama-8b", "max_tokens": 4,
                      "messages": [{"role": "user", "content": "a b c d e f g h"}]});
    let ours: Value = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let keys = |v: &Value| -> BTreeSet<String> { v.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&ours["usage"]), keys(&real["usage"]));
    assert_eq!(
        keys(&ours["usage"]["prompt_tokens_details"]),
        keys(&real["usage"]["prompt_tokens_details"])
    );
    assert!(ours["usage"]["completion_tokens_details"].is_null());
    assert!(ours["usage"]["prompt_tokens_details"]["multimodal_tokens"].is_null());
}

/// The top-level keys of a JSON text, in the order written.
fn key_order(text: &str) -> Vec<String> {
    // serde_json's Map sorts; walk the text instead: each key at depth 1.
    let (mut depth, mut keys, mut in_str, mut esc, mut cur) = (0, Vec::new(), false, false, None);
    let bytes = text.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if in_str {
            match (esc, b) {
                (true, _) => esc = false,
                (false, b'\\') => esc = true,
                (false, b'"') => {
                    in_str = false;
                    if let Some(start) = cur.take() {
                        let after = text[i + 1..].trim_start();
                        if after.starts_with(':') {
                            keys.push(text[start..i].to_string());
                        }
                    }
                }
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => {
                in_str = true;
                cur = (depth == 1).then_some(i + 1);
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth -= 1,
            _ => {}
        }
    }
    keys
}

/// A server-sent stream's events: (name, data text), deltas collapsed to one.
fn event_names(text: &str) -> Vec<String> {
    let mut names: Vec<String> = text
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("event: ")))
        .map(str::to_string)
        .collect();
    names.dedup();
    names
}

fn first_data<'a>(text: &'a str, event: &str) -> &'a str {
    text.split("\n\n")
        .find(|e| e.lines().any(|l| l == format!("event: {event}")))
        .and_then(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .unwrap_or_default()
}

async fn post_text(base: &str, path: &str, body: &Value) -> String {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let res = client
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    res.text().await.unwrap()
}

#[tokio::test]
async fn the_responses_answers_are_vllms_shape_and_order() {
    let base = sim().await;
    let body = json!({"model": "sim-llama-8b", "instructions": "Be brief.", "input": "a b c d", "max_output_tokens": 4});
    let ours = post_text(&base, "/v1/responses", &body).await;
    // Every field in vLLM's order, the id first (the filter reads it from the first bytes).
    assert_eq!(key_order(&ours), key_order(REAL_RESPONSES));
    let (o, r): (Value, Value) = (
        serde_json::from_str(&ours).unwrap(),
        serde_json::from_str(REAL_RESPONSES).unwrap(),
    );
    for path in [
        "/usage",
        "/usage/input_tokens_details",
        "/usage/output_tokens_details",
        "/output/0",
        "/output/0/content/0",
    ] {
        let keys = |v: &Value| key_order(&v.pointer(path).unwrap().to_string());
        assert_eq!(keys(&o).len(), keys(&r).len(), "{path}");
    }
    let id = o["id"].as_str().unwrap();
    let real_id = r["id"].as_str().unwrap();
    assert_eq!((id.len(), &id[..5]), (real_id.len(), &real_id[..5]));
    // Streamed: the same events in the same order, the response's id in the first one.
    let streamed = post_text(
        &base,
        "/v1/responses",
        &json!({"input": "a b", "stream": true, "max_output_tokens": 3}),
    )
    .await;
    assert_eq!(event_names(&streamed), event_names(REAL_RESPONSES_STREAM));
    for event in [
        "response.created",
        "response.output_text.delta",
        "response.completed",
    ] {
        assert_eq!(
            key_order(first_data(&streamed, event)),
            key_order(first_data(REAL_RESPONSES_STREAM, event)),
            "{event}"
        );
    }
}

#[tokio::test]
async fn the_messages_answers_are_vllms_shape_and_order() {
    let base = sim().await;
    let body = json!({"model": "sim-llama-8b", "max_tokens": 4, "system": "Be brief.",
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "a b c d"}]}]});
    let ours = post_text(&base, "/v1/messages", &body).await;
    assert_eq!(key_order(&ours), key_order(REAL_MESSAGES));
    let (o, r): (Value, Value) = (
        serde_json::from_str(&ours).unwrap(),
        serde_json::from_str(REAL_MESSAGES).unwrap(),
    );
    assert_eq!(
        key_order(&o["usage"].to_string()).len(),
        key_order(&r["usage"].to_string()).len()
    );
    let streamed = post_text(
        &base,
        "/v1/messages",
        &json!({"stream": true, "max_tokens": 3, "messages": [{"role": "user", "content": "a b"}]}),
    )
    .await;
    assert_eq!(event_names(&streamed), event_names(REAL_MESSAGES_STREAM));
    for event in [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "message_delta",
    ] {
        assert_eq!(
            key_order(first_data(&streamed, event)),
            key_order(first_data(REAL_MESSAGES_STREAM, event)),
            "{event}"
        );
    }
}
