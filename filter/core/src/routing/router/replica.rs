//! This VM's index replica: the events other VMs appended to the shared log
//! applied to it, this VM's own written there, the pods' cache reports
//! folded in ([`crate::routing::feedback`]), and its capacities sized to
//! each pod's KV cache in the pods' tokens.

use super::peers::keep_for_peers;
use super::Router;
use crate::config::Strategy;
use crate::host::{Host, HostError};
use crate::phases::Stage;
use crate::routing::feedback::{Report, Verdict};
use crate::routing::index::{kept_positions, PromptModel};
use crate::routing::index_log::{Event, Head, Kind};

impl Router {
    /// Applies index events other VMs appended before `next` (the log head as
    /// read with the ledger); true if some were lost (overwritten in the ring
    /// before this VM read them).
    pub(super) fn sync_index<H: Host>(&mut self, host: &H, next: u64) -> Result<bool, HostError> {
        let slots = self.fleet.store(host).keys.log_shape().slots;
        let mut gap = false;
        if next < self.applied_seq {
            // The log restarted (its record was lost or rewritten): follow it from here.
            self.applied_seq = next;
            return Ok(true);
        }
        if next.saturating_sub(self.applied_seq) > slots {
            gap = true;
            self.applied_seq = next - slots;
        }
        while self.applied_seq < next {
            let seq = self.applied_seq;
            // One event, or a peer's pack of them, all under the slot's seq.
            let events = self.fleet.store(host).log_events(seq)?;
            match events.first().map(|e| e.head.seq) {
                Some(s) if s == seq => {
                    for ev in events.into_iter().filter(|e| e.head.seq == seq) {
                        self.apply_foreign(ev);
                    }
                }
                Some(s) if s > seq => gap = true,
                // Reserved but not written yet (its writer runs on another thread):
                // read it next time, unless the ring is about to pass it by.
                _ if next - seq < slots / 2 => break,
                _ => gap = true,
            }
            self.applied_seq = seq + 1;
        }
        Ok(gap)
    }

    /// Applies an event another VM (or a peer replica) appended to the log.
    fn apply_foreign(&mut self, ev: Event) {
        if ev.head.origin == self.fleet.vm_id() {
            return;
        }
        let b = usize::from(ev.head.backend);
        match ev.head.kind {
            // Routed to the slot's previous pod: not this one's cache. Or to
            // a slot this VM's fleet does not have (a VM configured with
            // another pool, or a corrupt slot): nothing to keep.
            Kind::Received
                if b >= self.fleet.slot_count() || ev.head.time_ms < self.fleet.joined_ms(b) => {}
            Kind::Received => {
                let len = ev.len as usize;
                let from = self.index.record_kept(len, &ev.blocks, b, ev.head.time_ms);
                if self.fleet.config().strategy == Strategy::CacheAware {
                    self.pending.keep_foreign(&ev, from);
                }
            }
            Kind::Evicted => self
                .index
                .forget_used_before(ev.head.backend as usize, ev.head.time_ms),
        }
        keep_for_peers(&mut self.outbox, ev);
    }

    /// This VM's log event `seq` about `backend`.
    pub(super) fn head(
        &self,
        kind: Kind,
        seq: u64,
        backend: usize,
        time_ms: u64,
        prefill: u32,
    ) -> Head {
        Head {
            kind,
            seq,
            origin: self.fleet.vm_id(),
            backend: backend as u16,
            time_ms,
            prefill,
        }
    }

    /// Writes an event to the log slot `head.seq` (reserved by [`Router::account`]);
    /// false if it could not (other VMs miss it, a gap).
    pub(super) fn log<H: Host>(&mut self, host: &H, head: Head, blocks: &[u64]) -> bool {
        let written = self.fleet.store(host).write_event(head, blocks);
        if self.outbox.is_some() {
            keep_for_peers(
                &mut self.outbox,
                Event {
                    head,
                    len: u32::try_from(blocks.len()).unwrap_or(u32::MAX),
                    blocks: kept_positions(blocks.len())
                        .filter_map(|i| blocks.get(i).copied())
                        .collect(),
                },
            );
        }
        self.split.lap(host, Stage::Log);
        // Nothing in between to read: skip our own event instead of reading it back.
        if head.seq == self.applied_seq {
            self.applied_seq = head.seq + 1;
        }
        written.is_ok()
    }

