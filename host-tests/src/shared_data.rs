//! Process-wide shared data (key/value with CAS) and shared queues, with the semantics
//! of proxy-wasm-cpp-host `src/shared_data.cc` / `src/shared_queue.cc`:
//!
//! * data is scoped by `vm_id`; VMs with the same vm_id see the same keys;
//! * `set` with `cas == 0` writes unconditionally; with `cas != 0` on an existing key whose
//!   current cas differs, it fails with `CasMismatch`; a set on a missing key always succeeds;
//! * every successful write assigns a fresh cas from one global counter (never 0);
//! * `get` returns `(value, cas)` or `NotFound`.

use crate::types::Status;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// One vm_id's keys: key -> (value, cas).
type Namespace = HashMap<Vec<u8>, (Vec<u8>, u32)>;

#[derive(Debug)]
pub struct SharedDataStore {
    data: HashMap<String, Namespace>,
    next_cas: u32,
    /// Number of `set` calls that failed with CasMismatch (useful for tests).
    pub cas_mismatches: u64,
    /// Number of successful writes.
    pub writes: u64,
}

impl Default for SharedDataStore {
    fn default() -> Self {
        SharedDataStore {
            data: HashMap::new(),
            next_cas: 1,
            cas_mismatches: 0,
            writes: 0,
        }
    }
}

impl SharedDataStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn bump_cas(&mut self) -> u32 {
        let r = self.next_cas;
        self.next_cas = self.next_cas.wrapping_add(1);
        if self.next_cas == 0 {
            self.next_cas = 1;
        }
        r
    }

    pub fn get(&self, vm_id: &str, key: &[u8]) -> Result<(Vec<u8>, u32), Status> {
        self.data
            .get(vm_id)
            .and_then(|m| m.get(key))
            .cloned()
            .ok_or(Status::NotFound)
    }

    pub fn set(&mut self, vm_id: &str, key: &[u8], value: &[u8], cas: u32) -> Result<(), Status> {
        let current = self
            .data
            .get(vm_id)
            .and_then(|m| m.get(key))
            .map(|(_, c)| *c);
        if let Some(current) = current {
            if cas != 0 && cas != current {
                self.cas_mismatches += 1;
                return Err(Status::CasMismatch);
            }
        }
        let new_cas = self.bump_cas();
        self.data
            .entry(vm_id.to_string())
            .or_default()
            .insert(key.to_vec(), (value.to_vec(), new_cas));
        self.writes += 1;
        Ok(())
    }

    /// All keys of one vm_id, sorted.
    pub fn keys(&self, vm_id: &str) -> Vec<Vec<u8>> {
        let mut k: Vec<_> = self
            .data
            .get(vm_id)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        k.sort();
        k
    }

    /// Total bytes stored (keys + values) for one vm_id.
    pub fn total_bytes(&self, vm_id: &str) -> usize {
        self.data
            .get(vm_id)
            .map(|m| m.iter().map(|(k, (v, _))| k.len() + v.len()).sum())
            .unwrap_or(0)
    }
}

/// A registered shared queue.
#[derive(Debug)]
pub struct Queue {
    pub vm_id: String,
    pub name: String,
    /// Index of the VM (in its `Host`) that registered the queue, and its context.
    pub owner_vm: usize,
    pub owner_context: u32,
    pub items: VecDeque<Vec<u8>>,
}

#[derive(Debug, Default)]
pub struct SharedQueues {
    queues: BTreeMap<u32, Queue>,
    by_name: HashMap<(String, String), u32>,
    next_id: u32,
    /// (owner vm index, owner context, queue id) waiting for `proxy_on_queue_ready`.
    pub pending_ready: VecDeque<(usize, u32, u32)>,
}

impl SharedQueues {
    pub fn register(
        &mut self, vm_id: &str, name: &str, owner_vm: usize, owner_context: u32,
    ) -> u32 {
        if let Some(id) = self.by_name.get(&(vm_id.to_string(), name.to_string())) {
            let q = self.queues.get_mut(id).expect("queue index consistent");
            q.owner_vm = owner_vm;
            q.owner_context = owner_context;
            return *id;
        }
        self.next_id += 1;
        let id = self.next_id;
        self.queues.insert(
            id,
            Queue {
                vm_id: vm_id.to_string(),
                name: name.to_string(),
                owner_vm,
                owner_context,
                items: VecDeque::new(),
            },
        );
        self.by_name
            .insert((vm_id.to_string(), name.to_string()), id);
        id
    }

