//! Workload generators: deterministic lists of sessions of pre-rendered requests.
//!
//! Every generator is a pure function of its options (and seed, or the trace
//! file), so two runs — e.g. round robin vs cache-aware routing — see the same
//! byte-identical request stream. All request bodies are rendered here, before
//! the runner starts its clock, so the client does no JSON work while measuring.
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
//! | workload | sessions | arrivals | shared prefix |
//! |---|---|---|---|
//! | `conversation` | 1 per trace line | trace `timestamp / speedup` | trace `hash_ids` (512-token blocks, scaled) |
//! | `agent` | 1 per agent, K steps | agent `i` at `i * stagger` | system prompt + own growing history |
//! | `chat` | 1 per user, T turns | Poisson(`rate`) session starts, exp. think time | system prompt + own history |
//! | `uniform` | 1 per request | Poisson(`rate`) | none |
//!
//! Input files are user data: parse errors are reported with the line number,
//! never unwrapped.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::rng::Rng;

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

/// Options shared by all body renderings.
#[derive(Clone, Debug)]
pub struct RenderOpts {
    /// `model` field.
    pub model: String,
    /// Send vLLM's `ignore_eos: true` so real servers generate exactly `max_tokens`.
    pub ignore_eos: bool,
}

impl Default for RenderOpts {
    fn default() -> Self {
        Self {
            model: "sim-llama-8b".into(),
            ignore_eos: false,
        }
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

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct ChatBody<'a> {
    model: &'a str,
    messages: &'a [Message],
    max_tokens: u32,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ignore_eos: bool,
}

#[derive(Serialize)]
struct CompletionBody<'a> {
    model: &'a str,
    prompt: &'a str,
    max_tokens: u32,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ignore_eos: bool,
}

/// Render a streaming chat-completions body.
pub fn render_chat(opts: &RenderOpts, messages: &[Message], max_tokens: u32) -> Result<Bytes> {
    let body = ChatBody {
        model: &opts.model,
        messages,
        max_tokens,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        ignore_eos: opts.ignore_eos,
    };
    Ok(Bytes::from(serde_json::to_vec(&body)?))
}

/// Render a streaming completions body.
pub fn render_completion(opts: &RenderOpts, prompt: &str, max_tokens: u32) -> Result<Bytes> {
    let body = CompletionBody {
        model: &opts.model,
        prompt,
        max_tokens,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        ignore_eos: opts.ignore_eos,
    };
    Ok(Bytes::from(serde_json::to_vec(&body)?))
}

fn render(opts: &RenderOpts, api: Api, prompt: &str, max_tokens: u32) -> Result<Bytes> {
    match api {
        Api::Completions => render_completion(opts, prompt, max_tokens),
        Api::Chat => render_chat(
            opts,
            &[Message::text("user", prompt.to_string())],
            max_tokens,
        ),
    }
}

fn count_words(s: &str) -> usize {
    s.split_whitespace().count()
}

fn messages_words(m: &[Message]) -> usize {
    m.iter().map(|m| count_words(&m.content)).sum()
}

const SYLLABLES: [&str; 16] = [
    "ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ber", "dan", "fel", "gor", "hin", "jul",
    "pex", "quo",
];

/// Words per line of generated text.
const LINE_WORDS: usize = 12;

/// What goes before word `n` (counted from 0) of generated text.
fn separator(n: usize) -> char {
    if n > 0 && n.is_multiple_of(LINE_WORDS) {
        '\n'
    } else {
        ' '
    }
}

/// Append `n` pseudo-words drawn from `rng` (vocabulary of 4096 words), in
/// lines of [`LINE_WORDS`]: real prompts have line breaks, and a JSON string
/// with escapes costs a parser about twice what plain text does, so text
/// without them would flatter the filter's measured cost.
fn push_words(out: &mut String, rng: &mut Rng, n: usize) {
    for i in 0..n {
        let r = rng.next_u64();
        if !out.is_empty() {
            out.push(separator(i));
        }
        for k in 0..3 {
            out.push_str(SYLLABLES[((r >> (4 * k)) & 15) as usize]);
        }
    }
}

