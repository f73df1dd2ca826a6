//! What this gateway has sent each backend and not seen answered, as every
//! worker VM accounts it in the ledger ([`crate::store`]).
//!
//! ```text
//! route:       requests += 1, prefill_blocks += prompt blocks − matched blocks,
//!              decode_tokens += its output limit (or the default)
//! first byte:  prefill_blocks −= that request's share (the prompt is prefilled)
//! end:         requests −= 1, decode_tokens −= its limit (and any prefill not
//!              yet given back)
//! ```
//! Decode tokens are held at the request's limit until it ends: counting the
//! tokens as they stream would cost a look at every response chunk, and the
//! limit is what the pod reserves room for.
//! Changes travel as [`Delta`]s and saturate at 0, so a release that arrives
//! twice or for a request the ledger never heard of cannot drive a count
//! negative. Each record is three little-endian `u32` ([`crate::codec`]).

use crate::codec::{put, Reader};

/// What this gateway's workers sent one backend and have not seen answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InFlight {
    /// Requests not finished.
    pub requests: u32,
    /// Prompt blocks not yet prefilled (released at the first response byte).
    pub prefill_blocks: u32,
    /// Output tokens the requests may still generate.
    pub decode_tokens: u32,
}

impl InFlight {
    /// Adds `d`, each field saturating at 0.
    pub fn apply(&mut self, d: Delta) {
        self.requests = self.requests.saturating_add_signed(d.requests);
        self.prefill_blocks = self.prefill_blocks.saturating_add_signed(d.prefill_blocks);
        self.decode_tokens = self.decode_tokens.saturating_add_signed(d.decode_tokens);
    }

    /// Adds another share's counts, each field saturating.
    pub fn add(&mut self, other: &InFlight) {
        self.requests = self.requests.saturating_add(other.requests);
        self.prefill_blocks = self.prefill_blocks.saturating_add(other.prefill_blocks);
        self.decode_tokens = self.decode_tokens.saturating_add(other.decode_tokens);
    }
}

/// A change to one backend's [`InFlight`] record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Delta {
    /// Change in requests.
    pub requests: i32,
    /// Change in prompt blocks waiting for prefill.
    pub prefill_blocks: i32,
    /// Change in output tokens still to generate.
    pub decode_tokens: i32,
}

impl Delta {
    /// One more or one fewer request, and nothing else.
    pub const fn requests(requests: i32) -> Delta {
        Delta {
            requests,
            prefill_blocks: 0,
            decode_tokens: 0,
        }
    }

    /// Prompt blocks waiting for prefill, and nothing else.
    pub const fn prefill(prefill_blocks: i32) -> Delta {
        Delta {
            requests: 0,
            prefill_blocks,
            decode_tokens: 0,
        }
    }
}

impl std::ops::AddAssign for Delta {
    fn add_assign(&mut self, d: Delta) {
        self.requests = self.requests.saturating_add(d.requests);
        self.prefill_blocks = self.prefill_blocks.saturating_add(d.prefill_blocks);
        self.decode_tokens = self.decode_tokens.saturating_add(d.decode_tokens);
    }
}

impl std::ops::Neg for Delta {
    type Output = Delta;
    fn neg(self) -> Delta {
        Delta {
            requests: -self.requests,
            prefill_blocks: -self.prefill_blocks,
            decode_tokens: -self.decode_tokens,
        }
    }
}

const INFLIGHT_LEN: usize = 12;

/// Bytes [`encode_inflight`] writes for `n` backends.
pub const fn inflight_len(n: usize) -> usize {
    n * INFLIGHT_LEN
}

/// Appends every backend's in-flight record, as shared data holds it, to `out`.
pub fn encode_inflight(all: &[InFlight], out: &mut Vec<u8>) {
    for f in all {
        put(out, f.requests);
        put(out, f.prefill_blocks);
        put(out, f.decode_tokens);
    }
}

/// Decodes `n` in-flight records; None for a blob of another length (another layout).
pub fn decode_inflight(bytes: &[u8], n: usize) -> Option<Vec<InFlight>> {
    if bytes.len() != inflight_len(n) {
        return None;
    }
    let mut r = Reader::new(bytes);
    (0..n)
        .map(|_| {
            Some(InFlight {
                requests: r.get()?,
                prefill_blocks: r.get()?,
                decode_tokens: r.get()?,
            })
        })
        .collect()
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::testing::proptest_config())]

        #[test]
        fn decode_inverts_encode(all in proptest::collection::vec((any::<u32>(), any::<u32>(), any::<u32>()), 0..64)) {
            let all: Vec<InFlight> = all
                .into_iter()
                .map(|(requests, prefill_blocks, decode_tokens)| InFlight { requests, prefill_blocks, decode_tokens })
                .collect();
            let mut bytes = Vec::new();
            encode_inflight(&all, &mut bytes);
            prop_assert_eq!(decode_inflight(&bytes, all.len()), Some(all));
        }
    }
}
