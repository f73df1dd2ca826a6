//! What every fuzz target checks besides "no panic": that no input makes the
//! code under test allocate more than a small multiple of the input.
//!
//! A counting global allocator tracks the bytes live on this thread's
//! allocations; [`bounded`] runs a closure and fails the run (abort: libFuzzer
//! reports a crash and saves the input) when the peak it reached exceeds
//! `FACTOR × input + SLACK`. Hostile input must cost memory in proportion to
//! its size, never more: a filter's VM has a fixed budget.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes the code under test may allocate per input byte.
pub const FACTOR: usize = 32;
/// Bytes it may allocate whatever the input (tables, first buffers).
pub const SLACK: usize = 1 << 20;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The allocator of every target (a global allocator declared in a library
/// serves the whole program that links it).
pub struct Counting;

#[global_allocator]
static ALLOC: Counting = Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

/// Runs `f` on `input` and aborts if its allocations peaked above the bound.
pub fn bounded<T>(input_len: usize, f: impl FnOnce() -> T) -> T {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    let limit = FACTOR.saturating_mul(input_len).saturating_add(SLACK);
    if peak > limit {
        eprintln!("allocated {peak} bytes for {input_len} input bytes (limit {limit})");
        std::process::abort();
    }
    out
}
