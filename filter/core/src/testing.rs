//! An in-memory host for tests and the native benches (feature `testing`).
//!
//! Shared data follows proxy-wasm-cpp-host's CAS semantics (a write with a
//! stale token fails, a write without one always succeeds). The current HTTP
//! exchange is whatever the test put in [`MemoryHost::exchange`]; callouts are
//! captured with their tokens, and a test delivers a reply by setting
//! [`MemoryHost::reply`] and calling the worker's `on_scrape`. Stats keep
//! their values, readable by name. Several workers on one `MemoryHost` are
//! several VMs of one Envoy: they share its data, as Envoy's workers do.

use crate::config::Config;
use crate::host::{Callout, HeaderPair, Host, HostError, MetricKind, Versioned};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// `bytes` as lowercase hex: the tests pin each shared record's layout with it.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The HTTP exchange a test is driving, as the host sees it.
#[derive(Debug, Clone, Default)]
pub struct TestExchange {
    /// Request headers, as the client sent them, then as the worker changed them.
    pub request_headers: Vec<HeaderPair>,
    /// The buffered request body.
    pub body: Vec<u8>,
    /// Response headers the worker added.
    pub response_headers: Vec<(String, String)>,
    /// The upstream's `:status`.
    pub status: Option<String>,
    /// Envoy's `response.code_details`.
    pub details: Option<String>,
    /// The upstream Envoy last sent the exchange to.
    pub upstream: Option<String>,
    /// The port the client connected to.
    pub local_port: Option<u16>,
    /// A local reply the worker sent instead of forwarding.
    pub local_reply: Option<LocalReply>,
    /// The response body chunk being delivered.
    pub response_body: Vec<u8>,
    /// Filter-state values the worker set, by key.
    pub filter_state: Vec<(String, String)>,
}

/// A response the worker sent itself.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalReply {
    /// `:status`.
    pub status: u32,
    /// Headers.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl TestExchange {
    /// A request with these headers and body.
    pub fn request(headers: &[(&str, &str)], body: &[u8]) -> TestExchange {
        TestExchange {
            request_headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
            body: body.to_vec(),
            ..TestExchange::default()
        }
    }

    /// A request header's value.
    pub fn header(&self, name: &str) -> Option<String> {
        self.request_headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }
}

/// A callout the worker dispatched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentCallout {
    /// Token the reply must carry.
    pub token: u32,
    /// Envoy cluster.
    pub cluster: String,
    /// Headers, pseudo-headers included.
    pub headers: Vec<(String, String)>,
    /// Timeout.
    pub timeout_ms: u64,
}

impl SentCallout {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A callout reply being delivered.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    /// `:status` (none: Envoy failed the callout).
    pub status: Option<String>,
    /// Body.
    pub body: Vec<u8>,
}

#[derive(Debug, Clone)]
struct Metric {
    kind: MetricKind,
    name: String,
    value: i64,
}

/// In-memory host.
#[derive(Default)]
pub struct MemoryHost {
    /// Current time.
    pub now: Cell<u64>,
    data: RefCell<HashMap<String, (Vec<u8>, u32)>>,
    /// Number of writes that will fail with a CAS mismatch first (to test retries).
    pub inject_conflicts: Cell<u32>,
    /// The exchange being driven.
    pub exchange: RefCell<TestExchange>,
    /// Callouts dispatched, oldest first.
    pub callouts: RefCell<Vec<SentCallout>>,
    /// Whether dispatching fails (Envoy refuses, e.g. an unknown cluster).
    pub refuse_callouts: Cell<bool>,
    /// The reply being delivered.
    pub reply: RefCell<Reply>,
    metrics: RefCell<Vec<Metric>>,
    /// Tick period last set.
    pub tick_period_ms: Cell<u64>,
    tokens: Cell<u32>,
    queues: RefCell<HashMap<u32, std::collections::VecDeque<Vec<u8>>>>,
    /// The HTTP context later calls act on (0: the current exchange's own).
    pub context: Cell<u32>,
    /// Contexts resumed, in order, each with its request headers then.
    pub resumed: RefCell<Vec<(u32, Vec<HeaderPair>)>>,
    /// Local replies sent, with the context each was sent on.
    pub replies: RefCell<Vec<(u32, LocalReply)>>,
    /// A real clock for `now_ns` (the native decision bench times the
    /// router's steps with it); without one, `now_ns` follows `now`.
    pub ns_clock: Cell<Option<fn() -> u64>>,
    /// How many times the filter asked which upstream served.
    pub upstream_reads: Cell<u32>,
}

