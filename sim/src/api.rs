//! OpenAI-compatible HTTP API (axum on hyper 1), shaped like vLLM's `vllm serve` where a router
//! can see it.
//!
//! * `POST /v1/chat/completions`, `POST /v1/completions`: non-streamed JSON or SSE
//!   (`data: {chunk}\n\n` per generated token, `data: [DONE]\n\n` at the end, an extra usage
//!   chunk with empty `choices` before it when `stream_options.include_usage` is true). A chunk
//!   is written as soon as its token is produced, so clients can time the first token.
//! * `POST /v1/responses` (with vLLM's per-instance store) and `POST /v1/messages`
//!   (Anthropic's Messages API): [`agents`].
//! * `GET /v1/models`: one entry per served name (`root` = `--model`), as vLLM lists its
//!   `base_model_paths`. `GET /health` (200, empty body), `GET /metrics` (see
//!   [`crate::metrics`]).
//! * A request's `model` may be any served name (or absent: the first one); responses echo the
//!   name asked for, as vLLM's `_get_model_name` does.
//! * With `--enable-lora`, `model` may also name a loaded LoRA adapter (checked before the served
//!   names, as vLLM's `_maybe_get_adapters` does); `/v1/models` lists each adapter after the base
//!   names with `root` = its path and `parent` = its base model (vLLM's `show_available_models`).
//!   With `--allow-runtime-lora-updating`, `POST /v1/load_lora_adapter`
//!   (`{"lora_name", "lora_path", "load_inplace"}`) and `POST /v1/unload_lora_adapter`
//!   (`{"lora_name"}`) add and remove adapters and answer vLLM's plain-text `Success: ...` line or
//!   its errors; without the flag these routes do not exist, as in vLLM without
//!   `VLLM_ALLOW_RUNTIME_LORA_UPDATING`.
//! * `POST /tokenize` (vLLM's `TokenizeCompletionRequest`/`TokenizeChatRequest`: `prompt`, or
//!   `messages` rendered as below) answers vLLM's `TokenizeResponse`
//!   `{"count", "max_model_len", "tokens", "token_strs": null}`. A token id is the low 31 bits of
//!   the word's hash ([`wire_token_id`]): ids fit the u32 that routers' tokenizers use, and equal
//!   prompts give equal ids, which is all a router matching prefixes on them needs. (Ids sent
//!   back to `/v1/completions` are words of their own, not the words they came from.)
//! * `POST /v1/chat/completions/render` and `POST /v1/completions/render` answer 403
//!   `PermissionDeniedError`, as `vllm serve` does without `--enable-scale-out` (vLLM 0.32,
//!   `entrypoints/scale_out/factories.py`). vLLM's router (0.1.17) asks render for each prompt's
//!   ids before routing: on this 403 it routes on the prompt's text, as in front of a default
//!   vLLM (on a 404, as from vLLMs before the render endpoints, it asks `/tokenize` next).
//! * `GET`/`POST /ping` (200, empty: vLLM's SageMaker route) and `GET /version`.
//! * SGLang-only probes (`/server_info`, `/get_server_info`, `/model_info`, `/get_model_info`,
//!   `/health_generate`, `/get_load`) get 404 as from a real vLLM server: the SGLang router
//!   falls back from each and registers the worker all the same.
//! * With `--debug-state` only, `GET /debug/state` (the engine's queue) and
//!   `POST /debug/state?prompt_tokens=N&max_tokens=M` with the prompt's full-block hashes as
//!   little-endian u64s in the body (what [`probe_prompt`] and
//!   [`crate::cache::block_hashes`] compute from a request body): the same plus the prompt's
//!   longest cached prefix and its predicted time to first token
//!   ([`crate::engine::Prediction`]). It is the bench's oracle router's view of the pod, which
//!   no vLLM offers and warmroute never reads; no shipped config turns it on.
//! * Every response, errors included, carries `x-sim-replica: <name>` ([`REPLICA_HEADER`]).
//! * With `--echo-request-headers`, every response also carries the request's headers as the
//!   pod received them ([`REQUEST_HEADERS_HEADER`]).
//! * Faults, for soak and failure tests: `--error-rate` answers a share of completion requests
//!   500 at once (vLLM's `InternalServerError` body), `--stall-after-first-byte-ms` holds every
//!   completion response after its first byte ([`faults`]).
//! * Invalid input never panics: it gets vLLM's error body, OpenAI's shape
//!   `{"error":{"message":..,"type":"BadRequestError","param":null,"code":400}}`
//!   (vLLM's `ErrorResponse` wrapping an `ErrorInfo`; `code` is the HTTP status), and for an
//!   unknown model `NotFoundError`/404 with `"param":"model"` (vLLM's `_check_model`).
//!
//! # Prompt rendering and tokenization
//! The simulator has no real tokenizer: a token is a whitespace-separated word. A chat request is
//! rendered as lines, in order:
//! `<|tools|> {tools as JSON}` (only if `tools` is present), then per message
//! `<|role|> content` (text parts of an array content joined; a non-text part renders as
//! `<|type|>`; an assistant's `tool_calls` render as `<|tool_calls|> {JSON}`), then the generation
//! prompt `<|assistant|>` (unless `add_generation_prompt` is false). Because the completion text
//! is exactly the generated words, the prompt of turn N+1 (with turn N's answer as an assistant
//! message) extends turn N's prompt + output token for token, and hits the prefix cache like a
//! real chat template would.
//!
//! `/v1/completions` takes `prompt` as a string, a list of strings (one choice per prompt), a list
//! of token ids (each id is one word), or a list of such lists.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Json, Router};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::cache::{tokenize, Token};
use crate::config::{Args, LoraModule};
use crate::engine::{EngineHandle, Probe, SeqEvent, SeqRequest, SeqUsage};
use crate::metrics::{self, CacheInfo};