fn words(rng: &mut Rng, n: usize) -> String {
    let mut s = String::with_capacity(n * 8);
    push_words(&mut s, rng, n);
    s
}

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64((v / 1000.0).max(0.0))
}

fn scaled(n: u64, scale: f64) -> usize {
    ((n as f64) * scale).round().max(1.0) as usize
}

// ---------------------------------------------------------------- conversation

/// Tokens per `hash_ids` block in the Mooncake trace.
pub const TRACE_BLOCK_TOKENS: usize = 512;

/// One line of the Mooncake trace.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct TraceLine {
    /// Arrival, ms since trace start.
    pub timestamp: f64,
    /// Prompt tokens.
    pub input_length: u64,
    /// Output tokens.
    pub output_length: u64,
    /// Ids of the prompt's 512-token blocks.
    pub hash_ids: Vec<u64>,
}

/// Parse a JSONL trace; blank lines are skipped, errors name the line.
pub fn parse_trace(text: &str) -> Result<Vec<TraceLine>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let t: TraceLine =
            serde_json::from_str(line).with_context(|| format!("trace line {}", i + 1))?;
        out.push(t);
    }
    Ok(out)
}

/// Options of the `conversation` workload.
#[derive(Clone, Debug)]
pub struct ConversationOpts {
    /// Divide trace timestamps by this.
    pub speedup: f64,
    /// Multiply token counts (input, block size) by this.
    pub length_scale: f64,
    /// Multiply output lengths by this (defaults to `length_scale`).
    pub output_scale: Option<f64>,
    /// Maximum number of requests (trace lines) to replay.
    pub limit: usize,
    /// Skip trace lines before this many seconds of trace time; later ones are shifted.
    pub start_offset_s: f64,
    /// Endpoint to send to.
    pub api: Api,
    /// Cap on `max_tokens` after scaling (0 = none).
    pub max_output: u32,
}

impl Default for ConversationOpts {
    fn default() -> Self {
        Self {
            speedup: 1.0,
            length_scale: 1.0,
            output_scale: None,
            limit: usize::MAX,
            start_offset_s: 0.0,
            api: Api::Completions,
            max_output: 0,
        }
    }
}

/// Synthesise the prompt of one trace line.
///
/// Block id `k` becomes `block_words` words `w{k}_{j}`, so equal ids give equal
/// text and a shared leading run of ids gives an equally long shared prefix.
/// The text is cut at `total_words`; if the ids do not cover `total_words`
/// (rounding), it is padded with words unique to `line_no`.
pub fn synth_prompt(
    hash_ids: &[u64],
    block_words: usize,
    total_words: usize,
    line_no: usize,
) -> String {
    use std::fmt::Write;
    let block_words = block_words.max(1);
    let mut s = String::with_capacity(total_words * 9);
    let mut n = 0;
    'outer: for &k in hash_ids {
        for j in 0..block_words {
            if n == total_words {
                break 'outer;
            }
            if n > 0 {
                s.push(separator(n));
            }
            // Writing to a String cannot fail.
            let _ = write!(s, "w{k}_{j}");
            n += 1;
        }
    }
    while n < total_words {
        if n > 0 {
            s.push(separator(n));
        }
        let _ = write!(s, "p{line_no}_{n}");
        n += 1;
    }
    s
}

