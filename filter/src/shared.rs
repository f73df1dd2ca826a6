//! Fleet state every worker VM shares through proxy-wasm shared data.
//!
//! Each value lives under `warmroute.<fleet>.<name>`, where `<fleet>` hashes
//! the backend addresses: a reconfigured fleet never reads another fleet's
//! bytes. Updates are read-modify-write with CAS, retried a bounded number of
//! times (a worker that keeps losing gives up and counts it rather than spin).

use crate::host::{Host, HostError};
use crate::index::Log;
use crate::load::{decode_health, encode_health, Health};

/// CAS attempts before an update is abandoned.
pub const MAX_CAS_RETRIES: u32 = 32;

/// Names of this fleet's shared-data keys.
#[derive(Debug, Clone)]
pub struct Keys {
    inflight: String,
    rotation: String,
    vm_seq: String,
    lease: String,
    health: String,
    log: String,
    log_hint: String,
}

impl Keys {
    /// Keys for the fleet identified by `fleet`.
    pub fn new(fleet: u64) -> Keys {
        let k = |n: &str| format!("warmroute.{fleet:016x}.{n}");
        Keys {
            inflight: k("inflight"),
            rotation: k("rotation"),
            vm_seq: k("vm_seq"),
            lease: k("lease"),
            health: k("health"),
            log: k("index_log"),
            log_hint: k("index_seq"),
        }
    }
}

