//! OpenAI-style request bodies → canonical prompt bytes → [`PromptKey`].
//!
//! The body is read with [`crate::prompt::json`]'s reader, which validates it and
//! borrows every value from it: a prompt string's text is fed to the hasher
//! in the runs between its escapes, straight from the body, so a 128 KB
//! prompt is never copied before it is hashed. Fields the endpoint does not
//! name are skipped (checked, not read).
//!
//! Canonical stream, fed in order: `tools` (raw JSON), then per message
//! `0x1e role 0x1f content [0x1d tool_calls]`, where separator bytes inside a
//! role or content are escaped (`0x1b b`). Escaping, unlike a length prefix,
//! is prefix-preserving: a conversation's turn N+1 extends turn N's stream,
//! *and* a message extended with more text (a document followed by different
//! questions) extends the shorter message's stream — while no content can
//! forge a boundary. Strings are fed as their text, whatever the encoding
//! (escaped or not); arrays and `tools` as their raw JSON.
//!
//! JSON cannot carry a raw byte below 0x20 inside a string, so the
//! separators can only appear in text decoded from an escape: raw JSON and
//! the runs between escapes are fed as they are, and only decoded escapes
//! are checked for a separator.
//!
//! Reading, as a backend would: a field of the wrong type, a field named
//! twice (which copy would the backend read?), or a `model` longer than any
//! name a pod serves ([`MAX_NAME_BYTES`]), is [`ParseError::Shape`];
//! `null` is an absent optional field. An error of shape is told from one of
//! syntax by checking the whole body ([`crate::prompt::json::validate`]), so a body
//! that is not JSON is always `NotJson`, wherever its first problem is.
//! `reference` reads the same stream with serde_json, for the tests.
//!
//! | endpoint | stream |
//! |---|---|
//! | `/v1/chat/completions` | `tools`, then each message (a `system` or `developer` message is instructions; the first other one anchors the conversation) |
//! | `/v1/completions` | the prompt (a string, or an array's raw JSON) |
//! | `/v1/responses` | `tools`, `instructions` as a `system` piece, then `input` |
//! | `/v1/messages` (Anthropic's, which vLLM also serves) | `tools`, the top-level `system` (a string, or its text blocks' raw JSON) as a `system` piece, then each message as in chat; content blocks (`text`, `image`, `tool_use`, `tool_result`) are an array, fed as raw JSON like chat's content parts |
//!
//! The Messages API carries the whole conversation in every request, as chat
//! does, and its stream is built the same way: turn N+1 (turn N's messages,
//! the assistant's answer, the next user message) extends turn N's stream.
//! Its answers always carry usage, streamed or not (vLLM asks its chat
//! engine for `include_usage` on a stream), so `reports_usage` holds; its
//! report is read by [`crate::routing::feedback::report_for`].
//!
//! A `/v1/responses` request may continue a response the pod stored
//! (`previous_response_id`): the input then holds only the new turn, and the
//! history is the pod's. The id is hashed here ([`crate::hash::response_id`])
//! and routed by the record of who answered it ([`crate::fleet::responses`]).

use crate::config::MAX_NAME_BYTES;
use crate::hash::response_id;
use crate::prompt::json::{self, JsonReader, Piece, Str};
use crate::prompt::prefix::{PrefixHasher, PromptKey};
use std::borrow::Cow;

pub mod answer;
#[cfg(any(test, feature = "reference"))]
pub mod reference;

/// The OpenAI endpoints whose bodies carry a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/responses`.
    Responses,
    /// `POST /v1/messages` (Anthropic's Messages API, as vLLM serves it).
    Messages,
}

impl Endpoint {
    /// Recognises the path (query string ignored).
    pub fn from_path(path: &str) -> Option<Endpoint> {
        let path = path.split(['?', '#']).next().unwrap_or_default();
        match path.trim_end_matches('/') {
            "/v1/chat/completions" => Some(Endpoint::Chat),
            "/v1/completions" => Some(Endpoint::Completions),
            "/v1/responses" => Some(Endpoint::Responses),
            "/v1/messages" => Some(Endpoint::Messages),
            _ => None,
        }
    }
}