/// Build the `conversation` workload from parsed trace lines.
pub fn conversation_from_trace(
    lines: &[TraceLine],
    opts: &ConversationOpts,
    render_opts: &RenderOpts,
) -> Result<Workload> {
    if opts.speedup <= 0.0 || !opts.speedup.is_finite() {
        bail!("--speedup must be > 0");
    }
    if opts.length_scale <= 0.0 || !opts.length_scale.is_finite() {
        bail!("--length-scale must be > 0");
    }
    let out_scale = opts.output_scale.unwrap_or(opts.length_scale);
    let block_words = scaled(TRACE_BLOCK_TOKENS as u64, opts.length_scale);
    let offset_ms = opts.start_offset_s * 1000.0;
    let mut sessions = Vec::new();
    for (i, line) in lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.timestamp >= offset_ms)
        .take(opts.limit)
    {
        let total = scaled(line.input_length, opts.length_scale);
        let prompt = synth_prompt(&line.hash_ids, block_words, total, i);
        let mut max_tokens = scaled(line.output_length, out_scale).min(u32::MAX as usize) as u32;
        if opts.max_output > 0 {
            max_tokens = max_tokens.min(opts.max_output);
        }
        sessions.push(Session {
            id: format!("conv-{i}"),
            start: ms((line.timestamp - offset_ms) / opts.speedup),
            requests: vec![Request {
                api: opts.api,
                body: render(render_opts, opts.api, &prompt, max_tokens)?,
                headers: Vec::new(),
                think: Duration::ZERO,
                prompt_words: total,
                max_tokens,
            }],
        });
    }
    sessions.sort_by_key(|s| s.start);
    Ok(Workload {
        name: "conversation",
        sessions,
        agent_steps: false,
    })
}

/// Load a trace file and build the `conversation` workload.
pub fn conversation(
    path: &Path,
    opts: &ConversationOpts,
    render_opts: &RenderOpts,
) -> Result<Workload> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading trace {}", path.display()))?;
    let lines = parse_trace(&text)?;
    conversation_from_trace(&lines, opts, render_opts)
}

// ---------------------------------------------------------------- agent

/// Options of the `agent` workload.
#[derive(Clone, Debug)]
pub struct AgentOpts {
    /// Concurrent agents.
    pub agents: usize,
    /// Sequential steps per agent.
    pub steps: usize,
    /// Shared system prompt length (tokens).
    pub system_tokens: usize,
    /// Per-agent task message length (tokens).
    pub task_tokens: usize,
    /// Synthesised assistant message length per step (tokens), also `max_tokens`.
    pub assistant_tokens: usize,
    /// Median tool output length (tokens); log-normal.
    pub tool_median: f64,
    /// Log-normal shape of tool output lengths.
    pub tool_sigma: f64,
    /// Cap on one tool output (tokens).
    pub tool_max: usize,
    /// Mean simulated tool run time between steps (ms, exponential).
    pub tool_ms: f64,
    /// Agent `i` starts at `i * stagger_ms`.
    pub stagger_ms: f64,
    /// Seed.
    pub seed: u64,
}

impl Default for AgentOpts {
    fn default() -> Self {
        Self {
            agents: 8,
            steps: 6,
            system_tokens: 1024,
            task_tokens: 64,
            assistant_tokens: 32,
            tool_median: 150.0,
            tool_sigma: 1.0,
            tool_max: 2000,
            tool_ms: 50.0,
            stagger_ms: 100.0,
            seed: 42,
        }
    }
}

/// The message lists sent by each agent at each step: `[agent][step] -> messages`.
pub fn agent_conversations(opts: &AgentOpts) -> Vec<Vec<Vec<Message>>> {
    let root = Rng::new(opts.seed);
    let mut sys_rng = root.fork(u64::MAX);
    let system = Message::text(
        "system",
        format!(
            "You are a coding agent. {}",
            words(&mut sys_rng, opts.system_tokens)
        ),
    );
    (0..opts.agents)
        .map(|a| {
            let mut rng = root.fork(a as u64);
            let task = Message::text(
                "user",
                format!("Task {a}: {}", words(&mut rng, opts.task_tokens)),
            );
            let mut history = vec![system.clone(), task];
            let mut steps = Vec::with_capacity(opts.steps);
            for s in 0..opts.steps {
                steps.push(history.clone());
                let call_id = format!("call_{a}_{s}");
                let args = format!("{{\"cmd\":\"{}\"}}", words(&mut rng, 3));
                history.push(Message {
                    role: "assistant".into(),
                    content: words(&mut rng, opts.assistant_tokens),
                    tool_calls: Some(vec![ToolCall {
                        id: call_id.clone(),
                        kind: "function".into(),
                        function: FunctionCall {
                            name: "run".into(),
                            arguments: args,
                        },
                    }]),
                    tool_call_id: None,
                });
                let len = (rng.lognormal(opts.tool_median, opts.tool_sigma).round() as usize)
                    .clamp(1, opts.tool_max.max(1));
                history.push(Message {
                    role: "tool".into(),
                    content: words(&mut rng, len),
                    tool_calls: None,
                    tool_call_id: Some(call_id),
                });
            }
            steps
        })
        .collect()
}

