//! Block prefix cache, modelled on vLLM's automatic prefix caching (V1 `KVCacheManager`).
//!
//! # Model
//! * The KV cache holds `capacity` blocks of `block_size` tokens each
//!   (`--kv-capacity-tokens / --block-size`, default 400000 / 16 = 25000 blocks, roughly what an
//!   8B fp16 model leaves free on an 80 GB H100 at `gpu_memory_utilization=0.9`).
//! * A *full* block is identified by a chained hash: `h(i) = H(h(i-1), tokens of block i)`, with
//!   `h(-1)` a fixed seed. Two prompts therefore share block `i` only if they share every token
//!   up to the end of block `i` -- exactly vLLM's prefix semantics. Partial (last) blocks are
//!   never shared.
//! * A request for a LoRA adapter hashes its blocks from a root salted with the adapter's name, so
//!   the same prompt under two adapters (or under an adapter and the base model) shares no block:
//!   the KV of a block depends on the weights that computed it. vLLM adds the adapter to every
//!   block's hash as an extra key (`_gen_lora_extra_hash_keys` in `vllm/v1/core/kv_cache_utils.py`,
//!   the adapter's name since vLLM PR #27211, its `lora_int_id` before); with chained hashes,
//!   salting the root separates exactly the same blocks.
//! * Every block is in one of three states:
//!   - *pinned*: hashed and referenced by at least one running sequence (`refs > 0`);
//!   - *evictable*: hashed, `refs == 0`, kept in an LRU list so a later request can hit it;
//!   - *private*: reserved by a running sequence for tokens not yet computed (uncached prompt
//!     tokens, decode tokens, the partial tail). When a private block fills up the sequence
//!     [`commit`](PrefixCache::commit)s it, turning it into a pinned hashed block (or, if another
//!     sequence computed the same block meanwhile, sharing that one and freeing its own).
//! * `free = capacity - pinned - private - evictable`. An allocation first takes free blocks, then
//!   evicts the least-recently-used evictable block (vLLM's free-block queue does the same).
//! * Usage reported as `vllm:kv_cache_usage_perc` is `(pinned + private) / capacity`: like vLLM,
//!   evictable cached blocks count as free.
//!
//! When a sequence finishes its blocks are released tail-first, so the tail of a prompt is evicted
//! before its head (a shared system prompt outlives the conversations that used it), as in vLLM.

use std::collections::{BTreeMap, HashMap, HashSet};

/// A token id. The simulator's tokenizer maps each whitespace-separated word to a 64-bit hash.
pub type Token = u64;
/// Chained hash identifying a full block (and, implicitly, every token before it).
pub type BlockHash = u64;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
/// Hash of the (non-existent) block before block 0.
pub const ROOT_HASH: BlockHash = 0x5157_6172_6d52_6f75;

/// FNV-1a over bytes: stable across runs and platforms (unlike `RandomState`).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = FNV_OFFSET;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// Token id of one word.
pub fn token_of(word: &str) -> Token {
    fnv1a(word.as_bytes())
}

/// Splits text into words and maps each to a token (one word = one token).
pub fn tokenize(text: &str) -> Vec<Token> {
    text.split_whitespace().map(token_of).collect()
}

/// Hash of the block following `parent` made of `tokens`.
pub fn chain_hash(parent: BlockHash, tokens: &[Token]) -> BlockHash {
    let mut buf = Vec::with_capacity(8 * (tokens.len() + 1));
    buf.extend_from_slice(&parent.to_le_bytes());
    for t in tokens {
        buf.extend_from_slice(&t.to_le_bytes());
    }
    fnv1a(&buf)
}

/// The hash before block 0 of a request: [`ROOT_HASH`] for the base model, a root salted with
/// the adapter's name for a LoRA adapter (see the module docs).
pub fn root_hash(lora: Option<&str>) -> BlockHash {
    match lora {
        None => ROOT_HASH,
        Some(name) => {
            let mut buf = Vec::with_capacity(13 + name.len());
            buf.extend_from_slice(&ROOT_HASH.to_le_bytes());
            buf.extend_from_slice(b"lora:");
            buf.extend_from_slice(name.as_bytes());
            fnv1a(&buf)
        }
    }
}

