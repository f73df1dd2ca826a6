//! Workload generators: deterministic lists of sessions of pre-rendered requests.
//!
//! Every generator is a pure function of its options (and seed, or the trace
//! file), so two runs — e.g. round robin vs cache-aware routing — see the same
//! byte-identical request stream. All request bodies are rendered by the
//! generators, before the runner starts its clock, so the client does no JSON
//! work while measuring.
//!
//! # Model
//! A [`Workload`] is a list of [`Session`]s. A session starts at `start`
//! (offset from the run start) and sends its requests *sequentially*: request
//! `i + 1` is sent `think` after request `i` completed. Independent requests
//! (trace replay, uniform) are one-request sessions; agents and chats are
//! multi-request sessions whose prompts extend each other.
//!
//! # Tokens
//! The simulated server counts whitespace-separated words as tokens and caches
//! 16-token blocks, so "N tokens" below means N words. Assistant turns in agent
//! and chat histories are *synthesised* (deterministic words), not copied from
//! the server's replies: that keeps bodies pre-renderable and makes each step's
//! prompt an exact extension of the previous one, as a real agent's would be.
//!
//! | workload | file | sessions | arrivals | shared prefix |
//! |---|---|---|---|---|
//! | `conversation` | `trace.rs` | 1 per trace line | trace `timestamp / speedup` | trace `hash_ids` (512-token blocks, scaled) |
//! | `agent` | `agent.rs` | 1 per agent, K steps | agent `i` at `i * stagger` | system prompt + own growing history |
//! | `chat` | `chat.rs` | 1 per user, T turns | Poisson(`rate`) session starts, exp. think time | system prompt + own history |
//! | `uniform` | `uniform.rs` | 1 per request | Poisson(`rate`) | none |
//! | `mixed` | `mixed.rs` | 1 per batch worker, J jobs; 1 per chat | workers at 0, closed loop; chats Poisson(`rate`) | chats: system prompt; jobs: none |
//!
//! Bodies and synthetic text are made in `render.rs`. Input files are user
//! data: parse errors are reported with the line number, never unwrapped.

use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

mod agent;
mod chat;
mod mixed;
mod render;
mod trace;
mod uniform;

pub use agent::{agent, agent_conversations, AgentOpts};
pub use chat::{chat, ChatOpts};
pub use mixed::{mixed, MixedOpts, BATCH, INTERACTIVE, PRIORITY_HEADER};
pub use render::{render_chat, render_completion, RenderOpts};
pub use trace::{
    conversation, conversation_from_trace, parse_trace, synth_prompt, ConversationOpts, TraceLine,
    TRACE_BLOCK_TOKENS,
};
pub use uniform::{uniform, UniformOpts};

/// Which OpenAI endpoint a request targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `POST /v1/chat/completions` with `messages`.
    Chat,
    /// `POST /v1/completions` with a `prompt` string.
    Completions,
}

impl Api {
    /// Request path for this API.
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
        }
    }
}

/// One pre-rendered request.
#[derive(Clone, Debug)]
pub struct Request {
    /// Endpoint.
    pub api: Api,
    /// JSON body, rendered before the run.
    pub body: Bytes,
    /// Extra request headers (e.g. `x-session-id`).
    pub headers: Vec<(String, String)>,
    /// Wait after the previous request of the session completed (zero for the first).
    pub think: Duration,
    /// Prompt length in words (= sim tokens), counting message contents only.
    pub prompt_words: usize,
    /// `max_tokens` sent.
    pub max_tokens: u32,
}

/// A sequence of dependent requests.
#[derive(Clone, Debug)]
pub struct Session {
    /// Stable name, e.g. `agent-3`.
    pub id: String,
    /// Start offset from the beginning of the run.
    pub start: Duration,
    /// Requests in order; each waits for the previous one.
    pub requests: Vec<Request>,
}

