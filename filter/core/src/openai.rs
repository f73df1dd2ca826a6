//! OpenAI-style request bodies → canonical prompt bytes → [`PromptKey`].
//!
//! Parsing borrows from the body wherever JSON allows (strings without
//! escapes, raw `tools`/parts JSON), so a 128 KB prompt is not copied.
//! serde_json's recursion limit (128) turns hostile nesting into an error,
//! not a stack overflow.
//!
//! Canonical stream, fed in order: `tools` (raw JSON), then per message
//! `0x1e role 0x1f content [0x1d tool_calls]`, where separator bytes inside a
//! role or content are escaped (`0x1b b`). Escaping, unlike a length prefix,
//! is prefix-preserving: a conversation's turn N+1 extends turn N's stream,
//! *and* a message extended with more text (a document followed by different
//! questions) extends the shorter message's stream — while no content can
//! forge a boundary.
//!
//! JSON cannot carry a raw byte below 0x20 inside a string (serde_json rejects
//! it), so the separators can only appear in text decoded from an escape: raw
//! JSON and strings borrowed unescaped from the body are fed without the
//! escaping scan, which is most of the per-byte cost after hashing.

use crate::prefix::{PrefixHasher, PromptKey};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// The OpenAI endpoints whose bodies carry a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/responses`.
    Responses,
}

impl Endpoint {
    /// Recognises the path (query string ignored).
    pub fn from_path(path: &str) -> Option<Endpoint> {
        let path = path.split(['?', '#']).next().unwrap_or_default();
        match path.trim_end_matches('/') {
            "/v1/chat/completions" => Some(Endpoint::Chat),
            "/v1/completions" => Some(Endpoint::Completions),
            "/v1/responses" => Some(Endpoint::Responses),
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

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<Text<'a>>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Chat<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_completion_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream_options: Option<&'a RawValue>,
    #[serde(borrow, default)]
    cache_salt: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: Vec<Message<'a>>,
}

#[derive(Deserialize)]
struct Completion<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream_options: Option<&'a RawValue>,
    #[serde(borrow, default)]
    cache_salt: Option<Cow<'a, str>>,
    #[serde(borrow)]
    prompt: Text<'a>,
}

#[derive(Deserialize)]
struct Responses<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    max_output_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    cache_salt: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    instructions: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    input: Text<'a>,
}

const RECORD: u8 = 0x1e;
const UNIT: u8 = 0x1f;
const GROUP: u8 = 0x1d;
const ESCAPE: u8 = 0x1b;

/// Feeds `bytes` with separator bytes escaped, in runs (no copy of the text).
fn feed_escaped(h: &mut PrefixHasher, mut bytes: &[u8]) {
    while let Some(i) = bytes
        .iter()
        .position(|b| matches!(*b, RECORD | UNIT | GROUP | ESCAPE))
    {
        h.feed(&bytes[..i]);
        h.feed(&[ESCAPE, bytes[i]]);
        bytes = &bytes[i + 1..];
    }
    h.feed(bytes);
}

/// Whether `bytes` holds a byte in `ESCAPE..=UNIT` (a superset of the separators).
///
/// Eight bytes per step (SWAR): wasm32 has no SIMD by default, and a byte loop
/// over a 100 KB prompt with escapes (any newline) cost ~120 us in V8, more
/// than parsing it. No early exit: a separator is rare.
fn has_separator(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES * 0x80;
    const LOW7: u64 = ONES * 0x7f;
    // "A byte between m and n" (m < b < n, both <= 128, so no lane borrows or
    // carries into the next): bit 7 of lane b is set iff ESCAPE <= b <= UNIT.
    let between = |x: u64| {
        let low = x & LOW7;
        (ONES * (127 + u64::from(UNIT) + 1) - low)
            & !x
            & (low + ONES * (127 + 1 - u64::from(ESCAPE)))
            & HIGH
    };
    let chunks = bytes.chunks_exact(8);
    let tail = chunks.remainder();
    let any = chunks.fold(0, |any, c| {
        let mut word = [0u8; 8];
        word.copy_from_slice(c);
        any | between(u64::from_le_bytes(word))
    });
    any != 0 || tail.iter().any(|b| (ESCAPE..=UNIT).contains(b))
}