/// Chained hashes of every *full* block of `tokens`, for the base model.
pub fn block_hashes(tokens: &[Token], block_size: usize) -> Vec<BlockHash> {
    block_hashes_from(ROOT_HASH, tokens, block_size)
}

/// Chained hashes of every *full* block of `tokens`, starting from `root` (see [`root_hash`]).
pub fn block_hashes_from(root: BlockHash, tokens: &[Token], block_size: usize) -> Vec<BlockHash> {
    let mut out = Vec::with_capacity(tokens.len() / block_size.max(1));
    let mut parent = root;
    for chunk in tokens.chunks_exact(block_size.max(1)) {
        parent = chain_hash(parent, chunk);
        out.push(parent);
    }
    out
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    refs: u32,
    /// Key in the LRU map while evictable (`refs == 0`).
    lru_key: Option<u64>,
}

/// The block pool with its prefix-hash index. See the module docs.
#[derive(Debug)]
pub struct PrefixCache {
    block_size: usize,
    capacity: usize,
    entries: HashMap<BlockHash, Entry>,
    /// Evictable blocks ordered by release time (smallest key = least recently used).
    lru: BTreeMap<u64, BlockHash>,
    tick: u64,
    pinned: usize,
    private: usize,
    evictions: u64,
    /// Hashes of blocks evicted and not cached again since: only for the debug endpoint's
    /// account of what a pod once held ([`held_prefix`](Self::held_prefix)), never read by the
    /// engine. At most [`EVICTED_MEMORY`] entries (cleared when full).
    evicted: HashSet<BlockHash>,
}

/// Most evicted hashes remembered for [`PrefixCache::held_prefix`] (8 MB of hashes): a run of
/// the bench evicts far fewer; past it the memory restarts empty rather than grow.
pub const EVICTED_MEMORY: usize = 1 << 20;

impl PrefixCache {
    /// A cache of `capacity_blocks` blocks of `block_size` tokens.
    pub fn new(block_size: usize, capacity_blocks: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            capacity: capacity_blocks,
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            pinned: 0,
            private: 0,
            evictions: 0,
            evicted: HashSet::new(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Blocks held by running sequences (pinned + private).
    pub fn used(&self) -> usize {
        self.pinned + self.private
    }
    /// Hashed blocks with no running user, kept for future hits.
    pub fn evictable(&self) -> usize {
        self.lru.len()
    }
    /// Blocks that an allocation could take right now (free + evictable).
    pub fn available(&self) -> usize {
        self.capacity.saturating_sub(self.used())
    }
    /// Number of blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
    /// `used / capacity`, in 0..=1.
    pub fn usage(&self) -> f64 {
        if self.capacity == 0 {
            return 0.0;
        }
        self.used() as f64 / self.capacity as f64
    }
    /// Whether a block with this hash is cached (pinned or evictable).
    pub fn contains(&self, hash: BlockHash) -> bool {
        self.entries.contains_key(&hash)
    }

    /// Length of the longest prefix of `hashes` present in the cache.
    pub fn match_prefix(&self, hashes: &[BlockHash]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.entries.contains_key(h))
            .count()
    }

    /// Length of the longest prefix of `hashes` this cache holds now or held once and evicted:
    /// what an index that saw every block the pod computed, but none of its evictions, would
    /// predict. For the debug endpoint (`/debug/state`) only.
    pub fn held_prefix(&self, hashes: &[BlockHash]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.entries.contains_key(h) || self.evicted.contains(h))
            .count()
    }

    /// References to a cached block by running sequences (0: evictable), `None` when not cached.
    pub fn refs(&self, hash: BlockHash) -> Option<u32> {
        self.entries.get(&hash).map(|e| e.refs)
    }

