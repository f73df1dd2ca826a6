//! The load runner: drives [`Session`]s against a target and records each request.
//!
//! # Measurement
//! - **Connections**: one hyper-util pooled HTTP/1.1 client; every connection
//!   is opened with `TCP_NODELAY` (Nagle would add up to 40 ms to small request
//!   writes and skew TTFT) and kept alive for reuse across requests.
//! - **TTFT**: time from just before the request is handed to the client until
//!   the arrival of the body frame that completes the first SSE `data:` line.
//!   **e2e**: until the body has ended. Both use the monotonic clock.
//! - **Served by**: the `x-sim-replica` response header.
//! - **Usage**: `prompt_tokens`, `completion_tokens` and
//!   `prompt_tokens_details.cached_tokens` from the usage chunk (we always send
//!   `stream_options.include_usage`). Only `data:` lines mentioning
//!   `"prompt_tokens"` are JSON-parsed, so per-token chunks cost a line scan.
//! - **Cheap client**: bodies are pre-rendered `Bytes` (cloning is a refcount
//!   bump); per request we build one `http::Request` and scan the stream.
//!
//! # Control
//! - Sessions start at their offset; requests within a session are sequential,
//!   separated by their `think` time.
//! - `concurrency` bounds requests in flight (a semaphore; 0 = unbounded, the
//!   right choice for open-loop trace replay).
//! - `max_requests` bounds requests sent; later ones are counted as skipped.
//! - `max_seconds` is a hard bound on the run: no request starts after it, and
//!   requests still in flight at it are cut and recorded as `aborted` (not as
//!   errors: the server did nothing wrong, the run just ended).
//! - `timeout` bounds each request; exceeding it is an error.
//! - A `429 Too Many Requests` is recorded as `shed`, not as an error: the
//!   gateway refused the request at once (warmroute's priority gate sheds a
//!   held request whose deadline passed), which a client retries later; it is
//!   not a lost request. Any other non-2xx is an error.
//! - A request's class is the value of its [`PRIORITY_HEADER`], if it has one;
//!   requests never sent are counted per class too.
//! - With an [`Oracle`], each request first probes every pod (bench only: see
//!   [`crate::oracle`]); the decision's time is recorded apart and the request's clock starts
//!   after it. Routing by the oracle sends the request to the picked pod directly.
//!
//! A failed step does not end its session: the next step's body is already
//! rendered and a real agent would retry; only the run deadline ends sessions.
//! Server output is foreign input: nothing here unwraps it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use hyper::{Method, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::oracle::{decide, Oracle, OracleRecord};
use crate::workload::{Api, Request, Session, Workload, PRIORITY_HEADER};

/// Response header naming the replica that served a request.
pub const REPLICA_HEADER: &str = "x-sim-replica";

/// Pooled HTTP/1.1 client used for load and scrapes.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// How long an idle pooled connection is kept by default (hyper's own default).
pub const POOL_IDLE: Duration = Duration::from_secs(90);

/// Build the keep-alive client; every connection gets `TCP_NODELAY`. `pool_idle` must be
/// shorter than the server's idle or drain timeout: a connection the server closes while it
/// sits idle in the pool fails the request the client sends on it next, which is the client's
/// race, not the server losing a request.
pub fn build_client(connect_timeout: Duration, pool_idle: Duration) -> HttpClient {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    http.enforce_http(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(pool_idle)
        .pool_max_idle_per_host(usize::MAX)
        .build(http)
}

/// Run limits.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Base URL, e.g. `http://127.0.0.1:10000`.
    pub target: String,
    /// More gateways serving the same fleet: requests are spread over `target`
    /// and these by a global round robin on the send order (per request, never
    /// per session, so a session's steps land on different gateways).
    pub extra_targets: Vec<String>,
    /// Hard bound on the run.
    pub max_seconds: f64,
    /// Bound on requests sent.
    pub max_requests: Option<usize>,
    /// Max requests in flight (0 = unbounded).
    pub concurrency: usize,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Probe the pods before each request, and route by the pick or only record it.
    pub oracle: Option<Oracle>,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            target: "http://127.0.0.1:10000".into(),
            extra_targets: Vec::new(),
            max_seconds: 120.0,
            max_requests: None,
            concurrency: 0,
            timeout: Duration::from_secs(60),
            oracle: None,
        }
    }
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// 2xx and a complete stream.
    Ok,
    /// Transport error, non-2xx other than 429, timeout or truncated stream.
    Error,
    /// 429: refused by the gateway (shed), to be retried later.
    Shed,
    /// Cut by the run deadline.
    Aborted,
}