impl MemoryHost {
    /// Messages waiting on shared queue `queue`.
    pub fn queued(&self, queue: u32) -> usize {
        self.queues.borrow().get(&queue).map_or(0, |q| q.len())
    }

    /// Every shared-data key with the size of its value, sorted by key.
    pub fn shared_sizes(&self) -> Vec<(String, usize)> {
        let mut v: Vec<(String, usize)> = self
            .data
            .borrow()
            .iter()
            .map(|(k, (bytes, _))| (k.clone(), bytes.len()))
            .collect();
        v.sort();
        v
    }

    /// The callouts dispatched since the last call.
    pub fn take_callouts(&self) -> Vec<SentCallout> {
        std::mem::take(&mut *self.callouts.borrow_mut())
    }

    /// The name of every metric defined.
    pub fn metric_names(&self) -> Vec<String> {
        self.metrics
            .borrow()
            .iter()
            .map(|m| m.name.clone())
            .collect()
    }

    /// A stat's value by its full name (counters: the sum flushed so far).
    pub fn metric(&self, name: &str) -> Option<i64> {
        self.metrics
            .borrow()
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.value)
    }

    /// Forgets a shared-data key (as a restarted Envoy would).
    pub fn remove_shared(&self, key: &str) {
        self.data.borrow_mut().remove(key);
    }

    fn next_token(&self) -> u32 {
        let t = self.tokens.get().wrapping_add(1);
        self.tokens.set(t);
        t
    }

    /// Every shared-data key, sorted.
    pub fn shared_keys(&self) -> Vec<String> {
        let mut k: Vec<String> = self.data.borrow().keys().cloned().collect();
        k.sort();
        k
    }
}

impl Host for MemoryHost {
    fn now_ms(&self) -> u64 {
        self.now.get()
    }

