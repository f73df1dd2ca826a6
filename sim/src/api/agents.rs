//! The APIs agents speak, as vLLM 0.32 serves them: `POST /v1/responses` (OpenAI's Responses
//! API, with vLLM's per-instance store) and `POST /v1/messages` (Anthropic's Messages API).
//!
//! # `/v1/responses`
//! * `input` is a string (one user message) or a list of items: messages (`role`, `content` as
//!   a string or parts of type `input_text`/`output_text`/`text`), `function_call` and
//!   `function_call_output` items; `instructions` becomes a system message; `tools` renders as
//!   in chat; `max_output_tokens`, `stream`, `store` (default true), `request_id` (the id of the
//!   response, vLLM's extra field; else `resp_` and 16 hex digits).
//! * The store, as vLLM's `OpenAIServingResponses` keeps it: only with `--enable-responses-store`
//!   or `VLLM_ENABLE_RESPONSES_API_STORE=1` (without, `store` is quietly off), in this process's
//!   memory. A request naming a `previous_response_id` this instance does not hold gets vLLM's
//!   404: `{"error":{"message":"Response with id '<id>' not found.","type":
//!   "invalid_request_error","param":"response_id","code":404}}`. One it holds is rendered as
//!   vLLM's `construct_input_messages` does: this request's instructions, the stored request's
//!   messages less its system message, the stored answer as an assistant message, then the new
//!   input. So a follow-up's prompt extends its predecessor's prompt and answer, and hits the
//!   cache on the instance that holds it.
//! * The answer: non-streamed, a `response` object whose first field is `id` and whose `usage`
//!   is `{input_tokens, input_tokens_details: {cached_tokens}, output_tokens, total_tokens}`;
//!   streamed, server-sent events with `event:` names: `response.created` and
//!   `response.in_progress` (the response so far), a `response.output_text.delta` per token,
//!   then `response.completed` with the whole response.
//!
//! # `/v1/messages`
//! * `system` (a string or text blocks), `messages` (`role`, `content` as a string or blocks:
//!   `text`, `image`, `tool_use`, `tool_result`), `tools`, `max_tokens`, `stream`. vLLM turns it
//!   into a chat request; here the blocks render as chat parts: a text block is its text,
//!   `tool_use` is `<|tool_use|> name {input}`, `tool_result` is `<|tool_result|> content`, any
//!   other block `<|type|>`. `tools` render as in chat.
//! * The answer: `{"id","type":"message","role":"assistant","content":[{"type":"text","text"}],
//!   "model","stop_reason","stop_sequence","usage"}` with vLLM's `_build_anthropic_usage`:
//!   `input_tokens` = prompt − cached − created cache tokens, `output_tokens`,
//!   `cache_creation_input_tokens`, `cache_read_input_tokens`. Streamed (always with usage, as
//!   vLLM asks its chat engine for it): `message_start`, `content_block_start`, a
//!   `content_block_delta` per token, `content_block_stop`, `message_delta` (stop reason and
//!   usage), `message_stop`. Errors in Anthropic's shape, `{"type":"error","error":{"type",
//!   "message"}}`, as vLLM's `translate_error_response` writes them.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{
    opt_bool, opt_count, parse_body, render_chat, resolve_model, unix_now, ApiError, AppState,
};
use crate::cache::tokenize;
use crate::engine::{SeqEvent, SeqRequest, SeqUsage};

/// One stored response: the messages its prompt was rendered from, and its answer.
#[derive(Debug, Clone)]
pub struct Stored {
    messages: Vec<Value>,
    text: String,
}

/// vLLM's `response_store`: this instance's stored responses, by id.
#[derive(Debug, Clone, Default)]
pub struct ResponseStore {
    enabled: bool,
    stored: Arc<Mutex<HashMap<String, Stored>>>,
}

