//! Canonical prompt bytes → a chain of block hashes.
//!
//! The prompt is fed piece by piece (never concatenated) into fixed-size byte
//! blocks. Block `i` hashes to
//!
//! ```text
//! h_0     = murmur3_x64_128(model ‖ 0x00 ‖ cache_salt, SEED)      (the "model" hash)
//! h_{i+1} = murmur3_x64_128(le64(h_i) ‖ block_i, SEED)  (low 64 bits)
//! ```
//!
//! so `h_i` identifies the whole prefix up to block `i`, two models or salts
//! never share a hash, and turn N+1 of a conversation (whose canonical bytes
//! extend turn N's) repeats turn N's hashes. Only full blocks enter the
//! index: a partial tail block could not be compared with later requests.
//!
//! The *anchor* is a placement key that stays stable across a conversation's
//! turns: the chained hash at the end of the first non-system message, but at
//! most `anchor_bytes` past the start of that message (a long first message,
//! e.g. a shared document, then anchors on the document, not the question).
//! Unstructured prompts start their conversation at byte 0. Everything up to
//! the anchor is the *head*: a cache match that ends inside the head only
//! says "this shares instructions with other conversations", not "this
//! conversation lives there". Rendezvous hashing on the anchor places a new
//! conversation the same way on every gateway replica.
//!
//! | parameter     | default | why |
//! |---------------|---------|-----|
//! | `block_bytes` | 256     | ≈ 64 tokens: fine enough to see a shared system prompt, coarse enough that a 128k-token prompt is ~2k hashes |
//! | `hash::SEED`  | `0x7772_6d72` | fixed: hashes must agree across VMs, restarts and gateway replicas |
//!
//! Cost: one murmur3 pass over the prompt bytes plus 8 bytes per block. The
//! block is hashed in place behind the previous hash (`buf = le64(h_i) ‖ block_i`),
//! with `mur3`'s slice-based murmur3: the `murmur3` crate's `Read`-based API,
//! same function and outputs, is 3-5x slower per byte (measured natively on a
//! 100 KB prompt), and hashing is most of a large request's cost in the filter.

/// The routing key of one request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PromptKey {
    /// Chained hashes of the full blocks, in prompt order.
    pub blocks: Vec<u64>,
    /// Placement key, stable across a conversation's turns.
    pub anchor: u64,
    /// Canonical bytes up to the anchor (the head shared with other conversations).
    pub anchor_offset: usize,
    /// Canonical prompt length in bytes.
    pub total_bytes: usize,
    /// The prompt carries earlier turns of its conversation (assistant or tool messages).
    pub continuation: bool,
    /// Canonical bytes before the last message: what the pod that served the
    /// previous turn holds already (0 when not a continuation).
    pub history_bytes: usize,
    /// Canonical bytes before the conversation's first message (its
    /// instructions; 0 without): a match past them holds part of that message.
    pub instructions_bytes: usize,
    /// Assistant messages it carries: the turns of its conversation answered so far.
    pub answers: u32,
    /// The request's `model` (a served model name or a LoRA adapter).
    pub model: Option<String>,
    /// The most tokens it may generate (`max_tokens`, `max_completion_tokens`,
    /// `max_output_tokens`), when it says.
    pub max_output_tokens: Option<u32>,
    /// The answer will carry a usage report: not streamed, or streamed with
    /// `stream_options.include_usage`.
    pub reports_usage: bool,
    /// A stream that sets no `stream_options`: the filter may ask for usage
    /// there (`feedback.request_usage`) without overriding a client's choice.
    pub can_ask_usage: bool,
    /// Its parameters make the pod compute the prompt again whatever it
    /// holds (`prompt_logprobs`, `echo`, ...): its report of cached tokens
    /// says nothing of the pod's cache ([`crate::routing::feedback`]).
    pub skips_cache_reads: bool,
    /// `/v1/responses`: its `previous_response_id`, hashed
    /// ([`crate::hash::response_id`]): the stored response it continues, which
    /// only the pod that answered it holds.
    pub previous_response: Option<u64>,
    /// `/v1/responses` whose answer the pod stores (`store` is not false): the
    /// answer's id is worth remembering.
    pub stores_response: bool,
}

use crate::hash::murmur;

/// Bytes in front of each block in the hash buffer: the previous hash.
const PREV: usize = 8;