/// Why a body yielded no prompt key (each is counted as a fallback reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// Not valid JSON (or truncated, or nested too deeply).
    NotJson,
    /// Valid JSON without the fields this endpoint needs.
    Shape,
}

impl From<json::Syntax> for ParseError {
    fn from(_: json::Syntax) -> ParseError {
        ParseError::NotJson
    }
}

const RECORD: u8 = 0x1e;
const UNIT: u8 = 0x1f;
const GROUP: u8 = 0x1d;
const ESCAPE: u8 = 0x1b;

fn is_separator(b: u8) -> bool {
    matches!(b, RECORD | UNIT | GROUP | ESCAPE)
}

/// Feeds `bytes` with separator bytes escaped, in runs (no copy of the text).
fn feed_escaped(h: &mut PrefixHasher, mut bytes: &[u8]) {
    while let Some(i) = bytes.iter().position(|&b| is_separator(b)) {
        h.feed(&bytes[..i]);
        h.feed(&[ESCAPE, bytes[i]]);
        bytes = &bytes[i + 1..];
    }
    h.feed(bytes);
}

/// Starts a piece of the stream: `0x1e tag 0x1f`.
fn feed_tag(h: &mut PrefixHasher, tag: &[u8]) {
    h.feed(&[RECORD]);
    feed_escaped(h, tag);
    h.feed(&[UNIT]);
}

/// A JSON value as canonical bytes: a string's text, or raw JSON (arrays:
/// content parts, a list of prompts, token ids; `tools`).
enum Text<'a> {
    /// A string, fed as its text.
    Str(Str<'a>),
    /// Raw JSON of an array's elements, fed as `[e1,e2,...]` without the
    /// whitespace between them.
    Parts(Vec<&'a [u8]>),
}

impl Text<'_> {
    fn is_empty(&self) -> bool {
        match self {
            Text::Str(s) => s.raw.is_empty(),
            Text::Parts(p) => p.is_empty(),
        }
    }

    fn feed(&self, h: &mut PrefixHasher, offsets: &[u32]) {
        match self {
            Text::Str(s) => s.decode(offsets, |piece| match piece {
                // Raw runs hold no byte below 0x20, so no separator.
                Piece::Run(run) => h.feed(run),
                Piece::Char(c) => match u8::try_from(c) {
                    Ok(b) if b.is_ascii() && !is_separator(b) => h.feed_byte(b),
                    _ => feed_escaped(h, c.encode_utf8(&mut [0; 4]).as_bytes()),
                },
            }),
            Text::Parts(parts) => {
                h.feed(b"[");
                for (i, p) in parts.iter().enumerate() {
                    if i > 0 {
                        h.feed(b",");
                    }
                    h.feed(p);
                }
                h.feed(b"]");
            }
        }
    }
}

/// The hasher of a request for `model` under `salt`. A model name longer than
/// any served one is Shape: the request routes by fallback, and the name is
/// kept nowhere (a held request's key would otherwise carry megabytes of it).
fn hasher(
    model: Option<&str>,
    salt: Option<&str>,
    block: usize,
    anchor: usize,
) -> Result<PrefixHasher, ParseError> {
    let model = model.unwrap_or_default();
    if model.len() > MAX_NAME_BYTES {
        return Err(ParseError::Shape);
    }
    Ok(PrefixHasher::new(
        block,
        anchor,
        model.as_bytes(),
        salt.map(str::as_bytes),
    ))
}

/// A token limit as a count. Read raw, so a limit of the wrong type (the
/// backend will reject it) still leaves the prompt routable; anything but a
/// non-negative number is no limit.
fn tokens(v: Option<&[u8]>) -> Option<u32> {
    let t: f64 = std::str::from_utf8(v?).ok()?.parse().ok()?;
    (t.is_finite() && t >= 0.0).then(|| t.min(f64::from(u32::MAX)) as u32)
}

