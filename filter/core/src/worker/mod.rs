//! One worker VM's verbs: everything a proxy-wasm callback does, behind the
//! [`Host`] trait, so the whole flow (headers → body → decision → response →
//! log, the tick and its scrapes) runs natively in unit tests against
//! [`crate::testing::MemoryHost`] and, unchanged, in Envoy.
//!
//! ```text
//! on_request_headers  strip client routing headers; an inference POST pauses for its body
//! on_request_body     at end of stream: parse → prompt key → Router::route → routing
//!                     header (and the model header); no pod serves the model → 404
//! on_request_trailers the same, for a body that ends with trailers
//! on_response_body    first streamed byte: the prompt is prefilled (queue released);
//!                     a predicted hit's answer: the pod's own cache report; a stored
//!                     `/v1/responses` answer: its id, and the pod that answered it,
//!                     into the record its follow-ups route by ([`crate::fleet::responses`])
//! on_log              the request ends: its in-flight share is released, and how
//!                     it ended feeds Envoy's own view of its pod ([`crate::fleet::passive`])
//! tick                flush stats and releases, heartbeat, take back silent VMs'
//!                     in-flight, sweep gone fleets, expire the index, re-read the
//!                     slot table, health and LoRA state; the lease holder reads
//!                     a discovered pool's endpoints and dispatches due scrapes
//! on_scrape           a scrape reply (or failure) → health, shared with every VM;
//!                     or, for a discovered pool, Envoy's list of its endpoints
//!                     → the slot table ([`crate::fleet::membership`])
//! ```
//! A body that cannot be read (too large, compressed, not JSON, another
//! shape) is still routed, by the load-only fallback, and proxied unchanged.
//! Per-request state lives in an [`Exchange`] the glue keeps per HTTP context.
//!
//! | file | verbs |
//! |---|---|
//! | `mod.rs` | the request path: headers, body, route |
//! | `response.rs` | the response and the request's end: first byte, the pod's cache report, a stored response's id, the log |
//! | `tick.rs` | the tick and the VM's end |
//! | `callouts.rs` | the pool's endpoints and the scrapes: sent from the tick, and their replies |
//! | `admission/` | the gate: admit, hold, release, shed |
//! | [`stats`], [`steering`] | the filter's Envoy stats; the header that steers Envoy |

use crate::config::{Config, ConfigError, OBJECTIVE_HEADER};
use crate::fleet::inflight::Delta;
use crate::fleet::scrape_schedule::Scheduler;
use crate::fleet::view::FleetView;
use crate::host::Host;
use crate::phases::{Laps, Phase};
use crate::prompt::openai::{prompt_key, Endpoint, ParseError};
use crate::prompt::prefix::PromptKey;
use crate::routing::exchange::{is_peer_path, Peers};
use crate::routing::pending::PendingTicket;
use crate::routing::router::{Look, Previous, Request, Routed, Router, ANCHOR_BYTES};
use crate::worker::stats::{Stats, Unread};
use admission::{Admission, Holding};

mod admission;
mod callouts;
mod peers;
mod response;
pub mod stats;
pub mod steering;
mod tick;

/// Response header carrying the decision when `debug_header` is on.
pub const DEBUG_HEADER: &str = "x-warmroute";

/// The filter-state key of a request's route when `route_log` is on: Envoy
/// stores it as `wasm.warmroute` (`%FILTER_STATE(wasm.warmroute:PLAIN)%`).
pub const ROUTE_STATE: &str = "warmroute";

/// What the glue tells Envoy after a request callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Go on (the route is decided, or the request is not routed by us).
    Continue,
    /// Hold the request until more of the body arrives.
    Pause,
    /// The filter answered the request itself (e.g. no pod serves its model).
    Replied,
}