    /// Pins `cached` (all present, as returned by [`match_prefix`](Self::match_prefix)) and
    /// reserves `private` new blocks, atomically: returns `false` and changes nothing when they
    /// do not fit.
    pub fn admit(&mut self, cached: &[BlockHash], private: usize) -> bool {
        if cached.iter().any(|h| !self.entries.contains_key(h)) {
            return false;
        }
        // Cached blocks that are currently evictable stop being available once pinned.
        let newly_pinned = cached
            .iter()
            .filter(|h| self.entries.get(h).is_some_and(|e| e.refs == 0))
            .count();
        if self.available() < newly_pinned + private {
            return false;
        }
        for h in cached {
            self.pin(*h);
        }
        self.private += private;
        self.make_room();
        true
    }

    /// Turns one of the caller's private blocks into the hashed block `hash`, pinned by the caller.
    /// If the block is already cached (another sequence computed it), the caller shares it and its
    /// private block is freed.
    pub fn commit(&mut self, hash: BlockHash) {
        self.private = self.private.saturating_sub(1);
        match self.entries.entry(hash) {
            std::collections::hash_map::Entry::Occupied(_) => self.pin(hash),
            std::collections::hash_map::Entry::Vacant(v) => {
                self.evicted.remove(&hash);
                v.insert(Entry {
                    refs: 1,
                    lru_key: None,
                });
                self.pinned += 1;
            }
        }
        self.make_room();
    }

    /// Releases a finished (or aborted) sequence: unpins `hashes` (tail first, so that the head of
    /// a prompt stays cached longest) and frees `private` reserved blocks.
    pub fn release(&mut self, hashes: &[BlockHash], private: usize) {
        self.private = self.private.saturating_sub(private);
        for h in hashes.iter().rev() {
            let Some(e) = self.entries.get_mut(h) else {
                continue;
            };
            if e.refs == 0 {
                continue;
            }
            e.refs -= 1;
            if e.refs == 0 {
                self.tick += 1;
                e.lru_key = Some(self.tick);
                self.lru.insert(self.tick, *h);
                self.pinned = self.pinned.saturating_sub(1);
            }
        }
        self.make_room();
    }

    fn pin(&mut self, hash: BlockHash) {
        if let Some(e) = self.entries.get_mut(&hash) {
            if e.refs == 0 {
                if let Some(k) = e.lru_key.take() {
                    self.lru.remove(&k);
                }
                self.pinned += 1;
            }
            e.refs += 1;
        }
    }