impl ResponseStore {
    /// A store that keeps responses only when `enabled`.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            stored: Arc::default(),
        }
    }

    fn get(&self, id: &str) -> Option<Stored> {
        let stored = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        stored.get(id).cloned()
    }

    fn put(&self, id: String, s: Stored) {
        let mut stored = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        stored.insert(id, s);
    }
}

/// A stored response this instance does not hold (vLLM's `_make_not_found_error`).
fn response_not_found(id: &str) -> ApiError {
    ApiError {
        param: Some("response_id"),
        ..ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("Response with id '{id}' not found."),
        )
    }
}

/// The text of a Responses API content: a string, or its text parts joined.
fn item_text(content: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = Vec::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("input_text" | "output_text" | "text"), Some(Value::String(t))) => {
                        out.push(t.clone())
                    }
                    (Some(t), _) => out.push(format!("<|{t}|>")),
                    _ => return Err(ApiError::bad_request(format!("{at}: a part needs a type"))),
                }
            }
            Ok(out.join(" "))
        }
        Some(_) => Err(ApiError::bad_request(format!(
            "{at}: content must be a string or an array"
        ))),
    }
}

/// `input` as chat messages (vLLM's `construct_chat_messages_with_tool_call`, in short).
fn input_messages(input: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    match input {
        Some(Value::String(s)) => Ok(vec![json!({"role": "user", "content": s})]),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let at = format!("input[{i}]");
                match (item.get("type").and_then(Value::as_str), item.get("role")) {
                    (Some("function_call"), _) => Ok(json!({"role": "assistant", "content": null,
                        "tool_calls": [{"id": item.get("call_id"), "type": "function",
                            "function": {"name": item.get("name"), "arguments": item.get("arguments")}}]})),
                    (Some("function_call_output"), _) => Ok(json!({"role": "tool",
                        "content": item_text(item.get("output"), &at)?})),
                    (_, Some(Value::String(role))) => Ok(json!({"role": role,
                        "content": item_text(item.get("content"), &at)?})),
                    _ => Err(ApiError::bad_request(format!("{at}: not an input item"))),
                }
            })
            .collect(),
        None | Some(Value::Null) => Err(ApiError::bad_request("Field required: 'input'")),
        Some(_) => Err(ApiError::bad_request(
            "'input' must be a string or a list of items",
        )),
    }
}

fn opt_str<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ApiError::bad_request(format!("'{key}' must be a string"))),
    }
}

/// The engine's answer to one prompt: its text, finish reason and usage, or the stream of it.
struct Run {
    rx: mpsc::UnboundedReceiver<SeqEvent>,
}

impl Run {
    fn start(
        st: &AppState,
        tokens: Vec<crate::cache::Token>,
        max_tokens: usize,
        lora: Option<Arc<str>>,
    ) -> Result<Run, ApiError> {
        if tokens.is_empty() {
            return Err(ApiError::bad_request("The prompt cannot be empty"));
        }
        let requested = tokens.len().saturating_add(max_tokens);
        if requested > st.max_len {
            return Err(ApiError::bad_request(format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the messages, {} in the completion). Please reduce the length of the messages or completion.",
                st.max_len, requested, tokens.len(), max_tokens
            )));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        st.engine.submit(SeqRequest {
            tokens,
            max_tokens,
            index: 0,
            events: tx,
            lora,
            skip_reading_prefix_cache: false,
        });
        Ok(Run { rx })
    }

    /// Every token, then the usage: the whole answer.
    async fn finish(mut self) -> Option<(String, &'static str, SeqUsage)> {
        let mut text = String::new();
        while let Some(ev) = self.rx.recv().await {
            match ev {
                SeqEvent::Token { text: t, .. } => text.push_str(&t),
                SeqEvent::Finished {
                    usage,
                    finish_reason,
                    ..
                } => return Some((text, finish_reason, usage)),
            }
        }
        None
    }
}