/// What was measured for one request.
#[derive(Clone, Debug, Serialize)]
pub struct RequestRecord {
    /// Session id.
    pub session: String,
    /// Index within the session (agent step number).
    pub step: usize,
    /// Priority class (the request's `x-warmroute-priority`), if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Send time, ms since run start.
    pub start_ms: f64,
    /// Index of the target (gateway) the request was sent to.
    pub gateway: usize,
    /// Outcome.
    pub outcome: Outcome,
    /// HTTP status, if a response arrived.
    pub status: Option<u16>,
    /// Time to first SSE `data:` chunk.
    pub ttft_ms: Option<f64>,
    /// Time to end of body (or to failure).
    pub e2e_ms: f64,
    /// `x-sim-replica` response header.
    pub replica: Option<String>,
    /// Prompt length in words as generated.
    pub prompt_words: usize,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: Option<u64>,
    /// `usage.completion_tokens`.
    pub completion_tokens: Option<u64>,
    /// SSE `data:` events received, excluding `[DONE]`.
    pub events: usize,
    /// Error text.
    pub error: Option<String>,
    /// The oracle's probes and pick, when it ran ([`crate::oracle`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oracle: Option<OracleRecord>,
}

/// Result of a run.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// One record per request sent, in completion order per session.
    pub records: Vec<RequestRecord>,
    /// Requests never sent (deadline or request budget).
    pub skipped: usize,
    /// Of those, how many per class (requests with a class only).
    pub skipped_by_class: BTreeMap<String, usize>,
    /// Wall time from start to the last request's end.
    pub runtime: Duration,
    /// Unix time of the start, ms: places `start_ms` against events outside the client.
    pub started_unix_ms: f64,
}

#[derive(Deserialize)]
struct UsageChunk {
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Usage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    cached_tokens: Option<u64>,
}

/// Incremental SSE scanner (lines may span body frames).
#[derive(Default, Debug)]
pub struct SseScanner {
    partial: Vec<u8>,
    /// `data:` events seen, excluding `[DONE]`.
    pub events: usize,
    /// `data: [DONE]` seen.
    pub done: bool,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: Option<u64>,
    /// `usage.completion_tokens`.
    pub completion_tokens: Option<u64>,
}