/// A JSON value as canonical bytes: a string's text, an array's raw elements
/// (content parts, a list of prompts, token ids), read in the one parsing pass.
enum Text<'a> {
    /// A string's text.
    Str {
        text: Cow<'a, str>,
        /// Whether it may hold separator bytes: only text decoded from escapes can.
        separators: bool,
    },
    /// Raw JSON (`tools`): no byte below 0x20 can occur in it.
    Raw(&'a RawValue),
    /// Raw JSON of each element of an array (content parts, prompts, token ids).
    Parts(Vec<&'a RawValue>),
}

impl<'a> Text<'a> {
    /// A message without content.
    const EMPTY: Text<'static> = Text::Str {
        text: Cow::Borrowed(""),
        separators: false,
    };

    /// A string serde_json decoded (owned only when it had escapes).
    fn decoded(text: Cow<'a, str>) -> Text<'a> {
        let separators = matches!(text, Cow::Owned(_)) && has_separator(text.as_bytes());
        Text::Str { text, separators }
    }

    fn is_empty(&self) -> bool {
        match self {
            Text::Str { text, .. } => text.is_empty(),
            Text::Raw(r) => r.get().is_empty(),
            Text::Parts(p) => p.is_empty(),
        }
    }

    fn feed(&self, h: &mut PrefixHasher) {
        match self {
            Text::Str {
                text,
                separators: true,
            } => feed_escaped(h, text.as_bytes()),
            Text::Str { text, .. } => h.feed(text.as_bytes()),
            Text::Raw(r) => h.feed(r.get().as_bytes()),
            Text::Parts(parts) => {
                h.feed(b"[");
                for (i, p) in parts.iter().enumerate() {
                    if i > 0 {
                        h.feed(b",");
                    }
                    h.feed(p.get().as_bytes());
                }
                h.feed(b"]");
            }
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or an array")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text::decoded(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text::decoded(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Text<'de>, E> {
                Ok(Text::decoded(Cow::Owned(v)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Text<'de>, A::Error> {
                let mut parts = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(p) = seq.next_element::<&'de RawValue>()? {
                    parts.push(p);
                }
                Ok(Text::Parts(parts))
            }
        }
        d.deserialize_any(V)
    }
}

fn feed_piece(h: &mut PrefixHasher, tag: &[u8], content: &Text<'_>) {
    h.feed(&[RECORD]);
    feed_escaped(h, tag);
    h.feed(&[UNIT]);
    content.feed(h);
}

fn hasher(
    model: &Option<Cow<'_, str>>,
    salt: &Option<Cow<'_, str>>,
    block: usize,
    anchor: usize,
) -> PrefixHasher {
    PrefixHasher::new(
        block,
        anchor,
        model.as_deref().unwrap_or_default().as_bytes(),
        salt.as_deref().map(str::as_bytes),
    )
}

/// A token limit as a count. Read raw, so a limit of the wrong type (the
/// backend will reject it) still leaves the prompt routable; anything but a
/// non-negative number is no limit.
fn tokens(v: Option<&RawValue>) -> Option<u32> {
    let t: f64 = v?.get().parse().ok()?;
    (t.is_finite() && t >= 0.0).then(|| t.min(f64::from(u32::MAX)) as u32)
}

/// A stream whose request sets no `stream_options` at all.
fn can_ask_usage(stream: Option<&RawValue>, options: Option<&RawValue>) -> bool {
    stream.is_some_and(|s| s.get() == "true") && options.is_none()
}

/// Whether the answer will carry `usage`: a non-streamed one always, a stream
/// only when asked (`stream_options.include_usage`). Read raw, like `tokens`.
fn reports_usage(stream: Option<&RawValue>, options: Option<&RawValue>) -> bool {
    #[derive(Deserialize)]
    struct Options {
        #[serde(default)]
        include_usage: bool,
    }
    if stream.is_none_or(|s| s.get() != "true") {
        return true;
    }
    options
        .and_then(|o| serde_json::from_str::<Options>(o.get()).ok())
        .is_some_and(|o| o.include_usage)
}

/// Turns a request body into its routing key.
pub fn prompt_key(
    endpoint: Endpoint,
    body: &[u8],
    block_bytes: usize,
    anchor_bytes: usize,
) -> Result<PromptKey, ParseError> {
    // Distinguish "not JSON at all" from "JSON of the wrong shape" for the stats.
    let classify = |e: serde_json::Error| {
        if e.is_data() {
            ParseError::Shape
        } else {
            ParseError::NotJson
        }
    };
    match endpoint {
        Endpoint::Chat => {
            let req: Chat = serde_json::from_slice(body).map_err(classify)?;
            if req.messages.is_empty() {
                return Err(ParseError::Shape);
            }
            let mut h = hasher(&req.model, &req.cache_salt, block_bytes, anchor_bytes);
            if let Some(tools) = req.tools {
                feed_piece(&mut h, b"tools", &Text::Raw(tools));
            }
            let (mut continuation, mut last_start) = (false, 0);
            for m in &req.messages {
                last_start = h.len();
                continuation |= matches!(m.role.as_ref(), "assistant" | "tool" | "function");
                let turn = !matches!(m.role.as_ref(), "system" | "developer");
                if turn {
                    h.begin_conversation();
                }
                let content = m.content.as_ref().unwrap_or(&Text::EMPTY);
                feed_piece(&mut h, m.role.as_bytes(), content);
                if let Some(calls) = m.tool_calls {
                    h.feed(&[GROUP]);
                    h.feed(calls.get().as_bytes());
                }
                // The first turn that is not instructions anchors the conversation.
                if turn {
                    h.mark_anchor();
                }
            }
            Ok(PromptKey {
                continuation,
                history_bytes: if continuation { last_start } else { 0 },
                model: req.model.map(Cow::into_owned),
                max_output_tokens: tokens(req.max_completion_tokens.or(req.max_tokens)),
                reports_usage: reports_usage(req.stream, req.stream_options),
                can_ask_usage: can_ask_usage(req.stream, req.stream_options),
                ..h.finish()
            })
        }
        Endpoint::Completions => {
            let req: Completion = serde_json::from_slice(body).map_err(classify)?;
            let prompt = req.prompt;
            if prompt.is_empty() {
                return Err(ParseError::Shape);
            }
            let mut h = hasher(&req.model, &req.cache_salt, block_bytes, anchor_bytes);
            h.begin_conversation();
            prompt.feed(&mut h);
            Ok(PromptKey {
                model: req.model.map(Cow::into_owned),
                max_output_tokens: tokens(req.max_tokens),
                reports_usage: reports_usage(req.stream, req.stream_options),
                can_ask_usage: can_ask_usage(req.stream, req.stream_options),
                ..h.finish()
            })
        }
        Endpoint::Responses => {
            let req: Responses = serde_json::from_slice(body).map_err(classify)?;
            let mut h = hasher(&req.model, &req.cache_salt, block_bytes, anchor_bytes);
            if let Some(tools) = req.tools {
                feed_piece(&mut h, b"tools", &Text::Raw(tools));
            }
            if let Some(instr) = req.instructions {
                feed_piece(&mut h, b"system", &Text::decoded(instr));
            }
            h.begin_conversation();
            feed_piece(&mut h, b"input", &req.input);
            Ok(PromptKey {
                model: req.model.map(Cow::into_owned),
                max_output_tokens: tokens(req.max_output_tokens),
                ..h.finish()
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn chat(messages: &str) -> PromptKey {
        let body = format!(r#"{{"model":"m","messages":{messages}}}"#);
        prompt_key(Endpoint::Chat, body.as_bytes(), 16, 4096).unwrap()
    }

    #[test]
    fn a_chat_key_matches_an_independent_implementation() {
        // Canonical bytes RS role US content per message (RS = 0x1e, US = 0x1f),
        // chained with Python's mmh3 as in `prefix`'s reference test.
        let body = br#"{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hello there, how are you today?"}]}"#;
        let k = prompt_key(Endpoint::Chat, body, 16, 2048).unwrap();
        assert_eq!(k.total_bytes, 59);
        assert_eq!(
            k.blocks,
            vec![
                0x5594_095a_a1ab_6daf,
                0x55ee_c20b_1098_adf9,
                0xb8c0_92ec_52fa_446d
            ]
        );
    }

    #[test]
    fn separator_scan_agrees_with_a_byte_loop() {
        // Every byte value in every lane of a word and in the tail, among
        // neighbours that are just outside the range.
        for len in [1, 7, 8, 9, 16, 19] {
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut bytes = vec![0x1a_u8; len];
                    if len > 1 {
                        bytes[(at + 1) % len] = 0x20;
                    }
                    bytes[at] = b;
                    let naive = bytes.iter().any(|b| (ESCAPE..=UNIT).contains(b));
                    assert_eq!(
                        has_separator(&bytes),
                        naive,
                        "len {len} at {at} byte {b:#x}"
                    );
                }
            }
        }
        assert!(!has_separator(b""));
        assert!(!has_separator("caf\u{e9} \u{1f600} line\n".as_bytes()));
    }

    #[test]
    fn escapes_decode_to_the_text_they_spell() {
        let key = |content: &str| {
            prompt_key(
                Endpoint::Completions,
                format!(r#"{{"prompt":"{content}"}}"#).as_bytes(),
                1,
                64,
            )
        };
        // Short escapes spell what their \u forms spell; a BMP character and a
        // surrogate pair spell the characters sent as they are.
        assert_eq!(
            key(r#"\"\\\/\b\f\n\r\t"#),
            key(r"\u0022\u005c\u002f\u0008\u000c\u000a\u000d\u0009")
        );
        assert_eq!(key(r"\u00e9\ud83d\ude00"), key("\u{e9}\u{1f600}"));
        // A separator from an escape is text: fed escaped, not as a boundary.
        let canonical = |feed: &dyn Fn(&mut PrefixHasher)| {
            let mut h = PrefixHasher::new(1, 64, b"", None);
            feed(&mut h);
            h.finish().blocks
        };
        let blocks = key(r"x\u001e").unwrap().blocks;
        assert_eq!(blocks, canonical(&|h| h.feed(&[b'x', ESCAPE, RECORD])));
        assert_ne!(blocks, canonical(&|h| h.feed(&[b'x', RECORD])));
        // A lone surrogate is not text, whatever follows it.
        for lone in [
            r"\ud800",
            r"\ud800x",
            r"\ud800\n",
            r"\ud800\u0041",
            r"\udc00",
        ] {
            assert_eq!(key(lone), Err(ParseError::NotJson), "{lone}");
        }
    }

    #[test]
    fn paths() {
        assert_eq!(
            Endpoint::from_path("/v1/chat/completions?x=1"),
            Some(Endpoint::Chat)
        );
        assert_eq!(
            Endpoint::from_path("/v1/completions"),
            Some(Endpoint::Completions)
        );
        assert_eq!(
            Endpoint::from_path("/v1/responses/"),
            Some(Endpoint::Responses)
        );
        assert_eq!(Endpoint::from_path("/v1/models"), None);
    }

    #[test]
    fn next_turn_extends_previous_turn() {
        let t1 = chat(
            r#"[{"role":"system","content":"You are a helpful assistant, be brief."},{"role":"user","content":"What is the capital of France?"}]"#,
        );
        let t2 = chat(
            r#"[{"role":"system","content":"You are a helpful assistant, be brief."},{"role":"user","content":"What is the capital of France?"},{"role":"assistant","content":"Paris."},{"role":"user","content":"And of Spain?"}]"#,
        );
        assert!(t1.blocks.len() >= 4);
        assert_eq!(t1.blocks[..], t2.blocks[..t1.blocks.len()]);
        assert_eq!(t1.anchor, t2.anchor, "a conversation keeps its anchor");
    }

    #[test]
    fn earlier_turns_mark_a_continuation() {
        let first = chat(r#"[{"role":"system","content":"s"},{"role":"user","content":"q"}]"#);
        let later = chat(
            r#"[{"role":"system","content":"s"},{"role":"user","content":"q"},{"role":"assistant","content":"a"},{"role":"user","content":"q2"}]"#,
        );
        let tool = chat(r#"[{"role":"user","content":"q"},{"role":"tool","content":"out"}]"#);
        assert!(!first.continuation);
        assert!(later.continuation && tool.continuation);
        // The history is everything before the last message, as the previous turn sent it.
        let previous = chat(
            r#"[{"role":"system","content":"s"},{"role":"user","content":"q"},{"role":"assistant","content":"a"}]"#,
        );
        assert_eq!(later.history_bytes, previous.total_bytes);
        assert_eq!(first.history_bytes, 0);
    }

    #[test]
    fn different_tasks_get_different_anchors() {
        let a =
            chat(r#"[{"role":"system","content":"shared"},{"role":"user","content":"task one"}]"#);
        let b =
            chat(r#"[{"role":"system","content":"shared"},{"role":"user","content":"task two"}]"#);
        assert_ne!(a.anchor, b.anchor);
    }

    #[test]
    fn string_and_escaped_content_hash_by_text() {
        let a = chat(r#"[{"role":"user","content":"line\nbreak and quote \" here, long enough"}]"#);
        let b = chat("[{\"role\":\"user\",\"content\":\"line\\u000abreak and quote \\\" here, long enough\"}]");
        assert_eq!(a, b);
    }

    #[test]
    fn parts_content_and_tools_count() {
        let a = chat(
            r#"[{"role":"user","content":[{"type":"text","text":"describe this image please"}]}]"#,
        );
        let b = chat(
            r#"[{"role":"user","content":[{"type":"text","text":"describe that image please"}]}]"#,
        );
        assert_ne!(a.blocks, b.blocks);
        let with_tools = prompt_key(
            Endpoint::Chat,
            br#"{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"describe this image please"}]}"#,
            16,
            4096,
        )
        .unwrap();
        assert_ne!(
            with_tools.blocks[0],
            chat(r#"[{"role":"user","content":"describe this image please"}]"#).blocks[0]
        );
    }

    #[test]
    fn an_extended_message_extends_the_stream() {
        let doc = "lorem ipsum dolor sit amet ".repeat(40);
        let a = chat(&format!(
            r#"[{{"role":"user","content":"{doc} first question"}}]"#
        ));
        let b = chat(&format!(
            r#"[{{"role":"user","content":"{doc} a different, longer question"}}]"#
        ));
        let shared = a
            .blocks
            .iter()
            .zip(&b.blocks)
            .take_while(|(x, y)| x == y)
            .count();
        assert!(
            shared >= doc.len() / 16 - 1,
            "{shared} of {} blocks shared",
            a.blocks.len()
        );
    }

    #[test]
    fn separator_bytes_in_content_cannot_forge_a_boundary() {
        // JSON escapes put the record and unit separators into the content itself.
        let a = chat(r#"[{"role":"user","content":"ab\u001euser\u001fcdefghijklmnopqrstuvwxyz"}]"#);
        let b = chat(
            r#"[{"role":"user","content":"ab"},{"role":"user","content":"cdefghijklmnopqrstuvwxyz"}]"#,
        );
        assert_ne!(a.blocks, b.blocks);
    }

    #[test]
    fn role_boundaries_are_unambiguous() {
        let a = chat(
            r#"[{"role":"user","content":"ab"},{"role":"user","content":"cdefghijklmnopqrstuvwxyz"}]"#,
        );
        let b = chat(
            r#"[{"role":"user","content":"abcd"},{"role":"user","content":"efghijklmnopqrstuvwxyz"}]"#,
        );
        assert_ne!(a.blocks, b.blocks);
    }

    #[test]
    fn completions_string_list_and_tokens() {
        let s = prompt_key(
            Endpoint::Completions,
            br#"{"model":"m","prompt":"once upon a time there was"}"#,
            8,
            64,
        )
        .unwrap();
        assert_eq!(s.blocks.len(), 3);
        let list = prompt_key(
            Endpoint::Completions,
            br#"{"model":"m","prompt":["a b c d e f g h i"]}"#,
            8,
            64,
        )
        .unwrap();
        assert!(!list.blocks.is_empty());
        let ids = prompt_key(
            Endpoint::Completions,
            br#"{"model":"m","prompt":[1,2,3,4,5,6,7,8,9]}"#,
            8,
            64,
        )
        .unwrap();
        assert!(!ids.blocks.is_empty());
    }

    #[test]
    fn responses_api() {
        let k = prompt_key(
            Endpoint::Responses,
            br#"{"model":"m","instructions":"be terse and kind","input":[{"role":"user","content":"hi"}]}"#,
            8,
            64,
        )
        .unwrap();
        assert!(!k.blocks.is_empty());
    }

    #[test]
    fn model_and_output_limit_are_read_whatever_their_form() {
        let chat = |extra: &str| {
            prompt_key(
                Endpoint::Chat,
                format!(r#"{{"model":"m",{extra}"messages":[{{"role":"user","content":"hi"}}]}}"#)
                    .as_bytes(),
                16,
                64,
            )
            .unwrap()
        };
        assert_eq!(chat("").max_output_tokens, None);
        assert_eq!(chat(r#""max_tokens":100,"#).max_output_tokens, Some(100));
        let both = chat(r#""max_tokens":100,"max_completion_tokens":7,"#);
        assert_eq!(
            (both.max_output_tokens, both.model.as_deref()),
            (Some(7), Some("m"))
        );
        // A limit of the wrong type or sign is no limit; the prompt still routes.
        for bad in [
            r#""max_tokens":"100","#,
            r#""max_tokens":-1,"#,
            r#""max_tokens":null,"#,
        ] {
            assert_eq!(chat(bad).max_output_tokens, None, "{bad}");
        }
        let huge = chat(r#""max_tokens":1e30,"#);
        assert_eq!(huge.max_output_tokens, Some(u32::MAX));
        let c = prompt_key(
            Endpoint::Completions,
            br#"{"model":"m","prompt":"abc","max_tokens":5}"#,
            16,
            64,
        )
        .unwrap();
        assert_eq!(c.max_output_tokens, Some(5));
        let r = prompt_key(
            Endpoint::Responses,
            br#"{"model":"m","input":"abc","max_output_tokens":9}"#,
            16,
            64,
        )
        .unwrap();
        assert_eq!(r.max_output_tokens, Some(9));
    }

    #[test]
    fn models_and_salts_do_not_share() {
        let a = prompt_key(
            Endpoint::Completions,
            br#"{"model":"a","prompt":"0123456789abcdef"}"#,
            8,
            64,
        )
        .unwrap();
        let b = prompt_key(
            Endpoint::Completions,
            br#"{"model":"b","prompt":"0123456789abcdef"}"#,
            8,
            64,
        )
        .unwrap();
        let c = prompt_key(
            Endpoint::Completions,
            br#"{"model":"a","cache_salt":"s","prompt":"0123456789abcdef"}"#,
            8,
            64,
        )
        .unwrap();
        assert_ne!(a.blocks, b.blocks);
        assert_ne!(a.blocks, c.blocks);
    }

    #[test]
    fn hostile_bodies_are_errors_not_panics() {
        let deep = "[".repeat(100_000);
        let cases: Vec<(&[u8], ParseError)> = vec![
            (b"", ParseError::NotJson),
            (
                b"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"trunc",
                ParseError::NotJson,
            ),
            (b"\xff\xfe\x00garbage", ParseError::NotJson),
            (
                br#"{"model":"m","messages":"not a list"}"#,
                ParseError::Shape,
            ),
            (br#"{"model":"m","messages":[]}"#, ParseError::Shape),
            (
                br#"{"model":7,"messages":[{"role":"user","content":"x"}]}"#,
                ParseError::Shape,
            ),
            (br#"[1,2,3]"#, ParseError::Shape),
            (deep.as_bytes(), ParseError::Shape),
        ];
        for (body, want) in cases {
            assert_eq!(
                prompt_key(Endpoint::Chat, body, 16, 64),
                Err(want),
                "{:?}",
                String::from_utf8_lossy(&body[..body.len().min(40)])
            );
        }
        let nested = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":{}}}]}}"#,
            "[".repeat(5000)
        );
        assert!(prompt_key(Endpoint::Chat, nested.as_bytes(), 16, 64).is_err());
        assert_eq!(
            prompt_key(Endpoint::Completions, br#"{"prompt":""}"#, 16, 64),
            Err(ParseError::Shape)
        );
    }

    #[cfg(not(target_arch = "wasm32"))]
    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Roles and contents drawn with the separator bytes over-represented.
        fn text() -> impl Strategy<Value = String> {
            proptest::collection::vec(
                prop_oneof![
                    Just("\u{1e}".to_string()),
                    Just("\u{1f}".to_string()),
                    Just("\u{1d}".to_string()),
                    Just("\u{1b}".to_string()),
                    // Control characters: JSON sends them as short or \u escapes.
                    Just("\t\r\u{8}\u{c}".to_string()),
                    Just("user".to_string()),
                    "[a-z \n\"\\\\]{0,6}",
                    any::<String>(),
                ],
                0..6,
            )
            .prop_map(|parts| parts.concat())
        }

        fn messages() -> impl Strategy<Value = Vec<(String, String)>> {
            let role = prop_oneof![
                Just("system".to_string()),
                Just("user".to_string()),
                Just("assistant".to_string()),
                text()
            ];
            proptest::collection::vec((role, text()), 1..6)
        }

        fn body(messages: &[(String, String)]) -> Vec<u8> {
            let m: Vec<serde_json::Value> = messages
                .iter()
                .map(|(r, c)| serde_json::json!({"role": r, "content": c}))
                .collect();
            serde_json::to_vec(&serde_json::json!({"model": "m", "messages": m})).unwrap()
        }

        /// With 1-byte blocks the chain names every byte of the canonical stream.
        fn stream(messages: &[(String, String)]) -> Vec<u64> {
            prompt_key(Endpoint::Chat, &body(messages), 1, 2048)
                .unwrap()
                .blocks
        }

        proptest! {
            #![proptest_config(crate::testing::proptest_config())]

            #[test]
            fn the_next_turn_extends_the_previous_turns_key(m in messages(), next in messages()) {
                let mut longer = m.clone();
                longer.extend(next);
                for block in [1, 16, 256] {
                    let a = prompt_key(Endpoint::Chat, &body(&m), block, 2048).unwrap();
                    let b = prompt_key(Endpoint::Chat, &body(&longer), block, 2048).unwrap();
                    prop_assert_eq!(&b.blocks[..a.blocks.len()], &a.blocks[..]);
                }
            }

            #[test]
            fn any_encoding_of_a_text_feeds_the_text_with_separators_escaped(t in text(), every in any::<bool>()) {
                // serde_json's encoding escapes little; the other escapes every
                // character (`\u` escapes, surrogate pairs for the astral planes)
                // or, for `every == false`, only the short ones.
                let mut escaped = String::new();
                for c in t.chars() {
                    match c {
                        '\n' if !every => escaped.push_str("\\n"),
                        '"' if !every => escaped.push_str("\\\""),
                        '\\' if !every => escaped.push_str("\\\\"),
                        c if every || c < ' ' => {
                            let mut units = [0u16; 2];
                            for u in c.encode_utf16(&mut units) {
                                escaped.push_str(&format!("\\u{u:04x}"));
                            }
                        }
                        c => escaped.push(c),
                    }
                }
                let mut reference = PrefixHasher::new(1, 2048, b"", None);
                feed_escaped(&mut reference, t.as_bytes());
                let expected = reference.finish().blocks;
                for raw in [serde_json::to_string(&t).unwrap(), format!("\"{escaped}\"")] {
                    let body = format!(r#"{{"prompt":{raw}}}"#);
                    match prompt_key(Endpoint::Completions, body.as_bytes(), 1, 2048) {
                        Ok(k) => prop_assert_eq!(&k.blocks, &expected, "{}", raw),
                        Err(e) => prop_assert!(t.is_empty() && e == ParseError::Shape, "{}: {:?}", raw, e),
                    }
                }
            }

            #[test]
            fn separators_in_content_never_forge_another_structure(a in messages(), b in messages()) {
                // Different messages, same canonical stream, would be a forged boundary
                // (a 64-bit hash collision aside).
                prop_assume!(a != b);
                prop_assert_ne!(stream(&a), stream(&b));
            }
        }
    }
}
