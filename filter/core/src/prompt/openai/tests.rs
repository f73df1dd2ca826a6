use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn chat(messages: &str) -> PromptKey {
    let body = format!(r#"{{"model":"m","messages":{messages}}}"#);
    prompt_key(Endpoint::Chat, body.as_bytes(), 16, 4096).unwrap()
}

/// A body's key, with blocks of `block` bytes.
fn endpoint_key(endpoint: Endpoint, body: &[u8], block: usize) -> PromptKey {
    prompt_key(endpoint, body, block, 64).unwrap()
}

/// Two chats (their messages) whose keys must differ.
fn assert_chats_differ(a: &str, b: &str) {
    assert_ne!(chat(a).blocks, chat(b).blocks, "{a} ~ {b}");
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
fn a_lone_surrogate_routes_where_it_is_not_text() {
    // In a content part (raw JSON) or a field nobody reads: the key, as serde reads it.
    for body in [
        r#"{"messages":[{"role":"user","content":[{"type":"text","text":"\ud83d"}]}]}"#,
        r#"{"messages":[{"role":"user","content":"hi","name":"\udc00"}]}"#,
    ] {
        let key = prompt_key(Endpoint::Chat, body.as_bytes(), 16, 64);
        assert!(key.is_ok(), "{body}");
        assert_eq!(
            key,
            reference::prompt_key(Endpoint::Chat, body.as_bytes(), 16, 64)
        );
    }
}

#[test]
fn paths() {
    for (path, endpoint) in [
        ("/v1/chat/completions?x=1", Some(Endpoint::Chat)),
        ("/v1/completions", Some(Endpoint::Completions)),
        ("/v1/responses/", Some(Endpoint::Responses)),
        ("/v1/messages", Some(Endpoint::Messages)),
        ("/v1/messages/count_tokens", None),
        ("/v1/models", None),
    ] {
        assert_eq!(Endpoint::from_path(path), endpoint, "{path}");
    }
}

fn messages_key(body: &serde_json::Value) -> PromptKey {
    prompt_key(
        Endpoint::Messages,
        serde_json::to_string(body).unwrap().as_bytes(),
        16,
        4096,
    )
    .unwrap()
}

/// An agent's conversation on the Messages API, `turns` turns long: a system
/// prompt in text blocks, tools, and each step a `tool_use` answered by a
/// `tool_result` in the next user message.
fn agent_turns(turns: usize) -> serde_json::Value {
    use serde_json::json;
    let mut messages =
        vec![json!({"role": "user", "content": "Fix the failing test in parser.rs"})];
    for i in 0..turns.saturating_sub(1) {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("Step {i}: reading the file.")},
            {"type": "tool_use", "id": format!("toolu_{i}"), "name": "read_file", "input": {"path": "src/parser.rs"}},
        ]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": "fn parse() { todo!() }"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        ]}));
    }
    json!({
        "model": "m",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "You are a coding agent. Use the tools."}],
        "tools": [{"name": "read_file", "description": "Reads a file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
        "messages": messages,
    })
}

#[test]
fn a_messages_turn_extends_the_previous_turn() {
    let mut previous = messages_key(&agent_turns(1));
    assert!(!previous.continuation);
    for turns in 2..=6 {
        let next = messages_key(&agent_turns(turns));
        assert!(next.blocks.len() > previous.blocks.len(), "{turns}");
        assert_eq!(
            next.blocks[..previous.blocks.len()],
            previous.blocks[..],
            "turn {turns}"
        );
        assert_eq!(
            next.anchor, previous.anchor,
            "a conversation keeps its anchor"
        );
        assert!(next.continuation && next.reports_usage && !next.can_ask_usage);
        // Its history is the previous turn's stream, up to its last message.
        assert!(next.history_bytes > previous.total_bytes, "{turns}");
        previous = next;
    }
    assert_eq!(previous.max_output_tokens, Some(64));
    assert_eq!(previous.model.as_deref(), Some("m"));
}