pub mod agents;

/// Response header naming the replica that served the request.
pub const REPLICA_HEADER: &str = "x-sim-replica";

/// Response header with the request's headers as received, a JSON array of `[name, value]`
/// pairs in arrival order (`--echo-request-headers`). Values are read as lossy UTF-8; JSON
/// escapes every control character, so any value fits in a response header.
pub const REQUEST_HEADERS_HEADER: &str = "x-sim-request-headers";

/// Largest accepted request body (long prompts are big; axum's default is 2 MiB).
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Shared state of the HTTP handlers.
#[derive(Debug, Clone)]
pub struct AppState {
    pub engine: EngineHandle,
    /// The first served name: the `model_name` label of the metrics, and the model of a
    /// request that names none.
    pub model: Arc<str>,
    /// Every served name of the base model.
    pub served: Arc<[Arc<str>]>,
    /// `--model`, the `root` of the base model's entries in `/v1/models`.
    root: Arc<str>,
    /// Loaded LoRA adapters, in load order (vLLM's `OpenAIServingModels.lora_requests`).
    adapters: Arc<RwLock<Vec<Adapter>>>,
    lora_enabled: bool,
    runtime_lora_updating: bool,
    pub replica: Arc<str>,
    replica_header: HeaderValue,
    echo_request_headers: bool,
    debug_state: bool,
    cache_info: Option<CacheInfo>,
    metrics_delay: std::time::Duration,
    /// `--stall-after-first-byte-ms` (zero: none).
    stall: std::time::Duration,
    /// `--error-rate`, clamped to [0, 1], and the completion requests counted so far.
    error_rate: f64,
    completions_seen: Arc<AtomicU64>,
    default_max_tokens: usize,
    max_len: usize,
    next_id: Arc<AtomicU64>,
    /// Unix time the state was built: the `_created` samples of the counters.
    started: u64,
    /// Stored `/v1/responses` answers, this instance's alone ([`agents`]).
    responses: agents::ResponseStore,
}

impl AppState {
    /// Builds the state and starts the engine loop (needs a tokio runtime).
    pub fn new(args: &Args, bound_port: u16) -> Self {
        let cfg = args.engine_config();
        let engine = EngineHandle::spawn(cfg.clone());
        let max_len = engine.lock().max_len();
        let cache_info = args.cache_config_info.then_some(CacheInfo {
            block_size: cfg.block_size,
            num_gpu_blocks: cfg.num_blocks,
            max_model_len: max_len,
        });
        let replica = args.replica_name(bound_port);
        let replica_header = HeaderValue::from_str(&replica)
            .unwrap_or_else(|_| HeaderValue::from_static("sim-invalid-name"));
        let started = unix_now();
        // Ids only need to be unique per process and distinct across replicas.
        let seed =
            crate::cache::fnv1a(format!("{replica}{started}{}", std::process::id()).as_bytes());
        let served: Arc<[Arc<str>]> = args
            .served_model_names()
            .iter()
            .map(|n| Arc::from(n.as_str()))
            .collect();
        let model = served
            .first()
            .cloned()
            .unwrap_or_else(|| args.model.as_str().into());
        // `Args::validate` refuses modules without --enable-lora; an embedder that skipped it
        // gets no adapters rather than adapters outside the max_loras limit.
        let adapters = args
            .lora_modules
            .iter()
            .filter(|_| args.enable_lora)
            .map(|m| Adapter::new(m, &served, &model))
            .collect();
        Self {
            engine,
            model,
            served,
            root: args.model.as_str().into(),
            adapters: Arc::new(RwLock::new(adapters)),
            lora_enabled: args.enable_lora,
            runtime_lora_updating: args.allow_runtime_lora_updating,
            replica: replica.into(),
            replica_header,
            echo_request_headers: args.echo_request_headers,
            debug_state: args.debug_state,
            cache_info,
            metrics_delay: std::time::Duration::from_millis(args.metrics_delay_ms),
            stall: std::time::Duration::from_millis(args.stall_after_first_byte_ms),
            error_rate: if args.error_rate.is_finite() {
                args.error_rate.clamp(0.0, 1.0)
            } else {
                0.0
            },
            completions_seen: Arc::new(AtomicU64::new(0)),
            default_max_tokens: args.default_max_tokens.max(1),
            max_len,
            next_id: Arc::new(AtomicU64::new(seed & 0xffff_ffff_0000_0000)),
            started,
            responses: agents::ResponseStore::new(args.responses_store_enabled()),
        }
    }

