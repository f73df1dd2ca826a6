//! Runner and CLI against a tiny in-test hyper server that streams SSE like the sim.

// Test scaffolding: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Channel, Either, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use warmroute_loadgen::cli::{execute, Cli};
use warmroute_loadgen::runner::{run, Outcome, RunConfig};
use warmroute_loadgen::workload::{self, AgentOpts, RenderOpts};

#[derive(Default)]
struct ServerState {
    connections: AtomicUsize,
    requests: AtomicUsize,
    hits: AtomicU64,
    queries: AtomicU64,
    session_headers: AtomicUsize,
}

type Body = Either<Full<Bytes>, Channel<Bytes>>;

const CHUNK_DELAY: Duration = Duration::from_millis(25);

async fn handle(
    st: Arc<ServerState>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    if req.uri().path() == "/metrics" {
        let text = format!(
            "# TYPE vllm:prefix_cache_hits_total counter\n\
             vllm:prefix_cache_hits_total{{model_name=\"sim-llama-8b\"}} {}\n\
             vllm:prefix_cache_queries_total{{model_name=\"sim-llama-8b\"}} {}\n",
            st.hits.load(Ordering::SeqCst),
            st.queries.load(Ordering::SeqCst)
        );
        return Ok(Response::new(Either::Left(Full::new(Bytes::from(text)))));
    }
    if req.uri().path() == "/fail" || req.uri().path() == "/fail/v1/chat/completions" {
        let mut r = Response::new(Either::Left(Full::new(Bytes::from_static(
            b"{\"error\":\"nope\"}",
        ))));
        *r.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
        return Ok(r);
    }
    // `/shed`: a gateway refusing batch work with a 429, as warmroute's gate does.
    if req.uri().path().starts_with("/shed")
        && req
            .headers()
            .get("x-warmroute-priority")
            .is_some_and(|v| v == "batch")
    {
        let mut r = Response::new(Either::Left(Full::new(Bytes::from_static(
            b"{\"error\":{\"code\":\"deadline_exceeded\"}}",
        ))));
        *r.status_mut() = hyper::StatusCode::TOO_MANY_REQUESTS;
        return Ok(r);
    }
    if req.headers().contains_key("x-session-id") {
        st.session_headers.fetch_add(1, Ordering::SeqCst);
    }
    let slow = req.uri().path().starts_with("/slow");
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    assert_eq!(json["stream_options"]["include_usage"], true);
    let n = st.requests.fetch_add(1, Ordering::SeqCst);
    st.hits.fetch_add(10, Ordering::SeqCst);
    st.queries.fetch_add(40, Ordering::SeqCst);
    let (mut tx, rx) = Channel::<Bytes>::new(4);
    tokio::spawn(async move {
        if slow {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        tokio::time::sleep(CHUNK_DELAY).await;
        // First data line split across two frames.
        let _ = tx
            .send_data(Bytes::from_static(b"data: {\"choices\":[{\"delta\":"))
            .await;
        let _ = tx
            .send_data(Bytes::from_static(b"{\"content\":\"hi\"}}]}\n\n"))
            .await;
        tokio::time::sleep(CHUNK_DELAY).await;
        let _ = tx
            .send_data(Bytes::from_static(
                b"data: {\"choices\":[{\"delta\":{\"content\":\" there\"}}]}\n\n",
            ))
            .await;
        let usage = format!(
            "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{},\"completion_tokens\":2,\"prompt_tokens_details\":{{\"cached_tokens\":10}}}}}}\n\ndata: [DONE]\n\n",
            40 + n
        );
        let _ = tx.send_data(Bytes::from(usage)).await;
    });
    let mut r = Response::new(Either::Right(rx));
    r.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    r.headers_mut()
        .insert("x-sim-replica", "replica-a".parse().unwrap());
    Ok(r)
}

async fn start_server() -> (SocketAddr, Arc<ServerState>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let st = Arc::new(ServerState::default());
    let st2 = st.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            st2.connections.fetch_add(1, Ordering::SeqCst);
            let st3 = st2.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| handle(st3.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, st)
}

fn small_agent() -> workload::Workload {
    let opts = AgentOpts {
        agents: 3,
        steps: 3,
        tool_ms: 5.0,
        stagger_ms: 5.0,
        system_tokens: 64,
        ..Default::default()
    };
    workload::agent(&opts, &RenderOpts::default()).unwrap()
}

#[tokio::test]
async fn records_ttft_e2e_replica_and_usage() {
    let (addr, st) = start_server().await;
    let cfg = RunConfig {
        target: format!("http://{addr}"),
        max_seconds: 10.0,
        ..Default::default()
    };
    let res = run(small_agent(), &cfg).await.unwrap();
    assert_eq!(res.records.len(), 9);
    assert_eq!(res.skipped, 0);
    for r in &res.records {
        assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
        assert_eq!(r.status, Some(200));
        assert_eq!(r.replica.as_deref(), Some("replica-a"));
        let ttft = r.ttft_ms.unwrap();
        assert!(ttft >= CHUNK_DELAY.as_millis() as f64 * 0.9, "ttft {ttft}");
        assert!(ttft < r.e2e_ms, "ttft {ttft} e2e {}", r.e2e_ms);
        assert!(r.e2e_ms >= 2.0 * CHUNK_DELAY.as_millis() as f64 * 0.9);
        assert_eq!(r.events, 3);
        assert!(r.prompt_tokens.unwrap() >= 40);
        assert_eq!(r.cached_tokens, Some(10));
        assert_eq!(r.completion_tokens, Some(2));
    }
    // Steps of one agent are sequential: each starts after the previous ended.
    for s in ["agent-0", "agent-1", "agent-2"] {
        let steps: Vec<_> = res.records.iter().filter(|r| r.session == s).collect();
        for p in steps.windows(2) {
            assert!(p[1].start_ms >= p[0].start_ms + p[0].e2e_ms - 1.0);
        }
    }
    assert_eq!(st.session_headers.load(Ordering::SeqCst), 9);
    // Keep-alive: at most one connection per concurrent agent.
    assert!(
        st.connections.load(Ordering::SeqCst) <= 3,
        "{}",
        st.connections.load(Ordering::SeqCst)
    );
}

#[tokio::test]
async fn several_targets_are_used_per_request_not_per_session() {
    let (a, _sa) = start_server().await;
    let (b, _sb) = start_server().await;
    let cli = Cli::try_parse_from([
        "warmroute-loadgen",
        "agent",
        "--target",
        &format!("http://{a}"),
        "--target",
        &format!("http://{b}"),
        "--agents",
        "1",
        "--steps",
        "4",
        "--tool-ms",
        "1",
        "--system-tokens",
        "32",
        "--quiet",
    ])
    .unwrap();
    let wl = cli.workload.generate().unwrap();
    let report = execute(&cli.workload, wl).await.unwrap();
    assert_eq!(report.ok, 4);
    // One session alternates gateways step by step.
    assert_eq!(report.per_target, vec![2, 2]);
    assert!(report.target.contains(&a.to_string()) && report.target.contains(&b.to_string()));
}

#[tokio::test]
async fn errors_deadline_and_budget() {
    let (addr, _st) = start_server().await;
    // Non-2xx → error with the status.
    let cfg = RunConfig {
        target: format!("http://{addr}/fail"),
        max_seconds: 10.0,
        ..Default::default()
    };
    let res = run(small_agent(), &cfg).await.unwrap();
    assert!(res
        .records
        .iter()
        .all(|r| r.outcome == Outcome::Error && r.status == Some(503)));
    assert!(res.records[0]
        .error
        .as_deref()
        .unwrap_or("")
        .contains("503"));

    // Deadline cuts slow requests: aborted, remaining steps skipped, run bounded.
    let cfg = RunConfig {
        target: format!("http://{addr}/slow"),
        max_seconds: 0.5,
        ..Default::default()
    };
    let res = run(small_agent(), &cfg).await.unwrap();
    assert!(res.runtime < Duration::from_secs(2), "{:?}", res.runtime);
    assert_eq!(res.records.len(), 3);
    assert!(res.records.iter().all(|r| r.outcome == Outcome::Aborted));
    assert_eq!(res.skipped, 6);

    // Request budget.
    let cfg = RunConfig {
        target: format!("http://{addr}"),
        max_requests: Some(4),
        concurrency: 1,
        ..Default::default()
    };
    let res = run(small_agent(), &cfg).await.unwrap();
    assert_eq!(res.records.len(), 4);
    assert_eq!(res.skipped, 5);

    // Connection refused → error, not a panic.
    let cfg = RunConfig {
        target: "http://127.0.0.1:1".into(),
        max_seconds: 5.0,
        ..Default::default()
    };
    let res = run(small_agent(), &cfg).await.unwrap();
    assert!(res
        .records
        .iter()
        .all(|r| r.outcome == Outcome::Error && r.status.is_none()));
}

#[tokio::test]
async fn cli_reports_hit_rate_from_backend_metrics() {
    let (addr, _st) = start_server().await;
    let url = format!("http://{addr}");
    let cli = Cli::try_parse_from([
        "warmroute-loadgen",
        "agent",
        "--target",
        &url,
        "--backend",
        &url,
        "--agents",
        "2",
        "--steps",
        "2",
        "--tool-ms",
        "1",
        "--stagger-ms",
        "1",
        "--system-tokens",
        "32",
        "--quiet",
    ])
    .unwrap();
    let wl = cli.workload.generate().unwrap();
    let report = execute(&cli.workload, wl).await.unwrap();
    assert_eq!(report.requests, 4);
    assert_eq!(report.hit_rate, Some(0.25));
    assert_eq!(report.share.get("replica-a"), Some(&1.0));
    assert!(report.step_ms.is_some());
    assert!(report.client_cpu_s >= 0.0);
}

#[test]
fn main_writes_json_report_with_expected_fields() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (addr, _st) = start_server().await;
            tx.send(addr).unwrap();
            std::future::pending::<()>().await;
        });
    });
    let addr = rx.recv().unwrap();
    let dir = std::env::temp_dir().join(format!("warmroute-loadgen-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("report.json");
    let records = dir.join("records.jsonl");
    let url = format!("http://{addr}");
    let cli = Cli::try_parse_from([
        "warmroute-loadgen",
        "uniform",
        "--target",
        &url,
        "--backend",
        &url,
        "--requests",
        "5",
        "--rate",
        "200",
        "--prompt-tokens",
        "16",
        "--json",
        json.to_str().unwrap(),
        "--records",
        records.to_str().unwrap(),
        "--quiet",
        "--fail-on-error",
    ])
    .unwrap();
    assert_eq!(warmroute_loadgen::cli::main_with(cli).unwrap(), 0);
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(j["requests"], 5);
    assert_eq!(j["errors"], 0);
    assert_eq!(j["hit_rate"], 0.25);
    assert_eq!(j["share"]["replica-a"], 1.0);
    for k in ["mean", "p50", "p95", "p99"] {
        assert!(j["ttft_ms"][k].is_number(), "ttft_ms.{k}");
    }
    for k in ["mean", "p95"] {
        assert!(j["e2e_ms"][k].is_number(), "e2e_ms.{k}");
    }
    assert!(j["step_ms"].is_null());
    assert!(j["runtime_s"].as_f64().unwrap() > 0.0);
    assert!(j["client_cpu_s"].is_number());
    assert_eq!(
        std::fs::read_to_string(&records).unwrap().lines().count(),
        5
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn mixed_reports_each_class_and_counts_a_429_as_shed_not_lost() {
    let (addr, st) = start_server().await;
    let cli = Cli::try_parse_from([
        "warmroute-loadgen",
        "mixed",
        "--target",
        &format!("http://{addr}/shed"),
        "--interactive",
        "6",
        "--rate",
        "200",
        "--interactive-start-ms",
        "10",
        "--batch-workers",
        "2",
        "--batch-jobs",
        "3",
        "--batch-prompt-tokens",
        "50",
        "--system-tokens",
        "16",
        "--quiet",
    ])
    .unwrap();
    let wl = cli.workload.generate().unwrap();
    let report = execute(&cli.workload, wl).await.unwrap();
    assert_eq!(
        (report.requests, report.ok, report.shed, report.errors),
        (12, 6, 6, 0)
    );
    let batch = &report.classes["batch"];
    assert_eq!(
        (batch.requests, batch.shed, batch.ok, batch.lost),
        (6, 6, 0, 0)
    );
    assert_eq!(batch.output_tokens_per_s, 0.0);
    let chat = &report.classes["interactive"];
    assert_eq!((chat.requests, chat.ok, chat.shed, chat.lost), (6, 6, 0, 0));
    // The server streams 2 tokens per answer, the first after CHUNK_DELAY.
    assert_eq!(chat.output_tokens, 12);
    assert!(chat.output_tokens_per_s > 0.0);
    assert!(chat.ttft_ms.unwrap().p95 >= CHUNK_DELAY.as_millis() as f64 * 0.9);
    // Only the interactive requests reached the streaming handler.
    assert_eq!(st.requests.load(Ordering::SeqCst), 6);

    // Cut by the run's end: aborted and never-sent batch jobs are losses.
    let cli = Cli::try_parse_from([
        "warmroute-loadgen",
        "mixed",
        "--target",
        &format!("http://{addr}/slow"),
        "--interactive",
        "1",
        "--interactive-start-ms",
        "5000",
        "--batch-workers",
        "2",
        "--batch-jobs",
        "3",
        "--batch-prompt-tokens",
        "20",
        "--max-seconds",
        "0.5",
        "--quiet",
    ])
    .unwrap();
    let wl = cli.workload.generate().unwrap();
    let report = execute(&cli.workload, wl).await.unwrap();
    let batch = &report.classes["batch"];
    assert_eq!((batch.aborted, batch.skipped, batch.lost), (2, 4, 6));
    assert_eq!(report.classes["interactive"].lost, 1);
}