#[test]
fn the_messages_system_and_tools_come_first_and_shape_the_key() {
    use serde_json::json;
    let key = |system: serde_json::Value, tools: bool| {
        let mut body = json!({"model": "m", "max_tokens": 8, "system": system,
                              "messages": [{"role": "user", "content": "a question long enough to fill blocks"}]});
        if tools {
            body["tools"] = json!([{"name": "f", "input_schema": {"type": "object"}}]);
        }
        messages_key(&body)
    };
    let text = key(json!("Be terse."), false);
    let blocks = key(json!([{"type": "text", "text": "Be terse."}]), false);
    let other = key(json!("Be verbose."), false);
    let tools = key(json!("Be terse."), true);
    assert_ne!(text.blocks[0], other.blocks[0]);
    assert_ne!(text.blocks[0], blocks.blocks[0]);
    assert_ne!(text.blocks[0], tools.blocks[0]);
    // The conversation's anchor is past the instructions: a shared system
    // prompt leaves conversations apart.
    assert!(text.anchor_offset > "Be terse.".len());
    // The top-level system is the same piece as a system message: same stream.
    let as_message = messages_key(&json!({"model": "m", "max_tokens": 8, "messages": [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "a question long enough to fill blocks"}]}));
    assert_eq!(as_message.blocks, text.blocks);
}

#[test]
fn a_messages_content_cannot_forge_a_boundary() {
    use serde_json::json;
    // One user message holding what two messages' stream would hold, as text
    // (its separators are escaped) and as a text block (raw JSON keeps the escape).
    let split = messages_key(&json!({"model": "m", "messages": [
        {"role": "user", "content": "ab"}, {"role": "assistant", "content": "cdefghijklmnopqrstuvwxyz"}]}));
    for forged in [
        json!("ab\u{1e}assistant\u{1f}cdefghijklmnopqrstuvwxyz"),
        json!([{"type": "text", "text": "ab\u{1e}assistant\u{1f}cdefghijklmnopqrstuvwxyz"}]),
    ] {
        let one =
            messages_key(&json!({"model": "m", "messages": [{"role": "user", "content": forged}]}));
        assert_ne!(one.blocks, split.blocks);
        assert!(!one.continuation);
    }
}

#[test]
fn messages_bodies_of_the_wrong_shape() {
    for body in [
        r#"{"model":"m","messages":[]}"#,
        r#"{"model":"m","messages":"hi"}"#,
        r#"{"model":"m","system":7,"messages":[{"role":"user","content":"hi"}]}"#,
        r#"{"model":"m","messages":[{"content":"hi"}]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":5}]}"#,
        r#"{"model":"m","stream":true,"stream":false,"messages":[{"role":"user","content":"hi"}]}"#,
    ] {
        assert_eq!(
            prompt_key(Endpoint::Messages, body.as_bytes(), 16, 64),
            Err(ParseError::Shape),
            "{body}"
        );
        assert_eq!(
            reference::prompt_key(Endpoint::Messages, body.as_bytes(), 16, 64),
            Err(ParseError::Shape),
            "{body}"
        );
    }
}