/// A stream whose request sets no `stream_options` at all.
fn can_ask_usage(stream: Option<&[u8]>, options: Option<&[u8]>) -> bool {
    stream == Some(b"true") && options.is_none()
}

/// Whether the answer will carry `usage`: a non-streamed one always, a stream
/// only when asked (`stream_options.include_usage`). Read raw, like `tokens`.
fn reports_usage(stream: Option<&[u8]>, options: Option<&[u8]>) -> bool {
    #[derive(serde::Deserialize)]
    struct Options {
        #[serde(default)]
        include_usage: bool,
    }
    if stream != Some(b"true") {
        return true;
    }
    options
        .and_then(|o| serde_json::from_slice::<Options>(o).ok())
        .is_some_and(|o| o.include_usage)
}

/// Reads an object's fields named in `names` (one list, or several read as
/// one), each once, by its index in them (`read`); others are skipped. Not an
/// object, or a name twice: Shape.
fn fields<'a>(
    r: &mut JsonReader<'a>,
    names: &[&[&str]],
    mut read: impl FnMut(&mut JsonReader<'a>, usize) -> Result<(), ParseError>,
) -> Result<(), ParseError> {
    if r.peek() != Some(b'{') {
        return Err(ParseError::Shape);
    }
    r.object()?;
    let mut seen = 0u32;
    let mut first = true;
    while let Some(key) = r.key(first)? {
        first = false;
        let name = key.text(r.offsets());
        match names.iter().flat_map(|n| n.iter()).position(|n| *n == name) {
            Some(i) if seen & (1 << i) != 0 => return Err(ParseError::Shape),
            Some(i) => {
                seen |= 1 << i;
                read(r, i)?;
            }
            None => {
                r.value()?;
            }
        }
    }
    Ok(())
}

/// A string; another type is Shape.
fn string<'a>(r: &mut JsonReader<'a>) -> Result<Str<'a>, ParseError> {
    match r.peek() {
        Some(b'"') => Ok(r.string()?),
        _ => Err(ParseError::Shape),
    }
}

/// A string, or `None` for null; another type is Shape.
fn optional_string<'a>(r: &mut JsonReader<'a>) -> Result<Option<Str<'a>>, ParseError> {
    if r.null()? {
        return Ok(None);
    }
    string(r).map(Some)
}

/// Any value's raw JSON, or `None` for null.
fn optional_raw<'a>(r: &mut JsonReader<'a>) -> Result<Option<&'a [u8]>, ParseError> {
    if r.null()? {
        return Ok(None);
    }
    Ok(Some(r.value()?))
}

/// A string or an array; another type is Shape.
fn text<'a>(r: &mut JsonReader<'a>) -> Result<Text<'a>, ParseError> {
    match r.peek() {
        Some(b'"') => Ok(Text::Str(r.string()?)),
        Some(b'[') => {
            r.array()?;
            let mut parts = Vec::new();
            while r.element(parts.is_empty())? {
                parts.push(r.value()?);
            }
            Ok(Text::Parts(parts))
        }
        _ => Err(ParseError::Shape),
    }
}

fn optional_text<'a>(r: &mut JsonReader<'a>) -> Result<Option<Text<'a>>, ParseError> {
    if r.null()? {
        return Ok(None);
    }
    text(r).map(Some)
}

/// One message of a conversation: chat's, or the Messages API's (whose
/// content is a string or an array of content blocks, and which has no
/// `tool_calls`).
struct Message<'a> {
    role: Cow<'a, str>,
    content: Option<Text<'a>>,
    tool_calls: Option<&'a [u8]>,
}

/// Chat's message fields; the Messages API reads the first two.
const MESSAGE: [&str; 3] = ["role", "content", "tool_calls"];

