//! Prompts waiting for their first token, per pod: the sole holder's guard,
//! and the part of a match a pod may still be prefilling.
//!
//! ```text
//! keep(chain, b, from)   one copy of the routed prompt's chain in b's list, under a ticket;
//!                        from = the blocks b held of it before (it brings the rest)
//! close(ticket)          at its first response byte, or its end
//! shared_b               = matched_b > head_blocks
//!                          ∧ ∃ w waiting on b: w.chain[matched_b − 1] = chain[matched_b − 1]
//! ready_b                = min(matched_b, min { from_w : w pending on b, from_w < matched_b,
//!                                                w agrees with chain at p })
//!     p = matched_b − 1                                  for this VM's prompts (whole chains)
//!     p = w's last kept position below matched_b, ≥ from_w   for the others' (sampled chains)
//! ```
//! `cache_aware` keeps a conversation's history on the only pod holding it
//! whatever that pod's prefill queue, unless another request waiting there
//! shares the prompt up to the pod's match: then it is a prefix many requests
//! send together, not one conversation's ([`crate::routing::policy`], the sole holder).
//! Block hashes are chained, so one comparison at the match's last block says
//! the two prompts agree up to it. Only a pod matching past the head can be the
//! sole holder, so only those are probed.
//!
//! **Ready.** The index records a prompt on its pod when it routes it, so a
//! prompt sent with another that shares its prefix (a document or few-shot
//! block many requests send together) matches the blocks the other is still
//! bringing. The pod computes them only once that prompt's prefill reaches
//! them: a prompt admitted with it gets no hit (vLLM does not share a prefix
//! being computed) and waits behind it anyway. Counted as a hit, such a
//! prompt stayed on a pod two prompts deep and was accounted a few blocks of
//! prefill, so the next new prompt joined that pod too (guidellm's opening
//! burst of 8 cold prompts: a fourth full prefill on one pod, its TTFT ~870 ms
//! against ~650). `ready_b` is the match without what pending prompts bring;
//! the router weighs and accounts that (for prompts that are not
//! continuations: a continuation's match is its own history, whose turn has
//! answered before the next is sent).
//!
//! Pending: this VM's own prompts until their first byte (their ticket). The
//! other workers' prompts come with their index-log events (the positions the
//! log carries, [`crate::routing::index::kept_positions`]) and are pending by the
//! ledger: a pod prefills in arrival order, so of VM v's prompts on b, those
//! whose prefill, counted from the newest back, starts within the prefill v
//! still accounts there (`P_vb`, released at each first byte) are the ones
//! not yet prefilled:
//! ```text
//! pending(w) = Σ prefill_u over v's prompts u on b newer than w  <  P_vb
//! ```
//! (`prefill_u`: what v accounted for u, which its log event carries.) A
//! prompt found prefilled is dropped, with every older one of v's on b. A
//! release v has not written yet keeps its prompts pending a little longer:
//! the ledger is late, never early.
//!
//! Lists rather than a map of hashes: routing pushes one copy and closing
//! scans the few prompts waiting on that pod, where a map took an insert and
//! a removal per index-sampled block of every prompt (~96 at 128 KB).
//!
//! Memory: at most [`MAX_WAITING_BLOCKS`] hashes (4 MB) per VM, this VM's and
//! the others' prompts together, each prompt counting at least one (an entry's
//! own 32 bytes on wasm32, 48 natively, are not: 2^19 bare entries would take
//! 16 MB in a VM, but the ledger settles the others' prompts long before).
//! Every exchange closes its ticket, and the ledger settles the others'; past
//! the cap (an exchange that never did, or a burst of huge prompts) the oldest
//! are dropped, and a longer prompt is not kept: the hold then applies
//! unguarded for those, the rule without its guard, and their blocks count as
//! ready.

use std::collections::VecDeque;

use crate::routing::index::last_kept_below;
use crate::routing::index_log::Event;

/// Most block hashes the waiting prompts a VM keeps hold in all: e.g. 1024
/// waiting 128 KB prompts or tens of thousands of chat turns.
pub const MAX_WAITING_BLOCKS: usize = 1 << 19;

/// A routed prompt kept as waiting on its pod ([`Pending::keep`], [`Pending::close`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingTicket {
    backend: usize,
    id: u64,
}

/// A prompt this VM routed to a pod and has seen no response byte of.
struct Prompt {
    id: u64,
    chain: Vec<u64>,
    /// Blocks the pod held of it before it was routed.
    from: u32,
}

