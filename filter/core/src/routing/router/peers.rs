//! This replica's side of the exchange between gateway replicas
//! ([`crate::routing::exchange`]): its own events served to a peer, a peer's
//! imported into the shared log, where every VM of this Envoy applies them.

use super::Router;
use crate::fleet::inflight::{InFlight, Sparse};
use crate::fleet::responses::Entry;
use crate::fleet::store::Writer;
use crate::host::{Host, HostError};
use crate::routing::exchange::{
    Batch, BatchWriter, Outbox, PeerAnswer, PeerEventRef, ANSWERS_ROOM,
};
use crate::routing::index_log::{pack_groups, Event, Head, IMPORTED};

/// What a peer's batch came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Imported {
    /// Events written to this replica's log.
    pub events: u32,
    /// Events about a pod this replica does not have, or not written (a host error).
    pub dropped: u32,
    /// Stored responses' answers written to this Envoy's record (not those
    /// it knew newer).
    pub answers: u32,
}

/// Keeps one of this replica's own events for peers (not one a peer sent).
pub(super) fn keep_for_peers(outbox: &mut Option<Outbox>, e: Event) {
    if let Some(outbox) = outbox {
        if e.head.origin != IMPORTED {
            outbox.push(e);
        }
    }
}

impl Router {
    /// Applies what other workers appended to the log since this VM last
    /// looked; true if some were lost. A worker that routes little still
    /// follows the log at its tick, so what its outbox serves peers has no gap
    /// that a pull landing on it would pass on.
    pub fn catch_up<H: Host>(&mut self, host: &H) -> Result<bool, HostError> {
        let next = self.fleet.store(host).log_next_seq()?;
        self.sync_index(host, next)
    }

    /// The reply to a peer asking for this replica's events from `since`,
    /// within the size it `asked` for (but for one event) and `max_bytes`:
    /// those this VM applied, with their pods by address and their ages;
    /// and, if it asks from answer `answers`, the stored responses' answers
    /// this Envoy proxied from there. Reads the log first, so a peer sees
    /// what other workers routed too.
    pub fn serve_peer<H: Host>(
        &mut self,
        host: &H,
        replica: u64,
        (since, answers): (u64, Option<u64>),
        (asked, max_bytes): (Option<usize>, usize),
    ) -> Result<Vec<u8>, HostError> {
        // Room for the answers is kept before the events fill the reply: a
        // catch-up reply full of events would carry none, and the ring would
        // lap the answers it left out before the events were caught up.
        let limit = asked.unwrap_or(max_bytes).min(max_bytes);
        let room = answers.map_or(0, |_| ANSWERS_ROOM.min(limit / 2));
        let events = (asked.map(|a| a.saturating_sub(room)), max_bytes - room);
        let mut w = self.serve_events(host, replica, since, events)?;
        w.widen(max_bytes, limit);
        // An unread ring costs this reply its answers, not its events: the
        // section is left out, and the peer asks from the same answer next time.
        let ring = answers.and_then(|_| {
            self.fleet
                .store(host)
                .recent_responses()
                .inspect_err(|e| {
                    log::debug!("warmroute: the stored responses' ring is unread: {e:?}")
                })
                .ok()
        });
        if let Some((since, ring)) = answers.zip(ring).filter(|&(n, _)| w.open_answers(n)) {
            let now = host.now_ms();
            let mut full = false;
            for (n, e) in ring.since(since) {
                let a = PeerAnswer {
                    id: e.id,
                    pod: e.pod,
                    age_ms: u32::try_from(now.saturating_sub(e.at_ms)).unwrap_or(u32::MAX),
                };
                if !w.answer(n, a) {
                    full = true;
                    break;
                }
            }
            if !full {
                w.answers_to(ring.next);
            }
        }
        Ok(w.finish())
    }

