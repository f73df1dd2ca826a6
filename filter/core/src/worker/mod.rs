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
//!                     a predicted hit's answer: the pod's own cache report
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

use crate::config::{Config, ConfigError, ENDPOINT_HEADER};
use crate::fleet::health::Outcome;
use crate::fleet::inflight::Delta;
use crate::fleet::membership::{admin_path, MAX_REPLY_BYTES};
use crate::fleet::passive::Answer;
use crate::fleet::scrape::extract_with_lora;
use crate::fleet::scrape_schedule::Scheduler;
use crate::host::{Callout, Host};
use crate::phases::{Laps, Phase};
use crate::prompt::openai::{prompt_key, Endpoint, ParseError};
use crate::prompt::prefix::PromptKey;
use crate::routing::feedback::{report, TAIL_BYTES};
use crate::routing::load::Standing;
use crate::routing::router::{Request, Router, ANCHOR_BYTES};
use crate::routing::waiting::WaitTicket;
use crate::worker::stats::{Fallback, Stats};
use admission::{Admission, Holding};

mod admission;
pub mod stats;
pub mod steering;

/// Response header carrying the decision when `debug_header` is on.
pub const DEBUG_HEADER: &str = "x-warmroute";

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

/// OpenAI's answer to a model nobody serves.
fn model_not_found(model: &str) -> Vec<u8> {
    let message = format!("The model `{model}` does not exist.");
    serde_json::json!({"error": {
        "message": message,
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }})
    .to_string()
    .into_bytes()
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
    /// Body bytes Envoy has buffered so far.
    buffered: usize,
    /// The backend this request was routed to.
    chosen: Option<usize>,
    /// What this request holds on `chosen` until released.
    held: Delta,
    /// Its prompt waits on `chosen` until its first response byte, or its end
    /// ([`Router::close`]).
    waiting: Option<WaitTicket>,
    debug: Option<String>,
    response_done: bool,
    /// A predicted cache hit whose answer will carry the pod's own report.
    awaiting_report: Option<Predicted>,
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
    /// Requests held at the gate, with a gate configured.
    holding: Option<Holding>,
    /// When the next full tick is due (the gate's check ticks in between).
    next_tick_ms: u64,
}