/// A prompt another VM routed to a pod, as its index-log event carries it.
struct Foreign {
    vm: u64,
    /// Blocks in its chain.
    len: u32,
    /// Its hashes at [`crate::routing::index::kept_positions`] of `len`; none if it brings no block.
    kept: Vec<u64>,
    /// Blocks the pod held of it before it was routed (by this VM's index).
    from: u32,
    /// Prefill blocks its VM accounted for it there.
    prefill: u32,
}

impl Foreign {
    /// What it counts against [`MAX_WAITING_BLOCKS`]: its hashes, at least one.
    fn cost(&self) -> usize {
        self.kept.len().max(1)
    }

    /// Whether it agrees with `chain` at its last held position in `from..end`
    /// (so `chain` uses blocks it brings).
    fn brings_into(&self, chain: &[u64], end: u32) -> bool {
        last_kept_below(self.len as usize, end as usize, self.kept.len())
            .is_some_and(|(k, i)| i >= self.from as usize && chain.get(i) == self.kept.get(k))
    }
}

/// Per backend, the prompts routed there that may still wait for their prefill.
#[derive(Default)]
pub struct Pending {
    /// This VM's, closed by their tickets.
    lists: Vec<Vec<Prompt>>,
    /// The other VMs', oldest first, settled by the ledger.
    foreign: Vec<VecDeque<Foreign>>,
    /// Block hashes `lists` and `foreign` hold in all.
    blocks: usize,
    /// The last [`PendingTicket`]'s id.
    tickets: u64,
}

impl Pending {
    /// Sets `shared` per backend (formula above); empty when nothing waits.
    /// This VM's prompts only: another worker's leave the hold in place.
    pub fn shared(&self, matched: &[u32], head_blocks: u32, chain: &[u64], shared: &mut Vec<bool>) {
        shared.clear();
        if self.lists.iter().all(Vec::is_empty) {
            return;
        }
        shared.extend(matched.iter().enumerate().map(|(b, &m)| {
            if m <= head_blocks {
                return false;
            }
            let i = m as usize - 1;
            let (Some(h), Some(list)) = (chain.get(i), self.lists.get(b)) else {
                return false;
            };
            list.iter().any(|w| w.chain.get(i) == Some(h))
        }));
    }

    /// Lowers each `matched` past the head to `ready` (formula above), again
    /// while it moves: what is left may be what another pending prompt brings.
    /// Adds the backends it lowered to `lowered`. Call [`Pending::settle`]
    /// first, so the others' prompts still kept are pending.
    pub fn ready(
        &self,
        matched: &mut [u32],
        head_blocks: u32,
        chain: &[u64],
        lowered: &mut Vec<usize>,
    ) {
        if self.blocks == 0 {
            return;
        }
        for (b, m) in matched.iter_mut().enumerate() {
            let indexed = *m;
            while *m > head_blocks {
                let end = *m;
                let i = end as usize - 1;
                let own = self.lists.get(b).into_iter().flatten().filter(|w| {
                    w.from < end && w.chain.get(i).is_some_and(|h| chain.get(i) == Some(h))
                });
                let others = self.foreign.get(b).into_iter().flatten();
                let others = others.filter(|w| w.from < end && w.brings_into(chain, end));
                match own.map(|w| w.from).chain(others.map(|w| w.from)).min() {
                    Some(from) => *m = from,
                    None => break,
                }
            }
            if *m < indexed {
                lowered.push(b);
            }
        }
    }

    /// Keeps `chain` as waiting on `backend`, which held its first `from`
    /// blocks, until [`Pending::close`].
    pub fn keep(&mut self, chain: &[u64], backend: usize, from: u32) -> Option<PendingTicket> {
        if chain.is_empty() || !self.make_room(chain.len(), true) {
            return None;
        }
        if self.lists.len() <= backend {
            self.lists.resize_with(backend + 1, Vec::new);
        }
        self.tickets = self.tickets.wrapping_add(1);
        let id = self.tickets;
        self.lists[backend].push(Prompt {
            id,
            chain: chain.to_vec(),
            from,
        });
        self.blocks += chain.len();
        Some(PendingTicket { backend, id })
    }