/// A JSON object with its keys in the order given: vLLM's answers are pydantic models, which
/// keep their fields' declaration order (a `ResponsesResponse` starts with its `id`), where
/// serde_json's `Map` sorts its keys. A value made with [`raw`] is written as it is.
fn ordered(pairs: &[(&str, J)]) -> String {
    let fields: Vec<String> = pairs
        .iter()
        .map(|(k, v)| match v {
            J::Raw(text) => format!("{}:{text}", json!(k)),
            J::Value(v) => format!("{}:{v}", json!(k)),
        })
        .collect();
    format!("{{{}}}", fields.join(","))
}

/// A field's value: JSON text already written ([`ordered`]), or a value to write.
enum J {
    Raw(String),
    Value(Value),
}

impl From<Value> for J {
    fn from(v: Value) -> J {
        J::Value(v)
    }
}

fn raw(text: String) -> J {
    J::Raw(text)
}

fn json_response(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn sse(name: &str, data: String) -> Result<Event, Infallible> {
    Ok(Event::default().event(name).data(data))
}

// ---------------------------------------------------------------------------------------------
// /v1/responses

/// `POST /v1/responses`.
pub async fn responses(State(st): State<AppState>, body: Bytes) -> Response {
    match responses_inner(st, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

fn responses_usage(u: &SeqUsage) -> String {
    ordered(&[
        ("input_tokens", J::from(json!(u.prompt_tokens))),
        (
            "input_tokens_details",
            raw(ordered(&[
                ("cached_tokens", J::from(json!(u.cached_tokens))),
                ("cache_write_tokens", J::from(json!(u.created_cache_tokens))),
                ("input_tokens_per_turn", J::from(json!([]))),
                ("cached_tokens_per_turn", J::from(json!([]))),
            ])),
        ),
        ("output_tokens", J::from(json!(u.completion_tokens))),
        (
            "output_tokens_details",
            raw(ordered(&[
                ("reasoning_tokens", J::from(json!(0))),
                ("tool_output_tokens", J::from(json!(0))),
                ("output_tokens_per_turn", J::from(json!([]))),
                ("tool_output_tokens_per_turn", J::from(json!([]))),
            ])),
        ),
        (
            "total_tokens",
            J::from(json!(u.prompt_tokens + u.completion_tokens)),
        ),
    ])
}

/// What every `ResponsesResponse` of one request repeats.
struct Head<'a> {
    id: &'a str,
    created: u64,
    model: &'a str,
    req: &'a Map<String, Value>,
    max_tokens: usize,
}

/// An output message as vLLM writes it (`status`: `in_progress` without text yet).
fn output_item(msg_id: &str, status: &str, text: Option<&str>) -> String {
    let content = text.map_or(
        json!([]),
        |t| json!([{"annotations": [], "text": t, "type": "output_text", "logprobs": null}]),
    );
    ordered(&[
        ("id", J::from(json!(msg_id))),
        ("content", J::from(content)),
        ("role", J::from(json!("assistant"))),
        ("status", J::from(json!(status))),
        ("type", J::from(json!("message"))),
        ("phase", J::from(Value::Null)),
    ])
}

/// vLLM's `ResponsesResponse`, in its fields' order (`id` first).
fn response_object(
    h: &Head<'_>,
    status: &str,
    output: Option<(&str, &str)>,
    usage: Option<&SeqUsage>,
) -> String {
    let field = |k: &str| h.req.get(k).cloned().unwrap_or(Value::Null);
    let tools = h
        .req
        .get("tools")
        .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()));
    let output = output.map_or_else(
        || "[]".to_string(),
        |(msg_id, text)| format!("[{}]", output_item(msg_id, "completed", Some(text))),
    );
    ordered(&[
        ("id", J::from(json!(h.id))),
        ("created_at", J::from(json!(h.created))),
        (
            "incomplete_details",
            J::from(if status == "incomplete" {
                json!({"reason": "max_output_tokens"})
            } else {
                Value::Null
            }),
        ),
        ("instructions", J::from(field("instructions"))),
        ("metadata", J::from(Value::Null)),
        ("model", J::from(json!(h.model))),
        ("object", J::from(json!("response"))),
        ("output", raw(output)),
        ("parallel_tool_calls", J::from(json!(true))),
        ("temperature", J::from(json!(1.0))),
        (
            "tool_choice",
            J::from(json!(if tools.is_some() { "auto" } else { "none" })),
        ),
        ("tools", J::from(tools.cloned().unwrap_or(json!([])))),
        ("top_p", J::from(json!(1.0))),
        ("background", J::from(json!(false))),
        ("max_output_tokens", J::from(json!(h.max_tokens))),
        ("max_tool_calls", J::from(Value::Null)),
        (
            "previous_response_id",
            J::from(field("previous_response_id")),
        ),
        ("prompt", J::from(Value::Null)),
        ("reasoning", J::from(Value::Null)),
        ("service_tier", J::from(json!("auto"))),
        ("status", J::from(json!(status))),
        ("text", J::from(Value::Null)),
        ("top_logprobs", J::from(Value::Null)),
        ("truncation", J::from(json!("disabled"))),
        (
            "usage",
            usage.map_or(J::from(Value::Null), |u| raw(responses_usage(u))),
        ),
        ("user", J::from(Value::Null)),
        ("presence_penalty", J::from(json!(0.0))),
        ("frequency_penalty", J::from(json!(0.0))),
        ("kv_transfer_params", J::from(Value::Null)),
        ("ec_transfer_params", J::from(Value::Null)),
        ("input_messages", J::from(Value::Null)),
        ("output_messages", J::from(Value::Null)),
    ])
}