/// Streams canonical prompt bytes into a [`PromptKey`].
#[derive(Debug)]
pub struct PrefixHasher {
    prev: u64,
    /// `le64(prev) ‖ the current block`, filled up to `fill`.
    buf: Vec<u8>,
    fill: usize,
    blocks: Vec<u64>,
    total: usize,
    anchor: Option<(u64, usize)>,
    anchor_limit: usize,
    conversation_start: Option<usize>,
}

impl PrefixHasher {
    /// Starts a chain seeded by the model (a LoRA adapter is a model) and salt.
    pub fn new(block_bytes: usize, anchor_limit: usize, model: &[u8], salt: Option<&[u8]>) -> Self {
        let block_bytes = block_bytes.max(1);
        let mut seed_bytes = Vec::with_capacity(model.len() + 1 + salt.map_or(0, <[u8]>::len));
        seed_bytes.extend_from_slice(model);
        seed_bytes.push(0);
        seed_bytes.extend_from_slice(salt.unwrap_or_default());
        let seed = murmur(&seed_bytes);
        let mut buf = vec![0; PREV + block_bytes];
        buf[..PREV].copy_from_slice(&seed.to_le_bytes());
        PrefixHasher {
            prev: seed,
            buf,
            fill: PREV,
            blocks: Vec::new(),
            total: 0,
            anchor: None,
            anchor_limit: anchor_limit.max(1),
            conversation_start: None,
        }
    }