/// Build the `agent` workload.
pub fn agent(opts: &AgentOpts, render_opts: &RenderOpts) -> Result<Workload> {
    let max_tokens = opts.assistant_tokens.clamp(1, u32::MAX as usize) as u32;
    let root = Rng::new(opts.seed);
    let mut sessions = Vec::with_capacity(opts.agents);
    for (a, steps) in agent_conversations(opts).into_iter().enumerate() {
        let mut think_rng = root.fork(1 << 32 | a as u64);
        let id = format!("agent-{a}");
        let mut requests = Vec::with_capacity(steps.len());
        for (s, messages) in steps.iter().enumerate() {
            let think = if s == 0 {
                Duration::ZERO
            } else {
                ms(think_rng.exponential(opts.tool_ms))
            };
            requests.push(Request {
                api: Api::Chat,
                body: render_chat(render_opts, messages, max_tokens)?,
                headers: vec![("x-session-id".into(), id.clone())],
                think,
                prompt_words: messages_words(messages),
                max_tokens,
            });
        }
        sessions.push(Session {
            id,
            start: ms(a as f64 * opts.stagger_ms),
            requests,
        });
    }
    Ok(Workload {
        name: "agent",
        sessions,
        agent_steps: true,
    })
}

// ---------------------------------------------------------------- chat

/// Options of the `chat` workload.
#[derive(Clone, Debug)]
pub struct ChatOpts {
    /// Number of sessions (users).
    pub sessions: usize,
    /// Turns per session.
    pub turns: usize,
    /// Session arrival rate (sessions/s, Poisson).
    pub rate: f64,
    /// Mean think time between turns (ms, exponential).
    pub think_ms: f64,
    /// Shared system prompt length (tokens).
    pub system_tokens: usize,
    /// Median user message length (tokens, log-normal, sigma 0.6).
    pub user_median: f64,
    /// Assistant reply length (tokens): `max_tokens` and the synthesised history.
    pub reply_tokens: usize,
    /// Seed.
    pub seed: u64,
}

impl Default for ChatOpts {
    fn default() -> Self {
        Self {
            sessions: 24,
            turns: 4,
            rate: 4.0,
            think_ms: 500.0,
            system_tokens: 256,
            user_median: 60.0,
            reply_tokens: 48,
            seed: 42,
        }
    }
}

/// Build the `chat` workload.
pub fn chat(opts: &ChatOpts, render_opts: &RenderOpts) -> Result<Workload> {
    if opts.rate <= 0.0 || !opts.rate.is_finite() {
        bail!("--rate must be > 0");
    }
    let root = Rng::new(opts.seed);
    let mut arrivals = root.fork(u64::MAX - 1);
    let system = Message::text(
        "system",
        format!(
            "You are a helpful assistant. {}",
            words(&mut root.fork(u64::MAX), opts.system_tokens)
        ),
    );
    let max_tokens = opts.reply_tokens.clamp(1, u32::MAX as usize) as u32;
    let mut t_ms = 0.0;
    let mut sessions = Vec::with_capacity(opts.sessions);
    for c in 0..opts.sessions {
        if c > 0 {
            t_ms += arrivals.exponential(1000.0 / opts.rate);
        }
        let mut rng = root.fork(c as u64);
        let id = format!("chat-{c}");
        let mut history = vec![system.clone()];
        let mut requests = Vec::with_capacity(opts.turns);
        for turn in 0..opts.turns {
            let len = (rng.lognormal(opts.user_median, 0.6).round() as usize).clamp(1, 8192);
            history.push(Message::text("user", words(&mut rng, len)));
            let think = if turn == 0 {
                Duration::ZERO
            } else {
                ms(rng.exponential(opts.think_ms))
            };
            requests.push(Request {
                api: Api::Chat,
                body: render_chat(render_opts, &history, max_tokens)?,
                headers: vec![("x-session-id".into(), id.clone())],
                think,
                prompt_words: messages_words(&history),
                max_tokens,
            });
            history.push(Message::text(
                "assistant",
                words(&mut rng, opts.reply_tokens),
            ));
        }
        sessions.push(Session {
            id,
            start: ms(t_ms),
            requests,
        });
    }
    Ok(Workload {
        name: "chat",
        sessions,
        agent_steps: false,
    })
}