    pub fn resolve(&self, vm_id: &str, name: &str) -> Result<u32, Status> {
        self.by_name
            .get(&(vm_id.to_string(), name.to_string()))
            .copied()
            .ok_or(Status::NotFound)
    }

    pub fn enqueue(&mut self, id: u32, value: &[u8]) -> Result<(), Status> {
        let q = self.queues.get_mut(&id).ok_or(Status::NotFound)?;
        q.items.push_back(value.to_vec());
        self.pending_ready
            .push_back((q.owner_vm, q.owner_context, id));
        Ok(())
    }

    pub fn dequeue(&mut self, id: u32) -> Result<Vec<u8>, Status> {
        let q = self.queues.get_mut(&id).ok_or(Status::NotFound)?;
        q.items.pop_front().ok_or(Status::Empty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_key_is_not_found() {
        let s = SharedDataStore::new();
        assert_eq!(s.get("vm", b"k"), Err(Status::NotFound));
    }

    #[test]
    fn cas_zero_writes_unconditionally_and_bumps_cas() {
        let mut s = SharedDataStore::new();
        s.set("vm", b"k", b"v1", 0).unwrap();
        let (v, c1) = s.get("vm", b"k").unwrap();
        assert_eq!(v, b"v1");
        assert_ne!(c1, 0);
        s.set("vm", b"k", b"v2", 0).unwrap();
        let (v, c2) = s.get("vm", b"k").unwrap();
        assert_eq!(v, b"v2");
        assert_ne!(c1, c2);
    }

    #[test]
    fn cas_mismatch_rejects_and_keeps_value() {
        let mut s = SharedDataStore::new();
        s.set("vm", b"k", b"a", 0).unwrap();
        let (_, c1) = s.get("vm", b"k").unwrap();
        // Another writer updates first.
        s.set("vm", b"k", b"b", c1).unwrap();
        // The stale writer loses.
        assert_eq!(s.set("vm", b"k", b"c", c1), Err(Status::CasMismatch));
        assert_eq!(s.get("vm", b"k").unwrap().0, b"b");
        assert_eq!(s.cas_mismatches, 1);
        // Retrying with the fresh cas succeeds.
        let (_, c2) = s.get("vm", b"k").unwrap();
        s.set("vm", b"k", b"c", c2).unwrap();
        assert_eq!(s.get("vm", b"k").unwrap().0, b"c");
    }

    #[test]
    fn set_missing_key_with_nonzero_cas_succeeds_like_cpp_host() {
        let mut s = SharedDataStore::new();
        s.set("vm", b"new", b"x", 12345).unwrap();
        assert_eq!(s.get("vm", b"new").unwrap().0, b"x");
    }

    #[test]
    fn cas_is_global_and_never_zero() {
        let mut s = SharedDataStore::new();
        s.next_cas = u32::MAX;
        s.set("vm", b"a", b"1", 0).unwrap();
        s.set("vm", b"b", b"1", 0).unwrap();
        assert_eq!(s.get("vm", b"a").unwrap().1, u32::MAX);
        assert_eq!(s.get("vm", b"b").unwrap().1, 1);
    }

    #[test]
    fn vm_ids_are_isolated() {
        let mut s = SharedDataStore::new();
        s.set("one", b"k", b"1", 0).unwrap();
        assert_eq!(s.get("two", b"k"), Err(Status::NotFound));
        assert_eq!(s.keys("one"), vec![b"k".to_vec()]);
        assert_eq!(s.total_bytes("one"), 2);
    }

    #[test]
    fn queues() {
        let mut q = SharedQueues::default();
        let id = q.register("vm", "q", 0, 1);
        assert_eq!(q.resolve("vm", "q"), Ok(id));
        assert_eq!(q.resolve("vm", "nope"), Err(Status::NotFound));
        assert_eq!(q.dequeue(id), Err(Status::Empty));
        q.enqueue(id, b"x").unwrap();
        assert_eq!(q.pending_ready.len(), 1);
        assert_eq!(q.dequeue(id).unwrap(), b"x");
        assert_eq!(q.enqueue(999, b"x"), Err(Status::NotFound));
    }
}