/// A list of messages, each read by its fields in `names` (a prefix of [`MESSAGE`]).
fn messages<'a>(r: &mut JsonReader<'a>, names: &[&str]) -> Result<Vec<Message<'a>>, ParseError> {
    if r.peek() != Some(b'[') {
        return Err(ParseError::Shape);
    }
    r.array()?;
    let mut all = Vec::new();
    while r.element(all.is_empty())? {
        let (mut role, mut content, mut tool_calls) = (None, None, None);
        fields(r, &[names], |r, i| {
            match i {
                0 => role = Some(string(r)?),
                1 => content = optional_text(r)?,
                _ => tool_calls = optional_raw(r)?,
            }
            Ok(())
        })?;
        all.push(Message {
            role: role.ok_or(ParseError::Shape)?.text(r.offsets()),
            content,
            tool_calls,
        });
    }
    Ok(all)
}

/// Feeds a conversation's messages (chat's and the Messages API's): each
/// `0x1e role 0x1f content [0x1d tool_calls]`, the first message that is not
/// instructions starting the conversation and anchoring it. Returns whether
/// it carries earlier turns, where its last message starts if so (the bytes
/// of its history), and how many assistant messages it carries.
fn feed_messages(h: &mut PrefixHasher, all: &[Message<'_>], offsets: &[u32]) -> (bool, usize, u32) {
    let (mut continuation, mut last_start, mut answers) = (false, 0, 0u32);
    for m in all {
        last_start = h.len();
        continuation |= matches!(m.role.as_ref(), "assistant" | "tool" | "function");
        answers = answers.saturating_add(u32::from(m.role.as_ref() == "assistant"));
        let turn = !matches!(m.role.as_ref(), "system" | "developer");
        if turn {
            h.begin_conversation();
        }
        feed_tag(h, m.role.as_bytes());
        if let Some(content) = &m.content {
            content.feed(h, offsets);
        }
        if let Some(calls) = m.tool_calls {
            h.feed(&[GROUP]);
            h.feed(calls);
        }
        // The first turn that is not instructions anchors the conversation.
        if turn {
            h.mark_anchor();
        }
    }
    (
        continuation,
        if continuation { last_start } else { 0 },
        answers,
    )
}

/// The fields every endpoint reads besides its prompt.
#[derive(Default)]
struct Common<'a> {
    model: Option<Str<'a>>,
    cache_salt: Option<Str<'a>>,
    max_tokens: Option<&'a [u8]>,
    stream: Option<&'a [u8]>,
    stream_options: Option<&'a [u8]>,
    /// The [`CACHE_READS`] fields, raw.
    cache_reads: [Option<&'a [u8]>; 4],
}

/// Parameters under which vLLM or SGLang computes the whole prompt again
/// (or most of it) whatever it holds: the list and its sources are in
/// [`crate::routing::feedback`]. Chat and completions read them, after their
/// own fields.
const CACHE_READS: [&str; 4] = [
    "prompt_logprobs",
    "echo",
    "logprob_start_len",
    "skip_reading_prefix_cache",
];

/// Whether the [`CACHE_READS`] fields, raw and in that order, make the pod
/// skip its prefix cache. Read raw, like `tokens`: the pod judges their types.
fn skips_cache_reads(fields: [Option<&[u8]>; 4]) -> bool {
    let [prompt_logprobs, echo, logprob_start_len, skip] = fields;
    prompt_logprobs.is_some()
        || echo == Some(b"true")
        || tokens(logprob_start_len).is_some()
        || skip == Some(b"true")
}

/// Turns a request body into its routing key.
pub fn prompt_key(
    endpoint: Endpoint,
    body: &[u8],
    block_bytes: usize,
    anchor_bytes: usize,
) -> Result<PromptKey, ParseError> {
    match read(endpoint, body, block_bytes, anchor_bytes) {
        // A body that is not JSON at all is NotJson, wherever its first problem is.
        Err(ParseError::Shape) if json::validate(body).is_err() => Err(ParseError::NotJson),
        result => result,
    }
}

/// [`Common`]'s fields as Chat and Completions name them, in [`common`]'s
/// order; the Messages API names the first four.
const STREAMED: [&str; 9] = [
    "model",
    "cache_salt",
    "max_tokens",
    "stream",
    "stream_options",
    CACHE_READS[0],
    CACHE_READS[1],
    CACHE_READS[2],
    CACHE_READS[3],
];

/// [`Common`]'s fields as the Responses API names them (its output limit is
/// `max_output_tokens`).
const RESPONSES: [&str; 3] = ["model", "cache_salt", "max_output_tokens"];

/// Reads a request body to its end: the fields named in `shared` (a prefix
/// of [`STREAMED`], or [`RESPONSES`]) into `c`, the endpoint's `own` by their
/// index in `own` (`read`).
fn request<'a>(
    r: &mut JsonReader<'a>,
    c: &mut Common<'a>,
    shared: &[&str],
    own: &[&str],
    mut read: impl FnMut(&mut JsonReader<'a>, usize) -> Result<(), ParseError>,
) -> Result<(), ParseError> {
    fields(r, &[shared, own], |r, i| {
        match i.checked_sub(shared.len()) {
            Some(i) => read(r, i),
            None => common(c, r, i),
        }
    })?;
    Ok(r.end()?)
}

/// `Common`'s field `i`, by its place in [`STREAMED`] (or [`RESPONSES`]).
fn common<'a>(c: &mut Common<'a>, r: &mut JsonReader<'a>, i: usize) -> Result<(), ParseError> {
    match i {
        0 => c.model = optional_string(r)?,
        1 => c.cache_salt = optional_string(r)?,
        2 => c.max_tokens = optional_raw(r)?,
        3 => c.stream = optional_raw(r)?,
        4 => c.stream_options = optional_raw(r)?,
        _ => c.cache_reads[i - 5] = optional_raw(r)?,
    }
    Ok(())
}

