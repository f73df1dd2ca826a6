//! The oracle router against real simulated pods (in-process `warmroute-sim --debug-state`):
//! it must trade cache against load the way the pods' own forecasts say.
//!
//! Timing: each test's margin is the queued load, seen on the pod before the oracle runs: the
//! pick is wrong only if the probes (one loopback round trip each, ~1 ms) come more than ~1 s
//! (the prefills queued ahead, at time scale 1) after the queue was seen, which takes a stall of
//! the test's own runtime three orders of magnitude longer than its work; on this machine
//! nothing comes near (0 failures in 5 runs of both tests, each test < 2 s), so well under 1e-3.

// Test scaffolding: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use clap::Parser;
use warmroute_loadgen::oracle::{self, Oracle};
use warmroute_loadgen::runner::{build_client, run, Outcome, RunConfig};
use warmroute_loadgen::workload::{render_completion, Api, RenderOpts, Request, Session, Workload};

/// Three pods at real speed (time scale 1: a queued 8000-token prefill holds its pod ~0.5 s,
/// far longer than the probes take), named pod0..pod2.
async fn pods() -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..3 {
        let name = format!("pod{i}");
        let args = warmroute_sim::Args::try_parse_from([
            "warmroute-sim",
            "--port",
            "0",
            "--name",
            &name,
            "--debug-state",
        ])
        .unwrap();
        let listener = warmroute_sim::bind(&args).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(warmroute_sim::serve(args, listener));
        out.push(format!("http://{addr}"));
    }
    out
}

fn words(prefix: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("{prefix}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// Runs `prompt` to completion on `pod`: its blocks are cached there afterwards.
async fn warm(pod: &str, prompt: &str) {
    let res = client()
        .post(format!("{pod}/v1/completions"))
        .json(&serde_json::json!({"prompt": prompt, "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    res.bytes().await.unwrap();
}

/// Queues `n` long prefills on `pod` (8000 tokens each, ~0.5 s of engine time apiece) and waits
/// until the pod shows them; the responses are kept so they are not aborted.
async fn load(pod: &str, n: usize) -> Vec<tokio::task::JoinHandle<()>> {
    let mut held = Vec::new();
    for i in 0..n {
        let (pod, prompt) = (pod.to_string(), words(&format!("load{i}_"), 8000));
        held.push(tokio::spawn(async move {
            let res = client()
                .post(format!("{pod}/v1/completions"))
                .json(&serde_json::json!({"prompt": prompt, "max_tokens": 500, "stream": true}))
                .send()
                .await
                .unwrap();
            res.bytes().await.ok();
        }));
    }
    for _ in 0..500 {
        let state: serde_json::Value = client()
            .get(format!("{pod}/debug/state"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if state["running"].as_u64().unwrap() + state["waiting"].as_u64().unwrap() >= n as u64 {
            return held;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("the load never reached {pod}");
}

/// One request through the oracle (routing): which pod served it, and the oracle's record.
async fn route_one(pods: &[String], prompt: &str) -> (String, Option<usize>) {
    let body = render_completion(&RenderOpts::default(), prompt, 4).unwrap();
    let workload = Workload {
        name: "probe",
        sessions: vec![Session {
            id: "s".into(),
            start: Duration::ZERO,
            requests: vec![Request {
                api: Api::Completions,
                body,
                headers: Vec::new(),
                think: Duration::ZERO,
                prompt_words: 0,
                max_tokens: 4,
            }],
        }],
        agent_steps: false,
    };
    let http = build_client(Duration::from_secs(5), Duration::from_secs(30));
    let bs = oracle::block_size(&http, pods).await.unwrap();
    let cfg = RunConfig {
        max_seconds: 30.0,
        oracle: Some(Oracle {
            pods: pods.to_vec(),
            route: true,
            probes: oracle::probes(&workload, bs).unwrap(),
        }),
        ..Default::default()
    };
    let res = run(workload, &cfg).await.unwrap();
    let r = &res.records[0];
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let o = r.oracle.as_ref().unwrap();
    assert!(
        o.pods.iter().all(Option::is_some),
        "every pod answered: {o:?}"
    );
    (r.replica.clone().unwrap(), o.pick)
}

/// pod0 is loaded, pod1 is idle and cold, pod2 is idle and holds the prompt's 2000-token
/// prefix: pod2. A router blind to the cache would take pod1 (idle, first in turn); one blind
/// to the load could take pod0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn picks_the_pod_holding_the_prefix_over_an_idle_cold_one() {
    let pods = pods().await;
    let prefix = words("shared", 2000);
    warm(&pods[2], &prefix).await;
    let _busy = load(&pods[0], 2).await;
    let (served, pick) = route_one(&pods, &format!("{prefix} {}", words("tail", 50))).await;
    assert_eq!((served.as_str(), pick), ("pod2", Some(2)));
}

/// The same, but pod2 (holding the prefix) has three long prefills queued: a cold prefill on
/// the idle pod1 (~0.13 s) beats waiting behind them (~1.5 s). A router that follows the cache
/// alone would take pod2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaves_the_pod_holding_the_prefix_when_its_queue_costs_more() {
    let pods = pods().await;
    let prefix = words("shared", 2000);
    warm(&pods[2], &prefix).await;
    let _busy0 = load(&pods[0], 2).await;
    let _busy2 = load(&pods[2], 3).await;
    let (served, pick) = route_one(&pods, &format!("{prefix} {}", words("tail", 50))).await;
    assert_eq!((served.as_str(), pick), ("pod1", Some(1)));
}