impl Worker {
    /// Parses and validates the plugin configuration and starts a worker:
    /// defines its stats and sets the tick period.
    pub fn configure<H: Host>(host: &H, config: &[u8]) -> Result<Worker, ConfigError> {
        let cfg = Config::parse(config)?;
        let fleet = cfg.describe_fleet();
        log::info!(
            "warmroute: {fleet}, strategy {}, route mode {:?} ({})",
            cfg.strategy.name(),
            cfg.route.mode,
            cfg.route.header
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
            .map(|b| Router::slot_name(&cfg, b))
            .collect();
        let stats = Stats::define(&cfg, &names, host);
        let scheduler = Scheduler::new(cfg.slot_count());
        let gated = cfg.gate.is_some();
        let router = Router::new(cfg, host);
        let holding = gated.then(|| Holding::new(host, router.vm_id()));
        Ok(Worker {
            router,
            stats,
            scheduler,
            members_call: None,
            members_ok: true,
            holding,
            next_tick_ms: 0,
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
            let class = g.class_headers.iter().find_map(|h| header(h));
            let deadline = header(&g.deadline_header);
            (ex.class, ex.wait_ms) = g.classify(class.as_deref(), deadline.as_deref());
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
        let fallback = if end_of_stream {
            Some(Fallback::NoBody)
        } else if encoded {
            Some(Fallback::Compressed)
        } else if too_large {
            Some(Fallback::TooLarge)
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
            self.route(host, ex, None, Some(Fallback::TooLarge), Laps::start(host));
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
            self.route(host, ex, None, Some(Fallback::NoBody), Laps::start(host))
        } else {
            // Whatever Envoy holds, up to one byte past the limit: `route` judges the size.
            let most = self.router.config().max_body_bytes.saturating_add(1);
            self.route_body(host, ex, most)
        }
    }

    /// Reads up to `size` bytes of the buffered body and routes on them.
    fn route_body<H: Host>(&mut self, host: &H, ex: &mut Exchange, size: usize) -> Step {
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
        fallback: Option<Fallback>,
        mut laps: Laps,
    ) -> Step {
        let (mut key, why) = self.read_prompt(ex, body, fallback);
        laps.lap(host, Phase::Parse);
        if let (Some(k), Some(b)) = (key.as_mut(), body) {
            if k.can_ask_usage && ex.sized && self.router.config().feedback.request_usage {
                k.reports_usage = self.ask_usage(host, b);
            }
        }
        // Only a request Envoy holds whole may wait: one whose body is still streaming
        // in (too large to read, compressed) would have it all buffered while held.
        let whole = body.is_some() || why == Some(Fallback::NoBody);
        if whole && ex.endpoint.is_some() && self.holding.is_some() {
            match self.admit(host, ex, key.as_ref()) {
                Admission::Go => {}
                Admission::Hold(ticket) => {
                    self.router.forget_admission();
                    let step = self.park(ex, key, why, ticket);
                    // Grants this admission made to this VM's older held requests.
                    self.release_granted(host, ex.context);
                    return step;
                }
                Admission::Shed(s) => {
                    self.router.forget_admission();
                    return self.shed_now(host, ex, s);
                }
            }
        }
        let step = self.dispatch(host, ex, key.as_ref(), why, laps);
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
        fallback: Option<Fallback>,
    ) -> (Option<PromptKey>, Option<Fallback>) {
        let cfg = self.router.config();
        let mut why = fallback;
        let key = match (ex.endpoint, body) {
            (Some(e), Some(b)) if b.len() <= cfg.max_body_bytes => {
                match prompt_key(e, b, cfg.block_bytes, ANCHOR_BYTES) {
                    Ok(k) => Some(k),
                    Err(ParseError::NotJson) => {
                        why = Some(Fallback::NotJson);
                        None
                    }
                    Err(ParseError::Shape) => {
                        why = Some(Fallback::BadShape);
                        None
                    }
                }
            }
            (Some(_), Some(_)) => {
                why = Some(Fallback::TooLarge);
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
        why: Option<Fallback>,
        mut laps: Laps,
    ) -> Step {
        let routed = self.router.route(
            host,
            &Request {
                key,
                session: ex.session.as_deref(),
            },
        );
        laps.lap(host, Phase::Route);
        if routed.unknown_model {
            let model = key.and_then(|k| k.model.as_deref()).unwrap_or("");
            self.stats.unknown_model();
            log::debug!("warmroute: no pod serves the requested model");
            ex.chosen = None;
            let body = model_not_found(model);
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
            if host.set_request_header(name, Some(model)).is_err() {
                log::warn!("warmroute: could not set {name}");
            }
        }
        // No pod at all (a discovered pool before its first read): no header,
        // and Envoy's own fallback policy routes.
        let primary = routed.decision.order.first().copied();
        ex.chosen = primary;
        ex.held = routed.held;
        ex.waiting = routed.waiting;
        // Set only for a predicted hit whose answer will carry usage.
        ex.awaiting_report = routed
            .last_use_ms
            .zip(primary)
            .map(|(last_use_ms, b)| Predicted {
                pod: self.router.pod_id(b),
                blocks: routed.decision.matched,
                of: routed.blocks,
                last_use_ms,
            });
        self.stats.decided(
            routed.decision.reason,
            primary,
            (routed.decision.matched, routed.blocks),
            (routed.host_errors, routed.log_gap, routed.redecided),
        );
        let cfg = self.router.config();
        if let Some((name, value)) =
            steering::route_header(cfg, self.router.fleet(), &routed.decision.order)
        {
            if host.set_request_header(name, Some(&value)).is_err() {
                log::warn!("warmroute: could not set {name}");
            }
        }
        laps.lap(host, Phase::Header);
        laps.done();
        if cfg.debug_header {
            let backend = primary
                .and_then(|b| self.router.backend(b))
                .map_or("", |b| b.name.as_str());
            // The match and the reason only on request: either tells whether anyone
            // sent this prefix lately (a cache hit is a match).
            let cache = if cfg.debug_match_counts {
                format!(
                    ";match={}/{};reason={}",
                    routed.decision.matched,
                    routed.blocks,
                    routed.decision.reason.name()
                )
            } else {
                String::new()
            };
            let fallback = why.map_or(String::new(), |w| format!(";fallback={}", w.name()));
            ex.debug = Some(format!("backend={backend}{cache}{fallback}"));
        }
        Step::Continue
    }

    /// Response headers: adds the debug header when configured.
    pub fn on_response_headers<H: Host>(
        &mut self,
        host: &H,
        ex: &mut Exchange,
        end_of_stream: bool,
    ) {
        self.reclaim(ex);
        ex.response_done = end_of_stream;
        if let Some(d) = &ex.debug {
            let _ = host.add_response_header(DEBUG_HEADER, d);
        }
    }

    /// A response body chunk: the first streamed byte means the prompt is
    /// prefilled, so others stop queueing behind it. A response that ends
    /// here is released whole in [`Worker::on_log`]. While a predicted hit
    /// waits for the pod's cache report, the chunk's tail is searched for it.
    pub fn on_response_body<H: Host>(
        &mut self,
        host: &H,
        ex: &mut Exchange,
        body_size: usize,
        end_of_stream: bool,
    ) {
        self.reclaim(ex);
        ex.response_done |= end_of_stream;
        if body_size > 0 && !end_of_stream {
            if let Some(b) = ex.chosen.filter(|_| ex.held.prefill_blocks > 0) {
                self.router.prefilled(b, &mut ex.held);
            }
            // Its prompt no longer waits on the pod: not a queue shared with it.
            if let Some(t) = ex.waiting.take() {
                self.router.close(t);
            }
        }
        if body_size > 0 && ex.awaiting_report.is_some() {
            self.read_report(host, ex, body_size);
        }
    }

    fn read_report<H: Host>(&mut self, host: &H, ex: &mut Exchange, body_size: usize) {
        let start = body_size.saturating_sub(TAIL_BYTES);
        let Some(reported) = host
            .response_body(start, body_size - start)
            .and_then(|tail| report(&tail))
        else {
            return;
        };
        let (Some(p), Some(b)) = (ex.awaiting_report.take(), ex.chosen) else {
            return;
        };
        if self.router.pod_id(b) != p.pod {
            return;
        }
        self.router.learn_ratio(p.of, reported.prompt_tokens);
        let verdict = self
            .router
            .reported(host, b, (p.blocks, p.of), reported, p.last_use_ms);
        // In the pod's tokens: the index's share of the prompt, against the pod's.
        let predicted =
            f64::from(p.blocks) / f64::from(p.of.max(1)) * reported.prompt_tokens as f64;
        self.stats
            .reported(predicted as u64, reported.cached_tokens, verdict);
    }

    /// The exchange is over (every outcome): counts it and releases what it held.
    pub fn on_log<H: Host>(&mut self, host: &H, ex: &mut Exchange) {
        if ex.parked {
            self.leave_gate(host, ex);
        }
        let Some(b) = ex.chosen.take() else { return };
        // A stream reset after the headers still has a :status; Envoy's details tell the
        // truth. A response whose last byte passed this filter was not reset upstream,
        // which spares most requests that host call.
        let details = (!ex.response_done)
            .then(|| host.response_details())
            .flatten();
        let reset = details
            .as_deref()
            .is_some_and(|d| d.contains("reset") || d.contains("disconnect"));
        let status: Option<u16> = host.response_status().and_then(|v| v.parse().ok());
        self.stats
            .finished(status.filter(|_| !reset).map(u32::from));
        if let Some(t) = ex.waiting.take() {
            self.router.close(t);
        }
        let held = std::mem::take(&mut ex.held);
        if let Err(e) = self.router.release(host, b, held) {
            log::debug!("warmroute: in-flight release waits for the tick: {e:?}");
        }
        self.answered(host, b, Answer::of(status, details.as_deref()));
        // Its pod has room again: the gate's next held request may go.
        self.pump(host, ex.context);
    }

    /// Envoy's own view of the pod that served (or failed) the request: the
    /// last upstream it tried, which a retry may have moved off the `chosen` one.
    fn answered<H: Host>(&mut self, host: &H, chosen: usize, answer: Option<Answer>) {
        let Some(answer) = answer else { return };
        let now = host.now_ms();
        if answer == Answer::Served && self.router.settled(chosen, now) {
            return;
        }
        let Some(b) = host
            .upstream_address()
            .and_then(|a| self.router.backend_at(&a))
        else {
            return;
        };
        if self.router.answered(b, answer, now) {
            self.stats.ejected();
            let name = self.router.backend(b).map_or("", |x| x.name.as_str());
            log::warn!(
                "warmroute: backend {name} out of this worker's rotation after {} failed responses",
                self.router.config().metrics.eject_after_errors
            );
        }
    }

    /// The root context's tick: flushes stats; writes pending releases and this
    /// VM's heartbeat, and takes back silent VMs' in-flight shares; ages the
    /// index, re-reads the slot table and health, refreshes the gauges and, in
    /// the VM holding the lease, reads the pool's endpoints from Envoy and
    /// dispatches the scrapes that are due.
    ///
    /// With a gate, the tick runs every `gate.check_ms`: the rest of the work
    /// every `metrics.period_ms` (within half a check), the gate's check
    /// ([`Worker::check_gate`]) every time, last.
    pub fn tick<H: Host>(&mut self, host: &H) {
        let now = host.now_ms();
        let half_check = self.router.config().gate.as_ref().map(|g| g.check_ms / 2);
        let due = half_check.is_none_or(|half| now.saturating_add(half) >= self.next_tick_ms);
        if due {
            self.next_tick_ms = now.saturating_add(self.router.config().metrics.period_ms);
            self.periodic(host, now);
        }
        if self.holding.is_some() {
            self.check_gate(host, now);
        }
    }

    fn periodic<H: Host>(&mut self, host: &H, now: u64) {
        self.stats.flush(host);
        let inflight = self.router.tick_ledger(host, now).unwrap_or_else(|e| {
            log::debug!("warmroute: in-flight releases wait for the next tick: {e:?}");
            self.router.inflight(host).unwrap_or_default()
        });
        self.router.expire(now);
        match self.router.sweep_fleets(host, now) {
            Ok(gone) => gone.iter().for_each(|id| {
                log::info!(
                    "warmroute: emptied the shared data of fleet {id:016x}, silent since long"
                )
            }),
            Err(e) => log::debug!("warmroute: fleet registry not updated: {e:?}"),
        }
        if let Err(e) = self.router.publish_served(host) {
            log::debug!("warmroute: answered-request times not shared: {e:?}");
        }
        match self.router.refresh_members(host) {
            Ok(changed) => changed.into_iter().for_each(|b| self.scheduler.forget(b)),
            Err(e) => log::debug!("warmroute: slot table not refreshed: {e:?}"),
        }
        if let Err(e) = self.router.refresh_health(host) {
            log::debug!("warmroute: health not refreshed: {e:?}");
        }
        if let Err(e) = self.router.refresh_lora(host) {
            log::debug!("warmroute: LoRA state not refreshed: {e:?}");
        }
        let in_rotation: Vec<bool> = self
            .router
            .standing(now)
            .into_iter()
            .map(|s| s == Standing::In)
            .collect();
        self.stats.gauges(host, &inflight, &in_rotation);
        let cfg = self.router.config();
        if !cfg.metrics.enabled && cfg.pool.is_none() {
            return;
        }
        let vm = self.router.vm_id();
        if !self
            .router
            .store(host)
            .try_lease(vm, 3 * cfg.metrics.period_ms)
            .unwrap_or(false)
        {
            self.scheduler.reset();
            self.members_call = None;
            return;
        }
        self.read_members(host, now);
        if self.router.config().metrics.enabled {
            self.scrape(host, now);
        }
    }

    /// Asks Envoy for the pool's endpoints, unless a read is under way.
    fn read_members<H: Host>(&mut self, host: &H, now: u64) {
        let cfg = self.router.config();
        let Some(pool) = &cfg.pool else { return };
        let lost_after = cfg.metrics.timeout_ms + cfg.metrics.period_ms;
        if self
            .members_call
            .is_some_and(|(_, since)| now.saturating_sub(since) <= lost_after)
        {
            return;
        }
        let names: Vec<&str> = pool.clusters.iter().map(|c| c.name.as_str()).collect();
        let path = admin_path(&names);
        let call = Callout {
            cluster: &pool.admin_cluster,
            headers: vec![
                (":method", "GET"),
                (":path", &path),
                (":authority", "envoy-admin"),
            ],
            timeout_ms: cfg.metrics.timeout_ms,
        };
        self.members_call = match host.dispatch(&call) {
            Ok(token) => Some((token, now)),
            Err(e) => {
                self.members_failed(format_args!("not dispatched: {e:?}"));
                None
            }
        };
    }

    /// Envoy's answer to [`Worker::read_members`].
    fn on_members<H: Host>(&mut self, host: &H, num_headers: usize, body_size: usize) {
        let status = (num_headers > 0).then(|| host.callout_status()).flatten();
        if status.as_deref() != Some("200") {
            let status = status.unwrap_or_else(|| "none".into());
            return self.members_failed(format_args!("admin status {status}"));
        }
        // An Envoy that ignores `filter` answers with every cluster: not worth copying in.
        if body_size > MAX_REPLY_BYTES {
            return self.members_failed(format_args!("admin reply of {body_size} bytes"));
        }
        let body = host.callout_body(body_size).unwrap_or_default();
        match self.router.members_reply(host, &body, host.now_ms()) {
            Ok(Ok(changes)) => {
                self.members_ok = true;
                for (b, address) in &changes.left {
                    log::info!("warmroute: pod {address} left the pool (slot pod-{b})");
                    self.scheduler.forget(*b);
                }
                for (b, address) in &changes.joined {
                    log::info!("warmroute: pod {address} joined the pool as slot pod-{b}");
                    self.scheduler.forget(*b);
                }
                if changes.unplaced > 0 {
                    log::warn!(
                        "warmroute: {} pods left out: all {} slots are taken (pool.max_backends)",
                        changes.unplaced,
                        self.router.slot_count()
                    );
                }
            }
            Ok(Err(e)) => self.members_failed(format_args!("unusable admin reply: {e:?}")),
            Err(e) => self.members_failed(format_args!("slot table not written: {e:?}")),
        }
    }

    /// A read of the pool's endpoints failed: members stay as they were.
    fn members_failed(&mut self, why: std::fmt::Arguments<'_>) {
        if std::mem::take(&mut self.members_ok) {
            log::warn!("warmroute: pool endpoints not read ({why}); keeping the last members");
        } else {
            log::debug!("warmroute: pool endpoints not read ({why})");
        }
    }

    /// Dispatches the scrapes that are due (this VM holds the lease).
    fn scrape<H: Host>(&mut self, host: &H, now: u64) {
        let m = &self.router.config().metrics;
        let lost_after = m.timeout_ms + m.period_ms;
        let due = self.scheduler.due(now, lost_after);
        for b in due.lost {
            self.scraped(host, b, Outcome::Slow, now);
        }
        for b in due.scrape {
            let cfg = self.router.config();
            let Some(backend) = self.router.backend(b) else {
                continue;
            };
            let call = Callout {
                cluster: &cfg.metrics.cluster,
                headers: vec![
                    (":method", "GET"),
                    (":path", &backend.metrics_path),
                    (":authority", &backend.host),
                    (ENDPOINT_HEADER, &backend.address),
                ],
                timeout_ms: cfg.metrics.timeout_ms,
            };
            match host.dispatch(&call) {
                Ok(token) => self.scheduler.dispatched(b, token, now),
                Err(e) => {
                    log::debug!(
                        "warmroute: scrape of {} not dispatched: {e:?}",
                        backend.name
                    );
                    self.scraped(host, b, Outcome::Failed, now);
                }
            }
        }
    }

    /// A callout reply (`num_headers == 0`: Envoy failed or timed it out).
    pub fn on_scrape<H: Host>(
        &mut self,
        host: &H,
        token: u32,
        num_headers: usize,
        body_size: usize,
    ) {
        if self.members_call.is_some_and(|(t, _)| t == token) {
            self.members_call = None;
            return self.on_members(host, num_headers, body_size);
        }
        let Some((b, sent_ms)) = self.scheduler.completed(token) else {
            return;
        };
        let now = host.now_ms();
        let mut lora_seen = None;
        let status = (num_headers > 0).then(|| host.callout_status()).flatten();
        let cfg = &self.router.config().metrics;
        let outcome = match status.as_deref() {
            Some("200") => host
                .callout_body(body_size)
                .map_or(Outcome::Failed, |body| {
                    let (mut sc, lora) = extract_with_lora(
                        &String::from_utf8_lossy(&body),
                        &cfg.names,
                        cfg.model_name.as_deref(),
                    );
                    lora_seen = Some(lora);
                    // What the scrape counts of this gateway's own traffic (see `load`).
                    let inflight = self.router.inflight(host).unwrap_or_default();
                    sc.own_inflight = inflight.get(b).map_or(0, |f| f.requests);
                    Outcome::Answered(sc)
                }),
            // Envoy answers a callout past its timeout with its own 504 (or, on some
            // paths, no headers at all); either one that lasted the whole timeout (less
            // a tenth, for the clock's granularity) timed out.
            Some("504") | None
                if now.saturating_sub(sent_ms) >= cfg.timeout_ms - cfg.timeout_ms / 10 =>
            {
                Outcome::Slow
            }
            _ => Outcome::Failed,
        };
        if let Some(lora) = lora_seen {
            if let Err(e) = self.router.record_lora(host, b, lora) {
                log::debug!("warmroute: LoRA state not shared: {e:?}");
            }
        }
        self.scraped(host, b, outcome, now);
    }

    /// Records a scrape's outcome: stats, shared health, and a log line when
    /// the backend leaves or rejoins the rotation.
    fn scraped<H: Host>(&mut self, host: &H, b: usize, outcome: Outcome, now: u64) {
        self.stats.scraped(&outcome);
        // This VM holds the scrape lease, so its own view is the last health written.
        let was_down = self.router.health().get(b).map(|x| x.down);
        let result = self.router.record_scrape(host, b, outcome, now);
        let name = self.router.backend(b).map_or("", |x| x.name.as_str());
        match result {
            Ok(h) if h.down && was_down == Some(false) => {
                log::warn!(
                    "warmroute: backend {name} out of rotation after {} failed scrapes",
                    h.failures
                )
            }
            Ok(h) if !h.down && was_down == Some(true) => {
                log::info!(
                    "warmroute: backend {name} back in rotation after {} good scrapes",
                    h.successes
                )
            }
            Ok(_) => {}
            Err(e) => log::debug!("warmroute: health update for {name} lost: {e:?}"),
        }
    }

    /// The VM is going away (reconfiguration, drain): what waits for the tick goes now.
    pub fn on_done<H: Host>(&mut self, host: &H) {
        self.release_all(host);
        self.stats.flush(host);
        if let Err(e) = self.router.flush_releases(host) {
            log::warn!("warmroute: in-flight releases lost at shutdown: {e:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{MemoryHost, Reply, SentCallout, TestExchange};
    use std::collections::BTreeSet;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const CONFIG: &str = r#"{"backends":[
        {"name":"a","address":"127.0.0.1:1"},
        {"name":"b","address":"127.0.0.1:2"},
        {"name":"c","address":"127.0.0.1:3"}],
        "metrics":{"period_ms":500,"timeout_ms":400,"unhealthy_after":2}}"#;

    const METRICS: &str = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n\
vllm:kv_cache_usage_perc 0.1\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1\n";

    fn worker(host: &MemoryHost) -> Worker {
        Worker::configure(host, CONFIG.as_bytes()).unwrap()
    }

    fn chat_body(user: &str) -> Vec<u8> {
        format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":"{}"}},{{"role":"user","content":"{user}"}}]}}"#,
            "s".repeat(600)
        )
        .into_bytes()
    }

    /// Drives one request through the callbacks up to the routing decision.
    fn send(w: &mut Worker, host: &MemoryHost, headers: &[(&str, &str)], body: &[u8]) -> Exchange {
        *host.exchange.borrow_mut() = TestExchange::request(headers, body);
        let mut ex = Exchange::default();
        if w.on_request_headers(host, &mut ex, body.is_empty()) == Step::Pause {
            assert_eq!(
                w.on_request_body(host, &mut ex, body.len() / 2, false),
                Step::Pause
            );
            assert_eq!(
                w.on_request_body(host, &mut ex, body.len(), true),
                Step::Continue
            );
        }
        ex
    }

    fn chat_headers() -> Vec<(&'static str, &'static str)> {
        vec![
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("content-type", "application/json"),
        ]
    }

    fn routed_to(host: &MemoryHost) -> Option<String> {
        host.exchange.borrow().header(ENDPOINT_HEADER)
    }

    fn inflight(w: &Worker, host: &MemoryHost) -> Vec<u32> {
        w.router
            .store(host)
            .inflight()
            .unwrap()
            .iter()
            .map(|f| f.requests)
            .collect()
    }

    /// Answers every callout dispatched since the last call with `reply`.
    fn answer(w: &mut Worker, host: &MemoryHost, reply: impl Fn(&str) -> Reply) {
        deliver(w, host, &host.take_callouts(), reply);
    }

    /// Delivers `reply(pod address)` to each of `sent`.
    fn deliver(
        w: &mut Worker,
        host: &MemoryHost,
        sent: &[SentCallout],
        reply: impl Fn(&str) -> Reply,
    ) {
        for c in sent {
            let r = reply(c.header(ENDPOINT_HEADER).unwrap_or_default());
            let (headers, size) = (usize::from(r.status.is_some()), r.body.len());
            *host.reply.borrow_mut() = r;
            w.on_scrape(host, c.token, headers, size);
        }
    }

    fn ok(body: &str) -> Reply {
        Reply {
            status: Some("200".into()),
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_prompt_waits_on_its_pod_until_its_first_response_byte() {
        let host = MemoryHost::default();
        let mut w = worker(&host);
        let body = chat_body(&"q".repeat(3000));
        let mut first = send(&mut w, &host, &chat_headers(), &body);
        let mut second = send(&mut w, &host, &chat_headers(), &body);
        assert!(first.waiting.is_some() && second.waiting.is_some());
        assert_eq!(w.router.waiting_prompts(), 2);
        // The first answer streams: its prompt no longer waits, the second's does.
        host.exchange.borrow_mut().status = Some("200".into());
        w.on_response_headers(&host, &mut first, false);
        w.on_response_body(&host, &mut first, 10, false);
        assert!(first.waiting.is_none());
        assert_eq!(w.router.waiting_prompts(), 1);
        // The second ends without a byte of body (an error, a reset): its end clears it.
        w.on_log(&host, &mut second);
        w.on_log(&host, &mut first);
        assert_eq!(w.router.waiting_prompts(), 0);
    }

    #[test]
    fn a_request_is_routed_through_the_callbacks() {
        let host = MemoryHost::default();
        let mut w = worker(&host);
        let mut headers = chat_headers();
        // A client's own routing header is never what Envoy sees.
        headers.push((ENDPOINT_HEADER, "10.9.9.9:80"));
        let body = chat_body("hello");
        let mut ex = send(&mut w, &host, &headers, &body);
        let dest = routed_to(&host).unwrap();
        assert!(dest.starts_with("127.0.0.1:"), "{dest}");
        assert!(!dest.contains("10.9.9.9"));
        assert_eq!(inflight(&w, &host).iter().sum::<u32>(), 1);
        host.exchange.borrow_mut().status = Some("200".into());
        w.on_response_headers(&host, &mut ex, false);
        w.on_response_body(&host, &mut ex, 10, false);
        w.on_response_body(&host, &mut ex, 0, true);
        w.on_log(&host, &mut ex);
        assert_eq!(
            inflight(&w, &host),
            vec![0, 0, 0],
            "the only open request wrote its release"
        );
        w.tick(&host);
        assert_eq!(host.metric("warmroute.requests.cache_aware.2xx"), Some(1));
        assert_eq!(host.metric("warmroute.decision.placed"), Some(1));
    }

    #[test]
    fn a_body_that_ends_with_trailers_is_routed_on_what_was_buffered() {
        let host = MemoryHost::default();
        let mut w = worker(&host);
        let body = chat_body("with trailers");
        *host.exchange.borrow_mut() = TestExchange::request(&chat_headers(), &body);
        let mut ex = Exchange::default();
        assert_eq!(w.on_request_headers(&host, &mut ex, false), Step::Pause);
        assert_eq!(
            w.on_request_body(&host, &mut ex, body.len(), false),
            Step::Pause
        );
        assert!(routed_to(&host).is_none());
        assert_eq!(w.on_request_trailers(&host, &mut ex), Step::Continue);
        assert!(routed_to(&host).is_some());
        assert_eq!(inflight(&w, &host).iter().sum::<u32>(), 1);
        w.on_log(&host, &mut ex);
        w.tick(&host);
        assert_eq!(
            host.metric("warmroute.prompt_blocks").map(|b| b > 0),
            Some(true)
        );
    }

    #[test]
    fn an_unreadable_body_is_still_routed() {
        let host = MemoryHost::default();
        let mut w = worker(&host);
        let mut ex = send(&mut w, &host, &chat_headers(), b"{not json");
        assert!(routed_to(&host).is_some());
        w.on_log(&host, &mut ex);
        w.tick(&host);
        assert_eq!(host.metric("warmroute.fallback.not_json"), Some(1));
        assert_eq!(host.metric("warmroute.decision.fallback"), Some(1));
    }

    #[test]
    fn a_tick_scrapes_every_backend_and_sizes_the_index() {
        let host = MemoryHost::default();
        host.now.set(1000);
        let mut w = worker(&host);
        w.tick(&host);
        let sent = host.take_callouts();
        let mut dests: Vec<&str> = sent
            .iter()
            .map(|c| c.header(ENDPOINT_HEADER).unwrap_or_default())
            .collect();
        dests.sort();
        assert_eq!(dests, vec!["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]);
        assert!(sent.iter().all(|c| c.cluster == "pool"
            && c.header(":path") == Some("/metrics")
            && c.timeout_ms == 400));
        // Pending scrapes are not sent again until answered.
        w.tick(&host);
        assert!(host.take_callouts().is_empty());
        deliver(&mut w, &host, &sent, |_| ok(METRICS));
        let h = w.router.health();
        assert!(h
            .iter()
            .all(|h| h.scraped_ms == 1000 && h.scrape.running == 1.0));
        assert_eq!(h[0].scrape.capacity_tokens, Some(16_000));
        w.tick(&host);
        assert_eq!(
            host.take_callouts().len(),
            3,
            "answered scrapes are due again"
        );
        assert_eq!(host.metric("warmroute.scrape.ok"), Some(3));
    }

    #[test]
    fn a_pod_that_stops_answering_leaves_rotation_and_comes_back() {
        let host = MemoryHost::default();
        let mut w = worker(&host);
        let down = |dest: &str| {
            if dest == "127.0.0.1:2" {
                // Envoy reports a failed callout as a reply without headers.
                Reply::default()
            } else {
                ok(METRICS)
            }
        };
        for t in 1..=2 {
            host.now.set(t * 500);
            w.tick(&host);
            answer(&mut w, &host, down);
        }
        assert_eq!(
            w.router.health().iter().map(|h| h.down).collect::<Vec<_>>(),
            vec![false, true, false]
        );
        // No request goes to it while it is down.
        for i in 0..12 {
            let mut ex = send(&mut w, &host, &chat_headers(), &chat_body(&format!("q{i}")));
            assert_ne!(routed_to(&host).as_deref(), Some("127.0.0.1:2"));
            w.on_log(&host, &mut ex);
        }
        // Two good scrapes in a row bring it back (one could be a flap), and the
        // gauge says so at the next tick.
        for t in 3..=4 {
            host.now.set(t * 500);
            w.tick(&host);
            answer(&mut w, &host, |_| ok(METRICS));
            assert_eq!(w.router.health()[1].down, t == 3);
        }
        w.tick(&host);
        assert_eq!(host.metric("warmroute.backend.b.healthy"), Some(1));
        assert_eq!(host.metric("warmroute.scrape.failed"), Some(2));
    }

    /// Ends `ex` as Envoy would report it: `upstream` answered `status`.
    fn end(w: &mut Worker, host: &MemoryHost, ex: &mut Exchange, upstream: &str, status: &str) {
        {
            let mut e = host.exchange.borrow_mut();
            e.upstream = Some(upstream.into());
            e.status = Some(status.into());
            e.details = Some(if status.starts_with('5') {
                "upstream_reset_before_response_started{remote_connection_failure}".into()
            } else {
                "via_upstream".into()
            });
        }
        w.on_log(host, ex);
    }

    #[test]
    fn a_slow_metrics_endpoint_does_not_eject_a_pod_that_serves() {
        for serving in [true, false] {
            let host = MemoryHost::default();
            // The scraper holds the lease and routes nothing (as Envoy's main-thread
            // VM); another worker sees the pod answer and says so at its tick.
            let mut w = worker(&host);
            let mut other = worker(&host);
            for t in 1..=4u64 {
                host.now.set(t * 500);
                w.tick(&host);
                let sent = host.take_callouts();
                if serving {
                    let mut ex = send(&mut other, &host, &chat_headers(), &chat_body("q"));
                    end(&mut other, &host, &mut ex, "127.0.0.1:2", "200");
                }
                other.tick(&host);
                assert!(host.take_callouts().is_empty());
                // b's /metrics times out (Envoy fails the callout after timeout_ms).
                host.now.set(t * 500 + 400);
                deliver(&mut w, &host, &sent, |dest| {
                    if dest == "127.0.0.1:2" {
                        Reply::default()
                    } else {
                        ok(METRICS)
                    }
                });
            }
            assert_eq!(w.router.health()[1].down, !serving, "serving={serving}");
            w.tick(&host);
            assert_eq!(host.metric("warmroute.scrape.slow"), Some(4));
        }
    }

    #[test]
    fn a_pod_failing_its_requests_leaves_this_workers_rotation_for_a_while() {
        let host = MemoryHost::default();
        host.now.set(1000);
        let mut w = worker(&host);
        // Whatever the filter chose, Envoy's last upstream is the one to blame: a
        // request retried from b to c and served there counts for c.
        for i in 0..3 {
            assert_eq!(
                w.router.standing(host.now.get())[1],
                Standing::In,
                "after {i} errors"
            );
            let mut ex = send(&mut w, &host, &chat_headers(), &chat_body(&format!("r{i}")));
            end(&mut w, &host, &mut ex, "127.0.0.1:3", "200");
            let mut ex = send(&mut w, &host, &chat_headers(), &chat_body(&format!("f{i}")));
            end(&mut w, &host, &mut ex, "127.0.0.1:2", "503");
        }
        assert_eq!(w.router.standing(host.now.get())[1], Standing::Out);
        w.tick(&host);
        assert_eq!(host.metric("warmroute.ejections"), Some(1));
        assert_eq!(host.metric("warmroute.backend.b.healthy"), Some(0));
        let routed = |w: &mut Worker, n: usize| {
            (0..n)
                .filter(|i| {
                    let mut ex = send(w, &host, &chat_headers(), &chat_body(&format!("x{i}")));
                    let to = routed_to(&host);
                    end(w, &host, &mut ex, "127.0.0.1:1", "200");
                    to.is_some_and(|d| d.starts_with("127.0.0.1:2"))
                })
                .count()
        };
        assert_eq!(routed(&mut w, 12), 0);
        // The ejection lasts stale_after_ms; then real traffic probes the pod again.
        host.now.set(1000 + w.config().metrics.stale_after_ms);
        assert!(routed(&mut w, 12) > 0);
        // A client that went away is nobody's fault.
        for i in 0..3 {
            let mut ex = send(&mut w, &host, &chat_headers(), &chat_body(&format!("g{i}")));
            let mut e = host.exchange.borrow_mut();
            e.upstream = Some("127.0.0.1:3".into());
            e.details = Some("downstream_remote_disconnect".into());
            e.status = Some("503".into());
            drop(e);
            w.on_log(&host, &mut ex);
        }
        assert_eq!(w.router.standing(host.now.get())[2], Standing::In);
    }

    #[test]
    fn a_success_on_a_settled_pod_spares_the_upstream_read() {
        let host = MemoryHost::default();
        host.now.set(1000);
        let mut w = worker(&host);
        let fresh = w.config().metrics.stale_after_ms / crate::fleet::passive::SERVED_SLACK;
        // Ends a request for the same prompt (so the same chosen pod) as Envoy
        // reports it: served by `upstream`, or by the pod chosen; true when the
        // filter asked which upstream served.
        let serve = |w: &mut Worker, status: &str, upstream: Option<&str>| {
            let mut ex = send(w, &host, &chat_headers(), &chat_body("same prompt"));
            let to = routed_to(&host).unwrap_or_default();
            // The first of the endpoint list: the pod chosen.
            let chosen = to.split(',').next().unwrap_or_default().to_string();
            let before = host.upstream_reads.get();
            end(w, &host, &mut ex, upstream.unwrap_or(&chosen), status);
            (host.upstream_reads.get() > before, chosen)
        };
        // The first success credits the pod; the next ones within the slack
        // change nothing and ask nothing.
        let (read, chosen) = serve(&mut w, "200", None);
        assert!(read);
        assert!(!serve(&mut w, "200", None).0);
        host.now.set(1000 + fresh);
        assert!(!serve(&mut w, "200", None).0);
        // Past it, the pod is credited again; a failure is always read, and the
        // success after it clears the streak, so it is read too.
        host.now.set(1001 + fresh);
        assert!(serve(&mut w, "200", None).0);
        assert!(serve(&mut w, "503", None).0);
        assert!(serve(&mut w, "200", None).0);
        assert!(!serve(&mut w, "200", None).0);
        // While another pod has a streak, a success is read even on a settled
        // chosen pod: a retry may have moved it to the failing one, and cleared it.
        let other = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
            .into_iter()
            .find(|a| *a != chosen)
            .unwrap();
        assert!(serve(&mut w, "503", Some(other)).0);
        assert!(serve(&mut w, "200", Some(other)).0);
        assert!(!serve(&mut w, "200", None).0);
        // A settled pod that starts failing is read every time, and ejected.
        for i in 0..w.config().metrics.eject_after_errors {
            assert!(serve(&mut w, "503", None).0, "failure {i}");
        }
        let b = w.router.backend_at(&chosen).unwrap();
        assert_eq!(w.router.standing(host.now.get())[b], Standing::Out);
    }

    #[test]
    fn a_scrape_that_never_returns_counts_as_slow_and_is_sent_again() {
        let host = MemoryHost::default();
        let mut w = worker(&host);
        w.tick(&host);
        assert_eq!(host.take_callouts().len(), 3);
        // Lost after timeout + period (900 ms): slow, and scraped again. No pod has
        // answered a request, so slow counts against it.
        host.now.set(901);
        w.tick(&host);
        assert_eq!(host.take_callouts().len(), 3);
        assert!(w.router.health().iter().all(|h| h.failures == 1));
        w.tick(&host);
        assert_eq!(host.metric("warmroute.scrape.slow"), Some(3));
    }

    #[test]
    fn the_scrape_lease_passes_to_another_worker() {
        let host = MemoryHost::default();
        let mut a = worker(&host);
        let mut b = worker(&host);
        a.tick(&host);
        assert_eq!(
            host.take_callouts().len(),
            3,
            "the first to tick takes the lease"
        );
        b.tick(&host);
        assert!(host.take_callouts().is_empty(), "one scraper per Envoy");
        // A stops ticking (its VM is gone): its lease expires after 3 periods.
        host.now.set(1500);
        b.tick(&host);
        assert!(
            host.take_callouts().is_empty(),
            "not before the lease expires"
        );
        host.now.set(1501);
        b.tick(&host);
        let sent = host.take_callouts();
        assert_eq!(sent.len(), 3);
        // B's scrapes reach A's view at A's next tick.
        deliver(&mut b, &host, &sent, |_| ok(METRICS));
        a.tick(&host);
        assert!(host.take_callouts().is_empty(), "A lost the lease");
        assert!(a.router.health().iter().all(|h| h.scraped_ms == 1501));
    }

    #[test]
    fn releases_wait_for_the_tick_while_others_are_open() {
        let host = MemoryHost::default();
        let mut w = worker(&host);
        let mut first = send(&mut w, &host, &chat_headers(), &chat_body("one"));
        let mut second = send(&mut w, &host, &chat_headers(), &chat_body("two"));
        assert_eq!(inflight(&w, &host).iter().sum::<u32>(), 2);
        // One ends while the other is open: the ledger hears of it at the tick.
        w.on_log(&host, &mut first);
        assert_eq!(inflight(&w, &host).iter().sum::<u32>(), 2);
        w.tick(&host);
        assert_eq!(inflight(&w, &host).iter().sum::<u32>(), 1);
        let open = w.router.inflight(&host).unwrap();
        let b = open.iter().position(|f| f.requests == 1).unwrap();
        let name = &w.config().backends[b].name;
        assert_eq!(
            host.metric(&format!("warmroute.backend.{name}.inflight")),
            Some(1)
        );
        w.on_log(&host, &mut second);
        assert_eq!(inflight(&w, &host), vec![0, 0, 0]);
    }

    #[test]
    fn a_crashed_vms_in_flight_is_taken_back_within_three_ticks() {
        let host = MemoryHost::default();
        let mut a = worker(&host);
        let mut b = worker(&host);
        let mut open: Vec<Exchange> = (0..10)
            .map(|i| send(&mut a, &host, &chat_headers(), &chat_body(&format!("q{i}"))))
            .collect();
        for ex in open.iter_mut().take(5) {
            a.on_log(&host, ex);
        }
        // Five ended, five still open: the releases wait in A for its next write.
        assert_eq!(inflight(&b, &host).iter().sum::<u32>(), 10);
        // A's VM crashes: no on_log, no on_done, no tick ever again.
        drop(a);
        for t in 1..=3 {
            host.now.set(t * 500);
            b.tick(&host);
        }
        assert_eq!(inflight(&b, &host), vec![0, 0, 0]);
        for name in ["a", "b", "c"] {
            assert_eq!(
                host.metric(&format!("warmroute.backend.{name}.inflight")),
                Some(0)
            );
        }
    }

    #[test]
    fn a_live_vm_keeps_its_requests_however_long_they_run() {
        let host = MemoryHost::default();
        let mut a = worker(&host);
        let mut b = worker(&host);
        let mut ex = send(&mut a, &host, &chat_headers(), &chat_body("long"));
        for t in 1..=20 {
            host.now.set(t * 500);
            a.tick(&host);
            b.tick(&host);
        }
        assert_eq!(inflight(&b, &host).iter().sum::<u32>(), 1);
        a.on_log(&host, &mut ex);
        assert_eq!(inflight(&b, &host), vec![0, 0, 0]);
    }

    #[test]
    fn the_debug_header_tells_cache_details_only_when_asked() {
        let body = chat_body("hello");
        for (extra, want_match) in [
            (r#""debug_header":true"#, false),
            (r#""debug_header":true,"debug_match_counts":true"#, true),
        ] {
            let host = MemoryHost::default();
            let cfg = CONFIG.replacen('{', &format!("{{{extra},"), 1);
            let mut w = Worker::configure(&host, cfg.as_bytes()).unwrap();
            let mut ex = send(&mut w, &host, &chat_headers(), &body);
            w.on_response_headers(&host, &mut ex, false);
            let headers = host.exchange.borrow().response_headers.clone();
            let (name, value) = &headers[0];
            assert_eq!(name, DEBUG_HEADER);
            assert!(value.starts_with("backend="), "{value}");
            assert_eq!(value.contains(";match="), want_match, "{value}");
            assert_eq!(value.contains(";reason="), want_match, "{value}");
        }
    }

    #[test]
    fn a_bad_config_names_its_field() {
        let host = MemoryHost::default();
        let e = match Worker::configure(&host, br#"{"backends":[{"name":"a","address":"x"}]}"#) {
            Ok(_) => panic!("accepted"),
            Err(e) => e,
        };
        assert_eq!(e.field, "backends[0].address");
    }

    const POOL: &str = r#"{"pool":{"cluster":"pool","admin_cluster":"envoy-admin","max_backends":4},
        "metrics":{"period_ms":500,"timeout_ms":400}}"#;

    /// Envoy's admin answer listing `pods` (all healthy) for cluster `pool`.
    fn endpoints(pods: &[&str]) -> Reply {
        let hosts: Vec<String> = pods
            .iter()
            .map(|a| {
                let (ip, port) = a.rsplit_once(':').unwrap();
                format!(r#"{{"address":{{"socket_address":{{"address":"{ip}","port_value":{port}}}}},"health_status":{{"eds_health_status":"HEALTHY"}}}}"#)
            })
            .collect();
        ok(&format!(
            r#"{{"cluster_statuses":[{{"name":"pool","host_statuses":[{}]}}]}}"#,
            hosts.join(",")
        ))
    }

    /// One tick of `w` at `now`, Envoy listing `pods`; every scrape answers.
    fn pool_tick(w: &mut Worker, host: &MemoryHost, now: u64, pods: &[&str]) {
        host.now.set(now);
        w.tick(host);
        let sent = host.take_callouts();
        for c in &sent {
            let r = if c.cluster == "envoy-admin" {
                assert_eq!(
                    c.header(":path"),
                    Some("/clusters?format=json&filter=%5Epool%24")
                );
                endpoints(pods)
            } else {
                ok(METRICS)
            };
            let (headers, size) = (usize::from(r.status.is_some()), r.body.len());
            *host.reply.borrow_mut() = r;
            w.on_scrape(host, c.token, headers, size);
        }
    }

    /// Where `n` fresh prompts go (the primary's address), ended at once.
    fn spread(w: &mut Worker, host: &MemoryHost, tag: &str, n: usize) -> BTreeSet<String> {
        (0..n)
            .filter_map(|i| {
                let mut ex = send(w, host, &chat_headers(), &chat_body(&format!("{tag}{i}")));
                let to = routed_to(host).map(|d| d.split(',').next().unwrap_or("").to_string());
                w.on_log(host, &mut ex);
                to
            })
            .collect()
    }

    #[test]
    fn a_discovered_pool_follows_envoys_endpoints() {
        let host = MemoryHost::default();
        let mut a = Worker::configure(&host, POOL.as_bytes()).unwrap();
        let mut b = Worker::configure(&host, POOL.as_bytes()).unwrap();
        // Before the first read there is no pod: no header, Envoy's fallback routes.
        assert!(spread(&mut b, &host, "none", 3).is_empty());
        pool_tick(
            &mut a,
            &host,
            500,
            &["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"],
        );
        let all: BTreeSet<String> = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
            .map(String::from)
            .into();
        assert_eq!(spread(&mut a, &host, "x", 30), all);
        // Another VM sees the pool at its own tick.
        pool_tick(&mut b, &host, 510, &[]);
        assert_eq!(spread(&mut b, &host, "y", 30), all);
        // A warm prefix on the pod that stays keeps its pod; .2 leaves.
        let warm = chat_body("warm");
        let mut ex = send(&mut a, &host, &chat_headers(), &warm);
        let home = routed_to(&host).unwrap();
        a.on_log(&host, &mut ex);
        let gone = if home.starts_with("10.0.0.2") {
            "10.0.0.1:8000"
        } else {
            "10.0.0.2:8000"
        };
        let stay: Vec<&str> = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
            .into_iter()
            .filter(|p| *p != gone)
            .collect();
        pool_tick(&mut a, &host, 1000, &stay);
        pool_tick(&mut b, &host, 1010, &[]);
        for w in [&mut a, &mut b] {
            assert!(!spread(w, &host, "z", 30).contains(gone));
        }
        let mut ex = send(&mut b, &host, &chat_headers(), &warm);
        assert_eq!(
            routed_to(&host).unwrap()[..13],
            home[..13],
            "the pod that stayed keeps its prefix"
        );
        b.on_log(&host, &mut ex);
        // A new pod takes a free slot and gets traffic; the slot of the pod that
        // left is the last one reused.
        let mut joined = stay.clone();
        joined.push("10.0.0.4:8000");
        pool_tick(&mut a, &host, 1500, &joined);
        assert!(spread(&mut a, &host, "n", 40).contains("10.0.0.4:8000"));
        assert_eq!(
            a.router.backend(3).map(|b| b.address.as_str()),
            Some("10.0.0.4:8000")
        );
        // An unusable answer (an Envoy that ignores `filter`) changes nothing.
        host.now.set(2000);
        a.tick(&host);
        for c in host.take_callouts() {
            let r = if c.cluster == "envoy-admin" {
                ok(r#"{"cluster_statuses":[{"name":"pool"},{"name":"other"}]}"#)
            } else {
                ok(METRICS)
            };
            let (headers, size) = (usize::from(r.status.is_some()), r.body.len());
            *host.reply.borrow_mut() = r;
            a.on_scrape(&host, c.token, headers, size);
        }
        assert!(spread(&mut a, &host, "k", 40).contains("10.0.0.4:8000"));
        // The pool emptied: nothing to route to, and no slot keeps a pod.
        pool_tick(&mut a, &host, 2500, &[]);
        assert!(spread(&mut a, &host, "e", 5).is_empty());
        assert!(a.router.fleet().iter().all(Option::is_none));
    }

    #[test]
    fn a_pod_back_on_a_new_address_starts_cold() {
        // Checked in the VM that read the change, and in one that applies the old
        // pod's log events only afterwards: a check routes the prompt, which records
        // it on the new pod.
        for check_late_vm in [false, true] {
            let host = MemoryHost::default();
            // One slot, so the new address must reuse the old one's.
            let one = POOL.replace(r#""max_backends":4"#, r#""max_backends":1"#);
            let mut w = Worker::configure(&host, one.as_bytes()).unwrap();
            let mut late = Worker::configure(&host, one.as_bytes()).unwrap();
            pool_tick(&mut w, &host, 500, &["10.0.0.1:8000"]);
            let warm = chat_body("warm");
            for _ in 0..2 {
                let mut ex = send(&mut w, &host, &chat_headers(), &warm);
                w.on_log(&host, &mut ex);
            }
            w.tick(&host);
            let hits = host.metric("warmroute.matched_blocks").unwrap_or(0);
            assert!(hits > 0);
            // The pod moves: its slot's cache picture goes with the old address.
            pool_tick(&mut w, &host, 1000, &[]);
            pool_tick(&mut w, &host, 1500, &["10.0.0.9:8000"]);
            let v = if check_late_vm { &mut late } else { &mut w };
            v.tick(&host);
            let mut ex = send(v, &host, &chat_headers(), &warm);
            assert_eq!(routed_to(&host).as_deref(), Some("10.0.0.9:8000"));
            v.on_log(&host, &mut ex);
            v.tick(&host);
            assert_eq!(
                host.metric("warmroute.matched_blocks"),
                Some(hits),
                "late VM: {check_late_vm}"
            );
        }
    }

    #[test]
    fn a_fleet_gone_silent_leaves_no_shared_data_behind() {
        let host = MemoryHost::default();
        host.now.set(1000);
        let mut old = worker(&host);
        for i in 0..5 {
            let mut ex = send(
                &mut old,
                &host,
                &chat_headers(),
                &chat_body(&format!("o{i}")),
            );
            old.on_log(&host, &mut ex);
        }
        old.tick(&host);
        let fleet_keys = |host: &MemoryHost| -> Vec<(String, usize)> {
            host.shared_sizes()
                .into_iter()
                .filter(|(k, _)| k != crate::fleet::store::FLEETS_KEY)
                .collect()
        };
        let old_keys = fleet_keys(&host);
        assert!(old_keys.iter().any(|(_, n)| *n > 0));
        // Reconfigured to another backend list: the old VMs are gone.
        let other = CONFIG.replace("127.0.0.1:3", "127.0.0.1:4");
        let mut new = Worker::configure(&host, other.as_bytes()).unwrap();
        for i in 0..5 {
            let mut ex = send(
                &mut new,
                &host,
                &chat_headers(),
                &chat_body(&format!("n{i}")),
            );
            new.on_log(&host, &mut ex);
        }
        new.tick(&host);
        let kept = |host: &MemoryHost| -> usize {
            fleet_keys(host)
                .iter()
                .filter(|(k, _)| old_keys.iter().any(|(o, _)| o == k))
                .map(|(_, n)| n)
                .sum()
        };
        assert!(kept(&host) > 0, "swept while still fresh");
        host.now.set(1000 + crate::fleet::store::FLEET_IDLE_MS + 1);
        new.tick(&host);
        assert_eq!(kept(&host), 0, "{:?}", fleet_keys(&host));
        // The fleet in use keeps its values.
        let mut ex = send(&mut new, &host, &chat_headers(), &chat_body("after"));
        assert!(routed_to(&host).is_some());
        new.on_log(&host, &mut ex);
        assert!(fleet_keys(&host)
            .iter()
            .any(|(k, n)| *n > 0 && !old_keys.iter().any(|(o, _)| o == k)));
    }

    const MODELS: &str = r#"{"backends":[
        {"name":"a","address":"127.0.0.1:1","models":["llama"],"adapters":["sql"]},
        {"name":"b","address":"127.0.0.1:2","models":["qwen"]},
        {"name":"c","address":"127.0.0.1:3","models":["llama"],"adapters":["sql"]}],
        "route":{"model_header":"x-gateway-model-name"},
        "metrics":{"period_ms":500,"timeout_ms":400}}"#;

    fn ask(w: &mut Worker, host: &MemoryHost, model: &str, tag: &str) -> (Step, Option<String>) {
        let body = format!(
            r#"{{"model":"{model}","messages":[{{"role":"user","content":"{tag} {}"}}]}}"#,
            "w ".repeat(300)
        );
        let mut headers = chat_headers();
        headers.push(("x-gateway-model-name", "forged"));
        *host.exchange.borrow_mut() = TestExchange::request(&headers, body.as_bytes());
        let mut ex = Exchange::default();
        assert_eq!(w.on_request_headers(host, &mut ex, false), Step::Pause);
        let step = w.on_request_body(host, &mut ex, body.len(), true);
        let to = routed_to(host).map(|d| d.split(',').next().unwrap_or("").to_string());
        w.on_log(host, &mut ex);
        (step, to)
    }

    #[test]
    fn requests_go_to_pods_that_serve_their_model_and_an_unknown_one_gets_a_404() {
        let host = MemoryHost::default();
        let mut w = Worker::configure(&host, MODELS.as_bytes()).unwrap();
        for i in 0..20 {
            let (_, to) = ask(&mut w, &host, "qwen", &format!("q{i}"));
            assert_eq!(to.as_deref(), Some("127.0.0.1:2"));
            assert_eq!(
                host.exchange
                    .borrow()
                    .header("x-gateway-model-name")
                    .as_deref(),
                Some("qwen"),
                "the body's model is published, the client's copy is not"
            );
            let (_, to) = ask(&mut w, &host, "llama", &format!("l{i}"));
            assert_ne!(to.as_deref(), Some("127.0.0.1:2"));
        }
        let (step, to) = ask(&mut w, &host, "mistral", "m");
        assert_eq!((step, to), (Step::Replied, None));
        let reply = host.exchange.borrow().local_reply.clone().unwrap();
        assert_eq!(reply.status, 404);
        let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(body["error"]["code"], "model_not_found");
        assert_eq!(
            body["error"]["message"],
            "The model `mistral` does not exist."
        );
        w.tick(&host);
        assert_eq!(host.metric("warmroute.unknown_model"), Some(1));
        assert_eq!(inflight(&w, &host), vec![0, 0, 0], "a 404 holds nothing");
    }

    #[test]
    fn adapter_requests_stay_on_the_pods_that_have_it_loaded() {
        let host = MemoryHost::default();
        host.now.set(500);
        let mut w = Worker::configure(&host, MODELS.as_bytes()).unwrap();
        w.tick(&host);
        let lora = |running: &str| {
            format!(
                "{METRICS}vllm:lora_requests_info{{max_lora=\"1\",running_lora_adapters=\"{running}\",waiting_lora_adapters=\"\"}} 1.8e9\n"
            )
        };
        // c has `sql` loaded, a another adapter (its only slot taken).
        answer(&mut w, &host, |dest| match dest {
            "127.0.0.1:1" => ok(&lora("law")),
            "127.0.0.1:3" => ok(&lora("sql")),
            _ => ok(METRICS),
        });
        for i in 0..20 {
            let (_, to) = ask(&mut w, &host, "sql", &format!("s{i}"));
            assert_eq!(to.as_deref(), Some("127.0.0.1:3"), "request {i}");
        }
        // Another VM learns it at its tick.
        let mut other = Worker::configure(&host, MODELS.as_bytes()).unwrap();
        other.tick(&host);
        let (_, to) = ask(&mut other, &host, "sql", "o");
        assert_eq!(to.as_deref(), Some("127.0.0.1:3"));
    }

    #[test]
    fn several_discovered_pools_each_serve_their_model() {
        let host = MemoryHost::default();
        host.now.set(500);
        let cfg = r#"{"pool":{"clusters":[{"cluster":"llama","models":["llama"]},
            {"cluster":"qwen","models":["qwen"]}]},"metrics":{"period_ms":500,"timeout_ms":400}}"#;
        let mut w = Worker::configure(&host, cfg.as_bytes()).unwrap();
        w.tick(&host);
        let host_entry = |ip: &str| {
            format!(r#"{{"address":{{"socket_address":{{"address":"{ip}","port_value":8000}}}}}}"#)
        };
        let body = format!(
            r#"{{"cluster_statuses":[{{"name":"llama","host_statuses":[{},{}]}},{{"name":"qwen","host_statuses":[{}]}}]}}"#,
            host_entry("10.0.0.1"),
            host_entry("10.0.0.2"),
            host_entry("10.0.0.3")
        );
        for c in host.take_callouts() {
            if c.cluster == "envoy-admin" {
                assert_eq!(
                    c.header(":path"),
                    Some("/clusters?format=json&filter=%5E%28llama%7Cqwen%29%24")
                );
                *host.reply.borrow_mut() = ok(&body);
                w.on_scrape(&host, c.token, 1, body.len());
            }
        }
        for i in 0..10 {
            assert_eq!(
                ask(&mut w, &host, "qwen", &format!("q{i}")).1.as_deref(),
                Some("10.0.0.3:8000")
            );
            let (_, to) = ask(&mut w, &host, "llama", &format!("l{i}"));
            assert!(
                matches!(to.as_deref(), Some("10.0.0.1:8000" | "10.0.0.2:8000")),
                "{to:?}"
            );
        }
        assert_eq!(ask(&mut w, &host, "mistral", "m").0, Step::Replied);
    }

    /// Routes `body`, delivers one response chunk holding `usage` with
    /// `cached` tokens, and ends it; returns the blocks the index predicted.
    fn answered_with(w: &mut Worker, host: &MemoryHost, body: &[u8], cached: Option<u64>) -> u32 {
        let mut ex = send(w, host, &chat_headers(), body);
        let matched = ex.awaiting_report.as_ref().map_or(0, |p| p.blocks);
        let usage = cached.map_or(String::new(), |c| {
            format!(r#","usage":{{"prompt_tokens":10000,"prompt_tokens_details":{{"cached_tokens":{c}}}}}"#)
        });
        host.exchange.borrow_mut().response_body =
            format!(r#"{{"choices":[{{"message":{{"content":"ok"}}}}]{usage}}}"#).into_bytes();
        let size = host.exchange.borrow().response_body.len();
        w.on_response_body(host, &mut ex, size, true);
        w.on_log(host, &mut ex);
        matched
    }

    #[test]
    fn a_pods_report_of_an_eviction_makes_every_vm_forget_what_it_used_before() {
        // One pod, two VMs. Checked once in the VM that read the report and once in
        // the other: a check routes its prompt, which records it again.
        let one_pod = r#"{"backends":[{"name":"a","address":"127.0.0.1:1"}]}"#;
        for check_other_vm in [false, true] {
            let host = MemoryHost::default();
            let mut a = Worker::configure(&host, one_pod.as_bytes()).unwrap();
            let mut b = Worker::configure(&host, one_pod.as_bytes()).unwrap();
            let older = chat_body(&"an older conversation ".repeat(500));
            let newer = chat_body(&"a newer conversation ".repeat(500));
            host.now.set(1000);
            answered_with(&mut a, &host, &older, Some(0));
            host.now.set(2000);
            answered_with(&mut a, &host, &newer, Some(0));
            // As predicted: nothing changes.
            host.now.set(3000);
            assert!(answered_with(&mut a, &host, &newer, Some(10_000)) > 0);
            // The pod lost the newer prompt (last used at 3000), so the older one too.
            host.now.set(4000);
            assert!(answered_with(&mut a, &host, &newer, Some(0)) > 0);
            a.tick(&host);
            assert_eq!(host.metric("warmroute.feedback.evictions"), Some(1));
            assert_eq!(host.metric("warmroute.feedback.forgets"), Some(1));
            let w = if check_other_vm { &mut b } else { &mut a };
            // Only the system prompt both share (refreshed by the newer one) is left.
            let ex = send(w, &host, &chat_headers(), &older);
            let left = ex.awaiting_report.as_ref().map_or(0, |p| p.blocks);
            assert!(
                left <= 3,
                "{left} blocks of the older prompt still predicted (other VM: {check_other_vm})"
            );
            w.on_log(&host, &mut { ex });
            // The prompt that revealed it was just prefilled again: still a hit.
            let ex = send(w, &host, &chat_headers(), &newer);
            assert!(ex.awaiting_report.is_some(), "other VM: {check_other_vm}");
        }
    }

    #[test]
    fn a_pod_that_holds_what_this_index_never_sent_it_forgets_nothing_on_a_shortfall() {
        let one_pod = r#"{"backends":[{"name":"a","address":"127.0.0.1:1"}]}"#;
        let host = MemoryHost::default();
        let mut w = Worker::configure(&host, one_pod.as_bytes()).unwrap();
        let older = chat_body(&"an older conversation ".repeat(500));
        let newer = chat_body(&"a newer conversation ".repeat(500));
        host.now.set(1000);
        answered_with(&mut w, &host, &older, Some(0));
        host.now.set(2000);
        answered_with(&mut w, &host, &newer, Some(0));
        // Three reports of whole prompts cached of which the index credited the pod
        // only the shared system prompt: what other gateways sent there.
        for t in 0..3 {
            let other = chat_body(&format!("another gateway's conversation {t} ").repeat(500));
            host.now.set(2500 + t);
            answered_with(&mut w, &host, &other, Some(10_000));
        }
        host.now.set(4000);
        assert!(answered_with(&mut w, &host, &newer, Some(0)) > 0);
        w.tick(&host);
        assert_eq!(host.metric("warmroute.feedback.evictions"), Some(1));
        assert_eq!(host.metric("warmroute.feedback.forgets"), Some(0));
        assert_eq!(host.metric("warmroute.feedback.surpluses"), Some(3));
        // The older prompt is still credited to the pod.
        let ex = send(&mut w, &host, &chat_headers(), &older);
        assert!(ex.awaiting_report.as_ref().map_or(0, |p| p.blocks) > 3);
    }

    #[test]
    fn a_stream_without_a_usage_report_is_not_watched() {
        let host = MemoryHost::default();
        let mut w = worker(&host);
        let streamed = |extra: &str| {
            format!(
                r#"{{"model":"m","stream":true,{extra}"messages":[{{"role":"system","content":"{}"}},{{"role":"user","content":"q"}}]}}"#,
                "s".repeat(600)
            )
        };
        for _ in 0..2 {
            let mut ex = send(&mut w, &host, &chat_headers(), streamed("").as_bytes());
            assert!(ex.awaiting_report.is_none());
            w.on_log(&host, &mut ex);
        }
        let with_usage = streamed(r#""stream_options":{"include_usage":true},"#);
        let ex = send(&mut w, &host, &chat_headers(), with_usage.as_bytes());
        assert!(ex.awaiting_report.is_some());
    }

    #[test]
    fn an_operator_may_ask_pods_for_usage_on_streams_that_did_not() {
        let streamed = |extra: &str| {
            format!(
                r#"{{"model":"m","stream":true,{extra}"messages":[{{"role":"system","content":"{}"}},{{"role":"user","content":"q"}}]}}"#,
                "s".repeat(600)
            )
        };
        let cfg = CONFIG.replace(
            r#""metrics":"#,
            r#""feedback":{"request_usage":true},"metrics":"#,
        );
        for (ask, extra, asked) in [
            (true, "", true),
            (false, "", false),
            // The client chose its stream options: they are left alone.
            (true, r#""stream_options":{"include_usage":false},"#, false),
        ] {
            let host = MemoryHost::default();
            let config = if ask { cfg.as_str() } else { CONFIG };
            let mut w = Worker::configure(&host, config.as_bytes()).unwrap();
            let body = streamed(extra);
            let len = body.len().to_string();
            let mut headers = chat_headers();
            headers.push(("content-length", &len));
            for turn in 0..2 {
                let mut ex = send(&mut w, &host, &headers, body.as_bytes());
                let sent = host.exchange.borrow().body.clone();
                let v: serde_json::Value = serde_json::from_slice(&sent).unwrap();
                let length = host.exchange.borrow().header("content-length");
                assert_eq!(length, Some(sent.len().to_string()), "ask {ask}, {extra}");
                assert_eq!(
                    v["stream_options"]["include_usage"] == true,
                    asked,
                    "{extra}"
                );
                // The second turn is a predicted hit: watched only when the answer reports.
                if turn == 1 {
                    assert_eq!(ex.awaiting_report.is_some(), asked, "ask {ask}, {extra}");
                }
                w.on_log(&host, &mut ex);
            }
        }
    }
}