    /// Folds a pod's own cache report for a request into the index: when it
    /// falls clearly short of the `(matched, prompt)` blocks the index
    /// credited `backend` with, what it last used at or before
    /// `last_use_ms` (the deepest predicted block's last use, before this
    /// request) is forgotten there, here and, through the log, in every VM
    /// ([`crate::routing::feedback`]), unless one of this VM's recent reports of
    /// that pod showed it holding more than this index credited it with (then
    /// this index's order of uses is not the pod's). Returns what the report showed.
    pub fn reported<H: Host>(
        &mut self,
        host: &H,
        backend: usize,
        predicted: (u32, u32),
        report: Report,
        last_use_ms: u64,
    ) -> Verdict {
        let (predicted_blocks, prompt_blocks) = predicted;
        let surplus = report.shows_surplus(predicted_blocks, prompt_blocks);
        let ordered = self
            .surplus
            .observe(backend, self.fleet.pod_id(backend), surplus);
        let shortfall = report.shows_eviction(predicted_blocks, prompt_blocks);
        let verdict = Verdict {
            shortfall,
            surplus,
            forgot: shortfall && ordered,
        };
        if !verdict.forgot {
            return verdict;
        }
        self.index.forget_used_before(backend, last_use_ms);
        match self.account(host, None, host.now_ms(), true, false) {
            Ok(Some(seq))
                if self.log(
                    host,
                    self.head(Kind::Evicted, seq, backend, last_use_ms, 0),
                    &[],
                ) => {}
            Ok(_) => log::debug!("warmroute: eviction not written to the log"),
            Err(e) => log::debug!("warmroute: eviction not shared with other VMs: {e:?}"),
        }
        verdict
    }

    /// A pod's report counted `tokens` for a prompt of `bytes` canonical bytes:
    /// learns the ratio, and resizes the index once it moved by a tenth.
    pub fn learn_ratio(&mut self, bytes: usize, tokens: u64) {
        if !self.fleet.config().index.learn_bytes_per_token {
            return;
        }
        self.ratio.observe(bytes, tokens);
        let moved = self.ratio.bytes_per_token() / self.sized_ratio.max(f64::MIN_POSITIVE);
        if !(0.9..=1.1).contains(&moved) {
            self.resize_index();
        }
    }

    /// Prompt bytes per pod token the index's capacities are sized with.
    pub fn bytes_per_token(&self) -> f64 {
        self.sized_ratio
    }

    /// Drops index entries idle past the TTL (from the tick).
    pub fn expire(&mut self, now_ms: u64) {
        self.index.expire(now_ms);
    }

    /// Sizes the index to each backend's real KV capacity, when known.
    pub(super) fn resize_index(&mut self) {
        self.sized_ratio = self.ratio.bytes_per_token();
        let blocks_per_token = self.sized_ratio / self.fleet.config().block_bytes.max(1) as f64;
        let known: Vec<Option<usize>> = self
            .fleet
            .health()
            .iter()
            .enumerate()
            .map(|(b, h)| match self.fleet.backend(b) {
                // An empty slot of a discovered pool: no share of the bound.
                None => Some(0),
                Some(_) => h
                    .scrape
                    .capacity_tokens
                    .map(|t| (t as f64 * blocks_per_token) as usize),
            })
            .collect();
        self.index.set_capacities(&known);
        // An engine that keeps whole prompts: its RAM cache in blocks, by the same ratio.
        let prompts = self
            .fleet
            .config()
            .metrics
            .prompt_cache
            .map(|p| PromptModel {
                slots: p.slots as usize,
                ram_blocks: (p.ram_tokens as f64 * blocks_per_token) as usize,
            });
        self.index.set_prompt_model(prompts);
    }
}