    /// The adapters, read (a poisoned lock is recovered: the list is always whole).
    fn adapters(&self) -> RwLockReadGuard<'_, Vec<Adapter>> {
        self.adapters.read().unwrap_or_else(|e| e.into_inner())
    }

    fn adapters_mut(&self) -> RwLockWriteGuard<'_, Vec<Adapter>> {
        self.adapters.write().unwrap_or_else(|e| e.into_inner())
    }

    fn new_id(&self, prefix: &str) -> String {
        format!("{prefix}-{}", self.new_hex())
    }

    /// A UUID's text form (8-4-4-4-12 hex digits), unique per process and distinct across
    /// replicas, as vLLM's chat ids carry.
    fn new_uuid(&self) -> String {
        let (a, b) = (self.new_hex(), self.new_hex());
        format!(
            "{}-{}-{}-{}-{}",
            &a[..8],
            &a[8..12],
            &a[12..],
            &b[..4],
            &b[4..]
        )
    }

    /// 16 hex digits, unique per process and distinct across replicas.
    fn new_hex(&self) -> String {
        format!("{:016x}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }
}

/// The router with every route and the replica-header layer.
pub fn router(state: AppState) -> Router {
    let completions = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(agents::responses))
        .route("/v1/messages", post(agents::messages));
    let completions = if state.error_rate > 0.0 || !state.stall.is_zero() {
        completions.route_layer(middleware::from_fn_with_state(state.clone(), faults))
    } else {
        completions
    };
    let mut router = Router::new()
        .merge(completions)
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize_handler))
        .route("/v1/chat/completions/render", post(scale_out_disabled))
        .route("/v1/completions/render", post(scale_out_disabled))
        .route("/ping", get(health).post(health))
        .route("/version", get(version))
        .route("/health", get(health))
        .route("/metrics", get(metrics_handler));
    if state.debug_state {
        router = router.route("/debug/state", get(debug_state).post(debug_state));
    }
    if state.runtime_lora_updating {
        router = router
            .route("/v1/load_lora_adapter", post(load_lora_adapter))
            .route("/v1/unload_lora_adapter", post(unload_lora_adapter));
    }
    router = router
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES));
    if state.echo_request_headers {
        router = router.layer(middleware::from_fn(echo_request_headers));
    }
    router
        .layer(middleware::map_response_with_state(
            state.clone(),
            add_replica_header,
        ))
        .with_state(state)
}

async fn echo_request_headers(req: axum::extract::Request, next: middleware::Next) -> Response {
    let seen: Vec<(&str, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let echoed = serde_json::to_vec(&seen).unwrap_or_default();
    let mut res = next.run(req).await;
    if let Ok(v) = HeaderValue::from_bytes(&echoed) {
        res.headers_mut().insert(REQUEST_HEADERS_HEADER, v);
    }
    res
}

/// The faults of `--error-rate` and `--stall-after-first-byte-ms`, on the completion routes.
async fn faults(
    State(st): State<AppState>,
    req: axum::extract::Request,
    next: middleware::Next,
) -> Response {
    let n = st.completions_seen.fetch_add(1, Ordering::Relaxed) as f64;
    // Request n + 1 fails when floor((n + 1) * rate) > floor(n * rate): exactly the rate's
    // share of any run of requests, fails spread evenly, the first one failing at rate 1.
    if ((n + 1.0) * st.error_rate).floor() > (n * st.error_rate).floor() {
        return ApiError::internal("EngineCore encountered an issue (simulated fault).")
            .into_response();
    }
    let res = next.run(req).await;
    if st.stall.is_zero() || !res.status().is_success() {
        return res;
    }
    let (parts, body) = res.into_parts();
    Response::from_parts(parts, stalled_after_first_byte(body, st.stall))
}

/// `body`, its first byte alone, then nothing for `stall`, then the rest as it comes. A client
/// that goes away ends the copy, and with it the original body (a stream then aborts).
fn stalled_after_first_byte(body: Body, stall: std::time::Duration) -> Body {
    let (tx, rx) = mpsc::channel::<Result<Bytes, axum::Error>>(16);
    tokio::spawn(async move {
        let mut data = body.into_data_stream();
        let mut first = true;
        while let Some(chunk) = data.next().await {
            let mut bytes = match chunk {
                Ok(b) => b,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            if first && !bytes.is_empty() {
                first = false;
                let rest = bytes.split_off(1);
                if tx.send(Ok(bytes)).await.is_err() {
                    return;
                }
                tokio::time::sleep(stall).await;
                bytes = rest;
            }
            if !bytes.is_empty() && tx.send(Ok(bytes)).await.is_err() {
                return;
            }
        }
    });
    Body::from_stream(ReceiverStream::new(rx))
}

async fn add_replica_header(State(state): State<AppState>, mut res: Response) -> Response {
    res.headers_mut()
        .insert(REPLICA_HEADER, state.replica_header.clone());
    res
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// vLLM's error response.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// vLLM's error `type`.
    pub kind: &'static str,
    /// The request field at fault, when vLLM names one.
    pub param: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequestError", message)
    }
    fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            message,
        )
    }
    /// The adapter endpoints' check failures (vLLM's `err_type="InvalidUserInput"`).
    fn invalid_user_input(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "InvalidUserInput", message)
    }
    /// vLLM's answer for a `model` that is neither a served name nor a loaded adapter.
    fn unknown_model(model: &str) -> Self {
        Self {
            param: Some("model"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "NotFoundError",
                format!("The model `{model}` does not exist."),
            )
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status.as_u16(),
            },
        });
        (self.status, Json(body)).into_response()
    }
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, Json(json!({"detail": "Not Found"}))).into_response()
}

async fn health() -> StatusCode {
    StatusCode::OK
}

/// The vLLM release whose answers the simulator follows (`GET /version`).
pub const VLLM_VERSION: &str = "0.32.0";

async fn version() -> Json<Value> {
    Json(json!({ "version": VLLM_VERSION }))
}

/// A token as a wire id: the low 31 bits of its hash, so it fits the u32 (and i32) token ids of
/// real tokenizers that routers parse.
pub fn wire_token_id(t: Token) -> u64 {
    t & 0x7fff_ffff
}