async fn responses_inner(st: AppState, body: Bytes) -> Result<Response, ApiError> {
    let obj = parse_body(&body)?;
    let target = resolve_model(&st, &obj)?;
    let max_tokens = opt_count(&obj, "max_output_tokens")?.unwrap_or(st.default_max_tokens);
    let stream = opt_bool(&obj, "stream")?.unwrap_or(false);
    let store = opt_bool(&obj, "store")?.unwrap_or(true) && st.responses.enabled;
    let instructions = opt_str(&obj, "instructions")?;
    let previous = match opt_str(&obj, "previous_response_id")? {
        Some(id) => Some(st.responses.get(id).ok_or_else(|| response_not_found(id))?),
        None => None,
    };
    let mut messages = Vec::new();
    if let Some(i) = instructions.filter(|i| !i.is_empty()) {
        messages.push(json!({"role": "system", "content": i}));
    }
    if let Some(p) = &previous {
        let history = p
            .messages
            .iter()
            .filter(|m| m.get("role") != Some(&json!("system")));
        messages.extend(history.cloned());
        messages.push(json!({"role": "assistant", "content": p.text}));
    }
    messages.extend(input_messages(obj.get("input"))?);
    let mut chat = Map::new();
    if let Some(tools) = obj
        .get("tools")
        .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
    {
        chat.insert("tools".into(), tools.clone());
    }
    chat.insert("messages".into(), Value::Array(messages.clone()));
    let prompt = render_chat(&chat)?;
    // vLLM's `request_id` (its extra field), else `resp_` and a random_uuid's 16 hex digits.
    let id = match opt_str(&obj, "request_id")? {
        Some(id) => id.to_string(),
        None => format!("resp_{}", st.new_hex()),
    };
    let msg_id = format!("msg_{}", st.new_hex());
    let run = Run::start(&st, tokenize(&prompt), max_tokens, target.lora.clone())?;
    let created = unix_now();
    let model = target.name.clone();
    let status_of = |reason: &str| {
        if reason == "length" {
            "incomplete"
        } else {
            "completed"
        }
    };
    if !stream {
        let (text, reason, usage) = run
            .finish()
            .await
            .ok_or_else(|| ApiError::internal("engine stopped"))?;
        if store {
            st.responses.put(
                id.clone(),
                Stored {
                    messages,
                    text: text.clone(),
                },
            );
        }
        let head = Head {
            id: &id,
            created,
            model: &model,
            req: &obj,
            max_tokens,
        };
        return Ok(json_response(response_object(
            &head,
            status_of(reason),
            Some((&msg_id, &text)),
            Some(&usage),
        )));
    }
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(64);
    let responses = st.responses.clone();
    tokio::spawn(async move {
        let mut run = run;
        let head = Head {
            id: &id,
            created,
            model: &model,
            req: &obj,
            max_tokens,
        };
        let mut seq = 0u64;
        // Each event: its own fields, then `sequence_number` and `type`, as vLLM's models order them.
        let mut event = |name: &str, fields: Vec<(&str, J)>| {
            let mut all = fields;
            all.push(("sequence_number", J::from(json!(seq))));
            all.push(("type", J::from(json!(name))));
            seq += 1;
            (name.to_string(), ordered(&all))
        };
        let initial = response_object(&head, "in_progress", None, None);
        let part = |text: &str, logprobs: Value| json!({"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs});
        let opening = [
            event("response.created", vec![("response", raw(initial.clone()))]),
            event("response.in_progress", vec![("response", raw(initial))]),
            event(
                "response.output_item.added",
                vec![
                    ("item", raw(output_item(&msg_id, "in_progress", None))),
                    ("output_index", J::from(json!(0))),
                ],
            ),
            event(
                "response.content_part.added",
                vec![
                    ("content_index", J::from(json!(0))),
                    ("item_id", J::from(json!(msg_id))),
                    ("output_index", J::from(json!(0))),
                    ("part", J::from(part("", json!([])))),
                ],
            ),
        ];
        for (name, v) in opening {
            if tx.send(sse(&name, v)).await.is_err() {
                return;
            }
        }
        let mut text = String::new();
        while let Some(ev) = run.rx.recv().await {
            match ev {
                SeqEvent::Token { text: t, .. } => {
                    text.push_str(&t);
                    let (name, v) = event(
                        "response.output_text.delta",
                        vec![
                            ("content_index", J::from(json!(0))),
                            ("delta", J::from(json!(t))),
                            ("item_id", J::from(json!(msg_id))),
                            ("logprobs", J::from(json!([]))),
                            ("output_index", J::from(json!(0))),
                        ],
                    );
                    if tx.send(sse(&name, v)).await.is_err() {
                        return;
                    }
                }
                SeqEvent::Finished {
                    usage,
                    finish_reason,
                    ..
                } => {
                    if store {
                        responses.put(
                            id.clone(),
                            Stored {
                                messages: messages.clone(),
                                text: text.clone(),
                            },
                        );
                    }
                    let done = response_object(
                        &head,
                        status_of(finish_reason),
                        Some((&msg_id, &text)),
                        Some(&usage),
                    );
                    let closing = [
                        event(
                            "response.output_text.done",
                            vec![
                                ("content_index", J::from(json!(0))),
                                ("item_id", J::from(json!(msg_id))),
                                ("logprobs", J::from(json!([]))),
                                ("output_index", J::from(json!(0))),
                                ("text", J::from(json!(text))),
                            ],
                        ),
                        event(
                            "response.content_part.done",
                            vec![
                                ("content_index", J::from(json!(0))),
                                ("item_id", J::from(json!(msg_id))),
                                ("output_index", J::from(json!(0))),
                                ("part", J::from(part(&text, Value::Null))),
                            ],
                        ),
                        event(
                            "response.output_item.done",
                            vec![
                                ("item", raw(output_item(&msg_id, "completed", Some(&text)))),
                                ("output_index", J::from(json!(0))),
                            ],
                        ),
                        event("response.completed", vec![("response", raw(done))]),
                    ];
                    for (name, v) in closing {
                        if tx.send(sse(&name, v)).await.is_err() {
                            return;
                        }
                    }
                    return;
                }
            }
        }
    });
    Ok(Sse::new(ReceiverStream::new(rx)).into_response())
}

// ---------------------------------------------------------------------------------------------
// /v1/messages

/// Anthropic's error shape, as vLLM's `translate_error_response` writes it.
fn anthropic_error(e: ApiError) -> Response {
    let body = json!({"type": "error", "error": {"type": e.kind, "message": e.message}});
    (e.status, Json(body)).into_response()
}

/// A Messages API content as a chat message's: a string as it is; blocks as text parts.
fn block_content(content: Option<&Value>, at: &str) -> Result<Value, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(Value::Null),
        Some(Value::String(s)) => Ok(json!(s)),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .enumerate()
            .map(|(j, b)| {
                let text = match b.get("type").and_then(Value::as_str) {
                    Some("text") => match b.get("text") {
                        Some(Value::String(t)) => t.clone(),
                        _ => {
                            return Err(ApiError::bad_request(format!(
                                "{at}.content[{j}].text must be a string"
                            )))
                        }
                    },
                    Some("tool_use") => format!(
                        "<|tool_use|> {} {}",
                        b.get("name").and_then(Value::as_str).unwrap_or_default(),
                        b.get("input").cloned().unwrap_or(Value::Null)
                    ),
                    Some("tool_result") => match b.get("content") {
                        Some(Value::String(t)) => format!("<|tool_result|> {t}"),
                        Some(other) => format!("<|tool_result|> {other}"),
                        None => "<|tool_result|>".to_string(),
                    },
                    Some(t) => format!("<|{t}|>"),
                    None => {
                        return Err(ApiError::bad_request(format!(
                            "{at}.content[{j}].type must be a string"
                        )))
                    }
                };
                Ok(json!({"type": "text", "text": text}))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        Some(_) => Err(ApiError::bad_request(format!(
            "{at}.content must be a string or an array"
        ))),
    }
}

/// The Messages request as a chat request (system first).
fn messages_as_chat(obj: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let mut messages = Vec::new();
    match obj.get("system") {
        None | Some(Value::Null) => {}
        s @ Some(Value::String(_) | Value::Array(_)) => {
            messages.push(json!({"role": "system", "content": block_content(s, "system")?}))
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "'system' must be a string or an array",
            ))
        }
    }
    let list = match obj.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => return Err(ApiError::bad_request("'messages' must not be empty")),
        _ => return Err(ApiError::bad_request("Field required: 'messages'")),
    };
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = match m.get("role") {
            Some(Value::String(r)) if matches!(r.as_str(), "user" | "assistant" | "system") => r,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "{at}.role must be user, assistant or system"
                )))
            }
        };
        messages.push(json!({"role": role, "content": block_content(m.get("content"), &at)?}));
    }
    let mut chat = Map::new();
    if let Some(tools) = obj.get("tools").filter(|t| !t.is_null()) {
        if !tools.is_array() {
            return Err(ApiError::bad_request("'tools' must be an array"));
        }
        chat.insert("tools".into(), tools.clone());
    }
    chat.insert("messages".into(), Value::Array(messages));
    Ok(chat)
}

