//! Where a routed request's time goes inside Envoy, for the overhead benchmark.
//!
//! Compiled in only with `--features phase-timing` (the bench builds that
//! variant on the side): every lap reads the host clock, itself a host call,
//! so the shipped filter carries none of it and [`Laps`] is an empty type.
//! Every 100 timed requests a VM logs each phase's mean at warn
//! level, in one line the bench parses:
//! `warmroute phases: n=100 body_ns=.. parse_ns=.. route_ns=.. header_ns=..`.
//! Each figure includes about one clock read (a few µs in Envoy's V8).

use crate::host::Host;

/// Parts of routing one request, in the order they run.
#[derive(Debug, Clone, Copy)]
pub enum Phase {
    /// Reading the buffered body into the VM.
    Body,
    /// Parsing the body and hashing the prompt's blocks.
    Parse,
    /// The routing decision with its shared-data reads and writes.
    Route,
    /// Writing the routing header.
    Header,
}

/// Lap timer of one request (empty unless built with `phase-timing`).
#[derive(Debug, Default)]
pub struct Laps {
    #[cfg(feature = "phase-timing")]
    last: u64,
}

#[cfg(feature = "phase-timing")]
mod on {
    use super::Phase;
    use std::cell::Cell;

    /// Timed requests per log line.
    pub const REPORT_EVERY: u64 = 100;

    thread_local! {
        /// Per-phase nanoseconds summed since the last report, then the request count.
        pub static SUMS: Cell<[u64; 5]> = const { Cell::new([0; 5]) };
    }

    pub fn add(phase: Phase, ns: u64) {
        SUMS.with(|s| {
            let mut v = s.get();
            v[phase as usize] += ns;
            s.set(v);
        });
    }

    pub fn count() {
        SUMS.with(|s| {
            let mut v = s.get();
            v[4] += 1;
            if v[4] >= REPORT_EVERY {
                let n = v[4];
                log::warn!(
                    "warmroute phases: n={n} body_ns={} parse_ns={} route_ns={} header_ns={}",
                    v[0] / n,
                    v[1] / n,
                    v[2] / n,
                    v[3] / n
                );
                v = [0; 5];
            }
            s.set(v);
        });
    }
}

impl Laps {
    /// Starts timing a request.
    pub fn start(_host: &impl Host) -> Laps {
        Laps {
            #[cfg(feature = "phase-timing")]
            last: _host.now_ns(),
        }
    }

    /// Ends `phase`: the time since the previous lap is charged to it.
    pub fn lap(&mut self, _host: &impl Host, _phase: Phase) {
        #[cfg(feature = "phase-timing")]
        {
            let now = _host.now_ns();
            on::add(_phase, now.saturating_sub(self.last));
            self.last = now;
        }
    }

    /// Counts the request once every phase it ran is charged.
    pub fn done(self) {
        #[cfg(feature = "phase-timing")]
        on::count();
    }
}