/// vLLM's `/tokenize`: a `prompt` string, or `messages` (rendered as the chat endpoint renders
/// them, honouring `add_generation_prompt`).
async fn tokenize_handler(State(st): State<AppState>, body: Bytes) -> Response {
    let result = (|| {
        let obj = parse_body(&body)?;
        resolve_model(&st, &obj)?;
        let tokens = if obj.contains_key("messages") {
            tokenize(&render_chat(&obj)?)
        } else {
            match obj.get("prompt") {
                Some(Value::String(p)) => tokenize(p),
                None | Some(Value::Null) => {
                    return Err(ApiError::bad_request(
                        "Field required: 'prompt' or 'messages'",
                    ))
                }
                Some(_) => return Err(ApiError::bad_request("'prompt' must be a string")),
            }
        };
        let ids: Vec<u64> = tokens.into_iter().map(wire_token_id).collect();
        Ok::<_, ApiError>(json!({
            "count": ids.len(),
            "max_model_len": st.max_len,
            "tokens": ids,
            "token_strs": null,
        }))
    })();
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The render endpoints of a `vllm serve` started without `--enable-scale-out`.
/// `/debug/state`'s query: the probe's prompt length and `max_tokens` (the default's when absent).
#[derive(Debug, serde::Deserialize)]
struct DebugQuery {
    prompt_tokens: Option<usize>,
    max_tokens: Option<usize>,
}

/// `/debug/state` (`--debug-state`, module docs): the queue, and for a probe its longest cached
/// prefix and predicted TTFT in simulated ms. `predict_us` is the handler's own time under the
/// engine lock.
async fn debug_state(
    State(st): State<AppState>,
    Query(q): Query<DebugQuery>,
    body: Bytes,
) -> Response {
    if !body.len().is_multiple_of(8) {
        return ApiError::bad_request("the body must be little-endian u64 block hashes")
            .into_response();
    }
    let hashes: Vec<u64> = body
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect();
    let probe = Probe {
        hashes: &hashes,
        prompt_len: q.prompt_tokens.unwrap_or(0),
        max_tokens: q.max_tokens.unwrap_or(st.default_max_tokens),
    };
    let t0 = std::time::Instant::now();
    let (p, snap) = st.engine.predict(probe);
    let predict_us = t0.elapsed().as_secs_f64() * 1e6;
    let cfg = st.engine.lock().config().clone();
    Json(json!({
        "replica": &*st.replica,
        "block_size": snap.block_size,
        "num_blocks": snap.num_blocks,
        "kv_usage": snap.kv_usage,
        "evictable_blocks": snap.evictable_blocks,
        "evictions": snap.evictions,
        "running": snap.running,
        "waiting": snap.waiting,
        "queue_prefill_tokens": p.queue_prefill_tokens,
        "time_scale": cfg.time_scale,
        "match_blocks": p.match_blocks,
        "cached_tokens": p.match_blocks * snap.block_size,
        "held_blocks": p.held_blocks,
        "predicted_ttft_ms": p.ttft_ms,
        "steps": p.steps,
        "predict_us": predict_us,
    }))
    .into_response()
}

/// A chat (`chat`) or completions request body's first prompt, tokenized as the server does, and
/// its `max_tokens` (`default_max_tokens` when it sets none): what a client needs to probe
/// `/debug/state` for it. The model is not resolved (the base model's hashes apply).
pub fn probe_prompt(
    body: &[u8],
    chat: bool,
    default_max_tokens: usize,
) -> Result<(Vec<Token>, usize), String> {
    let obj = parse_body(body).map_err(|e| e.message)?;
    let max_tokens = match opt_count(&obj, "max_completion_tokens").map_err(|e| e.message)? {
        Some(n) => n,
        None => opt_count(&obj, "max_tokens")
            .map_err(|e| e.message)?
            .unwrap_or(default_max_tokens),
    };
    let tokens = if chat {
        tokenize(&render_chat(&obj).map_err(|e| e.message)?)
    } else {
        completion_prompts(&obj)
            .map_err(|e| e.message)?
            .into_iter()
            .next()
            .unwrap_or_default()
    };
    Ok((tokens, max_tokens))
}

async fn scale_out_disabled() -> Response {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "PermissionDeniedError",
        "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.",
    )
    .into_response()
}

/// vLLM's `ModelPermission` with its defaults (every `ModelCard` carries one).
fn model_permission(st: &AppState) -> Value {
    json!({
        "id": st.new_id("modelperm"),
        "object": "model_permission",
        "created": unix_now(),
        "allow_create_engine": false,
        "allow_sampling": true,
        "allow_logprobs": true,
        "allow_search_indices": false,
        "allow_view": true,
        "allow_fine_tuning": false,
        "organization": "*",
        "group": null,
        "is_blocking": false,
    })
}

/// vLLM's `ModelCard`.
fn model_card(
    st: &AppState,
    id: &str,
    root: &str,
    parent: Option<&str>,
    max_len: Option<usize>,
) -> Value {
    json!({
        "id": id,
        "object": "model",
        "created": unix_now(),
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        "max_model_len": max_len,
        "permission": [model_permission(st)],
    })
}

async fn models(State(st): State<AppState>) -> Json<Value> {
    let mut data: Vec<Value> = st
        .served
        .iter()
        .map(|name| model_card(&st, name, &st.root, None, Some(st.max_len)))
        .collect();
    data.extend(
        st.adapters()
            .iter()
            .map(|a| model_card(&st, &a.name, &a.path, Some(&a.parent), None)),
    );
    Json(json!({"object": "list", "data": data}))
}

/// A loaded LoRA adapter.
#[derive(Debug, Clone)]
struct Adapter {
    name: Arc<str>,
    path: String,
    /// Its base model: `base_model_name` when that is a served name, else the first served name
    /// (vLLM's `load_lora_adapter` and `show_available_models`).
    parent: Arc<str>,
}

