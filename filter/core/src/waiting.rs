//! Prompts waiting for their first token, per pod: the sole holder's guard.
//!
//! ```text
//! keep(chain, b)        one copy of the routed prompt's chain in b's list, under a ticket
//! close(ticket)         at its first response byte, or its end
//! shared_b              = matched_b > head_blocks
//!                         ∧ ∃ w waiting on b: w.chain[matched_b − 1] = chain[matched_b − 1]
//! ```
//! `cache_aware` keeps a conversation's history on the only pod holding it
//! whatever that pod's prefill queue, unless another request waiting there
//! shares the prompt up to the pod's match: then it is a prefix many requests
//! send together, not one conversation's ([`crate::policy`], the sole holder).
//! Block hashes are chained, so one comparison at the match's last block says
//! the two prompts agree up to it. Only a pod matching past the head can be the
//! sole holder, so only those are probed.
//!
//! Lists rather than a map of hashes: routing pushes one copy and closing
//! scans the few prompts waiting on that pod, where a map took an insert and
//! a removal per index-sampled block of every prompt (~96 at 128 KB).
//!
//! Memory: at most [`MAX_WAITING_BLOCKS`] hashes (4 MB) per VM. Every exchange
//! closes its ticket; past the cap (an exchange that never did, or a burst of
//! huge prompts) the oldest are dropped, and a longer prompt is not kept: the
//! hold then applies unguarded for those, the rule without its guard.

/// Most block hashes the waiting prompts a VM keeps hold in all: e.g. 1024
/// waiting 128 KB prompts or tens of thousands of chat turns.
pub const MAX_WAITING_BLOCKS: usize = 1 << 19;

/// A routed prompt kept as waiting on its pod ([`Waiting::keep`], [`Waiting::close`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitTicket {
    backend: usize,
    id: u64,
}

/// A prompt this VM routed to a pod and has seen no response byte of.
struct Prompt {
    id: u64,
    chain: Vec<u64>,
}

/// Per backend, the prompts this VM routed there and has seen no response byte of.
#[derive(Default)]
pub struct Waiting {
    lists: Vec<Vec<Prompt>>,
    /// Block hashes `lists` hold in all.
    blocks: usize,
    /// The last [`WaitTicket`]'s id.
    tickets: u64,
}

impl Waiting {
    /// Sets `shared` per backend (formula above); empty when nothing waits.
    pub fn shared(&self, matched: &[u32], head_blocks: u32, chain: &[u64], shared: &mut Vec<bool>) {
        shared.clear();
        if self.blocks == 0 {
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

    /// Keeps `chain` as waiting on `backend` until [`Waiting::close`].
    pub fn keep(&mut self, chain: &[u64], backend: usize) -> Option<WaitTicket> {
        if chain.is_empty() || chain.len() > MAX_WAITING_BLOCKS {
            return None;
        }
        while self.blocks + chain.len() > MAX_WAITING_BLOCKS {
            self.drop_oldest();
        }
        if self.lists.len() <= backend {
            self.lists.resize_with(backend + 1, Vec::new);
        }
        self.tickets = self.tickets.wrapping_add(1);
        let id = self.tickets;
        self.lists[backend].push(Prompt {
            id,
            chain: chain.to_vec(),
        });
        self.blocks += chain.len();
        Some(WaitTicket { backend, id })
    }

    /// The prompt got its first response byte (or its exchange ended): it no
    /// longer waits. A ticket already closed (or dropped by the cap) changes nothing.
    pub fn close(&mut self, ticket: WaitTicket) {
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
    }

    /// Drops the longest-kept waiting prompt (the lowest id): the likeliest
    /// to be one whose exchange never closed it.
    fn drop_oldest(&mut self) {
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

    /// How many prompts wait (tests).
    #[cfg(test)]
    pub(crate) fn prompts(&self) -> usize {
        self.lists.iter().map(Vec::len).sum()
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

    #[test]
    fn a_waiting_prompt_is_shared_up_to_the_last_block_of_the_match() {
        let chain: Vec<u64> = (0..100).collect();
        // Another prompt waits on backend 0: the same up to block 91 (an index-sampled
        // position), then its own; backend 1's waiting prompt ends after block 39.
        let mut other: Vec<u64> = (0..92).collect();
        other.extend(1000..1010);
        let mut waiting = Waiting::default();
        waiting.keep(&other, 0);
        waiting.keep(&(0..40).collect::<Vec<u64>>(), 1);
        let mut shared = Vec::new();
        waiting.shared(&[92, 40, 0], 8, &chain, &mut shared);
        assert_eq!(shared, [true, true, false]);
        // Past block 91 this prompt's match is its own, not the waiting one's.
        waiting.shared(&[95, 41, 0], 8, &chain, &mut shared);
        assert_eq!(shared, [false, false, false]);
        // A match within the head makes no pod the sole holder: nothing is probed.
        waiting.shared(&[92, 40, 0], 40, &chain, &mut shared);
        assert_eq!(shared, [true, false, false]);
        Waiting::default().shared(&[92, 40, 0], 8, &chain, &mut shared);
        assert!(shared.is_empty());
    }

    #[test]
    fn waiting_prompts_stay_bounded() {
        let mut w = Waiting::default();
        let chain: Vec<u64> = (0..12).collect();
        let first = w.keep(&chain, 0).unwrap();
        let n = w.blocks;
        w.blocks = MAX_WAITING_BLOCKS - n + 1;
        let second = w.keep(&chain, 0).unwrap();
        // The oldest made room; its ticket closes nothing, the kept one empties the lists.
        assert_eq!((w.prompts(), w.blocks), (1, MAX_WAITING_BLOCKS - n + 1));
        w.blocks = n;
        w.close(first);
        assert_eq!(w.prompts(), 1);
        w.close(second);
        assert_eq!((w.prompts(), w.blocks), (0, 0));
        assert!(w.keep(&vec![1; MAX_WAITING_BLOCKS + 1], 0).is_none());
    }

    #[test]
    fn a_changed_slot_forgets_what_waited_on_it() {
        let mut w = Waiting::default();
        let kept = w.keep(&[1, 2, 3], 1).unwrap();
        w.keep(&[4, 5], 0);
        w.forget(1);
        assert_eq!((w.prompts(), w.blocks), (1, 2));
        w.close(kept);
        assert_eq!((w.prompts(), w.blocks), (1, 2));
    }
}