/// A generated workload.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Workload name (`agent`, ...).
    pub name: &'static str,
    /// Sessions, sorted by start.
    pub sessions: Vec<Session>,
    /// Whether requests are agent steps (enables step latency reporting).
    pub agent_steps: bool,
}

impl Workload {
    /// Total number of requests across sessions.
    pub fn total_requests(&self) -> usize {
        self.sessions.iter().map(|s| s.requests.len()).sum()
    }
}

/// An OpenAI chat message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Text content.
    pub content: String,
    /// Tool calls made by an assistant message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// For `tool` messages: the call answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A plain text message.
    fn text(role: &str, content: String) -> Self {
        Self {
            role: role.into(),
            content,
            tool_calls: None,
            tool_call_id: None,
        }
    }
}

/// An OpenAI tool call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Call id.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Function name and JSON arguments.
    pub function: FunctionCall,
}

/// Function name and arguments of a tool call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// Function name.
    pub name: String,
    /// JSON-encoded arguments.
    pub arguments: String,
}

/// One step of a multi-request chat session (agent step, chat turn): the whole
/// history as `messages`, tagged `x-session-id` so session-affine policies can
/// pin the session.
fn chat_step(
    render_opts: &RenderOpts,
    session_id: &str,
    messages: &[Message],
    think: Duration,
    max_tokens: u32,
) -> Result<Request> {
    Ok(Request {
        api: Api::Chat,
        body: render_chat(render_opts, messages, max_tokens)?,
        headers: vec![("x-session-id".into(), session_id.to_string())],
        think,
        prompt_words: render::messages_words(messages),
        max_tokens,
    })
}

/// A non-negative millisecond count as a `Duration`.
fn ms(v: f64) -> Duration {
    Duration::from_secs_f64((v / 1000.0).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bodies(w: &Workload) -> Vec<Bytes> {
        w.sessions
            .iter()
            .flat_map(|s| s.requests.iter().map(|r| r.body.clone()))
            .collect()
    }

    fn starts(w: &Workload) -> Vec<(Duration, Vec<Duration>)> {
        w.sessions
            .iter()
            .map(|s| (s.start, s.requests.iter().map(|r| r.think).collect()))
            .collect()
    }

    pub(super) fn body_json(r: &Request) -> serde_json::Value {
        serde_json::from_slice(&r.body).unwrap()
    }

    /// Each request's `messages` array, in order.
    pub(super) fn message_arrays(s: &Session) -> Vec<Vec<serde_json::Value>> {
        s.requests
            .iter()
            .map(|r| body_json(r)["messages"].as_array().unwrap().clone())
            .collect()
    }

    pub(super) fn prompt_of(r: &Request) -> String {
        body_json(r)["prompt"].as_str().unwrap().to_string()
    }

    /// The same options give the same workload; another seed another.
    fn assert_seeded<O>(same: &O, reseeded: &O, generate: impl Fn(&O) -> Workload) {
        let (w1, w2) = (generate(same), generate(same));
        assert_eq!(bodies(&w1), bodies(&w2));
        assert_eq!(starts(&w1), starts(&w2));
        assert_ne!(bodies(&w1), bodies(&generate(reseeded)));
    }

    #[test]
    fn same_seed_same_bodies() {
        let ro = RenderOpts::default();
        let a = AgentOpts {
            seed: 43,
            ..AgentOpts::default()
        };
        assert_seeded(&AgentOpts::default(), &a, |o| agent(o, &ro).unwrap());
        let c = ChatOpts {
            seed: 1,
            ..ChatOpts::default()
        };
        assert_seeded(&ChatOpts::default(), &c, |o| chat(o, &ro).unwrap());
        let u = UniformOpts {
            seed: 1,
            ..UniformOpts::default()
        };
        assert_seeded(&UniformOpts::default(), &u, |o| uniform(o, &ro).unwrap());
        let m = MixedOpts {
            seed: 1,
            ..MixedOpts::default()
        };
        assert_seeded(&MixedOpts::default(), &m, |o| mixed(o, &ro).unwrap());
    }
}
