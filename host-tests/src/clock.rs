//! Virtual clock shared by all VMs of a `Host`. Time only moves when the test says so.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Default start: 2024-01-01T00:00:00Z, so timestamps look realistic.
pub const DEFAULT_EPOCH_NS: u64 = 1_704_067_200_000_000_000;

#[derive(Clone, Debug)]
pub struct VirtualClock {
    ns: Arc<AtomicU64>,
    start: u64,
}

impl VirtualClock {
    pub fn new(start_ns: u64) -> Self {
        VirtualClock {
            ns: Arc::new(AtomicU64::new(start_ns)),
            start: start_ns,
        }
    }

    /// Wall-clock nanoseconds since the Unix epoch.
    pub fn now_ns(&self) -> u64 {
        self.ns.load(Ordering::SeqCst)
    }

    /// Milliseconds elapsed since the clock was created.
    pub fn elapsed_ms(&self) -> u64 {
        (self.now_ns() - self.start) / 1_000_000
    }

    pub fn set_ns(&self, ns: u64) {
        let cur = self.now_ns();
        assert!(
            ns >= cur,
            "virtual clock cannot go backwards ({ns} < {cur})"
        );
        self.ns.store(ns, Ordering::SeqCst);
    }

    pub fn advance_ns(&self, ns: u64) {
        self.ns.fetch_add(ns, Ordering::SeqCst);
    }
}

impl wasmtime_wasi::HostWallClock for VirtualClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now_ns())
    }
}

impl wasmtime_wasi::HostMonotonicClock for VirtualClock {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        self.now_ns() - self.start
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn advances_only_on_demand() {
        let c = VirtualClock::new(1_000_000);
        assert_eq!(c.now_ns(), 1_000_000);
        c.advance_ns(5_000_000);
        assert_eq!(c.elapsed_ms(), 5);
        let c2 = c.clone();
        c2.set_ns(10_000_000);
        assert_eq!(c.now_ns(), 10_000_000);
    }
}