impl SseScanner {
    /// Feed bytes; returns true if at least one `data:` line completed in them.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        let mut saw_data = false;
        let mut rest = chunk;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (line_part, after) = rest.split_at(nl);
            rest = &after[1..];
            if self.partial.is_empty() {
                saw_data |= self.line(line_part);
            } else {
                self.partial.extend_from_slice(line_part);
                let line = std::mem::take(&mut self.partial);
                saw_data |= self.line(&line);
            }
        }
        self.partial.extend_from_slice(rest);
        saw_data
    }

    /// Process a trailing line without newline at end of stream.
    pub fn finish(&mut self) -> bool {
        let line = std::mem::take(&mut self.partial);
        !line.is_empty() && self.line(&line)
    }

    fn line(&mut self, line: &[u8]) -> bool {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(payload) = line.strip_prefix(b"data:") else {
            return false;
        };
        let payload = payload.trim_ascii();
        if payload == b"[DONE]" {
            self.done = true;
            return true;
        }
        self.events += 1;
        if contains(payload, b"\"prompt_tokens\"") {
            self.usage(payload);
        }
        true
    }

    /// Read usage from a JSON document (usage chunk or non-streamed response).
    pub fn usage(&mut self, json: &[u8]) {
        if let Ok(UsageChunk { usage: Some(u) }) = serde_json::from_slice::<UsageChunk>(json) {
            self.prompt_tokens = u.prompt_tokens.or(self.prompt_tokens);
            self.completion_tokens = u.completion_tokens.or(self.completion_tokens);
            if let Some(c) = u.prompt_tokens_details.and_then(|d| d.cached_tokens) {
                self.cached_tokens = Some(c);
            }
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

struct Shared {
    client: HttpClient,
    /// (chat, completions) URI per gateway.
    uris: Vec<(Uri, Uri)>,
    /// Requests sent so far: picks the gateway (round robin on send order).
    sent: AtomicUsize,
    start: Instant,
    deadline: Instant,
    budget: AtomicUsize,
    permits: Option<Semaphore>,
    timeout: Duration,
    oracle: Option<Oracle>,
    /// (chat, completions) URI per oracle pod.
    pod_uris: Vec<(Uri, Uri)>,
    /// Held by a routing oracle from its probes until its request's response headers arrive
    /// (the pod has queued it by then): each decision sees every earlier one in the pods' state.
    decide: tokio::sync::Mutex<()>,
}

/// Drive a workload to completion (or the deadline).
pub async fn run(workload: Workload, cfg: &RunConfig) -> Result<RunResult> {
    let client = build_client(Duration::from_secs(5), POOL_IDLE);
    run_with_client(workload, cfg, client).await
}

fn join_uri(base: &str, path: &str) -> Result<Uri> {
    let s = format!("{}{}", base.trim_end_matches('/'), path);
    s.parse::<Uri>()
        .with_context(|| format!("bad target URL {s:?}"))
}

/// [`run`] with a caller-provided client (shared with metric scrapes).
pub async fn run_with_client(
    workload: Workload,
    cfg: &RunConfig,
    client: HttpClient,
) -> Result<RunResult> {
    let start = Instant::now();
    let started_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    let shared = Arc::new(Shared {
        client,
        uris: std::iter::once(&cfg.target)
            .chain(&cfg.extra_targets)
            .map(|t| {
                Ok((
                    join_uri(t, Api::Chat.path())?,
                    join_uri(t, Api::Completions.path())?,
                ))
            })
            .collect::<Result<_>>()?,
        sent: AtomicUsize::new(0),
        start,
        deadline: start + Duration::from_secs_f64(cfg.max_seconds.max(0.0)),
        budget: AtomicUsize::new(cfg.max_requests.unwrap_or(usize::MAX)),
        permits: (cfg.concurrency > 0).then(|| Semaphore::new(cfg.concurrency)),
        timeout: cfg.timeout,
        pod_uris: cfg
            .oracle
            .iter()
            .flat_map(|o| &o.pods)
            .map(|t| {
                Ok((
                    join_uri(t, Api::Chat.path())?,
                    join_uri(t, Api::Completions.path())?,
                ))
            })
            .collect::<Result<_>>()?,
        oracle: cfg.oracle.clone(),
        decide: tokio::sync::Mutex::new(()),
    });
    let handles: Vec<_> = workload
        .sessions
        .into_iter()
        .enumerate()
        .map(|(i, s)| tokio::spawn(run_session(shared.clone(), i, s)))
        .collect();
    let mut records = Vec::new();
    let mut skipped = 0;
    let mut skipped_by_class = BTreeMap::new();
    for h in handles {
        let (mut r, unsent) = h.await.context("session task failed")?;
        records.append(&mut r);
        skipped += unsent.len();
        for class in unsent.into_iter().flatten() {
            *skipped_by_class.entry(class).or_default() += 1;
        }
    }
    Ok(RunResult {
        records,
        skipped,
        skipped_by_class,
        runtime: start.elapsed(),
        started_unix_ms,
    })
}

fn take_budget(b: &AtomicUsize) -> bool {
    b.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
}

/// The class of a request: its [`PRIORITY_HEADER`] value.
fn class_of(req: &Request) -> Option<String> {
    req.headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(PRIORITY_HEADER))
        .map(|(_, v)| v.clone())
}

/// A session's records, and the class of each request it never sent.
type SessionResult = (Vec<RequestRecord>, Vec<Option<String>>);

async fn run_session(sh: Arc<Shared>, index: usize, session: Session) -> SessionResult {
    let mut records = Vec::with_capacity(session.requests.len());
    let unsent = |from: usize| session.requests[from..].iter().map(class_of).collect();
    let begin = sh.start + session.start;
    if begin >= sh.deadline {
        return (records, unsent(0));
    }
    tokio::time::sleep_until(begin).await;
    for (i, req) in session.requests.iter().enumerate() {
        let at = Instant::now() + req.think;
        if at >= sh.deadline || !take_budget(&sh.budget) {
            return (records, unsent(i));
        }
        tokio::time::sleep_until(at).await;
        let _permit = match &sh.permits {
            Some(sem) => tokio::select! {
                p = sem.acquire() => match p { Ok(p) => Some(p), Err(_) => return (records, unsent(i)) },
                _ = tokio::time::sleep_until(sh.deadline) => return (records, unsent(i)),
            },
            None => None,
        };
        let rec = send(&sh, (index, &session.id), i, req).await;
        let aborted = rec.outcome == Outcome::Aborted;
        records.push(rec);
        if aborted {
            return (records, unsent(i + 1));
        }
    }
    (records, Vec::new())
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

async fn send(
    sh: &Shared,
    (index, session): (usize, &str),
    step: usize,
    req: &Request,
) -> RequestRecord {
    let start_ms = ms_since(sh.start);
    let n = sh.sent.fetch_add(1, Ordering::Relaxed);
    let mut gateway = n % sh.uris.len();
    let mut uris = &sh.uris;
    let mut oracle = None;
    let mut decided = None;
    if let Some(o) = &sh.oracle {
        if let Some(probe) = o.probes.get(index).and_then(|p| p.get(step)) {
            if o.route {
                decided = Some(sh.decide.lock().await);
            }
            let d = decide(&sh.client, &o.pods, probe, n).await;
            if let (true, Some(pick)) = (o.route, d.pick) {
                gateway = pick;
                uris = &sh.pod_uris;
            }
            oracle = Some(d);
        }
    }
    let (chat, completions) = &uris[gateway];
    let uri = match req.api {
        Api::Chat => chat.clone(),
        Api::Completions => completions.clone(),
    };
    let mut rec = RequestRecord {
        session: session.to_string(),
        step,
        class: class_of(req),
        start_ms,
        gateway,
        outcome: Outcome::Error,
        status: None,
        ttft_ms: None,
        e2e_ms: 0.0,
        replica: None,
        prompt_words: req.prompt_words,
        prompt_tokens: None,
        cached_tokens: None,
        completion_tokens: None,
        events: 0,
        error: None,
        oracle,
    };
    let http_req = match build_request(uri, req) {
        Ok(r) => r,
        Err(e) => {
            rec.error = Some(format!("{e:#}"));
            return rec;
        }
    };
    let t0 = Instant::now();
    let limit = (t0 + sh.timeout).min(sh.deadline);
    let mut sse = SseScanner::default();
    let res = tokio::time::timeout_at(
        limit,
        exchange(sh, http_req, t0, &mut rec, &mut sse, decided),
    )
    .await;
    rec.e2e_ms = ms_since(t0);
    rec.events = sse.events;
    rec.prompt_tokens = sse.prompt_tokens;
    rec.cached_tokens = sse.cached_tokens;
    rec.completion_tokens = sse.completion_tokens;
    match res {
        Ok(Ok(())) => rec.outcome = Outcome::Ok,
        Ok(Err(e)) if rec.status == Some(429) => {
            rec.outcome = Outcome::Shed;
            rec.error = Some(e);
        }
        Ok(Err(e)) => rec.error = Some(e),
        Err(_) if limit == sh.deadline && t0 + sh.timeout > sh.deadline => {
            rec.outcome = Outcome::Aborted;
            rec.error = Some("cut by --max-seconds".into());
        }
        Err(_) => rec.error = Some(format!("timeout after {:.1}s", sh.timeout.as_secs_f64())),
    }
    rec
}

fn build_request(uri: Uri, req: &Request) -> Result<hyper::Request<Full<Bytes>>> {
    let mut b = hyper::Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .header(ACCEPT, HeaderValue::from_static("text/event-stream"));
    for (k, v) in &req.headers {
        b = b.header(
            HeaderName::try_from(k.as_str())?,
            HeaderValue::try_from(v.as_str())?,
        );
    }
    Ok(b.body(Full::new(req.body.clone()))?)
}

const MAX_ERROR_BODY: usize = 512;

async fn exchange(
    sh: &Shared,
    req: hyper::Request<Full<Bytes>>,
    t0: Instant,
    rec: &mut RequestRecord,
    sse: &mut SseScanner,
    decided: Option<tokio::sync::MutexGuard<'_, ()>>,
) -> Result<(), String> {
    let resp = sh.client.request(req).await;
    // The pod answers its headers once it has queued the request: the next decision may go.
    drop(decided);
    let resp = resp.map_err(|e| format!("request: {}", error_chain(&e)))?;
    let status = resp.status();
    rec.status = Some(status.as_u16());
    rec.replica = resp
        .headers()
        .get(REPLICA_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let is_sse = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut body = resp.into_body();
    if !status.is_success() {
        let mut text = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("HTTP {status}, body: {e}"))?;
            if let Some(d) = frame.data_ref() {
                text.extend_from_slice(
                    &d[..d.len().min(MAX_ERROR_BODY - text.len().min(MAX_ERROR_BODY))],
                );
            }
        }
        return Err(format!(
            "HTTP {}: {}",
            status.as_u16(),
            String::from_utf8_lossy(&text).trim()
        ));
    }
    let mut whole = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("body: {}", error_chain(&e)))?;
        if let Some(d) = frame.data_ref() {
            if is_sse {
                if sse.feed(d) && rec.ttft_ms.is_none() {
                    rec.ttft_ms = Some(ms_since(t0));
                }
            } else {
                whole.extend_from_slice(d);
            }
        }
    }
    if !is_sse {
        sse.usage(&whole);
        return Ok(());
    }
    if sse.finish() && rec.ttft_ms.is_none() {
        rec.ttft_ms = Some(ms_since(t0));
    }
    if !sse.done {
        return Err("stream ended without data: [DONE]".into());
    }
    Ok(())
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// GET a URL's body as text (for `/metrics`), bounded by `timeout`.
pub async fn get_text(client: &HttpClient, url: &str, timeout: Duration) -> Result<String, String> {
    let uri: Uri = url.parse().map_err(|e| format!("bad URL {url:?}: {e}"))?;
    let req = hyper::Request::get(uri)
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let fut = async {
        let resp = client.request(req).await.map_err(|e| error_chain(&e))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| error_chain(&e))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("HTTP {}", status.as_u16()));
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| "timeout".to_string())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_scanner_handles_split_lines_and_usage() {
        let mut s = SseScanner::default();
        assert!(!s.feed(b": comment\n\nda"));
        assert!(s.feed(b"ta: {\"choices\":[{\"text\":\"a\"}]}\n\n"));
        assert!(s.feed(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\r\n\r\n"));
        assert!(!s.done);
        assert!(!s.feed(b"data: [DONE]"));
        // [DONE] without trailing newline completes only at finish.
        assert!(!s.done);
        assert!(s.finish());
        assert!(s.done);
        assert_eq!(s.events, 2);
        assert_eq!(
            (s.prompt_tokens, s.cached_tokens, s.completion_tokens),
            (Some(40), Some(32), Some(2))
        );
    }

    #[test]
    fn usage_null_chunks_are_ignored() {
        let mut s = SseScanner::default();
        s.feed(b"data: {\"choices\":[],\"usage\":null,\"x\":\"\\\"prompt_tokens\\\"\"}\n");
        s.feed(b"data: not json \"prompt_tokens\"\n");
        assert_eq!(s.prompt_tokens, None);
        assert_eq!(s.events, 2);
    }
}
