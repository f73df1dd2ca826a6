//! Where a routed request's time goes inside Envoy, for the overhead benchmark.
//!
//! Compiled in only with `--features phase-timing` (the bench builds that
//! variant on the side): every lap reads the host clock, itself a host call,
//! so the shipped filter carries none of it and [`Laps`] and [`Split`] are
//! empty types. Every 100 timed requests a VM logs each phase's mean at warn
//! level, in one line the bench parses:
//! `warmroute phases: n=100 body_ns=.. parse_ns=.. route_ns=.. header_ns=..
//! ledger_ns=.. sync_ns=.. loads_ns=.. match_ns=.. policy_ns=.. account_ns=..
//! record_ns=.. log_ns=..`. The last eight split `route` into the router's
//! steps ([`Stage`]); `route` also holds their eight clock reads. Each figure
//! includes about one clock read (a few µs in Envoy's V8, ~25 ns natively).
//! The native decision bench (`bench/decision`) reads the same sums with
//! [`take`] instead of the log.

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

/// The router's steps inside [`Phase::Route`], in the order they run.
#[derive(Debug, Clone, Copy)]
pub enum Stage {
    /// Reading the ledger (one host call), decoding it, and applying this
    /// VM's view to it (its unwritten releases, each slot's standing).
    Ledger,
    /// Applying the index events other VMs appended (host calls per event).
    Sync,
    /// Each pod's load picture.
    Loads,
    /// The index's longest-prefix lookup.
    Match,
    /// The strategy's choice, fallbacks included.
    Policy,
    /// The ledger CAS: decode, this VM's deltas, encode, write.
    Account,
    /// Recording the prompt in this VM's index replica.
    Record,
    /// Writing the request's index-log event.
    Log,
}

/// Phases then steps, as the log line names them.
pub const NAMES: [&str; 12] = [
    "body", "parse", "route", "header", "ledger", "sync", "loads", "match", "policy", "account",
    "record", "log",
];

/// Lap timer of one request (empty unless built with `phase-timing`).
#[derive(Debug, Default)]
pub struct Laps {
    #[cfg(feature = "phase-timing")]
    last: u64,
}

/// Lap timer of the router's steps (empty unless built with `phase-timing`):
/// only between [`Split::start`] and [`Split::stop`] does a lap count.
#[derive(Debug, Default)]
pub struct Split {
    #[cfg(feature = "phase-timing")]
    last: Option<u64>,
}

#[cfg(feature = "phase-timing")]
mod on {
    use super::NAMES;
    use std::cell::Cell;

    /// Timed requests per log line.
    pub const REPORT_EVERY: u64 = 100;

    /// Sums of nanoseconds per phase and step, then the request count.
    pub type Sums = [u64; NAMES.len() + 1];

    thread_local! {
        /// Per-phase nanoseconds summed since the last report, then the request count.
        pub static SUMS: Cell<Sums> = const { Cell::new([0; NAMES.len() + 1]) };
    }

    pub fn add(i: usize, ns: u64) {
        SUMS.with(|s| {
            let mut v = s.get();
            if let Some(x) = v.get_mut(i) {
                *x += ns;
            }
            s.set(v);
        });
    }

    pub fn count(log_every: bool) {
        SUMS.with(|s| {
            let mut v = s.get();
            v[NAMES.len()] += 1;
            let n = v[NAMES.len()];
            if log_every && n >= REPORT_EVERY {
                let fields: Vec<String> = NAMES
                    .iter()
                    .zip(v)
                    .map(|(k, ns)| format!("{k}_ns={}", ns / n))
                    .collect();
                log::warn!("warmroute phases: n={n} {}", fields.join(" "));
                v = [0; NAMES.len() + 1];
            }
            s.set(v);
        });
    }
}

/// Mean ns per request of every phase and step ([`NAMES`]) since the last
/// call, and the request count; resets the sums. For the native bench, which
/// counts requests with [`count`] (no log line).
#[cfg(feature = "phase-timing")]
pub fn take() -> (u64, Vec<f64>) {
    let v = on::SUMS.with(|s| s.replace([0; NAMES.len() + 1]));
    let n = v[NAMES.len()];
    let means = v[..NAMES.len()]
        .iter()
        .map(|&ns| ns as f64 / n.max(1) as f64)
        .collect();
    (n, means)
}

/// Counts one request whose router steps were timed, without a log line (native bench).
#[cfg(feature = "phase-timing")]
pub fn count() {
    on::count(false);
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
            on::add(_phase as usize, now.saturating_sub(self.last));
            self.last = now;
        }
    }

    /// Counts the request once every phase it ran is charged.
    pub fn done(self) {
        #[cfg(feature = "phase-timing")]
        on::count(true);
    }
}

impl Split {
    /// Starts timing the router's steps of one request.
    pub fn start(&mut self, _host: &impl Host) {
        #[cfg(feature = "phase-timing")]
        {
            self.last = Some(_host.now_ns());
        }
    }

    /// Ends `step`, if timing: the time since the previous lap is charged to it.
    pub fn lap(&mut self, _host: &impl Host, _step: Stage) {
        #[cfg(feature = "phase-timing")]
        if let Some(last) = self.last {
            let now = _host.now_ns();
            on::add(
                Phase::Header as usize + 1 + _step as usize,
                now.saturating_sub(last),
            );
            self.last = Some(now);
        }
    }

    /// Stops timing: laps outside a routed request (the gate's look at the fleet) count nowhere.
    pub fn stop(&mut self) {
        #[cfg(feature = "phase-timing")]
        {
            self.last = None;
        }
    }
}