impl<'a> Common<'a> {
    /// The request's hasher, fed what comes before its turns: `tools` (raw
    /// JSON), then the instructions given apart from them, as a `system` piece.
    fn hasher(
        &self,
        offsets: &[u32],
        (block, anchor): (usize, usize),
        tools: Option<&[u8]>,
        system: Option<&Text<'_>>,
    ) -> Result<PrefixHasher, ParseError> {
        let model = self.model.map(|m| m.text(offsets));
        let salt = self.cache_salt.map(|s| s.text(offsets));
        let mut h = hasher(model.as_deref(), salt.as_deref(), block, anchor)?;
        if let Some(tools) = tools {
            feed_tag(&mut h, b"tools");
            h.feed(tools);
        }
        if let Some(system) = system {
            feed_tag(&mut h, b"system");
            system.feed(&mut h, offsets);
        }
        Ok(h)
    }

    /// The key's fields read from these.
    fn key(&self, offsets: &[u32], limit: Option<&[u8]>, h: PrefixHasher) -> PromptKey {
        PromptKey {
            model: self.model.map(|m| m.text(offsets).into_owned()),
            max_output_tokens: tokens(limit.or(self.max_tokens)),
            reports_usage: reports_usage(self.stream, self.stream_options),
            can_ask_usage: can_ask_usage(self.stream, self.stream_options),
            skips_cache_reads: skips_cache_reads(self.cache_reads),
            ..h.finish()
        }
    }
}

