//! The ledger: each VM's share of the in-flight records and the index log's head.
//!
//! The value every routed request updates is the *ledger*: each VM's share
//! of the in-flight records (per backend) and the sequence number the index
//! log's next event gets. One read of it tells a request both what is in
//! flight and which log events to apply, and one CAS both accounts the
//! request and reserves its event's sequence number: two host calls where
//! separate keys took four.
//!
//! ## Self-healing
//! ```text
//! inflight_b = Σ_v share_v,b            (what routing weighs)
//! a write by VM w:  share_w += deltas; heartbeat_w = now; lease_w = w's lease
//!                   drop every share_v (v ≠ w) with now − heartbeat_v ≥ lease_v
//!                   drop every all-zero share
//! ```
//! A VM that crashes, or is torn down without `on_log`/`on_done`, leaves its
//! open requests and its unwritten releases behind. Kept per VM, that
//! residue is one share, and the first write after the share's lease runs
//! out without a heartbeat takes it back, in the same CAS as everything else:
//! no pod looks loaded for good. Each share carries its own lease, set by its
//! VM from its own tick period, so VMs of another configuration judge it by
//! its writer's clock, not theirs. A live VM heartbeats with every ledger
//! write: each routed request, and every tick while it holds requests.
//!
//! A VM silent past its lease (stalled, not dead) loses its share: until its
//! open requests end, this gateway under-counts them, as its releases
//! saturate at 0 and net against its new requests. That is the price of
//! never leaking, and the lease makes it rare.
//!
//! | parameter | value | why |
//! |-----------|-------|-----|
//! | lease | `max(3 × metrics.period_ms, 1 s)` ([`crate::fleet::view::lease_ms`]) | a live VM ticks every period; three leave room for a late tick, and the floor for a short period on a loaded worker |
//!
//! Cost: the record holds 12 bytes, then 28 per VM holding requests (Envoy
//! runs a VM per worker thread) and 16 per backend that VM holds something
//! on: a share is sparse ([`crate::fleet::inflight::encode_sparse`]). Each routed
//! request reads, decodes and re-encodes it, so that work grows with the
//! pods in flight, not with the fleet (a dense share of every backend made a
//! request at 1024 pods copy and decode 24 KB for two VMs; the decision
//! bench, `bench/decision`, measures it). What stays O(backends) is the
//! totals vector routing weighs, zeroed then filled from the records.
//! The key carries the layout's version (`ledger.v5`; v3 was dense, v4 the
//! same layout beside an unversioned slot table): VMs of an older release,
//! running side by side during a rollout, keep their own ledger instead of
//! wiping this one.

use crate::codec::{put, Reader};
use crate::fleet::inflight::{decode_sparse, encode_sparse, sparse_len, InFlight, Sparse};

/// One VM's part of the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Share {
    /// The VM ([`super::Store::new_vm_id`]).
    pub vm: u64,
    /// Host time of its last write.
    pub heartbeat_ms: u64,
    /// How long after its last write it counts as abandoned.
    pub lease_ms: u64,
    /// What its routed requests hold, on the backends where that is
    /// something, ascending by backend.
    pub inflight: Sparse,
}

impl Share {
    pub(super) fn is_empty(&self) -> bool {
        self.inflight.is_empty()
    }
}

/// Bytes of a share before its in-flight records: VM, heartbeat, lease.
const SHARE_HEAD: usize = 24;

/// In-flight work per backend, by VM, and the index log's head, updated together.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Ledger {
    /// Every VM's share added up, per backend: what routing weighs.
    pub inflight: Vec<InFlight>,
    /// Sequence number the next index-log event gets.
    pub next_seq: u64,
    /// Each VM's share.
    pub shares: Vec<Share>,
}

/// Who writes the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Writer {
    /// The writing VM.
    pub vm: u64,
    /// Host time of the write.
    pub now_ms: u64,
    /// The writer's lease: how long its share outlives its last write.
    pub lease_ms: u64,
}

impl Writer {
    pub(super) fn abandoned(&self, share: &Share) -> bool {
        share.vm != self.vm && self.now_ms.saturating_sub(share.heartbeat_ms) >= share.lease_ms
    }
}

impl Ledger {
    pub(super) fn encode(&self) -> Vec<u8> {
        let len: usize = self
            .shares
            .iter()
            .map(|s| SHARE_HEAD + sparse_len(s.inflight.len()))
            .sum();
        // One allocation: this runs in every request's CAS.
        let mut out = Vec::with_capacity(12 + len);
        put(&mut out, self.next_seq);
        put(&mut out, self.shares.len() as u32);
        for s in &self.shares {
            put(&mut out, s.vm);
            put(&mut out, s.heartbeat_ms);
            put(&mut out, s.lease_ms);
            encode_sparse(&s.inflight, &mut out);
        }
        out
    }

    /// A missing or mismatched blob (another layout, another fleet size) reads as empty.
    pub(super) fn decode(bytes: Option<&[u8]>, n: usize) -> Ledger {
        let parsed = bytes.and_then(|b| {
            let mut r = Reader::new(b);
            let next_seq = r.get()?;
            let count = r.get::<u32>()? as usize;
            // Every share takes at least 28 bytes: a count beyond that is not this layout.
            if count > r.rest().len() / (SHARE_HEAD + sparse_len(0)) {
                return None;
            }
            let shares = (0..count)
                .map(|_| {
                    Some(Share {
                        vm: r.get()?,
                        heartbeat_ms: r.get()?,
                        lease_ms: r.get()?,
                        inflight: decode_sparse(&mut r, n)?,
                    })
                })
                .collect::<Option<Vec<Share>>>()?;
            r.is_empty()
                .then(|| Ledger::with_total(next_seq, shares, n))
        });
        parsed.unwrap_or_else(|| Ledger::with_total(0, Vec::new(), n))
    }

    pub(super) fn with_total(next_seq: u64, shares: Vec<Share>, n: usize) -> Ledger {
        let mut inflight = vec![InFlight::default(); n];
        for (b, f) in shares.iter().flat_map(|s| &s.inflight) {
            if let Some(t) = inflight.get_mut(*b as usize) {
                t.add(f);
            }
        }
        Ledger {
            inflight,
            next_seq,
            shares,
        }
    }

    /// The prefill blocks VM `vm` accounts on backend `b`.
    pub fn prefill_of(&self, vm: u64, b: usize) -> u32 {
        let Some(share) = self.shares.iter().find(|s| s.vm == vm) else {
            return 0;
        };
        let at = share
            .inflight
            .binary_search_by_key(&b, |&(b, _)| b as usize);
        at.map_or(0, |i| share.inflight[i].1.prefill_blocks)
    }

    /// Whether `writer` would take some other VM's share back.
    pub fn has_abandoned(&self, writer: &Writer) -> bool {
        self.shares.iter().any(|s| writer.abandoned(s))
    }
}

/// What one ledger write did.
#[derive(Debug, Clone, PartialEq)]
pub struct Accounted {
    /// The ledger as written.
    pub ledger: Ledger,
    /// The log sequence number reserved, if asked.
    pub seq: Option<u64>,
    /// VMs whose abandoned shares this write took back.
    pub reclaimed: Vec<u64>,
}