/// The answer to a model nobody serves: OpenAI's shape, or on `/v1/messages`
/// Anthropic's (vLLM's `translate_error_response` there).
fn model_not_found(model: &str, endpoint: Option<Endpoint>) -> Vec<u8> {
    let message = format!("The model `{model}` does not exist.");
    let body = match endpoint {
        Some(Endpoint::Messages) => serde_json::json!({"type": "error", "error": {
            "type": "not_found_error",
            "message": message,
        }}),
        _ => serde_json::json!({"error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }}),
    };
    body.to_string().into_bytes()
}

/// One HTTP exchange's state between callbacks.
#[derive(Debug, Default)]
pub struct Exchange {
    /// The glue's id of this exchange's HTTP context: the gate resumes or
    /// answers a held request from other callbacks by it.
    context: u32,
    /// Class rank and longest hold, from the request's headers (with a gate).
    class: usize,
    wait_ms: u64,
    /// Held at the gate or released from it: the worker keeps the state
    /// meanwhile, and the next callback takes it back ([`Worker::reclaim`]).
    parked: bool,
    /// The request said its body's length (not chunked, no trailers).
    sized: bool,
    endpoint: Option<Endpoint>,
    session: Option<String>,
    awaiting_body: bool,
    /// A compressed body buffered whole for the gate, which cannot read it.
    compressed: bool,
    /// Body bytes Envoy has buffered so far.
    buffered: usize,
    /// The backend this request was routed to.
    chosen: Option<usize>,
    /// What this request holds on `chosen` until released.
    claim: Delta,
    /// Its prompt waits on `chosen` until its first response byte, or its end
    /// ([`Router::close`]).
    pending: Option<PendingTicket>,
    debug: Option<String>,
    response_done: bool,
    /// A predicted cache hit whose answer will carry the pod's own report.
    awaiting_report: Option<Predicted>,
    /// A `/v1/responses` answer the pod stores: its first bytes so far, until
    /// its id is read ([`crate::prompt::openai::answer`]).
    answer: Option<Vec<u8>>,
}

impl Exchange {
    /// The state of a new exchange on HTTP context `context`.
    pub fn new(context: u32) -> Exchange {
        Exchange {
            context,
            ..Exchange::default()
        }
    }
}

/// What the index credited the chosen pod with, for the pod's report to check.
#[derive(Debug)]
struct Predicted {
    /// The pod's id: a report from a pod that has since left its slot says
    /// nothing of the slot's new pod.
    pod: u64,
    /// Matched blocks.
    blocks: u32,
    /// The prompt's blocks.
    of: u32,
    /// The prompt's canonical bytes.
    bytes: usize,
    /// When the pod last used the deepest of them, before this request.
    last_use_ms: u64,
}

/// One worker VM: its router, its stats, and (while it holds the lease) the scrapes.
pub struct Worker {
    router: Router,
    stats: Stats,
    scheduler: Scheduler,
    /// The pending read of the pool's endpoints: token, when sent.
    members_call: Option<(u32, u64)>,
    /// Whether the last read of the pool's endpoints was usable (logs only changes).
    members_ok: bool,
    /// The log said once that Envoy's admin ignores `/clusters?filter=`.
    unfiltered_logged: bool,
    /// Requests held at the gate, with a gate configured.
    holding: Option<Holding>,
    /// When the next full tick is due (the gate's check ticks in between).
    next_tick_ms: u64,
    /// This gateway replica's id among its peers.
    replica: u64,
    /// The pulls from the gateway's other replicas, with `peers` configured.
    peers: Option<Peers>,
}

/// The oldest Envoy the filter and the shipped configurations pass the e2e
/// suite on (`make e2e-oldest-envoy` runs part of it there). On 1.36 the
/// virtual host's `request_body_buffer_limit` is applied only when the router
/// sees the headers, after the filter has held the body, so prompts past the
/// listener's buffer (1 MiB) get 413 (envoyproxy/envoy#42607, in 1.37).
pub const MIN_ENVOY: &str = "1.37 or later";

impl Worker {
    /// Parses and validates the plugin configuration and starts a worker:
    /// defines its stats and sets the tick period.
    pub fn configure<H: Host>(host: &H, config: &[u8]) -> Result<Worker, ConfigError> {
        let cfg = Config::parse(config)?;
        let fleet = cfg.describe_fleet();
        log::info!(
            "warmroute: {fleet}, strategy {}, route mode {:?} ({}); warmroute {} needs Envoy {}",
            cfg.strategy.name(),
            cfg.route.mode,
            cfg.route.header,
            env!("CARGO_PKG_VERSION"),
            MIN_ENVOY
        );
        // The tick also ages the index out, so it runs even without scraping;
        // with a gate, it also checks the held requests, more often.
        let tick_ms = cfg.gate.as_ref().map_or(cfg.metrics.period_ms, |g| {
            g.check_ms.min(cfg.metrics.period_ms)
        });
        if host.set_tick_period_ms(tick_ms).is_err() {
            log::warn!(
                "warmroute: could not set the tick period: no scrapes, no index expiry, and \
                 this worker's in-flight counts live only as long as it routes"
            );
        }
        let names: Vec<String> = (0..cfg.slot_count())
            .map(|b| FleetView::slot_name(&cfg, b))
            .collect();
        let stats = Stats::define(&cfg, &names, host);
        let scheduler = Scheduler::new(cfg.slot_count());
        let gated = cfg.gate.is_some();
        let router = Router::new(cfg, host);
        let holding = gated.then(|| Holding::new(host, router.fleet().vm_id()));
        let fresh = host.now_ns() ^ router.fleet().vm_id().rotate_left(32);
        let replica = router
            .fleet()
            .store(host)
            .replica_id(fresh)
            .unwrap_or(fresh);
        let peers = router.config().peers.as_ref().map(|_| Peers::new(replica));
        Ok(Worker {
            router,
            stats,
            scheduler,
            members_call: None,
            members_ok: true,
            unfiltered_logged: false,
            holding,
            next_tick_ms: 0,
            replica,
            peers,
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        self.router.config()
    }

    /// Request headers: strips client routing headers, reads the session, and
    /// either routes at once (no body to read) or pauses for the body.
    pub fn on_request_headers<H: Host>(
        &mut self,
        host: &H,
        ex: &mut Exchange,
        end_of_stream: bool,
    ) -> Step {
        // One host call for every header read here: each call crosses the VM boundary
        // (and back, for the host to allocate the answer), which costs more than a scan.
        let headers = host.request_headers();
        let header = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| String::from_utf8_lossy(v))
        };
        let cfg = self.router.config();
        for h in steering::forbidden_client_headers(cfg) {
            if header(h).is_some() {
                let _ = host.set_request_header(h, None);
            }
        }
        ex.session = header(&cfg.session_header).map(|v| v.into_owned());
        if let Some(g) = &cfg.gate {
            let class = header(&g.class_header);
            let objective = header(OBJECTIVE_HEADER);
            let deadline = header(&g.deadline_header);
            (ex.class, ex.wait_ms) =
                g.classify(class.as_deref(), objective.as_deref(), deadline.as_deref());
        }
        if cfg.peers.is_some() {
            if let Some(path) = header(":path").filter(|p| is_peer_path(p)) {
                return self.serve_peer(host, &path);
            }
        }
        let max_body = cfg.max_body_bytes;
        let post = header(":method").is_some_and(|m| m.eq_ignore_ascii_case("POST"));
        ex.endpoint = header(":path")
            .filter(|_| post)
            .and_then(|p| Endpoint::from_path(&p));
        if ex.endpoint.is_none() {
            self.route(host, ex, None, None, Laps::start(host));
            return Step::Continue;
        }
        let encoded =
            header("content-encoding").is_some_and(|e| !e.eq_ignore_ascii_case("identity"));
        let length = header("content-length").and_then(|l| l.trim().parse::<usize>().ok());
        ex.sized = length.is_some();
        let too_large = length.is_some_and(|l| l > max_body);
        // With a gate, a compressed body is buffered like any other (within
        // `max_body_bytes`), unread, so that it waits its turn with the rest;
        // one too large to buffer routes at once, like a plain one.
        ex.compressed = encoded && self.holding.is_some() && !too_large;
        let fallback = if end_of_stream {
            Some(Unread::NoBody)
        } else if encoded && !ex.compressed {
            Some(Unread::Compressed)
        } else if too_large {
            Some(Unread::TooLarge)
        } else {
            None
        };
        match fallback {
            // A request without a body may wait at the gate (Pause); one whose body is
            // still to come and will not be read goes at once (see `route`).
            Some(f) => self.route(host, ex, None, Some(f), Laps::start(host)),
            None => {
                // Hold the route until the body is read (needs allow_on_headers_stop_iteration).
                ex.awaiting_body = true;
                Step::Pause
            }
        }
    }

    /// A request body chunk: at end of stream the body is read and routed.
    pub fn on_request_body<H: Host>(
        &mut self,
        host: &H,
        ex: &mut Exchange,
        body_size: usize,
        end_of_stream: bool,
    ) -> Step {
        if !ex.awaiting_body {
            return Step::Continue;
        }
        ex.buffered = body_size;
        if body_size > self.router.config().max_body_bytes {
            ex.awaiting_body = false;
            ex.compressed = false;
            self.route(host, ex, None, Some(Unread::TooLarge), Laps::start(host));
            return Step::Continue;
        }
        if !end_of_stream {
            return Step::Pause;
        }
        ex.awaiting_body = false;
        self.route_body(host, ex, body_size)
    }

    /// Request trailers: the body ended without an end-of-stream body callback
    /// (gRPC-style or chunked uploads with trailers), so route on what was buffered.
    pub fn on_request_trailers<H: Host>(&mut self, host: &H, ex: &mut Exchange) -> Step {
        if !ex.awaiting_body {
            return Step::Continue;
        }
        ex.awaiting_body = false;
        if ex.buffered == 0 {
            // Held at the gate (Pause) or shed (Replied) like any request without a body.
            self.route(host, ex, None, Some(Unread::NoBody), Laps::start(host))
        } else {
            // Whatever Envoy holds, up to one byte past the limit: `route` judges the size.
            let most = self.router.config().max_body_bytes.saturating_add(1);
            self.route_body(host, ex, most)
        }
    }

    /// Reads up to `size` bytes of the buffered body and routes on them.
    fn route_body<H: Host>(&mut self, host: &H, ex: &mut Exchange, size: usize) -> Step {
        if ex.compressed {
            return self.route(host, ex, None, Some(Unread::Compressed), Laps::start(host));
        }
        let mut laps = Laps::start(host);
        let body = host.request_body(size).unwrap_or_default();
        laps.lap(host, Phase::Body);
        self.route(host, ex, Some(&body), None, laps)
    }

    /// Reads the prompt, then routes the request, unless the gate holds it
    /// (every pod that could serve it is past its knee) or sheds it.
    fn route<H: Host>(
        &mut self,
        host: &H,
        ex: &mut Exchange,
        body: Option<&[u8]>,
        fallback: Option<Unread>,
        mut laps: Laps,
    ) -> Step {
        let (mut key, why) = self.read_prompt(ex, body, fallback);
        laps.lap(host, Phase::Parse);
        if let (Some(k), Some(b)) = (key.as_mut(), body) {
            if k.can_ask_usage
                && !k.skips_cache_reads
                && ex.sized
                && self.router.config().feedback.request_usage
            {
                k.reports_usage = self.ask_usage(host, b);
            }
        }
        // Only a request Envoy holds whole may wait: one whose body is still streaming
        // in (too large to read) would have it all buffered while held.
        let whole = body.is_some() || why == Some(Unread::NoBody) || ex.compressed;
        let mut look = None;
        if whole && ex.endpoint.is_some() && self.holding.is_some() {
            match self.admit(host, ex, key.as_ref()) {
                Admission::Go(l) => look = l,
                Admission::Hold(ticket) => {
                    let step = self.park(ex, key, why, ticket);
                    // Grants this admission made to this VM's older held requests.
                    self.release_granted(host, ex.context);
                    return step;
                }
                Admission::Shed(s) => {
                    return self.shed_now(host, ex, s);
                }
            }
        }
        let step = self.dispatch(host, ex, key.as_ref(), why, look, laps);
        // Grants this VM's admission made to its other held requests.
        self.release_granted(host, ex.context);
        step
    }

    /// Asks the pod to end the stream with its usage (`feedback.request_usage`):
    /// appends `stream_options` to the body, which set none, and fixes its length.
    fn ask_usage<H: Host>(&mut self, host: &H, body: &[u8]) -> bool {
        const ASK: &[u8] = br#","stream_options":{"include_usage":true}"#;
        let Some(end) = body.iter().rposition(|b| !b.is_ascii_whitespace()) else {
            return false;
        };
        // `"stream_options": null` parses as absent: a second key would be a duplicate.
        const OPTIONS: &[u8] = b"\"stream_options\"";
        if body[end] != b'}' || body.windows(OPTIONS.len()).any(|w| w == OPTIONS) {
            return false;
        }
        let mut asked = Vec::with_capacity(body.len() + ASK.len());
        asked.extend_from_slice(&body[..end]);
        asked.extend_from_slice(ASK);
        asked.extend_from_slice(&body[end..]);
        // The length first: a body longer than its content-length would be cut upstream.
        let asked_length = asked.len().to_string();
        let done = host
            .set_request_header("content-length", Some(&asked_length))
            .is_ok()
            && self.replace_body_or_restore(host, body, &asked);
        if done {
            self.stats.asked_usage();
        } else {
            log::warn!("warmroute: could not ask a pod for usage; the request goes as sent");
        }
        done
    }

    /// Replaces the body with `asked`; on failure puts its length back.
    fn replace_body_or_restore<H: Host>(&self, host: &H, body: &[u8], asked: &[u8]) -> bool {
        let replaced = host.replace_request_body(body.len(), asked).is_ok();
        if !replaced {
            let _ = host.set_request_header("content-length", Some(&body.len().to_string()));
        }
        replaced
    }

    /// Parses the body into the prompt's key, or says why it could not.
    fn read_prompt(
        &mut self,
        ex: &Exchange,
        body: Option<&[u8]>,
        fallback: Option<Unread>,
    ) -> (Option<PromptKey>, Option<Unread>) {
        let cfg = self.router.config();
        let mut why = fallback;
        let key = match (ex.endpoint, body) {
            (Some(e), Some(b)) if b.len() <= cfg.max_body_bytes => {
                match prompt_key(e, b, cfg.block_bytes, ANCHOR_BYTES) {
                    Ok(k) => Some(k),
                    Err(ParseError::NotJson) => {
                        why = Some(Unread::NotJson);
                        None
                    }
                    Err(ParseError::Shape) => {
                        why = Some(Unread::BadShape);
                        None
                    }
                }
            }
            (Some(_), Some(_)) => {
                why = Some(Unread::TooLarge);
                None
            }
            _ => None,
        };
        if let Some(w) = why {
            self.stats.fell_back(w);
            log::debug!("warmroute: fallback routing: {}", w.name());
        } else if ex.endpoint.is_none() {
            self.stats.passed_through();
        }
        (key, why)
    }

    /// Decides, writes the routing header, accounts the request; or, when no
    /// pod serves the request's model, answers it with a 404.
    fn dispatch<H: Host>(
        &mut self,
        host: &H,
        ex: &mut Exchange,
        key: Option<&PromptKey>,
        why: Option<Unread>,
        look: Option<Look>,
        mut laps: Laps,
    ) -> Step {
        let (previous, lookup_failed) = self.previous(host, key);
        let routed = self.router.route_admitted(
            host,
            &Request {
                key,
                session: ex.session.as_deref(),
                previous,
            },
            look,
        );
        laps.lap(host, Phase::Route);
        if lookup_failed {
            self.stats.host_error();
        }
        if let Some(how) = routed.continued {
            self.stats.continued(how);
        }
        if routed.unknown_model {
            let model = key.and_then(|k| k.model.as_deref()).unwrap_or("");
            self.stats.unknown_model();
            log::debug!("warmroute: no pod serves the requested model");
            ex.chosen = None;
            let body = model_not_found(model, ex.endpoint);
            if let Err(e) = host.send_response(404, &[("content-type", "application/json")], &body)
            {
                log::warn!("warmroute: could not answer an unknown model: {e:?}");
                return Step::Continue;
            }
            return Step::Replied;
        }
        if let (Some(name), Some(model)) = (
            &self.router.config().route.model_header,
            key.and_then(|k| k.model.as_deref()),
        ) {
            // A model no pod can serve (no served name has a control character): routed as
            // usual without the header, so routes on it fall to their default, and the pod
            // answers it as it would without warmroute (vLLM: 404, no such model). Refusing
            // it here would be a second error shape for the same mistake.
            if !steering::publishable_model(model) {
                log::debug!("warmroute: model has a control character, {name} not written");
            } else if host.set_request_header(name, Some(model)).is_err() {
                log::warn!("warmroute: could not set {name}");
            }
        }
        // No pod at all (a discovered pool before its first read): no header,
        // and Envoy's own fallback policy routes.
        let primary = routed.decision.order.first().copied();
        ex.chosen = primary;
        ex.claim = routed.claim;
        ex.pending = routed.pending;
        // Its id is read from the answer, whichever pod Envoy's last try reaches.
        ex.answer = key
            .filter(|k| k.stores_response && self.router.config().responses.max_entries > 0)
            .map(|_| Vec::new());
        // Set only for a predicted hit whose answer will carry usage.
        ex.awaiting_report = routed
            .last_use_ms
            .zip(primary)
            .map(|(last_use_ms, b)| Predicted {
                pod: self.router.fleet().pod_id(b),
                blocks: routed.decision.matched,
                of: routed.blocks,
                bytes: key.map_or(0, |k| k.total_bytes),
                last_use_ms,
            });
        self.stats.decided(
            routed.decision.reason,
            primary,
            key.and_then(|k| k.model.as_deref()),
            (routed.decision.matched, routed.blocks),
            (routed.host_errors, routed.log_gap, routed.redecided),
        );
        let cfg = self.router.config();
        for (name, value) in
            steering::route_headers(cfg, self.router.fleet().backends(), &routed.decision.order)
        {
            if host.set_request_header(name, Some(&value)).is_err() {
                log::warn!("warmroute: could not set {name}");
            }
        }
        laps.lap(host, Phase::Header);
        laps.done();
        if cfg.debug_header {
            // The match and the reason only on request: either tells whether anyone
            // sent this prefix lately (a cache hit is a match).
            ex.debug = Some(self.route_note(&routed, why, cfg.debug_match_counts));
        }
        if cfg.route_log {
            let note = self.route_note(&routed, why, true);
            if let Err(e) = host.set_filter_state(ROUTE_STATE, &note) {
                log::debug!("warmroute: route not noted for the access log: {e:?}");
            }
        }
        Step::Continue
    }

    /// Who answered the stored response a follow-up continues, by the record
    /// ([`crate::fleet::responses`]): one read of its bucket. Also whether
    /// that read failed (the request then routes as usual).
    fn previous<H: Host>(&self, host: &H, key: Option<&PromptKey>) -> (Option<Previous>, bool) {
        let Some(id) = key.and_then(|k| k.previous_response) else {
            return (None, false);
        };
        if self.router.config().responses.max_entries == 0 {
            return (None, false);
        }
        match self.router.fleet().store(host).response_holder(id) {
            Ok(Some(e)) => (Some(Previous::Answered(e.pod)), false),
            Ok(None) => (Some(Previous::Unknown), false),
            Err(e) => {
                log::debug!("warmroute: the record of stored responses is unread: {e:?}");
                (Some(Previous::Unknown), true)
            }
        }
    }

    /// One request's route as `backend=<pod>[;match=<held>/<blocks>;reason=<why>[;previous_response=<how>]][;fallback=<cause>]`,
    /// with the match, the reason and how a follow-up went when `counts`.
    fn route_note(&self, routed: &Routed, why: Option<Unread>, counts: bool) -> String {
        let backend = routed
            .decision
            .order
            .first()
            .and_then(|&b| self.router.fleet().backend(b))
            .map_or("", |b| b.name.as_str());
        let cache = if counts {
            let continued = routed.continued.map_or(String::new(), |c| {
                format!(";previous_response={}", c.name())
            });
            format!(
                ";match={}/{};reason={}{continued}",
                routed.decision.matched,
                routed.blocks,
                routed.decision.reason.name()
            )
        } else {
            String::new()
        };
        let fallback = why.map_or(String::new(), |w| format!(";fallback={}", w.name()));
        format!("backend={backend}{cache}{fallback}")
    }
}

#[cfg(test)]
mod tests;