/// Read-modify-write of one key; `f` returns the new value or `None` to leave it.
pub fn update<H: Host, T>(
    host: &H,
    key: &str,
    mut f: impl FnMut(Option<Vec<u8>>) -> (Option<Vec<u8>>, T),
) -> Result<T, HostError> {
    for _ in 0..MAX_CAS_RETRIES {
        let (value, cas) = host.get_shared(key)?;
        let (new, out) = f(value);
        let Some(new) = new else { return Ok(out) };
        match host.set_shared(key, &new, cas) {
            Ok(()) => return Ok(out),
            Err(HostError::CasMismatch) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(HostError::CasMismatch)
}

fn u64_of(v: &Option<Vec<u8>>) -> u64 {
    v.as_deref()
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn counters(v: Option<Vec<u8>>, n: usize) -> Vec<u32> {
    match v {
        Some(b) if b.len() == n * 4 => b
            .chunks_exact(4)
            .map(|c| c.try_into().map_or(0, u32::from_le_bytes))
            .collect(),
        _ => vec![0; n],
    }
}

fn encode_counters(c: &[u32]) -> Vec<u8> {
    c.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Typed access to the shared fleet state.
pub struct Shared<'h, H: Host> {
    /// The host.
    pub host: &'h H,
    /// Key names.
    pub keys: &'h Keys,
    /// Number of backends.
    pub n: usize,
}

impl<H: Host> Shared<'_, H> {
    /// A fleet-unique id for this VM (its lease identity and log origin).
    pub fn new_vm_id(&self) -> Result<u64, HostError> {
        update(self.host, &self.keys.vm_seq, |v| {
            let next = u64_of(&v) + 1;
            (Some(next.to_le_bytes().to_vec()), next)
        })
    }

    /// The next value of the round-robin rotation shared by all workers.
    pub fn next_rotation(&self) -> Result<u64, HostError> {
        update(self.host, &self.keys.rotation, |v| {
            let cur = u64_of(&v);
            (Some(cur.wrapping_add(1).to_le_bytes().to_vec()), cur)
        })
    }

    /// In-flight requests per backend, as accounted by every worker.
    pub fn inflight(&self) -> Result<Vec<u32>, HostError> {
        Ok(counters(
            self.host.get_shared(&self.keys.inflight)?.0,
            self.n,
        ))
    }

    /// Adds `delta` to one backend's in-flight count (saturating at 0).
    pub fn add_inflight(&self, backend: usize, delta: i32) -> Result<Vec<u32>, HostError> {
        let n = self.n;
        update(self.host, &self.keys.inflight, |v| {
            let mut c = counters(v, n);
            if let Some(x) = c.get_mut(backend) {
                *x = x.saturating_add_signed(delta);
            }
            (Some(encode_counters(&c)), c)
        })
    }

    /// Health of every backend as the scraper last published it.
    pub fn health(&self) -> Result<Vec<Health>, HostError> {
        let v = self.host.get_shared(&self.keys.health)?.0;
        Ok(decode_health(v.as_deref().unwrap_or_default(), self.n))
    }

    /// Applies `f` to one backend's health.
    pub fn update_health(
        &self,
        backend: usize,
        f: impl Fn(&mut Health),
    ) -> Result<Health, HostError> {
        let n = self.n;
        update(self.host, &self.keys.health, |v| {
            let mut all = decode_health(v.as_deref().unwrap_or_default(), n);
            let out = all.get_mut(backend).map(|h| {
                f(h);
                *h
            });
            (Some(encode_health(&all)), out.unwrap_or_default())
        })
    }

    /// Takes or renews the scraper lease; true when this VM holds it.
    pub fn try_lease(&self, me: u64, ttl_ms: u64) -> Result<bool, HostError> {
        let now = self.host.now_ms();
        update(self.host, &self.keys.lease, |v| {
            let b = v.unwrap_or_default();
            let holder = b
                .get(0..8)
                .and_then(|s| s.try_into().ok())
                .map_or(0, u64::from_le_bytes);
            let expiry = b
                .get(8..16)
                .and_then(|s| s.try_into().ok())
                .map_or(0, u64::from_le_bytes);
            if holder == me || holder == 0 || expiry < now {
                let mut new = me.to_le_bytes().to_vec();
                new.extend_from_slice(&(now + ttl_ms).to_le_bytes());
                (Some(new), true)
            } else {
                (None, false)
            }
        })
    }

    /// Sequence hint of the index log: cheap to read, tells whether the log moved.
    pub fn log_hint(&self) -> Result<u64, HostError> {
        Ok(u64_of(&self.host.get_shared(&self.keys.log_hint)?.0))
    }

    /// The index change log.
    pub fn log(&self) -> Result<Log, HostError> {
        Ok(Log::decode(
            self.host.get_shared(&self.keys.log)?.0.unwrap_or_default(),
        ))
    }

    /// Appends an index event and bumps the hint; returns the event's seq.
    pub fn append_log(
        &self,
        origin: u64,
        backend: u16,
        blocks: &[u64],
        max_bytes: usize,
    ) -> Result<u64, HostError> {
        let now = self.host.now_ms();
        let seq = update(self.host, &self.keys.log, |v| {
            let log = Log::decode(v.unwrap_or_default());
            let seq = log.next_seq;
            (
                Some(log.append(origin, backend, now, blocks, max_bytes)),
                seq,
            )
        })?;
        // The hint may briefly lag under races; readers then catch up next request.
        self.host
            .set_shared(&self.keys.log_hint, &(seq + 1).to_le_bytes(), None)?;
        Ok(seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::MemoryHost;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn shared<'a>(host: &'a MemoryHost, keys: &'a Keys) -> Shared<'a, MemoryHost> {
        Shared { host, keys, n: 3 }
    }

    #[test]
    fn inflight_counts_survive_conflicts() {
        let (host, keys) = (MemoryHost::default(), Keys::new(1));
        let s = shared(&host, &keys);
        s.add_inflight(1, 1).unwrap();
        host.inject_conflicts.set(5);
        s.add_inflight(1, 1).unwrap();
        s.add_inflight(2, 1).unwrap();
        s.add_inflight(1, -1).unwrap();
        assert_eq!(s.inflight().unwrap(), vec![0, 1, 1]);
        s.add_inflight(0, -1).unwrap();
        assert_eq!(s.inflight().unwrap(), vec![0, 1, 1], "never below zero");
    }

    #[test]
    fn endless_conflicts_give_up() {
        let (host, keys) = (MemoryHost::default(), Keys::new(1));
        let s = shared(&host, &keys);
        s.add_inflight(0, 1).unwrap();
        host.inject_conflicts.set(1000);
        assert_eq!(s.add_inflight(0, 1), Err(HostError::CasMismatch));
    }

    #[test]
    fn rotation_and_vm_ids_are_unique() {
        let (host, keys) = (MemoryHost::default(), Keys::new(1));
        let s = shared(&host, &keys);
        assert_eq!(
            (s.next_rotation().unwrap(), s.next_rotation().unwrap()),
            (0, 1)
        );
        assert_ne!(s.new_vm_id().unwrap(), s.new_vm_id().unwrap());
    }

    #[test]
    fn lease_has_one_holder_until_it_expires() {
        let (host, keys) = (MemoryHost::default(), Keys::new(1));
        let s = shared(&host, &keys);
        host.now.set(1000);
        assert!(s.try_lease(1, 1500).unwrap());
        assert!(!s.try_lease(2, 1500).unwrap());
        assert!(s.try_lease(1, 1500).unwrap());
        host.now.set(2500);
        assert!(!s.try_lease(2, 1500).unwrap());
        host.now.set(2501);
        assert!(s.try_lease(2, 1500).unwrap());
        assert!(!s.try_lease(1, 1500).unwrap());
    }

    #[test]
    fn log_append_and_hint() {
        let (host, keys) = (MemoryHost::default(), Keys::new(1));
        let s = shared(&host, &keys);
        assert_eq!(s.log_hint().unwrap(), 0);
        s.append_log(7, 2, &[1, 2, 3], 4096).unwrap();
        s.append_log(8, 1, &[4], 4096).unwrap();
        assert_eq!(s.log_hint().unwrap(), 2);
        let evs: Vec<_> = s.log().unwrap().since(1).collect();
        assert_eq!(evs.len(), 1);
        assert_eq!(
            (evs[0].origin, evs[0].backend, evs[0].blocks.clone()),
            (8, 1, vec![4])
        );
    }

    #[test]
    fn health_updates_one_backend() {
        let (host, keys) = (MemoryHost::default(), Keys::new(1));
        let s = shared(&host, &keys);
        s.update_health(1, |h| h.failures += 1).unwrap();
        s.update_health(1, |h| h.failures += 1).unwrap();
        let h = s.health().unwrap();
        assert_eq!((h[0].failures, h[1].failures), (0, 2));
    }
}
