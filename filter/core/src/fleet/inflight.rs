//! What this gateway has sent each backend and not seen answered, as every
//! worker VM accounts it in the ledger ([`crate::fleet::store`]).
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
//! negative. Each record is three little-endian `u32` ([`crate::codec`]);
//! the ledger keeps a VM's records sparsely ([`encode_sparse`]): only the
//! backends it holds something on, so its size and each request's decode
//! grow with the pods in flight, not the fleet.

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

/// The backends one VM holds something on, ascending, with their records.
pub type Sparse = Vec<(u32, InFlight)>;

/// Appends the non-empty records of `all` (backend, record), ascending by
/// backend: a count, then per record its backend and its three fields.
pub fn encode_sparse(all: &[(u32, InFlight)], out: &mut Vec<u8>) {
    let kept = || all.iter().filter(|(_, f)| *f != InFlight::default());
    put(out, kept().count() as u32);
    for (b, f) in kept() {
        put(out, *b);
        put(out, f.requests);
        put(out, f.prefill_blocks);
        put(out, f.decode_tokens);
    }
}

/// Bytes [`encode_sparse`] writes for `k` non-empty records.
pub const fn sparse_len(k: usize) -> usize {
    4 + k * (4 + INFLIGHT_LEN)
}

/// Reads what [`encode_sparse`] wrote from `r`; None unless the backends
/// ascend strictly and are below `n` (another layout, another fleet size).
pub fn decode_sparse(r: &mut Reader<'_>, n: usize) -> Option<Sparse> {
    let k = r.get::<u32>()? as usize;
    // Every record takes 16 bytes: a count beyond what is left is not this layout.
    if k > r.rest().len() / (4 + INFLIGHT_LEN) {
        return None;
    }
    let mut out: Sparse = Vec::with_capacity(k);
    for _ in 0..k {
        let b: u32 = r.get()?;
        if (b as usize) >= n || out.last().is_some_and(|(p, _)| *p >= b) {
            return None;
        }
        let f = InFlight {
            requests: r.get()?,
            prefill_blocks: r.get()?,
            decode_tokens: r.get()?,
        };
        out.push((b, f));
    }
    Some(out)
}

/// `records` with `deltas[b]` applied to backend `b` (each field saturating
/// at 0), empty records dropped; ascending like `records`. O(records + deltas).
pub fn apply_sparse(records: &[(u32, InFlight)], deltas: &[Delta]) -> Sparse {
    let mut out: Sparse = Vec::with_capacity(records.len() + 1);
    let mut rest = records.iter().peekable();
    for (b, d) in deltas.iter().enumerate() {
        let b = b as u32;
        while let Some(&&(x, f)) = rest.peek() {
            if x >= b {
                break;
            }
            out.push((x, f));
            rest.next();
        }
        let mut f = match rest.peek() {
            Some(&&(x, f)) if x == b => {
                rest.next();
                f
            }
            _ if *d == Delta::default() => continue,
            _ => InFlight::default(),
        };
        f.apply(*d);
        out.push((b, f));
    }
    out.extend(rest.copied());
    out.retain(|(_, f)| *f != InFlight::default());
    out
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

        #[test]
        fn sparse_records_round_trip_and_apply_like_dense_ones(
            dense in proptest::collection::vec((0..3u32, 0..3u32, 0..3u32), 1..40),
            deltas in proptest::collection::vec((-3..3i32, -3..3i32, -3..3i32), 0..45),
        ) {
            let n = dense.len();
            let dense: Vec<InFlight> = dense
                .into_iter()
                .map(|(requests, prefill_blocks, decode_tokens)| InFlight { requests, prefill_blocks, decode_tokens })
                .collect();
            let sparse: Sparse = dense.iter().enumerate().map(|(b, f)| (b as u32, *f)).collect();
            let mut bytes = Vec::new();
            encode_sparse(&sparse, &mut bytes);
            let kept: Sparse = sparse.iter().copied().filter(|(_, f)| *f != InFlight::default()).collect();
            prop_assert_eq!(bytes.len(), sparse_len(kept.len()));
            let mut r = Reader::new(&bytes);
            prop_assert_eq!(decode_sparse(&mut r, n), Some(kept.clone()));
            prop_assert!(r.is_empty());
            // A fleet too small for the highest backend is another layout.
            if let Some((last, _)) = kept.last() {
                prop_assert_eq!(decode_sparse(&mut Reader::new(&bytes), *last as usize), None);
            }
            let deltas: Vec<Delta> = deltas
                .into_iter()
                .take(n)
                .map(|(requests, prefill_blocks, decode_tokens)| Delta { requests, prefill_blocks, decode_tokens })
                .collect();
            let mut want = dense.clone();
            for (f, d) in want.iter_mut().zip(&deltas) {
                f.apply(*d);
            }
            let want: Sparse = want.into_iter().enumerate().map(|(b, f)| (b as u32, f)).filter(|(_, f)| *f != InFlight::default()).collect();
            prop_assert_eq!(apply_sparse(&kept, &deltas), want);
        }
    }
}
