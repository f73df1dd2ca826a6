//! What the core asks of its host: Envoy through proxy-wasm in the filter
//! (the wasm crate's `Proxy`), [`crate::testing::MemoryHost`] in tests.
//!
//! The trait is the whole surface the worker's verbs ([`crate::worker`]) use:
//! time, shared data, the current HTTP exchange's headers and body, callouts
//! (scrapes) and their replies, Envoy stats, and for requests held at the
//! gate ([`crate::gate`]) shared queues and acting on another exchange. Every fallible call returns
//! a [`HostError`]; the core never unwraps one, and a failed call degrades to
//! less information (a fallback decision, a scrape counted as failed), never
//! to a broken request.

/// A failed host call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostError {
    /// Shared data changed since it was read (compare-and-swap lost).
    CasMismatch,
    /// Any other status (proxy-wasm's `Status` as a number).
    Status(u32),
}

/// Shared data value with its CAS token.
pub type Versioned = (Option<Vec<u8>>, Option<u32>);

/// A header name and value as the host holds them.
pub type HeaderPair = (String, Vec<u8>);

/// Kinds of Envoy stats the filter defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up; increments from every VM add up.
    Counter,
    /// Set to a value.
    Gauge,
}

/// A GET callout to dispatch through an Envoy cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Callout<'a> {
    /// Envoy cluster name.
    pub cluster: &'a str,
    /// Request headers, pseudo-headers included.
    pub headers: Vec<(&'a str, &'a str)>,
    /// Envoy fails the callout after this long.
    pub timeout_ms: u64,
}

/// What the core may ask of the host.
pub trait Host {
    /// Host clock in milliseconds (never the wall clock: tests control it).
    fn now_ms(&self) -> u64;
    /// Host clock in nanoseconds, for the bench-only phase timing.
    fn now_ns(&self) -> u64 {
        self.now_ms().saturating_mul(1_000_000)
    }

    /// Reads a shared-data key.
    fn get_shared(&self, key: &str) -> Result<Versioned, HostError>;
    /// Writes a shared-data key; `cas` of `None` writes unconditionally.
    fn set_shared(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError>;

    /// Every request header of the current exchange, in one call.
    fn request_headers(&self) -> Vec<HeaderPair>;
    /// Sets (or, with `None`, removes) a request header of the current exchange.
    fn set_request_header(&self, name: &str, value: Option<&str>) -> Result<(), HostError>;
    /// The first `size` bytes of the current exchange's buffered request body.
    fn request_body(&self, size: usize) -> Option<Vec<u8>>;
    /// Replaces the first `len` bytes of the buffered request body (all of it) with `body`.
    fn replace_request_body(&self, len: usize, body: &[u8]) -> Result<(), HostError>;
    /// `size` bytes from `start` of the response body chunk being delivered.
    fn response_body(&self, start: usize, size: usize) -> Option<Vec<u8>>;
    /// Adds a response header to the current exchange.
    fn add_response_header(&self, name: &str, value: &str) -> Result<(), HostError>;
    /// The current exchange's response `:status`.
    fn response_status(&self) -> Option<String>;
    /// Envoy's `response.code_details` of the current exchange (why it ended).
    fn response_details(&self) -> Option<String>;
    /// `ip:port` of the upstream Envoy last sent the current exchange to.
    fn upstream_address(&self) -> Option<String>;
    /// The port the current exchange's client connected to (its listener's).
    fn local_port(&self) -> Option<u16>;
    /// Answers the current exchange locally; it is not forwarded.
    fn send_response(
        &self,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError>;

    /// Dispatches a callout; its reply arrives as the root context's
    /// `on_http_call_response` with the returned token.
    fn dispatch(&self, call: &Callout<'_>) -> Result<u32, HostError>;
    /// `:status` of the callout reply being delivered (none: the callout failed).
    fn callout_status(&self) -> Option<String>;
    /// The first `size` bytes of the callout reply being delivered.
    fn callout_body(&self, size: usize) -> Option<Vec<u8>>;

    /// Defines an Envoy stat; `None` when the host refuses (its counts are dropped).
    fn define_metric(&self, kind: MetricKind, name: &str) -> Option<u32>;
    /// Adds to a counter.
    fn increment_metric(&self, id: u32, by: i64);
    /// Sets a gauge.
    fn record_metric(&self, id: u32, value: u64);
    /// Sets the root context's tick period.
    fn set_tick_period_ms(&self, ms: u64) -> Result<(), HostError>;

    /// Registers this VM's shared queue `name`: whatever any VM enqueues on
    /// it arrives as this VM's root `on_queue_ready`. Returns its token.
    fn register_queue(&self, name: &str) -> Result<u32, HostError>;
    /// Puts a message on a shared queue, by token (any VM's).
    fn enqueue(&self, queue: u32, value: &[u8]) -> Result<(), HostError>;
    /// Takes the oldest message off a shared queue; `None` when it is empty.
    fn dequeue(&self, queue: u32) -> Result<Option<Vec<u8>>, HostError>;
    /// Makes `context` (an HTTP context of this VM) the one later calls act on
    /// (its headers, its local reply, its resumption), from any callback.
    fn enter_context(&self, context: u32) -> Result<(), HostError>;
    /// Lets the current exchange's paused request go on through Envoy.
    fn resume_request(&self) -> Result<(), HostError>;
    /// Sets the current exchange's filter-state value `key` (Envoy stores it as
    /// `wasm.<key>`, which an access log reads with `%FILTER_STATE(wasm.<key>:PLAIN)%`).
    fn set_filter_state(&self, key: &str, value: &str) -> Result<(), HostError>;
}