// ---------------------------------------------------------------- uniform

/// Options of the `uniform` workload.
#[derive(Clone, Debug)]
pub struct UniformOpts {
    /// Number of requests.
    pub requests: usize,
    /// Arrival rate (requests/s, Poisson).
    pub rate: f64,
    /// Prompt length (tokens).
    pub prompt_tokens: usize,
    /// `max_tokens`.
    pub output_tokens: u32,
    /// Endpoint.
    pub api: Api,
    /// Seed.
    pub seed: u64,
}

impl Default for UniformOpts {
    fn default() -> Self {
        Self {
            requests: 200,
            rate: 20.0,
            prompt_tokens: 512,
            output_tokens: 32,
            api: Api::Completions,
            seed: 42,
        }
    }
}

/// Build the `uniform` workload: independent random prompts, no shared prefix
/// (each prompt starts with a word unique to the request).
pub fn uniform(opts: &UniformOpts, render_opts: &RenderOpts) -> Result<Workload> {
    if opts.rate <= 0.0 || !opts.rate.is_finite() {
        bail!("--rate must be > 0");
    }
    let root = Rng::new(opts.seed);
    let mut arrivals = root.fork(u64::MAX);
    let mut t_ms = 0.0;
    let max_tokens = opts.output_tokens.max(1);
    let mut sessions = Vec::with_capacity(opts.requests);
    for i in 0..opts.requests {
        if i > 0 {
            t_ms += arrivals.exponential(1000.0 / opts.rate);
        }
        let mut rng = root.fork(i as u64);
        let mut prompt = format!("req{i}");
        push_words(&mut prompt, &mut rng, opts.prompt_tokens.saturating_sub(1));
        sessions.push(Session {
            id: format!("uniform-{i}"),
            start: ms(t_ms),
            requests: vec![Request {
                api: opts.api,
                body: render(render_opts, opts.api, &prompt, max_tokens)?,
                headers: Vec::new(),
                think: Duration::ZERO,
                prompt_words: opts.prompt_tokens.max(1),
                max_tokens,
            }],
        });
    }
    Ok(Workload {
        name: "uniform",
        sessions,
        agent_steps: false,
    })
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

    fn body_json(r: &Request) -> serde_json::Value {
        serde_json::from_slice(&r.body).unwrap()
    }

    #[test]
    fn same_seed_same_bodies() {
        let ro = RenderOpts::default();
        let a1 = agent(&AgentOpts::default(), &ro).unwrap();
        let a2 = agent(&AgentOpts::default(), &ro).unwrap();
        assert_eq!(bodies(&a1), bodies(&a2));
        assert_eq!(starts(&a1), starts(&a2));
        let a3 = agent(
            &AgentOpts {
                seed: 43,
                ..Default::default()
            },
            &ro,
        )
        .unwrap();
        assert_ne!(bodies(&a1), bodies(&a3));

        let c1 = chat(&ChatOpts::default(), &ro).unwrap();
        let c2 = chat(&ChatOpts::default(), &ro).unwrap();
        assert_eq!(bodies(&c1), bodies(&c2));
        assert_eq!(starts(&c1), starts(&c2));
        assert_ne!(
            bodies(&c1),
            bodies(
                &chat(
                    &ChatOpts {
                        seed: 1,
                        ..Default::default()
                    },
                    &ro
                )
                .unwrap()
            )
        );

        let u1 = uniform(&UniformOpts::default(), &ro).unwrap();
        let u2 = uniform(&UniformOpts::default(), &ro).unwrap();
        assert_eq!(bodies(&u1), bodies(&u2));
        assert_eq!(starts(&u1), starts(&u2));
        assert_ne!(
            bodies(&u1),
            bodies(
                &uniform(
                    &UniformOpts {
                        seed: 1,
                        ..Default::default()
                    },
                    &ro
                )
                .unwrap()
            )
        );
    }

    const TRACE: &str = r#"{"timestamp": 0, "input_length": 1800, "output_length": 100, "hash_ids": [0, 1, 2, 3]}

{"timestamp": 2000, "input_length": 1100, "output_length": 3, "hash_ids": [0, 1, 7]}
{"timestamp": 500, "input_length": 300, "output_length": 1, "hash_ids": [9]}
"#;

    fn prompt_of(r: &Request) -> String {
        body_json(r)["prompt"].as_str().unwrap().to_string()
    }

    #[test]
    fn conversation_synthesis_shares_exact_prefix_blocks() {
        let lines = parse_trace(TRACE).unwrap();
        assert_eq!(lines.len(), 3);
        let opts = ConversationOpts {
            length_scale: 0.125,
            speedup: 2.0,
            ..Default::default()
        };
        let w = conversation_from_trace(&lines, &opts, &RenderOpts::default()).unwrap();
        // Sorted by start: line 0 (0 ms), line 2 (250 ms), line 1 (1000 ms).
        let ids: Vec<_> = w.sessions.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["conv-0", "conv-2", "conv-1"]);
        assert_eq!(w.sessions[1].start, Duration::from_millis(250));
        assert_eq!(w.sessions[2].start, Duration::from_millis(1000));

        let a = prompt_of(&w.sessions[0].requests[0]);
        let b = prompt_of(&w.sessions[2].requests[0]);
        let c = prompt_of(&w.sessions[1].requests[0]);
        let (a, b, c): (Vec<&str>, Vec<&str>, Vec<&str>) = (
            a.split_whitespace().collect(),
            b.split_whitespace().collect(),
            c.split_whitespace().collect(),
        );
        // Lengths: input_length * 0.125.
        assert_eq!(a.len(), 225);
        assert_eq!(b.len(), 138);
        assert_eq!(c.len(), 38);
        assert_eq!(w.sessions[0].requests[0].prompt_words, 225);
        // Block = 512 * 0.125 = 64 words; a and b share ids [0, 1] → exactly 128 words.
        let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        assert_eq!(common, 128);
        // Different first block → nothing shared.
        assert_eq!(a.iter().zip(&c).take_while(|(x, y)| x == y).count(), 0);
        // max_tokens scaled, min 1.
        assert_eq!(w.sessions[0].requests[0].max_tokens, 13);
        assert_eq!(w.sessions[1].requests[0].max_tokens, 1);
        let j = body_json(&w.sessions[0].requests[0]);
        assert_eq!(j["stream"], true);
        assert_eq!(j["stream_options"]["include_usage"], true);
        assert_eq!(j["model"], "sim-llama-8b");
    }

    #[test]
    fn conversation_limit_offset_and_chat_api() {
        let lines = parse_trace(TRACE).unwrap();
        let opts = ConversationOpts {
            start_offset_s: 0.4,
            limit: 1,
            api: Api::Chat,
            ..Default::default()
        };
        let w = conversation_from_trace(&lines, &opts, &RenderOpts::default()).unwrap();
        assert_eq!(w.sessions.len(), 1);
        // First line at/after 400 ms in file order is line 1 (2000 ms), shifted by 400.
        assert_eq!(w.sessions[0].id, "conv-1");
        assert_eq!(w.sessions[0].start, Duration::from_millis(1600));
        let j = body_json(&w.sessions[0].requests[0]);
        assert_eq!(j["messages"][0]["role"], "user");
        assert_eq!(
            j["messages"][0]["content"]
                .as_str()
                .unwrap()
                .split_whitespace()
                .count(),
            1100
        );
    }

    #[test]
    fn trace_errors_name_the_line() {
        let err = parse_trace("{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}\nnot json").unwrap_err();
        assert!(format!("{err:#}").contains("line 2"), "{err:#}");
    }

    #[test]
    fn synth_pads_when_ids_do_not_cover_length() {
        let p = synth_prompt(&[5], 2, 4, 9);
        assert_eq!(p, "w5_0 w5_1 p9_2 p9_3");
        assert_eq!(synth_prompt(&[5, 6], 3, 4, 0), "w5_0 w5_1 w5_2 w6_0");
    }

    #[test]
    fn agent_context_grows_and_extends_previous_step() {
        let opts = AgentOpts {
            agents: 3,
            steps: 5,
            ..Default::default()
        };
        let convs = agent_conversations(&opts);
        assert_eq!(convs.len(), 3);
        for steps in &convs {
            assert_eq!(steps.len(), 5);
            for pair in steps.windows(2) {
                let (prev, next) = (&pair[0], &pair[1]);
                assert_eq!(next.len(), prev.len() + 2);
                assert_eq!(&next[..prev.len()], &prev[..]);
                assert_eq!(next[prev.len()].role, "assistant");
                assert_eq!(next[prev.len() + 1].role, "tool");
            }
        }
        // All agents share the system prompt, tasks differ.
        assert_eq!(convs[0][0][0], convs[1][0][0]);
        assert_ne!(convs[0][0][1], convs[1][0][1]);

        let w = agent(&opts, &RenderOpts::default()).unwrap();
        assert!(w.agent_steps);
        for s in &w.sessions {
            let lens: Vec<usize> = s.requests.iter().map(|r| r.prompt_words).collect();
            assert!(lens.windows(2).all(|p| p[1] > p[0]), "{lens:?}");
            assert!(s.requests.iter().all(|r| r
                .headers
                .iter()
                .any(|(k, v)| k == "x-session-id" && v == &s.id)));
            // The rendered bodies carry the same growing message arrays.
            let msgs: Vec<serde_json::Value> = s
                .requests
                .iter()
                .map(|r| body_json(r)["messages"].clone())
                .collect();
            for pair in msgs.windows(2) {
                let (a, b) = (pair[0].as_array().unwrap(), pair[1].as_array().unwrap());
                assert_eq!(&b[..a.len()], &a[..]);
            }
        }
    }

    #[test]
    fn tool_outputs_are_skewed() {
        let opts = AgentOpts {
            agents: 20,
            steps: 10,
            ..Default::default()
        };
        let mut lens: Vec<usize> = agent_conversations(&opts)
            .iter()
            .filter_map(|steps| steps.last())
            .flat_map(|m| {
                m.iter()
                    .filter(|m| m.role == "tool")
                    .map(|m| count_words(&m.content))
            })
            .collect();
        lens.sort_unstable();
        let median = lens[lens.len() / 2] as f64;
        let mean = lens.iter().sum::<usize>() as f64 / lens.len() as f64;
        assert!(mean > median * 1.2, "mean {mean} median {median}");
    }

    #[test]
    fn chat_turns_extend_history_and_uniform_shares_nothing() {
        let w = chat(
            &ChatOpts {
                sessions: 3,
                turns: 3,
                ..Default::default()
            },
            &RenderOpts::default(),
        )
        .unwrap();
        for s in &w.sessions {
            let msgs: Vec<serde_json::Value> = s
                .requests
                .iter()
                .map(|r| body_json(r)["messages"].clone())
                .collect();
            for pair in msgs.windows(2) {
                let (a, b) = (pair[0].as_array().unwrap(), pair[1].as_array().unwrap());
                assert_eq!(b.len(), a.len() + 2);
                assert_eq!(&b[..a.len()], &a[..]);
            }
        }
        assert!(w.sessions.windows(2).all(|p| p[0].start <= p[1].start));

        let u = uniform(
            &UniformOpts {
                requests: 50,
                prompt_tokens: 20,
                ..Default::default()
            },
            &RenderOpts::default(),
        )
        .unwrap();
        let prompts: Vec<String> = u
            .sessions
            .iter()
            .map(|s| prompt_of(&s.requests[0]))
            .collect();
        for (i, p) in prompts.iter().enumerate() {
            assert_eq!(p.split_whitespace().count(), 20);
            // Lines of 12 words, as real text has line breaks (JSON escapes).
            assert_eq!(p.lines().count(), 2, "{p:?}");
            for q in &prompts[i + 1..] {
                assert_ne!(p.split_whitespace().next(), q.split_whitespace().next());
            }
        }
    }
}