    fn serve_events<H: Host>(
        &mut self,
        host: &H,
        replica: u64,
        since: u64,
        (asked, max_bytes): (Option<usize>, usize),
    ) -> Result<BatchWriter, HostError> {
        let ledger = self.fleet.store(host).read_ledger()?.value;
        self.sync_index(host, ledger.next_seq)?;
        // This replica's own load: every VM's share but the one its peers' replies make.
        let mut own = vec![InFlight::default(); self.fleet.slot_count()];
        for s in ledger.shares.iter().filter(|s| s.vm != IMPORTED) {
            for (b, held) in &s.inflight {
                if let Some(o) = own.get_mut(*b as usize) {
                    o.add(held);
                }
            }
        }
        let Some(outbox) = &self.outbox else {
            return Ok(BatchWriter::new(replica, since, max_bytes));
        };
        let until = self.applied_seq;
        // A cursor past this log is a peer's of an earlier life of this replica.
        let since = if since > until { 0 } else { since };
        let start = since.max(outbox.oldest().unwrap_or(until));
        let mut w = BatchWriter::new(replica, start, max_bytes).asked(asked.unwrap_or(max_bytes));
        for (b, held) in own.into_iter().enumerate() {
            if let Some(pod) = self
                .fleet
                .backend(b)
                .filter(|_| held != InFlight::default())
            {
                w.load(&pod.address, held);
            }
        }
        let now = host.now_ms();
        let mut full = false;
        for e in outbox.range(start, until) {
            let b = usize::from(e.head.backend);
            let pod = self
                .fleet
                .backend(b)
                .filter(|_| e.head.time_ms >= self.fleet.joined_ms(b));
            let Some(pod) = pod else { continue };
            let event = PeerEventRef {
                kind: e.head.kind,
                age_ms: u32::try_from(now.saturating_sub(e.head.time_ms)).unwrap_or(u32::MAX),
                len: e.len,
                blocks: &e.blocks,
            };
            if !w.push(e.head.seq, &pod.address, event) {
                full = true;
                break;
            }
        }
        if !full {
            w.skip_to(until);
        }
        Ok(w)
    }

    /// Counts the peers' own in-flight work (`loads`, by pod address) in every
    /// VM's load: one share of this Envoy's ledger, as a VM's, lapsing with
    /// this VM's lease if it stops pulling.
    pub fn record_peer_loads<H: Host>(
        &self,
        host: &H,
        loads: &[(String, InFlight)],
        now: u64,
    ) -> Result<(), HostError> {
        let mut share: Sparse = loads
            .iter()
            .filter_map(|(address, held)| Some((self.fleet.backend_at(address)? as u32, *held)))
            .collect();
        share.sort_by_key(|&(b, _)| b);
        share.dedup_by_key(|&mut (b, _)| b);
        let writer = Writer {
            vm: IMPORTED,
            now_ms: now,
            lease_ms: self.fleet.lease_ms(),
        };
        self.fleet.store(host).set_share(writer, share)
    }

    /// Writes a peer's events to this replica's log (every VM applies them
    /// from there, this one included): each pod by its address, each time
    /// by its age on this clock, never before the pod joined its slot here;
    /// packed many to a slot, in at most `max_slots` slots
    /// ([`crate::routing::exchange::ring_share`]: what the ring carries before
    /// a VM that reads it once a tick would lose some); what does not fit
    /// (a peer that ignored the asked size) is dropped.
    /// Its stored responses' answers go into this Envoy's record (buckets of
    /// `capacity`; 0: the record is off), not into the ring peers read.
    pub fn import_peer<H: Host>(
        &mut self,
        host: &H,
        batch: &Batch,
        now: u64,
        (capacity, max_slots): (usize, usize),
    ) -> Imported {
        let mut out = Imported::default();
        let mut heads = Vec::with_capacity(batch.events.len());
        for e in &batch.events {
            let Some(b) = batch
                .pods
                .get(usize::from(e.pod))
                .and_then(|a| self.fleet.backend_at(a))
            else {
                out.dropped += 1;
                continue;
            };
            let time_ms = now
                .saturating_sub(u64::from(e.age_ms))
                .max(self.fleet.joined_ms(b));
            let head = Head {
                kind: e.kind,
                seq: 0,
                origin: IMPORTED,
                backend: b as u16,
                time_ms,
                prefill: 0,
            };
            heads.push((head, e.len, e.blocks.as_slice()));
        }
        let slot_bytes = self.fleet.store(host).keys.log_shape().slot_bytes;
        let kept: Vec<usize> = heads.iter().map(|(_, _, k)| k.len()).collect();
        for (i, group) in pack_groups(&kept, slot_bytes).into_iter().enumerate() {
            let events = heads.get(group).unwrap_or_default();
            let written = i < max_slots
                && match self.account(host, None, now, true, false) {
                    Ok(Some(seq)) => self.fleet.store(host).write_pack(seq, events).is_ok(),
                    _ => false,
                };
            let n = events.len() as u32;
            if written {
                out.events += n;
            } else {
                out.dropped += n;
            }
        }
        if capacity > 0 {
            for a in batch.answers.iter().flat_map(|a| &a.entries) {
                let entry = Entry {
                    id: a.id,
                    pod: a.pod,
                    at_ms: now.saturating_sub(u64::from(a.age_ms)),
                };
                match self.fleet.store(host).remember_imported(entry, capacity) {
                    Ok(written) => out.answers += u32::from(written),
                    Err(e) => {
                        log::debug!("warmroute: a peer's stored response not remembered: {e:?}")
                    }
                }
            }
        }
        out
    }
}