    /// Evicts least-recently-used evictable blocks until everything fits in `capacity`.
    fn make_room(&mut self) {
        while self.used() + self.lru.len() > self.capacity {
            let Some((_, h)) = self.lru.pop_first() else {
                break;
            };
            self.entries.remove(&h);
            self.evictions += 1;
            if self.evicted.len() >= EVICTED_MEMORY {
                self.evicted.clear();
            }
            self.evicted.insert(h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(prefix: &str, n: usize) -> Vec<Token> {
        (0..n).map(|i| token_of(&format!("{prefix}{i}"))).collect()
    }

    /// Runs a whole "request" through the cache: admit, compute every block, finish.
    fn run(cache: &mut PrefixCache, hashes: &[BlockHash]) -> usize {
        let hit = cache.match_prefix(hashes);
        assert!(cache.admit(&hashes[..hit], hashes.len() - hit));
        for h in &hashes[hit..] {
            cache.commit(*h);
        }
        cache.release(hashes, 0);
        hit
    }

    #[test]
    fn chained_hashes_share_prefix_only() {
        let a = words("a", 64);
        let mut b = a.clone();
        b[40] = token_of("different");
        let ha = block_hashes(&a, 16);
        let hb = block_hashes(&b, 16);
        assert_eq!(ha.len(), 4);
        assert_eq!(ha[..2], hb[..2]);
        assert_ne!(ha[2], hb[2]);
        // A change in block 2 changes every later block hash too (chaining).
        assert_ne!(ha[3], hb[3]);
        // Partial blocks are not hashed.
        assert_eq!(block_hashes(&a[..31], 16).len(), 1);
    }

    #[test]
    fn adapters_salt_every_block() {
        let t = words("a", 64);
        let base = block_hashes(&t, 16);
        assert_eq!(block_hashes_from(root_hash(None), &t, 16), base);
        let x = block_hashes_from(root_hash(Some("x")), &t, 16);
        let y = block_hashes_from(root_hash(Some("y")), &t, 16);
        assert_eq!(x, block_hashes_from(root_hash(Some("x")), &t, 16));
        for i in 0..4 {
            assert_ne!(x[i], base[i]);
            assert_ne!(x[i], y[i]);
        }
        let mut c = PrefixCache::new(16, 100);
        run(&mut c, &x);
        assert_eq!(c.match_prefix(&x), 4);
        assert_eq!(c.match_prefix(&y), 0);
        assert_eq!(c.match_prefix(&base), 0);
    }

    #[test]
    fn repeated_prefix_hits() {
        let mut c = PrefixCache::new(16, 100);
        let h = block_hashes(&words("p", 160), 16);
        assert_eq!(run(&mut c, &h), 0);
        assert_eq!(run(&mut c, &h), 10);
        assert_eq!(c.used(), 0);
        assert_eq!(c.evictable(), 10);
    }

    #[test]
    fn lru_evicts_oldest_touched_prefix() {
        // Room for 10 blocks; each prefix is 4 blocks.
        let mut c = PrefixCache::new(16, 10);
        let a = block_hashes(&words("a", 64), 16);
        let b = block_hashes(&words("b", 64), 16);
        let d = block_hashes(&words("d", 64), 16);
        run(&mut c, &a);
        run(&mut c, &b);
        // Touch A again: B is now the least recently used prefix.
        assert_eq!(run(&mut c, &a), 4);
        // D needs 4 blocks; only 2 are free, so 2 of B's must go (tail first).
        run(&mut c, &d);
        assert_eq!(c.match_prefix(&a), 4, "recently touched prefix stays");
        assert_eq!(c.match_prefix(&d), 4);
        assert!(
            c.match_prefix(&b) < 4,
            "least recently used prefix is evicted"
        );
        assert_eq!(
            c.match_prefix(&b),
            2,
            "evicted tail-first: B's head still hits"
        );
        assert_eq!(c.evictions(), 2);
        // One more fresh prefix pushes B out entirely.
        let e = block_hashes(&words("e", 32), 16);
        run(&mut c, &e);
        assert_eq!(c.match_prefix(&b), 0);
        assert_eq!(c.match_prefix(&a), 4);
        assert!(c.evictable() <= c.capacity());
    }

    #[test]
    fn pinned_blocks_are_not_evicted() {
        let mut c = PrefixCache::new(16, 8);
        let a = block_hashes(&words("a", 64), 16);
        assert!(c.admit(&[], 4));
        for h in &a {
            c.commit(*h);
        }
        // A is running (pinned): only 4 blocks remain.
        assert!(!c.admit(&[], 5));
        assert!(c.admit(&[], 4));
        assert_eq!(c.available(), 0);
        assert_eq!(c.match_prefix(&a), 4);
        c.release(&a, 0);
        assert_eq!(c.available(), 4);
        // Admitting a hit on evictable blocks consumes their availability.
        assert!(!c.admit(&a, 1));
        c.release(&[], 4);
        assert!(c.admit(&a, 4));
        assert_eq!(c.available(), 0);
        assert!((c.usage() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn concurrent_identical_blocks_are_shared() {
        let mut c = PrefixCache::new(16, 8);
        let a = block_hashes(&words("a", 32), 16);
        assert!(c.admit(&[], 2));
        assert!(c.admit(&[], 2));
        for h in &a {
            c.commit(*h);
            c.commit(*h);
        }
        // The duplicate computation was freed: 2 hashed blocks, pinned twice.
        assert_eq!(c.used(), 2);
        c.release(&a, 0);
        assert_eq!(c.used(), 2);
        c.release(&a, 0);
        assert_eq!(c.used(), 0);
        assert_eq!(c.evictable(), 2);
    }
}