#[test]
fn a_responses_follow_up_names_its_predecessor_hashed() {
    let key = |extra: &str| {
        prompt_key(
            Endpoint::Responses,
            format!(r#"{{"model":"m","input":"and then?"{extra}}}"#).as_bytes(),
            16,
            64,
        )
        .unwrap()
    };
    let first = key("");
    assert_eq!(
        (first.previous_response, first.stores_response),
        (None, true)
    );
    let next = key(r#","previous_response_id":"resp_1""#);
    assert_eq!(
        next.previous_response,
        Some(crate::hash::response_id(b"resp_1"))
    );
    // Escaped, it is the same id.
    assert_eq!(
        key(r#","previous_response_id":"resp\u005f1""#).previous_response,
        next.previous_response
    );
    assert_eq!(
        key(r#","previous_response_id":null"#).previous_response,
        None
    );
    // The pod's usage report is read for a request that carries its whole prompt only.
    assert!(first.reports_usage && !next.reports_usage);
    assert!(key(r#","previous_response_id":null"#).reports_usage);
    assert!(!key(r#","store":false"#).stores_response);
    assert!(key(r#","store":true"#).stores_response);
    assert!(key(r#","store":null"#).stores_response);
    // The id does not change the prompt's hashes.
    assert_eq!(next.blocks, first.blocks);
    assert_eq!(
        prompt_key(
            Endpoint::Responses,
            br#"{"input":"x","previous_response_id":7}"#,
            16,
            64
        ),
        Err(ParseError::Shape)
    );
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
    // The turns answered so far, and where the instructions end (the first message starts).
    assert_eq!((first.answers, later.answers, tool.answers), (0, 1, 0));
    let alone = chat(r#"[{"role":"user","content":"q"}]"#);
    assert_eq!(alone.instructions_bytes, 0);
    assert!(first.instructions_bytes > 0 && first.instructions_bytes < first.anchor_offset);
    assert_eq!(later.instructions_bytes, first.instructions_bytes);
}

#[test]
fn different_tasks_get_different_anchors() {
    let a = chat(r#"[{"role":"system","content":"shared"},{"role":"user","content":"task one"}]"#);
    let b = chat(r#"[{"role":"system","content":"shared"},{"role":"user","content":"task two"}]"#);
    assert_ne!(a.anchor, b.anchor);
}

#[test]
fn string_and_escaped_content_hash_by_text() {
    let a = chat(r#"[{"role":"user","content":"line\nbreak and quote \" here, long enough"}]"#);
    let b = chat(
        "[{\"role\":\"user\",\"content\":\"line\\u000abreak and quote \\\" here, long enough\"}]",
    );
    assert_eq!(a, b);
}

#[test]
fn parts_content_and_tools_count() {
    assert_chats_differ(
        r#"[{"role":"user","content":[{"type":"text","text":"describe this image please"}]}]"#,
        r#"[{"role":"user","content":[{"type":"text","text":"describe that image please"}]}]"#,
    );
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
    assert_chats_differ(
        r#"[{"role":"user","content":"ab\u001euser\u001fcdefghijklmnopqrstuvwxyz"}]"#,
        r#"[{"role":"user","content":"ab"},{"role":"user","content":"cdefghijklmnopqrstuvwxyz"}]"#,
    );
}

#[test]
fn role_boundaries_are_unambiguous() {
    assert_chats_differ(
        r#"[{"role":"user","content":"ab"},{"role":"user","content":"cdefghijklmnopqrstuvwxyz"}]"#,
        r#"[{"role":"user","content":"abcd"},{"role":"user","content":"efghijklmnopqrstuvwxyz"}]"#,
    );
}

#[test]
fn completions_string_list_and_tokens() {
    let s = endpoint_key(
        Endpoint::Completions,
        br#"{"model":"m","prompt":"once upon a time there was"}"#,
        8,
    );
    assert_eq!(s.blocks.len(), 3);
    let list = endpoint_key(
        Endpoint::Completions,
        br#"{"model":"m","prompt":["a b c d e f g h i"]}"#,
        8,
    );
    assert!(!list.blocks.is_empty());
    let ids = endpoint_key(
        Endpoint::Completions,
        br#"{"model":"m","prompt":[1,2,3,4,5,6,7,8,9]}"#,
        8,
    );
    assert!(!ids.blocks.is_empty());
}

#[test]
fn responses_api() {
    let k = endpoint_key(Endpoint::Responses, br#"{"model":"m","instructions":"be terse and kind","input":[{"role":"user","content":"hi"}]}"#, 8);
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
    let c = endpoint_key(
        Endpoint::Completions,
        br#"{"model":"m","prompt":"abc","max_tokens":5}"#,
        16,
    );
    assert_eq!(c.max_output_tokens, Some(5));
    let r = endpoint_key(
        Endpoint::Responses,
        br#"{"model":"m","input":"abc","max_output_tokens":9}"#,
        16,
    );
    assert_eq!(r.max_output_tokens, Some(9));
}

#[test]
fn models_and_salts_do_not_share() {
    let a = endpoint_key(
        Endpoint::Completions,
        br#"{"model":"a","prompt":"0123456789abcdef"}"#,
        8,
    );
    let b = endpoint_key(
        Endpoint::Completions,
        br#"{"model":"b","prompt":"0123456789abcdef"}"#,
        8,
    );
    let c = endpoint_key(
        Endpoint::Completions,
        br#"{"model":"a","cache_salt":"s","prompt":"0123456789abcdef"}"#,
        8,
    );
    assert_ne!(a.blocks, b.blocks);
    assert_ne!(a.blocks, c.blocks);
}

#[test]
fn parameters_that_skip_the_pods_cache_are_seen_and_change_no_hash() {
    let key = |endpoint, extra: &str| {
        let body = match endpoint {
            Endpoint::Chat => format!(
                r#"{{"model":"m",{extra}"messages":[{{"role":"user","content":"0123456789abcdef"}}]}}"#
            ),
            _ => format!(r#"{{"model":"m",{extra}"prompt":"0123456789abcdef"}}"#),
        };
        prompt_key(endpoint, body.as_bytes(), 8, 64).unwrap()
    };
    for endpoint in [Endpoint::Chat, Endpoint::Completions] {
        let plain = key(endpoint, "");
        assert!(!plain.skips_cache_reads);
        for skips in [
            r#""prompt_logprobs":0,"#,
            r#""prompt_logprobs":5,"#,
            r#""echo":true,"logprobs":1,"#,
            r#""echo":true,"#,
            r#""return_logprob":true,"logprob_start_len":0,"#,
            r#""skip_reading_prefix_cache":true,"#,
        ] {
            let k = key(endpoint, skips);
            assert!(k.skips_cache_reads, "{endpoint:?} {skips}");
            assert_eq!(k.blocks, plain.blocks, "{skips}");
        }
        for reads in [
            r#""prompt_logprobs":null,"#,
            r#""echo":false,"logprobs":1,"#,
            r#""logprobs":5,"top_logprobs":5,"#,
            r#""logprob_start_len":-1,"#,
            r#""skip_reading_prefix_cache":false,"#,
        ] {
            assert!(
                !key(endpoint, reads).skips_cache_reads,
                "{endpoint:?} {reads}"
            );
        }
    }
}

#[test]
fn a_model_longer_than_any_served_name_is_shape() {
    let body = |model: &str| {
        format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#)
    };
    let at_limit = "m".repeat(crate::config::MAX_NAME_BYTES);
    let key = prompt_key(Endpoint::Chat, body(&at_limit).as_bytes(), 8, 64).unwrap();
    assert_eq!(key.model.as_deref(), Some(at_limit.as_str()));
    let long = "m".repeat(4 << 20);
    for endpoint in [Endpoint::Chat, Endpoint::Completions, Endpoint::Responses] {
        let b = body(&long).replace(
            r#""messages":[{"role":"user","content":"hi"}]"#,
            r#""messages":[{"role":"user","content":"hi"}],"prompt":"hi","input":"hi""#,
        );
        assert_eq!(
            prompt_key(endpoint, b.as_bytes(), 8, 64).map(|k| k.model),
            Err(ParseError::Shape),
            "{endpoint:?}"
        );
    }
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
        (deep.as_bytes(), ParseError::NotJson),
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

    /// A JSON value of any type, text over-represented.
    fn value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::{json, Value};
        let leaf = prop_oneof![
            3 => text().prop_map(Value::from),
            1 => Just(Value::Null),
            1 => any::<bool>().prop_map(Value::from),
            1 => any::<i32>().prop_map(Value::from),
            1 => (0.0..1e6f64).prop_map(|f| json!(f)),
        ];
        leaf.prop_recursive(3, 12, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map("[a-z]{1,4}|text|type", inner, 0..3)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Mostly what a field should hold, sometimes any value.
    fn mostly(
        typed: impl Strategy<Value = serde_json::Value> + 'static,
    ) -> BoxedStrategy<serde_json::Value> {
        prop_oneof![6 => typed, 1 => value()].boxed()
    }

    /// A prompt: a string, or an array of parts (or token ids).
    fn prompt() -> BoxedStrategy<serde_json::Value> {
        mostly(prop_oneof![
            text().prop_map(serde_json::Value::from),
            proptest::collection::vec(value(), 0..3).prop_map(serde_json::Value::from),
        ])
    }

    /// An object of some of `fields` (name, how likely present, value).
    fn object(
        fields: Vec<(&'static str, f64, BoxedStrategy<serde_json::Value>)>,
    ) -> BoxedStrategy<serde_json::Value> {
        fields
            .into_iter()
            .map(|(k, p, v)| proptest::option::weighted(p, v).prop_map(move |v| (k, v)))
            .collect::<Vec<_>>()
            .prop_map(|fields| {
                let present = fields
                    .into_iter()
                    .filter_map(|(k, v)| Some((k.to_string(), v?)));
                serde_json::Value::Object(present.collect())
            })
            .boxed()
    }

    /// A chat message: role, content and tool_calls (or not), and another field.
    fn message() -> BoxedStrategy<serde_json::Value> {
        let role = prop_oneof![
            Just(serde_json::json!("user")),
            Just(serde_json::json!("system")),
            Just(serde_json::json!("assistant")),
            text().prop_map(serde_json::Value::from),
        ];
        object(vec![
            ("role", 0.95, mostly(role)),
            ("content", 0.9, prompt()),
            ("tool_calls", 0.2, value().boxed()),
            ("name", 0.2, value().boxed()),
        ])
    }

    /// A request body: every field some endpoint reads, each present or
    /// not, mostly of its type, and a field none reads.
    fn request() -> BoxedStrategy<serde_json::Value> {
        let string = || mostly(text().prop_map(serde_json::Value::from));
        let number = || mostly((0..100_000u32).prop_map(serde_json::Value::from));
        let messages =
            mostly(proptest::collection::vec(message(), 0..4).prop_map(serde_json::Value::from));
        object(vec![
            ("model", 0.8, string()),
            ("cache_salt", 0.2, string()),
            ("messages", 0.8, messages),
            ("prompt", 0.5, prompt()),
            ("input", 0.5, prompt()),
            ("instructions", 0.3, string()),
            ("tools", 0.2, value().boxed()),
            ("max_tokens", 0.3, number()),
            ("max_completion_tokens", 0.2, number()),
            ("max_output_tokens", 0.2, number()),
            (
                "stream",
                0.3,
                mostly(any::<bool>().prop_map(serde_json::Value::from)),
            ),
            ("stream_options", 0.2, value().boxed()),
            ("prompt_logprobs", 0.1, value().boxed()),
            (
                "echo",
                0.1,
                mostly(any::<bool>().prop_map(serde_json::Value::from)),
            ),
            ("logprob_start_len", 0.1, value().boxed()),
            (
                "skip_reading_prefix_cache",
                0.1,
                mostly(any::<bool>().prop_map(serde_json::Value::from)),
            ),
            ("n", 0.2, value().boxed()),
            ("system", 0.3, prompt()),
            ("previous_response_id", 0.3, string()),
            (
                "store",
                0.2,
                mostly(any::<bool>().prop_map(serde_json::Value::from)),
            ),
        ])
    }

    /// A Messages API conversation: roles, and contents that are strings or
    /// arrays of blocks (text, tool_use, tool_result) with text drawn as above.
    fn block_messages() -> impl Strategy<Value = Vec<serde_json::Value>> {
        use serde_json::json;
        let block = prop_oneof![
            text().prop_map(|t| json!({"type": "text", "text": t})),
            text().prop_map(
                |t| json!({"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"q": t}})
            ),
            text().prop_map(
                |t| json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": t})
            ),
        ];
        let content = prop_oneof![
            text().prop_map(serde_json::Value::from),
            proptest::collection::vec(block, 0..3).prop_map(serde_json::Value::from),
        ];
        let role = prop_oneof![Just("user"), Just("assistant"), Just("system")];
        proptest::collection::vec(
            (role, content).prop_map(|(r, c)| json!({"role": r, "content": c})),
            1..5,
        )
    }

    /// With 1-byte blocks the chain names every byte of the canonical stream.
    fn stream(messages: &[(String, String)]) -> Vec<u64> {
        prompt_key(Endpoint::Chat, &body(messages), 1, 2048)
            .unwrap()
            .blocks
    }

    /// The key of `longer`, checked to start with the blocks of `shorter`'s.
    fn extending_key(
        endpoint: Endpoint,
        shorter: &[u8],
        longer: &[u8],
        block: usize,
    ) -> Result<PromptKey, TestCaseError> {
        let a = prompt_key(endpoint, shorter, block, 2048).unwrap();
        let b = prompt_key(endpoint, longer, block, 2048).unwrap();
        prop_assert_eq!(&b.blocks[..a.blocks.len()], &a.blocks[..]);
        Ok(b)
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config())]

        #[test]
        fn the_next_turn_extends_the_previous_turns_key(m in messages(), next in messages()) {
            let mut longer = m.clone();
            longer.extend(next);
            for block in [1, 16, 256] {
                extending_key(Endpoint::Chat, &body(&m), &body(&longer), block)?;
            }
        }

        #[test]
        fn the_next_messages_turn_extends_the_previous_turns_key(
            m in block_messages(), next in block_messages(), system in proptest::option::of(text()),
        ) {
            let body = |messages: &[serde_json::Value]| {
                let mut b = serde_json::json!({"model": "m", "max_tokens": 8, "messages": messages});
                if let Some(s) = &system {
                    b["system"] = serde_json::json!([{"type": "text", "text": s}]);
                }
                serde_json::to_vec(&b).unwrap()
            };
            let mut longer = m.clone();
            longer.extend(next);
            for block in [1, 16, 256] {
                let b = extending_key(Endpoint::Messages, &body(&m), &body(&longer), block)?;
                let serde = reference::prompt_key(Endpoint::Messages, &body(&longer), block, 2048);
                prop_assert_eq!(Ok(&b), serde.as_ref());
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

    proptest! {
        // Enough cases that every endpoint yields keys and each kind of error.
        #![proptest_config(proptest::test_runner::Config { cases: 1024, ..crate::testing::proptest_config() })]

        #[test]
        fn the_key_is_the_one_serde_json_reads(body in request(), pretty in any::<bool>(), e in 0..4u8, block in prop_oneof![Just(1usize), Just(16), Just(256)]) {
            // Any object of the fields the endpoints read (and others), each
            // of any type: the same key, or the same error, as the reference.
            let endpoint = [Endpoint::Chat, Endpoint::Completions, Endpoint::Responses, Endpoint::Messages][usize::from(e)];
            let bytes = if pretty {
                serde_json::to_vec_pretty(&body).unwrap()
            } else {
                serde_json::to_vec(&body).unwrap()
            };
            prop_assert_eq!(
                prompt_key(endpoint, &bytes, block, 64),
                reference::prompt_key(endpoint, &bytes, block, 64),
                "{}", String::from_utf8_lossy(&bytes)
            );
        }
    }
}