/// vLLM's `_build_anthropic_usage`.
fn anthropic_usage(u: &SeqUsage) -> String {
    let input = u
        .prompt_tokens
        .saturating_sub(u.cached_tokens)
        .saturating_sub(u.created_cache_tokens);
    ordered(&[
        ("input_tokens", J::from(json!(input))),
        ("output_tokens", J::from(json!(u.completion_tokens))),
        (
            "cache_creation_input_tokens",
            J::from(json!(u.created_cache_tokens)),
        ),
        ("cache_read_input_tokens", J::from(json!(u.cached_tokens))),
    ])
}

fn stop_reason(finish_reason: &str) -> &'static str {
    if finish_reason == "length" {
        "max_tokens"
    } else {
        "end_turn"
    }
}

/// `POST /v1/messages`.
pub async fn messages(State(st): State<AppState>, body: Bytes) -> Response {
    match messages_inner(st, body).await {
        Ok(r) => r,
        Err(e) => anthropic_error(e),
    }
}

async fn messages_inner(st: AppState, body: Bytes) -> Result<Response, ApiError> {
    let obj = parse_body(&body)?;
    let target = resolve_model(&st, &obj)?;
    let max_tokens = opt_count(&obj, "max_tokens")?.unwrap_or(st.default_max_tokens);
    let stream = opt_bool(&obj, "stream")?.unwrap_or(false);
    let prompt = tokenize(&render_chat(&messages_as_chat(&obj)?)?);
    let prompt_tokens = prompt.len();
    let run = Run::start(&st, prompt, max_tokens, target.lora.clone())?;
    let id = format!("chatcmpl-{}", st.new_uuid());
    let model = target.name.clone();
    if !stream {
        let (text, reason, usage) = run
            .finish()
            .await
            .ok_or_else(|| ApiError::internal("engine stopped"))?;
        // `exclude_none`: no `stop_sequence` when it is null.
        let body = ordered(&[
            ("id", J::from(json!(id))),
            ("type", J::from(json!("message"))),
            ("role", J::from(json!("assistant"))),
            ("content", J::from(json!([{"type": "text", "text": text}]))),
            ("model", J::from(json!(&*model))),
            ("stop_reason", J::from(json!(stop_reason(reason)))),
            ("usage", raw(anthropic_usage(&usage))),
        ]);
        return Ok(json_response(body));
    }
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        let mut run = run;
        let message = ordered(&[
            ("id", J::from(json!(id))),
            ("type", J::from(json!("message"))),
            ("role", J::from(json!("assistant"))),
            ("content", J::from(json!([]))),
            ("model", J::from(json!(&*model))),
            ("stop_reason", J::from(Value::Null)),
            ("stop_sequence", J::from(Value::Null)),
            (
                "usage",
                J::from(json!({"input_tokens": prompt_tokens, "output_tokens": 0})),
            ),
        ]);
        let opening = [
            (
                "message_start",
                ordered(&[
                    ("type", J::from(json!("message_start"))),
                    ("message", raw(message)),
                ]),
            ),
            (
                "content_block_start",
                ordered(&[
                    ("type", J::from(json!("content_block_start"))),
                    (
                        "content_block",
                        J::from(json!({"type": "text", "text": ""})),
                    ),
                    ("index", J::from(json!(0))),
                ]),
            ),
        ];
        for (name, v) in opening {
            if tx.send(sse(name, v)).await.is_err() {
                return;
            }
        }
        while let Some(ev) = run.rx.recv().await {
            match ev {
                SeqEvent::Token { text, .. } => {
                    let d = ordered(&[
                        ("type", J::from(json!("content_block_delta"))),
                        (
                            "delta",
                            J::from(json!({"type": "text_delta", "text": text})),
                        ),
                        ("index", J::from(json!(0))),
                    ]);
                    if tx.send(sse("content_block_delta", d)).await.is_err() {
                        return;
                    }
                }
                SeqEvent::Finished {
                    usage,
                    finish_reason,
                    ..
                } => {
                    let delta = ordered(&[
                        ("stop_reason", J::from(json!(stop_reason(finish_reason)))),
                        ("stop_sequence", J::from(Value::Null)),
                    ]);
                    let closing = [
                        (
                            "content_block_stop",
                            ordered(&[
                                ("type", J::from(json!("content_block_stop"))),
                                ("index", J::from(json!(0))),
                            ]),
                        ),
                        (
                            "message_delta",
                            ordered(&[
                                ("type", J::from(json!("message_delta"))),
                                ("delta", raw(delta)),
                                ("usage", raw(anthropic_usage(&usage))),
                            ]),
                        ),
                        (
                            "message_stop",
                            ordered(&[("type", J::from(json!("message_stop")))]),
                        ),
                    ];
                    for (name, v) in closing {
                        if tx.send(sse(name, v)).await.is_err() {
                            return;
                        }
                    }
                    return;
                }
            }
        }
    });
    Ok(Sse::new(ReceiverStream::new(rx)).into_response())
}
