//! The one module that talks to the proxy-wasm host.
//!
//! Logic that needs time or shared data takes a [`Host`], so unit tests run it
//! against [`MemoryHost`] and the filter against [`Proxy`]. Host statuses map
//! to [`HostError`]; nothing here unwraps.

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// A failed host call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostError {
    /// Shared data changed since it was read (compare-and-swap lost).
    CasMismatch,
    /// Any other status.
    Status(u32),
}

impl From<Status> for HostError {
    fn from(s: Status) -> Self {
        match s {
            Status::CasMismatch => HostError::CasMismatch,
            other => HostError::Status(other as u32),
        }
    }
}

/// Shared data value with its CAS token.
pub type Versioned = (Option<Vec<u8>>, Option<u32>);

/// What pure logic may ask of the host.
pub trait Host {
    /// Host clock in milliseconds (never the wall clock: host-tests control it).
    fn now_ms(&self) -> u64;
    /// Reads a shared-data key.
    fn get_shared(&self, key: &str) -> Result<Versioned, HostError>;
    /// Writes a shared-data key; `cas` of `None` writes unconditionally.
    fn set_shared(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError>;
}

/// The real host.
pub struct Proxy;

impl Host for Proxy {
    fn now_ms(&self) -> u64 {
        hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as u64)
    }

    fn get_shared(&self, key: &str) -> Result<Versioned, HostError> {
        Ok(hostcalls::get_shared_data(key)?)
    }

    fn set_shared(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError> {
        Ok(hostcalls::set_shared_data(key, Some(value), cas)?)
    }
}

/// In-memory host with proxy-wasm-cpp-host's CAS semantics, for unit tests.
#[derive(Default)]
pub struct MemoryHost {
    /// Current time.
    pub now: Cell<u64>,
    data: RefCell<HashMap<String, (Vec<u8>, u32)>>,
    /// Number of writes that will fail with a CAS mismatch first (to test retries).
    pub inject_conflicts: Cell<u32>,
}

impl Host for MemoryHost {
    fn now_ms(&self) -> u64 {
        self.now.get()
    }

    fn get_shared(&self, key: &str) -> Result<Versioned, HostError> {
        Ok(match self.data.borrow().get(key) {
            Some((v, cas)) => (Some(v.clone()), Some(*cas)),
            None => (None, None),
        })
    }

    fn set_shared(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError> {
        let mut data = self.data.borrow_mut();
        let current = data.get(key).map(|(_, c)| *c);
        if let (Some(want), Some(have)) = (cas.filter(|c| *c != 0), current) {
            if want != have || self.inject_conflicts.get() > 0 {
                self.inject_conflicts
                    .set(self.inject_conflicts.get().saturating_sub(1));
                return Err(HostError::CasMismatch);
            }
        }
        let next = current.unwrap_or(0).wrapping_add(1).max(1);
        data.insert(key.to_string(), (value.to_vec(), next));
        Ok(())
    }
}