    fn now_ns(&self) -> u64 {
        match self.ns_clock.get() {
            Some(clock) => clock(),
            None => self.now.get().saturating_mul(1_000_000),
        }
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

    fn request_headers(&self) -> Vec<HeaderPair> {
        self.exchange.borrow().request_headers.clone()
    }

    fn set_request_header(&self, name: &str, value: Option<&str>) -> Result<(), HostError> {
        let mut ex = self.exchange.borrow_mut();
        ex.request_headers
            .retain(|(k, _)| !k.eq_ignore_ascii_case(name));
        if let Some(v) = value {
            ex.request_headers
                .push((name.to_string(), v.as_bytes().to_vec()));
        }
        Ok(())
    }

    fn request_body(&self, size: usize) -> Option<Vec<u8>> {
        let ex = self.exchange.borrow();
        Some(ex.body[..size.min(ex.body.len())].to_vec())
    }

    fn replace_request_body(&self, len: usize, body: &[u8]) -> Result<(), HostError> {
        let mut ex = self.exchange.borrow_mut();
        let len = len.min(ex.body.len());
        ex.body.splice(..len, body.iter().copied());
        Ok(())
    }

    fn send_response(
        &self,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError> {
        let headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let reply = LocalReply {
            status,
            headers,
            body: body.to_vec(),
        };
        self.replies
            .borrow_mut()
            .push((self.context.get(), reply.clone()));
        self.exchange.borrow_mut().local_reply = Some(reply);
        Ok(())
    }

    fn add_response_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        self.exchange
            .borrow_mut()
            .response_headers
            .push((name.to_string(), value.to_string()));
        Ok(())
    }

    fn response_status(&self) -> Option<String> {
        self.exchange.borrow().status.clone()
    }

    fn response_details(&self) -> Option<String> {
        self.exchange.borrow().details.clone()
    }

    fn upstream_address(&self) -> Option<String> {
        self.upstream_reads.set(self.upstream_reads.get() + 1);
        self.exchange.borrow().upstream.clone()
    }

    fn local_port(&self) -> Option<u16> {
        self.exchange.borrow().local_port
    }

    fn response_body(&self, start: usize, size: usize) -> Option<Vec<u8>> {
        let e = self.exchange.borrow();
        let end = start.saturating_add(size).min(e.response_body.len());
        e.response_body.get(start..end).map(<[u8]>::to_vec)
    }

    fn dispatch(&self, call: &Callout<'_>) -> Result<u32, HostError> {
        if self.refuse_callouts.get() {
            return Err(HostError::Status(2));
        }
        let mut sent = self.callouts.borrow_mut();
        // Tokens are unique for the host's life, as Envoy's are.
        let token = self.next_token();
        sent.push(SentCallout {
            token,
            cluster: call.cluster.to_string(),
            headers: call
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            timeout_ms: call.timeout_ms,
        });
        Ok(token)
    }

    fn callout_status(&self) -> Option<String> {
        self.reply.borrow().status.clone()
    }

    fn callout_body(&self, size: usize) -> Option<Vec<u8>> {
        let r = self.reply.borrow();
        Some(r.body[..size.min(r.body.len())].to_vec())
    }

    fn define_metric(&self, kind: MetricKind, name: &str) -> Option<u32> {
        let mut m = self.metrics.borrow_mut();
        // As in Envoy, every VM that defines a name gets the one stat.
        if let Some(i) = m.iter().position(|x| x.name == name) {
            return u32::try_from(i).ok();
        }
        m.push(Metric {
            kind,
            name: name.to_string(),
            value: 0,
        });
        u32::try_from(m.len() - 1).ok()
    }

    fn increment_metric(&self, id: u32, by: i64) {
        if let Some(m) = self.metrics.borrow_mut().get_mut(id as usize) {
            debug_assert_eq!(m.kind, MetricKind::Counter);
            m.value = m.value.saturating_add(by);
        }
    }

    fn record_metric(&self, id: u32, value: u64) {
        if let Some(m) = self.metrics.borrow_mut().get_mut(id as usize) {
            m.value = i64::try_from(value).unwrap_or(i64::MAX);
        }
    }

    fn set_tick_period_ms(&self, ms: u64) -> Result<(), HostError> {
        self.tick_period_ms.set(ms);
        Ok(())
    }

    fn register_queue(&self, _name: &str) -> Result<u32, HostError> {
        let token = self.next_token();
        self.queues.borrow_mut().insert(token, Default::default());
        Ok(token)
    }

    fn enqueue(&self, queue: u32, value: &[u8]) -> Result<(), HostError> {
        match self.queues.borrow_mut().get_mut(&queue) {
            Some(q) => {
                q.push_back(value.to_vec());
                Ok(())
            }
            // proxy-wasm's NotFound.
            None => Err(HostError::Status(1)),
        }
    }

    fn dequeue(&self, queue: u32) -> Result<Option<Vec<u8>>, HostError> {
        match self.queues.borrow_mut().get_mut(&queue) {
            Some(q) => Ok(q.pop_front()),
            None => Err(HostError::Status(1)),
        }
    }

    fn enter_context(&self, context: u32) -> Result<(), HostError> {
        self.context.set(context);
        Ok(())
    }

    fn resume_request(&self) -> Result<(), HostError> {
        let headers = self.exchange.borrow().request_headers.clone();
        self.resumed
            .borrow_mut()
            .push((self.context.get(), headers));
        Ok(())
    }

    fn set_filter_state(&self, key: &str, value: &str) -> Result<(), HostError> {
        let mut e = self.exchange.borrow_mut();
        e.filter_state.retain(|(k, _)| k != key);
        e.filter_state.push((key.to_string(), value.to_string()));
        Ok(())
    }
}

/// A chain of `n` block hashes, the first `shared` of them common to every `tag`
/// (a system prompt every conversation carries), the rest this `tag`'s own.
pub fn tagged_chain(tag: u64, shared: usize, n: usize) -> Vec<u64> {
    (0..n as u64)
        .map(|i| {
            if (i as usize) < shared {
                i
            } else {
                tag << 32 | i
            }
        })
        .collect()
}

/// A configuration of `n` backends (`b0`.. at `127.0.0.1:1`..), every other field at its default.
pub fn config(n: usize) -> Config {
    let backends: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"name":"b{i}","address":"127.0.0.1:{}"}}"#, i + 1))
        .collect();
    let json = format!(r#"{{"backends":[{}]}}"#, backends.join(","));
    match Config::parse(json.as_bytes()) {
        Ok(c) => c,
        Err(e) => unreachable!("the test configuration is valid: {e}"),
    }
}

/// Property-test settings: a fixed seed, so a run is reproducible and a
/// property that holds can never fail by chance; no files written.
#[cfg(all(test, not(target_arch = "wasm32")))]
pub fn proptest_config() -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases: 256,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x7772_6d72),
        ..proptest::test_runner::Config::default()
    }
}
