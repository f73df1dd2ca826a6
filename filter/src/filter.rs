//! The proxy-wasm glue: root context (configuration, tick, scrapes) and HTTP
//! context (headers → body → decision → header). Thin on purpose: every
//! decision is made by [`Router`] and the pure modules.

use crate::config::Config;
use crate::host::{Host, Proxy};
use crate::load::{extract, Delta};
use crate::openai::{prompt_key, Endpoint};
use crate::phases::{Laps, Phase};
use crate::route;
use crate::router::{Request, Router, ANCHOR_BYTES};
use crate::stats::{Fallback, Stats};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// Response header carrying the decision when `debug_header` is on.
pub const DEBUG_HEADER: &str = "x-warmroute";

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

struct Shared {
    router: RefCell<Router>,
    stats: Stats,
}

#[derive(Default)]
struct Root {
    shared: Option<Rc<Shared>>,
}

impl Context for Root {
    fn on_done(&mut self) -> bool {
        // The VM is going away (reconfiguration, drain): what waits for the tick goes now.
        if let Some(s) = &self.shared {
            s.stats.flush();
            if let Err(e) = s.router.borrow_mut().flush_releases(&Proxy) {
                log::warn!("warmroute: in-flight releases lost at shutdown: {e:?}");
            }
        }
        true
    }

    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let Some(s) = &self.shared else { return };
        let mut router = s.router.borrow_mut();
        let Some(b) = router.scraper.completed(token) else {
            return;
        };
        // Envoy reports a failed or timed-out callout as a response without headers.
        let status = (num_headers > 0)
            .then(|| {
                hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status")
                    .ok()
                    .flatten()
            })
            .flatten();
        let scrape = match status.as_deref() {
            Some("200") => hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
                .ok()
                .flatten()
                .map(|body| {
                    let cfg = &router.cfg.metrics;
                    extract(
                        &String::from_utf8_lossy(&body),
                        &cfg.names,
                        cfg.model_name.as_deref(),
                    )
                }),
            _ => None,
        };
        s.stats.scraped(scrape.is_some());
        // What the scrape counts of this gateway's own traffic (see `load`).
        let scrape = scrape.map(|mut sc| {
            let inflight = router.inflight(&Proxy).unwrap_or_default();
            sc.own_inflight = inflight.get(b).map_or(0, |f| f.requests);
            sc
        });
        let now = Proxy.now_ms();
        let name = router
            .cfg
            .backends
            .get(b)
            .map(|x| x.name.clone())
            .unwrap_or_default();
        // This VM holds the scrape lease, so its own view is the last health written.
        let was_down = router.health().get(b).map(|x| x.down);
        match router.record_scrape(&Proxy, b, scrape, now) {
            Ok(h) if h.down && was_down == Some(false) => {
                log::warn!(
                    "warmroute: backend {name} out of rotation after {} failed scrapes",
                    h.failures
                )
            }
            Ok(h) if !h.down && was_down == Some(true) => {
                log::info!("warmroute: backend {name} back in rotation")
            }
            Ok(_) => {}
            Err(e) => log::debug!("warmroute: health update for {name} lost: {e:?}"),
        }
        drop(router);
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        let cfg = match Config::parse(&bytes) {
            Ok(c) => c,
            Err(e) => {
                log::error!("warmroute: invalid configuration: {e}");
                return false;
            }
        };
        let period = Duration::from_millis(cfg.metrics.period_ms);
        log::info!(
            "warmroute: {} backends, strategy {}, route mode {:?} ({})",
            cfg.backends.len(),
            cfg.strategy.name(),
            cfg.route.mode,
            cfg.route.header
        );
        let stats = Stats::define(&cfg);
        let router = Router::new(cfg, &Proxy);
        self.shared = Some(Rc::new(Shared {
            router: RefCell::new(router),
            stats,
        }));
        // The tick also ages the index out, so it runs even without scraping.
        if hostcalls::set_tick_period(period).is_err() {
            log::warn!("warmroute: could not set the tick period; metrics will not be scraped");
        }
        true
    }

    fn on_tick(&mut self) {
        let Some(s) = &self.shared else { return };
        s.stats.flush();
        let mut router = s.router.borrow_mut();
        // Before the gauges below read the ledger.
        if let Err(e) = router.flush_releases(&Proxy) {
            log::debug!("warmroute: in-flight releases wait for the next tick: {e:?}");
        }
        let now = Proxy.now_ms();
        router.index.expire(now);
        if let Err(e) = router.refresh_health(&Proxy) {
            log::debug!("warmroute: health not refreshed: {e:?}");
        }
        let inflight = router.inflight(&Proxy).unwrap_or_default();
        s.stats.gauges(
            &inflight,
            &router.health().iter().map(|h| !h.down).collect::<Vec<_>>(),
        );
        let m = router.cfg.metrics.clone();
        if !m.enabled {
            return;
        }
        let vm = router.vm_id;
        if !router
            .shared(&Proxy)
            .try_lease(vm, 3 * m.period_ms)
            .unwrap_or(false)
        {
            router.scraper.reset();
            return;
        }
        let due = router.scraper.due(now, m.timeout_ms + m.period_ms);
        for b in due.lost {
            let _ = router.record_scrape(&Proxy, b, None, now);
            s.stats.scraped(false);
        }
        for b in due.scrape {
            let Some(backend) = router.cfg.backends.get(b).cloned() else {
                continue;
            };
            let headers = vec![
                (":method", "GET"),
                (":path", backend.metrics_path.as_str()),
                (":authority", backend.host.as_str()),
                (crate::config::ENDPOINT_HEADER, backend.address.as_str()),
            ];
            match hostcalls::dispatch_http_call(
                &m.cluster,
                headers,
                None,
                vec![],
                Duration::from_millis(m.timeout_ms),
            ) {
                Ok(token) => router.scraper.dispatched(b, token, now),
                Err(e) => {
                    log::debug!(
                        "warmroute: scrape of {} not dispatched: {e:?}",
                        backend.name
                    );
                    let _ = router.record_scrape(&Proxy, b, None, now);
                    s.stats.scraped(false);
                }
            }
        }
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http {
            shared: self.shared.clone(),
            ..Http::default()
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

#[derive(Default)]
struct Http {
    shared: Option<Rc<Shared>>,
    endpoint: Option<Endpoint>,
    session: Option<String>,
    awaiting_body: bool,
    chosen: Option<usize>,
    /// What this request holds on `chosen` until released.
    held: Delta,
    debug: Option<String>,
    response_done: bool,
}

impl Http {
    /// Decides, writes the routing header, accounts the request.
    fn route(&mut self, body: Option<&[u8]>, fallback: Option<Fallback>, mut laps: Laps) {
        let Some(s) = self.shared.clone() else { return };
        let mut router = s.router.borrow_mut();
        let (block, max_body) = (router.cfg.block_bytes, router.cfg.max_body_bytes);
        let mut why = fallback;
        let key = match (self.endpoint, body) {
            (Some(e), Some(b)) if b.len() <= max_body => {
                match prompt_key(e, b, block, ANCHOR_BYTES) {
                    Ok(k) => Some(k),
                    Err(err) => {
                        why = Some(if err == crate::openai::ParseError::NotJson {
                            Fallback::NotJson
                        } else {
                            Fallback::BadShape
                        });
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
        laps.lap(Phase::Parse);
        if let Some(w) = why {
            s.stats.fell_back(w);
            log::debug!("warmroute: fallback routing: {}", w.name());
        } else if self.endpoint.is_none() {
            s.stats.passed_through();
        }
        let routed = router.route(
            &Proxy,
            &Request {
                key: key.as_ref(),
                session: self.session.as_deref(),
            },
        );
        laps.lap(Phase::Route);
        let primary = routed.decision.order.first().copied().unwrap_or(0);
        self.chosen = Some(primary);
        self.held = routed.held;
        s.stats.decided(
            routed.decision.reason,
            primary,
            (routed.decision.matched, routed.blocks),
            routed.host_errors,
            routed.log_gap,
        );
        if let Some((name, value)) = route::route_header(&router.cfg, &routed.decision.order) {
            if hostcalls::set_map_value(MapType::HttpRequestHeaders, name, Some(&value)).is_err() {
                log::warn!("warmroute: could not set {name}");
            }
        }
        laps.lap(Phase::Header);
        laps.done();
        if router.cfg.debug_header {
            let backend = router
                .cfg
                .backends
                .get(primary)
                .map_or("", |b| b.name.as_str());
            self.debug = Some(format!(
                "backend={backend};match={}/{};reason={}{}",
                routed.decision.matched,
                routed.blocks,
                routed.decision.reason.name(),
                why.map(|w| format!(";fallback={}", w.name()))
                    .unwrap_or_default()
            ));
        }
    }
}

impl Context for Http {}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(s) = self.shared.clone() else {
            return Action::Continue;
        };
        // One host call for every header read here: each call crosses the VM boundary
        // (and back, for the host to allocate the answer), which costs more than a scan.
        let headers = hostcalls::get_map_bytes(MapType::HttpRequestHeaders).unwrap_or_default();
        let header = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| String::from_utf8_lossy(v))
        };
        let max_body = {
            let router = s.router.borrow();
            for h in route::forbidden_client_headers(&router.cfg) {
                if header(h).is_some() {
                    let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, h, None);
                }
            }
            self.session = header(&router.cfg.session_header).map(|v| v.into_owned());
            router.cfg.max_body_bytes
        };
        let post = header(":method").is_some_and(|m| m.eq_ignore_ascii_case("POST"));
        self.endpoint = header(":path")
            .filter(|_| post)
            .and_then(|p| Endpoint::from_path(&p));
        if self.endpoint.is_none() {
            self.route(None, None, Laps::start());
            return Action::Continue;
        }
        let encoded =
            header("content-encoding").is_some_and(|e| !e.eq_ignore_ascii_case("identity"));
        let too_large = header("content-length")
            .and_then(|l| l.trim().parse::<usize>().ok())
            .is_some_and(|l| l > max_body);
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
            Some(f) => {
                self.route(None, Some(f), Laps::start());
                Action::Continue
            }
            None => {
                // Hold the route until the body is read (needs allow_on_headers_stop_iteration).
                self.awaiting_body = true;
                Action::Pause
            }
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.awaiting_body {
            return Action::Continue;
        }
        let max = self
            .shared
            .as_ref()
            .map_or(0, |s| s.router.borrow().cfg.max_body_bytes);
        if body_size > max {
            self.awaiting_body = false;
            self.route(None, Some(Fallback::TooLarge), Laps::start());
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.awaiting_body = false;
        let mut laps = Laps::start();
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default();
        laps.lap(Phase::Body);
        self.route(Some(&body), None, laps);
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.response_done = end_of_stream;
        if let Some(d) = &self.debug {
            let _ = hostcalls::add_map_value(MapType::HttpResponseHeaders, DEBUG_HEADER, d);
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.response_done |= end_of_stream;
        // The first streamed byte means the prompt is prefilled: stop making others
        // queue behind it. A response that ends here is released whole in on_log.
        if body_size > 0 && !end_of_stream && self.held.prefill_blocks > 0 {
            if let (Some(s), Some(b)) = (&self.shared, self.chosen) {
                s.router.borrow_mut().prefilled(b, &mut self.held);
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        let (Some(s), Some(b)) = (&self.shared, self.chosen.take()) else {
            return;
        };
        // A stream reset after the headers still has a :status; Envoy's details tell the
        // truth. A response whose last byte passed this filter was not reset upstream,
        // which spares most requests that host call.
        let details = (!self.response_done)
            .then(|| {
                hostcalls::get_property(vec!["response", "code_details"])
                    .ok()
                    .flatten()
            })
            .flatten();
        let reset = details.is_some_and(|d| {
            let d = String::from_utf8_lossy(&d);
            d.contains("reset") || d.contains("disconnect")
        });
        let status = hostcalls::get_map_value(MapType::HttpResponseHeaders, ":status")
            .ok()
            .flatten()
            .and_then(|v| v.parse().ok())
            .filter(|_| !reset);
        s.stats.finished(status);
        if let Err(e) = s.router.borrow_mut().release(&Proxy, b, self.held) {
            log::debug!("warmroute: in-flight release waits for the tick: {e:?}");
        }
    }
}
