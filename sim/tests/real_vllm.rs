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
    let args =
        Args::try_parse_from(["warmroute-sim", "--port", "0", "--time-scale", "100"]).unwrap();
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