    /// Appends bytes to the canonical stream.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        if let (None, Some(start)) = (self.anchor, self.conversation_start) {
            let limit = start + self.anchor_limit;
            if self.total + bytes.len() >= limit {
                let (head, tail) =
                    bytes.split_at(limit.saturating_sub(self.total).min(bytes.len()));
                self.feed_raw(head);
                self.mark_anchor();
                bytes = tail;
            }
        }
        self.feed_raw(bytes);
    }

    /// Appends one byte: an escape's character between two runs of text
    /// (a copy call per byte costs more than the byte).
    pub fn feed_byte(&mut self, b: u8) {
        if self.anchor.is_none() && self.conversation_start.is_some() {
            return self.feed(&[b]);
        }
        self.total += 1;
        if let Some(slot) = self.buf.get_mut(self.fill) {
            *slot = b;
            self.fill += 1;
        }
        if self.fill == self.buf.len() {
            self.end_block();
        }
    }

    fn feed_raw(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len();
        while !bytes.is_empty() {
            let take = (self.buf.len() - self.fill).min(bytes.len());
            let (now, rest) = bytes.split_at(take);
            if let Some(room) = self.buf.get_mut(self.fill..self.fill + take) {
                room.copy_from_slice(now);
            }
            self.fill += take;
            bytes = rest;
            if self.fill == self.buf.len() {
                self.end_block();
            }
        }
    }

    fn end_block(&mut self) {
        self.prev = murmur(&self.buf);
        self.blocks.push(self.prev);
        self.buf[..PREV].copy_from_slice(&self.prev.to_le_bytes());
        self.fill = PREV;
    }

    /// Marks where the conversation-specific part starts (after shared instructions):
    /// the anchor falls at most `anchor_limit` bytes after it.
    pub fn begin_conversation(&mut self) {
        if self.anchor.is_none() && self.conversation_start.is_none() {
            self.conversation_start = Some(self.total);
        }
    }

    /// Fixes the anchor at the current position, unless it is already set.
    pub fn mark_anchor(&mut self) {
        if self.anchor.is_none() {
            self.anchor = Some((self.position_hash(), self.total));
        }
    }

    /// Hash of everything fed so far, including a partial block.
    fn position_hash(&self) -> u64 {
        if self.fill == PREV {
            self.prev
        } else {
            murmur(&self.buf[..self.fill])
        }
    }

    /// Bytes fed so far.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Whether nothing was fed.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Ends the stream; a prompt shorter than the anchor limit anchors on all of it.
    pub fn finish(self) -> PromptKey {
        let (anchor, anchor_offset) = self
            .anchor
            .unwrap_or_else(|| (self.position_hash(), self.total));
        PromptKey {
            blocks: self.blocks,
            anchor,
            anchor_offset,
            total_bytes: self.total,
            continuation: false,
            history_bytes: 0,
            instructions_bytes: self.conversation_start.unwrap_or(0),
            answers: 0,
            model: None,
            max_output_tokens: None,
            reports_usage: false,
            can_ask_usage: false,
            skips_cache_reads: false,
            previous_response: None,
            stores_response: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn key(block: usize, pieces: &[&[u8]]) -> PromptKey {
        let mut h = PrefixHasher::new(block, 1 << 20, b"m", None);
        h.begin_conversation();
        for p in pieces {
            h.feed(p);
        }
        h.finish()
    }

    #[test]
    fn only_full_blocks_are_hashed() {
        assert_eq!(key(4, &[b"abcdefghij"]).blocks.len(), 2);
        assert_eq!(key(4, &[b"abc"]).blocks.len(), 0);
    }

    #[test]
    fn piecewise_feeding_equals_one_piece() {
        assert_eq!(
            key(4, &[b"ab", b"cdefg", b"hijkl"]),
            key(4, &[b"abcdefghijkl"])
        );
    }

    #[test]
    fn an_extension_repeats_the_prefix_hashes() {
        let a = key(4, &[b"abcdefgh"]);
        let b = key(4, &[b"abcdefghijklmnop"]);
        assert_eq!(a.blocks[..], b.blocks[..2]);
    }

    #[test]
    fn hashes_are_chained() {
        // Same second block after different first blocks must differ.
        let a = key(4, &[b"aaaaXXXX"]);
        let b = key(4, &[b"bbbbXXXX"]);
        assert_ne!(a.blocks[1], b.blocks[1]);
    }

    #[test]
    fn model_and_salt_separate_chains() {
        let mut a = PrefixHasher::new(4, 64, b"m1", None);
        let mut b = PrefixHasher::new(4, 64, b"m2", None);
        let mut c = PrefixHasher::new(4, 64, b"m1", Some(b"tenant"));
        for h in [&mut a, &mut b, &mut c] {
            h.feed(b"abcdefgh");
        }
        let (a, b, c) = (a.finish(), b.finish(), c.finish());
        assert_ne!(a.blocks[0], b.blocks[0]);
        assert_ne!(a.blocks[0], c.blocks[0]);
    }

    #[test]
    fn chains_match_an_independent_implementation() {
        // Gateways of different versions must agree on placement, so the chain is
        // pinned to values computed outside Rust (Python's mmh3):
        // h_0 = mmh3.hash64(model + b"\0" + salt, SEED)[0], then
        // h_{i+1} = mmh3.hash64(le64(h_i) + block_i, SEED)[0].
        assert_eq!(
            key(4, &[b"abcdefghijklmnop"]).blocks,
            vec![
                0xa0f9_1bc8_23cb_8833,
                0x92f1_6182_2d58_8ea2,
                0x58c9_e7b6_1eb4_164d,
                0x1a30_c127_310d_6ef5
            ]
        );
        let mut salted = PrefixHasher::new(4, 64, b"m", Some(b"tenant"));
        salted.feed(b"abcdefgh");
        assert_eq!(
            salted.finish().blocks,
            vec![0xe022_3586_7271_2208, 0x9d08_5b74_26be_4da4]
        );
    }

    #[test]
    fn anchor_is_stable_under_extension() {
        let mut a = PrefixHasher::new(4, 6, b"m", None);
        a.begin_conversation();
        a.feed(b"abcdefgh");
        let mut b = PrefixHasher::new(4, 6, b"m", None);
        b.begin_conversation();
        b.feed(b"abcdefghijklmnopqrstuvwxyz");
        assert_eq!(a.finish().anchor, b.finish().anchor);
    }

    #[test]
    fn anchor_limit_counts_from_the_conversation_start() {
        let key = |sys: &[u8], user: &[u8]| {
            let mut h = PrefixHasher::new(4, 8, b"m", None);
            h.feed(sys);
            h.begin_conversation();
            h.feed(user);
            h.mark_anchor();
            h.finish()
        };
        let long_sys = [b'x'; 64];
        let a = key(&long_sys, b"task one");
        let b = key(&long_sys, b"task two");
        assert_ne!(
            a.anchor, b.anchor,
            "a long shared system prompt does not swallow the anchor"
        );
        assert_eq!(a.anchor_offset, 72);
        let doc1 = key(b"s", b"same long document, question 1");
        let doc2 = key(b"s", b"same long document, question 2");
        assert_eq!(
            doc1.anchor, doc2.anchor,
            "a long first message anchors on its beginning"
        );
        assert_eq!(doc1.anchor_offset, 9);
    }

    #[test]
    fn explicit_anchor_wins() {
        let mut a = PrefixHasher::new(4, 100, b"m", None);
        a.feed(b"sys|user1");
        a.mark_anchor();
        a.feed(b"|asst|user2");
        let mut b = PrefixHasher::new(4, 100, b"m", None);
        b.feed(b"sys|user1");
        b.mark_anchor();
        assert_eq!(a.finish().anchor, b.finish().anchor);
    }
}