fn read(
    endpoint: Endpoint,
    body: &[u8],
    block_bytes: usize,
    anchor_bytes: usize,
) -> Result<PromptKey, ParseError> {
    let mut r = JsonReader::new(body);
    let mut c = Common::default();
    let blocks = (block_bytes, anchor_bytes);
    match endpoint {
        Endpoint::Chat => {
            let (mut completion_limit, mut tools, mut all) = (None, None, Vec::new());
            let own = ["max_completion_tokens", "tools", "messages"];
            request(&mut r, &mut c, &STREAMED, &own, |r, i| {
                match i {
                    0 => completion_limit = optional_raw(r)?,
                    1 => tools = optional_raw(r)?,
                    _ => all = messages(r, &MESSAGE)?,
                }
                Ok(())
            })?;
            if all.is_empty() {
                return Err(ParseError::Shape);
            }
            let offsets = r.offsets();
            let mut h = c.hasher(offsets, blocks, tools, None)?;
            let (continuation, history_bytes, answers) = feed_messages(&mut h, &all, offsets);
            Ok(PromptKey {
                continuation,
                history_bytes,
                answers,
                ..c.key(offsets, completion_limit, h)
            })
        }
        Endpoint::Completions => {
            let mut prompt = None;
            request(&mut r, &mut c, &STREAMED, &["prompt"], |r, _| {
                prompt = Some(text(r)?);
                Ok(())
            })?;
            let prompt = prompt.ok_or(ParseError::Shape)?;
            if prompt.is_empty() {
                return Err(ParseError::Shape);
            }
            let offsets = r.offsets();
            let mut h = c.hasher(offsets, blocks, None, None)?;
            h.begin_conversation();
            prompt.feed(&mut h, offsets);
            Ok(c.key(offsets, None, h))
        }
        Endpoint::Responses => {
            let (mut instructions, mut tools, mut input) = (None, None, None);
            let (mut previous, mut store) = (None, None);
            let own = [
                "instructions",
                "tools",
                "input",
                "previous_response_id",
                "store",
            ];
            request(&mut r, &mut c, &RESPONSES, &own, |r, i| {
                match i {
                    0 => instructions = optional_string(r)?.map(Text::Str),
                    1 => tools = optional_raw(r)?,
                    2 => input = Some(text(r)?),
                    3 => previous = optional_string(r)?,
                    _ => store = optional_raw(r)?,
                }
                Ok(())
            })?;
            let input = input.ok_or(ParseError::Shape)?;
            let offsets = r.offsets();
            let mut h = c.hasher(offsets, blocks, tools, instructions.as_ref())?;
            h.begin_conversation();
            feed_tag(&mut h, b"input");
            input.feed(&mut h, offsets);
            // Every answer carries its usage, streamed or not: nothing to ask for. A
            // follow-up's counts the whole stored conversation against a key of its new
            // input alone, a surplus every time that would hold off its pod's evictions
            // (`crate::routing::feedback`): only a request that carries its whole prompt is read.
            Ok(PromptKey {
                reports_usage: previous.is_none(),
                can_ask_usage: false,
                previous_response: previous.map(|p| response_id(p.text(offsets).as_bytes())),
                stores_response: stores(store),
                ..c.key(offsets, None, h)
            })
        }
        Endpoint::Messages => {
            let (mut system, mut tools, mut all) = (None, None, Vec::new());
            let own = ["system", "tools", "messages"];
            request(&mut r, &mut c, &STREAMED[..4], &own, |r, i| {
                match i {
                    0 => system = optional_text(r)?,
                    1 => tools = optional_raw(r)?,
                    _ => all = messages(r, &MESSAGE[..2])?,
                }
                Ok(())
            })?;
            if all.is_empty() {
                return Err(ParseError::Shape);
            }
            let offsets = r.offsets();
            let mut h = c.hasher(offsets, blocks, tools, system.as_ref())?;
            let (continuation, history_bytes, answers) = feed_messages(&mut h, &all, offsets);
            Ok(PromptKey {
                continuation,
                history_bytes,
                answers,
                // Streamed or not, vLLM's answer carries usage.
                reports_usage: true,
                can_ask_usage: false,
                ..c.key(offsets, None, h)
            })
        }
    }
}

/// Whether the pod stores the answer: `store` defaults to true (vLLM's
/// `ResponsesRequest.store`); read raw, only `false` says no.
fn stores(store: Option<&[u8]>) -> bool {
    store != Some(b"false")
}

#[cfg(test)]
mod tests;