    /// Keeps a prompt another VM routed, as its log event `ev` says (a chain
    /// of `ev.len` blocks, its hashes at the kept positions, `ev.head.prefill`
    /// blocks accounted for it), of which its pod held the first `from`, until
    /// [`Pending::settle`] finds it prefilled. One accounted no prefill is not
    /// kept; one that brings no block is kept without its hashes (the settling
    /// counts it). This VM's own prompts are not dropped to make room.
    pub fn keep_foreign(&mut self, ev: &Event, from: u32) {
        let len = ev.len;
        let w = Foreign {
            vm: ev.head.origin,
            len,
            kept: if from < len {
                ev.blocks.clone()
            } else {
                Vec::new()
            },
            from: from.min(len),
            prefill: ev.head.prefill,
        };
        if w.prefill == 0 || !self.make_room(w.cost(), false) {
            return;
        }
        let backend = usize::from(ev.head.backend);
        if self.foreign.len() <= backend {
            self.foreign.resize_with(backend + 1, VecDeque::new);
        }
        self.blocks += w.cost();
        self.foreign[backend].push_back(w);
    }

    /// Drops the other VMs' prompts the ledger shows prefilled (formula above):
    /// `prefill(vm, b)` is the prefill VM `vm` accounts on `b`.
    pub fn settle(&mut self, prefill: impl Fn(u64, usize) -> u32) {
        let mut covered: Vec<(u64, u64)> = Vec::new();
        let mut keep = Vec::new();
        for (b, list) in self.foreign.iter_mut().enumerate() {
            covered.clear();
            keep.clear();
            // Newest first: a prompt is prefilled once the newer ones of its VM on
            // `b` cover what that VM still accounts there; so is every older one.
            for w in list.iter().rev() {
                let i = match covered.iter().position(|&(vm, _)| vm == w.vm) {
                    Some(i) => i,
                    None => {
                        covered.push((w.vm, 0));
                        covered.len() - 1
                    }
                };
                let pending = covered[i].1 < u64::from(prefill(w.vm, b));
                covered[i].1 = match pending {
                    true => covered[i].1 + u64::from(w.prefill),
                    false => u64::MAX,
                };
                keep.push(pending);
            }
            let mut pending = keep.iter().rev();
            list.retain(|w| {
                let kept = pending.next().copied().unwrap_or(true);
                if !kept {
                    self.blocks -= w.cost();
                }
                kept
            });
        }
    }

    /// The prompt got its first response byte (or its exchange ended): it no
    /// longer waits. A ticket already closed (or dropped by the cap) changes nothing.
    pub fn close(&mut self, ticket: PendingTicket) {
        let Some(list) = self.lists.get_mut(ticket.backend) else {
            return;
        };
        if let Some(i) = list.iter().position(|w| w.id == ticket.id) {
            self.blocks -= list.swap_remove(i).chain.len();
        }
    }

    /// Forgets what waits on a slot whose pod changed: the new pod holds none of it.
    pub fn forget(&mut self, backend: usize) {
        if let Some(list) = self.lists.get_mut(backend) {
            self.blocks -= list.iter().map(|w| w.chain.len()).sum::<usize>();
            list.clear();
        }
        if let Some(list) = self.foreign.get_mut(backend) {
            self.blocks -= list.iter().map(Foreign::cost).sum::<usize>();
            list.clear();
        }
    }

    /// Makes room for `blocks` more hashes under the cap, dropping the oldest
    /// kept prompts (this VM's too if `own`); false if they cannot fit.
    fn make_room(&mut self, blocks: usize, own: bool) -> bool {
        if blocks > MAX_WAITING_BLOCKS {
            return false;
        }
        while self.blocks + blocks > MAX_WAITING_BLOCKS {
            if !own && self.foreign.iter().all(VecDeque::is_empty) {
                return false;
            }
            self.drop_oldest();
        }
        true
    }

    /// Drops the oldest of the other VMs' prompts on the pod where most are
    /// kept, or if none, the longest-kept of this VM's (the lowest id): the
    /// likeliest to be one whose exchange never closed it.
    fn drop_oldest(&mut self) {
        if let Some(list) = self
            .foreign
            .iter_mut()
            .max_by_key(|l| l.len())
            .filter(|l| !l.is_empty())
        {
            if let Some(w) = list.pop_front() {
                self.blocks -= w.cost();
            }
            return;
        }
        let oldest = self
            .lists
            .iter()
            .enumerate()
            .flat_map(|(b, list)| list.iter().enumerate().map(move |(i, w)| (w.id, b, i)))
            .min();
        match oldest {
            Some((_, b, i)) => self.blocks -= self.lists[b].swap_remove(i).chain.len(),
            None => self.blocks = 0,
        }
    }

    /// How many of this VM's prompts wait (tests).
    #[cfg(test)]
    pub(crate) fn prompts(&self) -> usize {
        self.lists.iter().map(Vec::len).sum()
    }