impl Adapter {
    fn new(m: &LoraModule, served: &[Arc<str>], first: &Arc<str>) -> Self {
        let parent = m
            .base_model_name
            .as_deref()
            .and_then(|b| served.iter().find(|s| &***s == b))
            .unwrap_or(first)
            .clone();
        Self {
            name: m.name.as_str().into(),
            path: m.path.clone(),
            parent,
        }
    }
}

/// A request body's string field, absent and null meaning empty.
fn str_field<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<&'a str, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(v)) => Ok(v),
        Some(_) => Err(ApiError::bad_request(format!("'{key}' must be a string"))),
    }
}

/// vLLM's plain 200 answer of the adapter endpoints (a bare `Response(content=...)`, no
/// content type).
fn success(text: String) -> Response {
    Response::new(Body::from(text))
}

/// `POST /v1/load_lora_adapter`, as vLLM's `OpenAIServingModels.load_lora_adapter`.
async fn load_lora_adapter(State(st): State<AppState>, body: Bytes) -> Response {
    let result = (|| {
        let obj = parse_body(&body)?;
        let name = str_field(&obj, "lora_name")?;
        let path = str_field(&obj, "lora_path")?;
        let in_place = opt_bool(&obj, "load_inplace")?.unwrap_or(false);
        if name.is_empty() || path.is_empty() {
            return Err(ApiError::invalid_user_input(
                "Both 'lora_name' and 'lora_path' must be provided.",
            ));
        }
        let mut adapters = st.adapters_mut();
        let existing = adapters.iter().position(|a| &*a.name == name);
        if existing.is_some() && !in_place {
            return Err(ApiError::invalid_user_input(format!(
                "The lora adapter '{name}' has already been loaded. If you want to load the \
                 adapter in place, set 'load_inplace' to True."
            )));
        }
        if !st.lora_enabled {
            // What the engine raises when asked to add an adapter without LoRA.
            return Err(ApiError::internal(
                "LoRA is not enabled. Use --enable-lora to enable LoRA.",
            ));
        }
        let module = LoraModule {
            name: name.to_string(),
            path: path.to_string(),
            base_model_name: None,
        };
        let adapter = Adapter::new(&module, &st.served, &st.model);
        match existing.and_then(|i| adapters.get_mut(i)) {
            Some(slot) => *slot = adapter,
            None => adapters.push(adapter),
        }
        Ok(format!(
            "Success: LoRA adapter '{name}' added successfully."
        ))
    })();
    match result {
        Ok(text) => success(text),
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/unload_lora_adapter`, as vLLM's `OpenAIServingModels.unload_lora_adapter`.
/// Requests already queued or running under the adapter finish under it.
async fn unload_lora_adapter(State(st): State<AppState>, body: Bytes) -> Response {
    let result = (|| {
        let obj = parse_body(&body)?;
        let name = str_field(&obj, "lora_name")?;
        if name.is_empty() {
            return Err(ApiError::invalid_user_input(
                "'lora_name' needs to be provided to unload a LoRA adapter.",
            ));
        }
        let mut adapters = st.adapters_mut();
        let Some(i) = adapters.iter().position(|a| &*a.name == name) else {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "NotFoundError",
                format!("The lora adapter '{name}' cannot be found."),
            ));
        };
        adapters.remove(i);
        Ok(format!(
            "Success: LoRA adapter '{name}' removed successfully."
        ))
    })();
    match result {
        Ok(text) => success(text),
        Err(e) => e.into_response(),
    }
}

async fn metrics_handler(State(st): State<AppState>) -> Response {
    if !st.metrics_delay.is_zero() {
        tokio::time::sleep(st.metrics_delay).await;
    }
    let (snapshot, lora) = {
        let engine = st.engine.lock();
        (engine.snapshot(), engine.lora_info().cloned())
    };
    let body = metrics::render(
        &st.model,
        &snapshot,
        st.cache_info.as_ref(),
        lora.as_ref(),
        st.started as f64,
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

// ---------------------------------------------------------------------------------------------
// Request parsing

/// What a request's `model` names.
#[derive(Debug)]
struct Target {
    /// The name responses carry.
    name: Arc<str>,
    /// The adapter the request runs under.
    lora: Option<Arc<str>>,
}

/// Fields common to both completion endpoints, validated.
#[derive(Debug)]
struct Common {
    target: Target,
    max_tokens: usize,
    stream: bool,
    include_usage: bool,
    /// vLLM's `SamplingParams.skip_reading_prefix_cache`: set when prompt logprobs are asked.
    skip_reading_prefix_cache: bool,
}

fn parse_body(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("Request body is not valid JSON: {e}")))?;
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(ApiError::bad_request("Request body must be a JSON object")),
    }
}

fn opt_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::bad_request(format!("'{key}' must be a boolean"))),
    }
}

fn opt_count(obj: &Map<String, Value>, key: &str) -> Result<Option<usize>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
            Some(n) => Err(ApiError::bad_request(format!(
                "{key} must be at least 1, got {n}."
            ))),
            None => Err(ApiError::bad_request(format!(
                "'{key}' must be a positive integer"
            ))),
        },
    }
}

/// Resolves a request's `model` as vLLM's `_check_model` and `_maybe_get_adapters` do: absent or
/// empty means the first served name, a loaded adapter runs under that adapter, any served name
/// is the base model, anything else is a 404.
fn resolve_model(st: &AppState, obj: &Map<String, Value>) -> Result<Target, ApiError> {
    let requested = match obj.get("model") {
        None | Some(Value::Null) => "",
        Some(Value::String(m)) => m.as_str(),
        Some(_) => return Err(ApiError::bad_request("'model' must be a string")),
    };
    if requested.is_empty() {
        return Ok(Target {
            name: st.model.clone(),
            lora: None,
        });
    }
    if let Some(a) = st.adapters().iter().find(|a| &*a.name == requested) {
        return Ok(Target {
            name: a.name.clone(),
            lora: Some(a.name.clone()),
        });
    }
    match st.served.iter().find(|n| &***n == requested) {
        Some(name) => Ok(Target {
            name: name.clone(),
            lora: None,
        }),
        None => Err(ApiError::unknown_model(requested)),
    }
}

/// Whether vLLM would compute prompt logprobs, and so skip its prefix-cache reads: an explicit
/// `prompt_logprobs`, or `echo` with `logprobs` (completions) or `top_logprobs` (chat, where it
/// defaults to 0) (`to_sampling_params`, then `SamplingParams.__post_init__`).
fn skips_prefix_cache(kind: Kind, obj: &Map<String, Value>) -> Result<bool, ApiError> {
    let set = |key: &str| !matches!(obj.get(key), None | Some(Value::Null));
    let echo_logprobs = match kind {
        Kind::Completion => set("logprobs"),
        Kind::Chat => !matches!(obj.get("top_logprobs"), Some(Value::Null)),
    };
    Ok(set("prompt_logprobs") || (opt_bool(obj, "echo")?.unwrap_or(false) && echo_logprobs))
}

fn parse_common(st: &AppState, kind: Kind, obj: &Map<String, Value>) -> Result<Common, ApiError> {
    let target = resolve_model(st, obj)?;
    let max_tokens = match opt_count(obj, "max_completion_tokens")? {
        Some(n) => n,
        None => opt_count(obj, "max_tokens")?.unwrap_or(st.default_max_tokens),
    };
    let stream = opt_bool(obj, "stream")?.unwrap_or(false);
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => opt_bool(o, "include_usage")?.unwrap_or(false),
        Some(_) => return Err(ApiError::bad_request("'stream_options' must be an object")),
    };
    Ok(Common {
        target,
        max_tokens,
        stream,
        include_usage,
        skip_reading_prefix_cache: skips_prefix_cache(kind, obj)?,
    })
}

/// Renders a chat request's `tools` + `messages` into prompt text (see the module docs).
pub fn render_chat(obj: &Map<String, Value>) -> Result<String, ApiError> {
    let mut lines: Vec<String> = Vec::new();
    match obj.get("tools") {
        None | Some(Value::Null) => {}
        Some(tools @ Value::Array(_)) => lines.push(format!("<|tools|> {tools}")),
        Some(_) => return Err(ApiError::bad_request("'tools' must be an array")),
    }
    let messages = match obj.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => return Err(ApiError::bad_request("'messages' must not be empty")),
        Some(_) => return Err(ApiError::bad_request("'messages' must be an array")),
        None => return Err(ApiError::bad_request("Field required: 'messages'")),
    };
    for (i, msg) in messages.iter().enumerate() {
        let Value::Object(msg) = msg else {
            return Err(ApiError::bad_request(format!(
                "messages[{i}] must be an object"
            )));
        };
        let role = match msg.get("role") {
            Some(Value::String(r)) => r,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "messages[{i}].role must be a string"
                )))
            }
        };
        let mut line = format!("<|{role}|>");
        match msg.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => {
                line.push(' ');
                line.push_str(s);
            }
            Some(Value::Array(parts)) => {
                for (j, part) in parts.iter().enumerate() {
                    let text = match part {
                        Value::String(s) => s.clone(),
                        Value::Object(p) => match (p.get("type"), p.get("text")) {
                            (Some(Value::String(t)), Some(Value::String(text))) if t == "text" => {
                                text.clone()
                            }
                            (Some(Value::String(t)), _) if t == "text" => {
                                return Err(ApiError::bad_request(format!(
                                    "messages[{i}].content[{j}].text must be a string"
                                )))
                            }
                            (Some(Value::String(t)), _) => format!("<|{t}|>"),
                            _ => {
                                return Err(ApiError::bad_request(format!(
                                    "messages[{i}].content[{j}].type must be a string"
                                )))
                            }
                        },
                        _ => {
                            return Err(ApiError::bad_request(format!(
                                "messages[{i}].content[{j}] must be an object"
                            )))
                        }
                    };
                    line.push(' ');
                    line.push_str(&text);
                }
            }
            Some(_) => {
                return Err(ApiError::bad_request(format!(
                    "messages[{i}].content must be a string or an array"
                )))
            }
        }
        if let Some(calls @ Value::Array(_)) = msg.get("tool_calls") {
            line.push_str(&format!(" <|tool_calls|> {calls}"));
        }
        lines.push(line);
    }
    if opt_bool(obj, "add_generation_prompt")?.unwrap_or(true) {
        lines.push("<|assistant|>".to_string());
    }
    Ok(lines.join("\n"))
}

/// The prompts of a `/v1/completions` request, tokenized.
pub fn completion_prompts(obj: &Map<String, Value>) -> Result<Vec<Vec<Token>>, ApiError> {
    fn ids(list: &[Value]) -> Option<Vec<Token>> {
        list.iter()
            .map(|v| v.as_u64().map(|id| crate::cache::token_of(&id.to_string())))
            .collect()
    }
    let bad = || {
        ApiError::bad_request(
            "'prompt' must be a string, a list of strings, or a list of token ids",
        )
    };
    match obj.get("prompt") {
        None | Some(Value::Null) => Err(ApiError::bad_request("Field required: 'prompt'")),
        Some(Value::String(s)) => Ok(vec![tokenize(s)]),
        Some(Value::Array(items)) if items.is_empty() => {
            Err(ApiError::bad_request("'prompt' must not be empty"))
        }
        Some(Value::Array(items)) => {
            if items.iter().all(Value::is_string) {
                Ok(items
                    .iter()
                    .map(|v| tokenize(v.as_str().unwrap_or_default()))
                    .collect())
            } else if items.iter().all(Value::is_array) {
                items
                    .iter()
                    .map(|v| v.as_array().and_then(|l| ids(l)).ok_or_else(bad))
                    .collect()
            } else {
                ids(items).map(|t| vec![t]).ok_or_else(bad)
            }
        }
        Some(_) => Err(bad()),
    }
}

// ---------------------------------------------------------------------------------------------
// Handlers

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

async fn chat_completions(State(st): State<AppState>, body: Bytes) -> Response {
    let result = (|| {
        let obj = parse_body(&body)?;
        let common = parse_common(&st, Kind::Chat, &obj)?;
        let prompt = render_chat(&obj)?;
        Ok::<_, ApiError>((common, vec![tokenize(&prompt)]))
    })();
    match result {
        Ok((common, prompts)) => generate(st, Kind::Chat, common, prompts).await,
        Err(e) => e.into_response(),
    }
}

async fn completions(State(st): State<AppState>, body: Bytes) -> Response {
    let result = (|| {
        let obj = parse_body(&body)?;
        let common = parse_common(&st, Kind::Completion, &obj)?;
        Ok::<_, ApiError>((common, completion_prompts(&obj)?))
    })();
    match result {
        Ok((common, prompts)) => generate(st, Kind::Completion, common, prompts).await,
        Err(e) => e.into_response(),
    }
}

fn usage_json(u: &SeqUsage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "completion_tokens": u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens,
                                  "created_cache_tokens": u.created_cache_tokens,
                                  "multimodal_tokens": null},
        "completion_tokens_details": null,
    })
}

fn add_usage(total: &mut SeqUsage, u: &SeqUsage) {
    total.prompt_tokens += u.prompt_tokens;
    total.completion_tokens += u.completion_tokens;
    total.cached_tokens += u.cached_tokens;
    total.created_cache_tokens += u.created_cache_tokens;
}

async fn generate(st: AppState, kind: Kind, common: Common, prompts: Vec<Vec<Token>>) -> Response {
    for p in &prompts {
        if p.is_empty() {
            return ApiError::bad_request("The prompt cannot be empty").into_response();
        }
        let requested = p.len().saturating_add(common.max_tokens);
        if requested > st.max_len {
            return ApiError::bad_request(format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the messages, {} in the completion). Please reduce the length of the messages or completion.",
                st.max_len, requested, p.len(), common.max_tokens
            ))
            .into_response();
        }
    }
    let n = prompts.len();
    let (tx, rx) = mpsc::unbounded_channel();
    for (index, tokens) in prompts.into_iter().enumerate() {
        st.engine.submit(SeqRequest {
            tokens,
            max_tokens: common.max_tokens,
            index,
            events: tx.clone(),
            lora: common.target.lora.clone(),
            skip_reading_prefix_cache: common.skip_reading_prefix_cache,
        });
    }
    drop(tx);
    let id = st.new_id(if kind == Kind::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    });
    let created = unix_now();
    if common.stream {
        stream_response(
            common.target.name,
            kind,
            id,
            created,
            n,
            common.include_usage,
            rx,
        )
    } else {
        full_response(common.target.name, kind, id, created, n, rx).await
    }
}

async fn full_response(
    model: Arc<str>,
    kind: Kind,
    id: String,
    created: u64,
    n: usize,
    mut rx: mpsc::UnboundedReceiver<SeqEvent>,
) -> Response {
    let mut texts = vec![String::new(); n];
    let mut reasons: Vec<Option<&'static str>> = vec![None; n];
    let mut usage = SeqUsage::default();
    let mut remaining = n;
    while remaining > 0 {
        match rx.recv().await {
            Some(SeqEvent::Token { index, text, .. }) => {
                if let Some(t) = texts.get_mut(index) {
                    t.push_str(&text);
                }
            }
            Some(SeqEvent::Finished {
                index,
                usage: u,
                finish_reason,
            }) => {
                if let Some(r) = reasons.get_mut(index) {
                    *r = Some(finish_reason);
                }
                add_usage(&mut usage, &u);
                remaining -= 1;
            }
            None => return ApiError::internal("engine stopped").into_response(),
        }
    }
    let choices: Vec<Value> = texts
        .into_iter()
        .zip(reasons)
        .enumerate()
        .map(|(index, (text, reason))| match kind {
            Kind::Chat => json!({
                "index": index,
                "message": {"role": "assistant", "reasoning_content": null, "content": text, "tool_calls": []},
                "logprobs": null,
                "finish_reason": reason,
                "stop_reason": null,
            }),
            Kind::Completion => json!({
                "index": index,
                "text": text,
                "logprobs": null,
                "finish_reason": reason,
                "stop_reason": null,
                "prompt_logprobs": null,
            }),
        })
        .collect();
    let object = if kind == Kind::Chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    Json(json!({
        "id": id,
        "object": object,
        "created": created,
        "model": &*model,
        "choices": choices,
        "usage": usage_json(&usage),
        "prompt_logprobs": null,
    }))
    .into_response()
}

fn stream_response(
    model: Arc<str>,
    kind: Kind,
    id: String,
    created: u64,
    n: usize,
    include_usage: bool,
    mut rx: mpsc::UnboundedReceiver<SeqEvent>,
) -> Response {
    let (sse_tx, sse_rx) = mpsc::channel::<Result<Event, Infallible>>(64);
    let object = if kind == Kind::Chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let (chunk_id, chunk_model) = (id.clone(), model.clone());
    let chunk = move |choices: Value| -> Event {
        let mut v = json!({"id": &chunk_id, "object": object, "created": created, "model": &*chunk_model, "choices": choices});
        if include_usage {
            if let Value::Object(o) = &mut v {
                o.insert("usage".into(), Value::Null);
            }
        }
        Event::default().data(v.to_string())
    };
    tokio::spawn(async move {
        let mut started = vec![false; n];
        let mut usage = SeqUsage::default();
        let mut remaining = n;
        // When the client goes away, `send` fails, this task ends and drops `rx`: the engine
        // then aborts the sequences and frees their blocks.
        while remaining > 0 {
            let Some(ev) = rx.recv().await else { return };
            match ev {
                SeqEvent::Token {
                    index,
                    text,
                    finish_reason,
                } => {
                    let mut events = Vec::with_capacity(2);
                    if kind == Kind::Chat {
                        if let Some(s) = started.get_mut(index) {
                            if !*s {
                                *s = true;
                                events.push(chunk(json!([{
                                    "index": index,
                                    "delta": {"role": "assistant", "content": ""},
                                    "logprobs": null,
                                    "finish_reason": null,
                                }])));
                            }
                        }
                        events.push(chunk(json!([{
                            "index": index,
                            "delta": {"content": text},
                            "logprobs": null,
                            "finish_reason": finish_reason,
                        }])));
                    } else {
                        events.push(chunk(json!([{
                            "index": index,
                            "text": text,
                            "logprobs": null,
                            "finish_reason": finish_reason,
                            "stop_reason": null,
                        }])));
                    }
                    for e in events {
                        if sse_tx.send(Ok(e)).await.is_err() {
                            return;
                        }
                    }
                }
                SeqEvent::Finished { usage: u, .. } => {
                    add_usage(&mut usage, &u);
                    remaining -= 1;
                }
            }
        }
        if include_usage {
            let v = json!({
                "id": &id, "object": object, "created": created, "model": &*model,
                "choices": [], "usage": usage_json(&usage),
            });
            if sse_tx
                .send(Ok(Event::default().data(v.to_string())))
                .await
                .is_err()
            {
                return;
            }
        }
        let _ = sse_tx.send(Ok(Event::default().data("[DONE]"))).await;
    });
    Sse::new(ReceiverStream::new(sse_rx)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn chat_turns_extend_token_wise() {
        let t1 = obj(json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
        ]}));
        let t2 = obj(json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
            {"role": "assistant", "content": "the cache"},
            {"role": "user", "content": "more"},
        ]}));
        let a = tokenize(&render_chat(&t1).unwrap_or_default());
        let b = tokenize(&render_chat(&t2).unwrap_or_default());
        assert_eq!(a.len(), 7);
        assert_eq!(b[..a.len()], a[..]);
        assert_eq!(b[a.len()..a.len() + 2], tokenize("the cache")[..]);
    }

    #[test]
    fn prompt_logprobs_skip_the_cache_as_vllm_derives_them() {
        let skips = |kind, v: Value| skips_prefix_cache(kind, &obj(v)).unwrap_or(false);
        for kind in [Kind::Chat, Kind::Completion] {
            assert!(!skips(kind, json!({})));
            assert!(skips(kind, json!({"prompt_logprobs": 0})));
            assert!(!skips(kind, json!({"prompt_logprobs": null})));
            assert!(!skips(kind, json!({"echo": false, "logprobs": 1})));
        }
        assert!(skips(
            Kind::Completion,
            json!({"echo": true, "logprobs": 0})
        ));
        assert!(!skips(Kind::Completion, json!({"echo": true})));
        // Chat's `top_logprobs` defaults to 0, so echo alone asks for prompt logprobs.
        assert!(skips(Kind::Chat, json!({"echo": true})));
        assert!(!skips(
            Kind::Chat,
            json!({"echo": true, "top_logprobs": null})
        ));
        assert!(skips_prefix_cache(Kind::Chat, &obj(json!({"echo": "yes"}))).is_err());
    }

    #[test]
    fn chat_rejects_bad_shapes() {
        for bad in [
            json!({}),
            json!({"messages": "hi"}),
            json!({"messages": []}),
            json!({"messages": [{"content": "x"}]}),
            json!({"messages": [{"role": "user", "content": 3}]}),
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}),
            json!({"messages": [{"role": "user", "content": "x"}], "tools": "x"}),
        ] {
            assert!(render_chat(&obj(bad.clone())).is_err(), "{bad}");
        }
        let tools = obj(
            json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}),
        );
        assert!(render_chat(&tools)
            .unwrap_or_default()
            .starts_with("<|tools|> [{\"type\":\"function\"}]"));
    }

    #[test]
    fn completion_prompt_forms() {
        let p = |v: Value| completion_prompts(&obj(json!({ "prompt": v })));
        assert_eq!(p(json!("a b c")).map(|v| v[0].len()).ok(), Some(3));
        assert_eq!(p(json!(["a b", "c"])).map(|v| v.len()).ok(), Some(2));
        assert_eq!(
            p(json!([1, 2, 3])).map(|v| (v.len(), v[0].len())).ok(),
            Some((1, 3))
        );
        assert_eq!(p(json!([[1, 2], [3]])).map(|v| v.len()).ok(), Some(2));
        assert!(p(json!([1, "a"])).is_err());
        assert!(p(json!({})).is_err());
        assert!(p(json!([])).is_err());
        assert!(completion_prompts(&Map::new()).is_err());
    }
}