    /// How many of the other VMs' prompts are kept (tests).
    #[cfg(test)]
    pub(crate) fn foreign_prompts(&self) -> usize {
        self.foreign.iter().map(VecDeque::len).sum()
    }

    /// How many pods the other VMs' lists are kept for (tests).
    #[cfg(test)]
    pub(crate) fn foreign_pods(&self) -> usize {
        self.foreign.len()
    }

    /// Block hashes held in all (tests).
    #[cfg(test)]
    pub(crate) fn blocks(&self) -> usize {
        self.blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::index::kept_positions;

    #[test]
    fn a_waiting_prompt_is_shared_up_to_the_last_block_of_the_match() {
        let chain: Vec<u64> = (0..100).collect();
        // Another prompt waits on backend 0: the same up to block 91 (an index-sampled
        // position), then its own; backend 1's waiting prompt ends after block 39.
        let mut other: Vec<u64> = (0..92).collect();
        other.extend(1000..1010);
        let mut waiting = Pending::default();
        waiting.keep(&other, 0, 0);
        waiting.keep(&(0..40).collect::<Vec<u64>>(), 1, 0);
        let mut shared = Vec::new();
        waiting.shared(&[92, 40, 0], 8, &chain, &mut shared);
        assert_eq!(shared, [true, true, false]);
        // Past block 91 this prompt's match is its own, not the waiting one's.
        waiting.shared(&[95, 41, 0], 8, &chain, &mut shared);
        assert_eq!(shared, [false, false, false]);
        // A match within the head makes no pod the sole holder: nothing is probed.
        waiting.shared(&[92, 40, 0], 40, &chain, &mut shared);
        assert_eq!(shared, [true, false, false]);
        Pending::default().shared(&[92, 40, 0], 8, &chain, &mut shared);
        assert!(shared.is_empty());
    }

    use crate::testing::tagged_chain as chain;

    /// `chain`'s hashes at the positions an index-log event carries.
    fn kept(chain: &[u64]) -> Vec<u64> {
        kept_positions(chain.len()).map(|i| chain[i]).collect()
    }

    #[test]
    fn a_match_is_ready_only_up_to_what_a_pending_prompt_brings() {
        let mut w = Pending::default();
        // Backend 0 held 10 blocks of the document before this prompt brought the rest.
        let ticket = w.keep(&chain(1, 60, 80), 0, 10).unwrap();
        let rider = chain(2, 60, 80);
        let mut matched = [60, 60, 0];
        w.ready(&mut matched, 4, &rider, &mut Vec::new());
        assert_eq!(matched, [10, 60, 0]);
        // A match the pending prompt brought none of, or one within the head, stands.
        let mut matched = [10, 0, 0];
        w.ready(&mut matched, 4, &rider, &mut Vec::new());
        assert_eq!(matched, [10, 0, 0]);
        let mut matched = [60, 0, 0];
        w.ready(&mut matched, 60, &rider, &mut Vec::new());
        assert_eq!(matched, [60, 0, 0]);
        // A prompt that parts ways before the match's end brings nothing it uses.
        let mut matched = [60, 0, 0];
        w.ready(&mut matched, 4, &chain(3, 30, 80), &mut Vec::new());
        assert_eq!(matched, [60, 0, 0]);
        w.close(ticket);
        let mut matched = [60, 0, 0];
        w.ready(&mut matched, 4, &rider, &mut Vec::new());
        assert_eq!(matched, [60, 0, 0]);
    }

    /// VM `vm`'s log event: `c` routed to backend 1, `prefill` blocks accounted.
    fn event(vm: u64, c: &[u64], prefill: u32) -> Event {
        let head = crate::routing::index_log::Head {
            kind: crate::routing::index_log::Kind::Received,
            seq: 0,
            origin: vm,
            backend: 1,
            time_ms: 0,
            prefill,
        };
        Event {
            head,
            len: c.len() as u32,
            blocks: kept(c),
        }
    }

    #[test]
    fn another_workers_prompt_is_pending_while_its_prefill_is_in_the_ledger() {
        let mut w = Pending::default();
        // VM 7 sent three prompts to backend 1, accounted 100, 100 and 90 blocks of
        // prefill (the last brings blocks 10.. of a document the rider shares up to
        // block 89, past the dense head: only the sampled positions travel); VM 8 one.
        for (tag, shared, prefill) in [(4, 0, 100), (5, 0, 100), (6, 90, 90)] {
            w.keep_foreign(&event(7, &chain(tag, shared, 100), prefill), 10);
        }
        w.keep_foreign(&event(8, &chain(9, 0, 100), 100), 0);
        // One accounted no prefill is not kept; one that brings no block is, bare.
        w.keep_foreign(&event(8, &chain(9, 0, 100), 0), 0);
        w.keep_foreign(&event(7, &chain(9, 0, 100), 3), 100);
        assert_eq!(w.foreign_prompts(), 5);
        let rider = chain(2, 90, 120);
        let ready = |w: &Pending| {
            let mut matched = [0, 90, 0];
            w.ready(&mut matched, 4, &rider, &mut Vec::new());
            matched[1]
        };
        // VM 7 still accounts 150 blocks there: the bare one (3) and the two before it
        // (90, 100) start within them, the oldest does not.
        w.settle(|vm, b| if (vm, b) == (7, 1) { 150 } else { 0 });
        assert_eq!(w.foreign_prompts(), 3);
        assert_eq!(ready(&w), 10);
        // The document's prompt is being prefilled, alone with the bare one; then nothing.
        w.settle(|vm, b| if (vm, b) == (7, 1) { 60 } else { 0 });
        assert_eq!(w.foreign_prompts(), 2);
        assert_eq!(ready(&w), 10);
        w.settle(|_, _| 0);
        assert_eq!((w.foreign_prompts(), w.blocks()), (0, 0));
        assert_eq!(ready(&w), 90);
    }

    #[test]
    fn a_match_is_lowered_past_every_pending_prompt_it_uses() {
        // One pending prompt brought the document (blocks 0..60), another its
        // second part (60..100); the rider uses both.
        let mut w = Pending::default();
        let doc = chain(1, 100, 100);
        w.keep(&chain(2, 60, 80), 0, 0);
        w.keep(&doc, 0, 60);
        let mut matched = [100];
        w.ready(&mut matched, 4, &chain(3, 100, 120), &mut Vec::new());
        assert_eq!(matched, [0]);
    }

    #[test]
    fn the_other_workers_prompts_never_push_this_ones_out() {
        let mut w = Pending::default();
        let mine = w.keep(&chain(1, 0, 12), 0, 0).unwrap();
        w.blocks = MAX_WAITING_BLOCKS;
        w.keep_foreign(&event(7, &chain(2, 0, 12), 12), 0);
        assert_eq!((w.prompts(), w.foreign_prompts()), (1, 0));
        w.blocks = 12;
        w.close(mine);
        assert_eq!(w.blocks(), 0);
        // At the cap, this VM's next prompt makes room by dropping the others' first.
        let mine = w.keep(&chain(1, 0, 12), 0, 0).unwrap();
        w.keep_foreign(&event(7, &chain(2, 0, 12), 12), 0);
        assert_eq!((w.prompts(), w.foreign_prompts(), w.blocks()), (1, 1, 24));
        w.blocks = MAX_WAITING_BLOCKS;
        let next = w.keep(&chain(3, 0, 12), 2, 0);
        assert!(next.is_some());
        assert_eq!((w.prompts(), w.foreign_prompts()), (2, 0));
        assert_eq!(w.blocks(), MAX_WAITING_BLOCKS);
        w.blocks = 24;
        w.close(mine);
        w.close(next.unwrap());
        assert_eq!(w.blocks(), 0);
    }

    #[test]
    fn waiting_prompts_stay_bounded() {
        let mut w = Pending::default();
        let chain: Vec<u64> = (0..12).collect();
        let first = w.keep(&chain, 0, 0).unwrap();
        let n = w.blocks;
        w.blocks = MAX_WAITING_BLOCKS - n + 1;
        let second = w.keep(&chain, 0, 0).unwrap();
        // The oldest made room; its ticket closes nothing, the kept one empties the lists.
        assert_eq!((w.prompts(), w.blocks), (1, MAX_WAITING_BLOCKS - n + 1));
        w.blocks = n;
        w.close(first);
        assert_eq!(w.prompts(), 1);
        w.close(second);
        assert_eq!((w.prompts(), w.blocks), (0, 0));
        assert!(w.keep(&vec![1; MAX_WAITING_BLOCKS + 1], 0, 0).is_none());
    }

    #[test]
    fn a_changed_slot_forgets_what_waited_on_it() {
        let mut w = Pending::default();
        let kept = w.keep(&[1, 2, 3], 1, 0).unwrap();
        w.keep(&[4, 5], 0, 0);
        w.forget(1);
        assert_eq!((w.prompts(), w.blocks), (1, 2));
        w.close(kept);
        assert_eq!((w.prompts(), w.blocks), (1, 2));
    }
}
