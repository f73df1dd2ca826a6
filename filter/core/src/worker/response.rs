//! The response side of a request: its first byte releases the prompt's
//! waiting entry, a predicted hit's answer carries the pod's own cache report,
//! a stored `/v1/responses` answer names the pod its follow-ups go to, and the
//! request's end releases its in-flight share and tells Envoy's own view of
//! its pod how it ended.

use super::{Exchange, Worker, DEBUG_HEADER};
use crate::fleet::passive::Answer;
use crate::fleet::responses::{bucket_capacity, Entry};
use crate::hash::address_id;
use crate::host::Host;
use crate::prompt::openai::answer::{scan, Scan, SCAN_BYTES};
use crate::routing::feedback::{report_for, TAIL_BYTES};

impl Worker {
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
        // Only a served answer was stored (an error names no response).
        if ex.answer.is_some() && host.response_status().as_deref() != Some("200") {
            ex.answer = None;
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
            if let Some(b) = ex.chosen.filter(|_| ex.claim.prefill_blocks > 0) {
                self.router.fleet_mut().prefilled(b, &mut ex.claim);
            }
            // Its prompt no longer waits on the pod: not a queue shared with it.
            if let Some(t) = ex.pending.take() {
                self.router.close(t);
            }
        }
        if body_size > 0 && ex.awaiting_report.is_some() {
            self.read_report(host, ex, body_size);
        }
        if ex.answer.is_some() {
            self.read_answer(host, ex, body_size, end_of_stream);
        }
    }

    /// Reads a stored response's id from the first bytes of its answer and
    /// remembers which pod answered it: Envoy's upstream for this exchange
    /// (its last try), never anything the client sent.
    fn read_answer<H: Host>(
        &mut self,
        host: &H,
        ex: &mut Exchange,
        body_size: usize,
        end_of_stream: bool,
    ) {
        let Some(mut seen) = ex.answer.take() else {
            return;
        };
        let want = SCAN_BYTES.saturating_sub(seen.len()).min(body_size);
        if want > 0 {
            if let Some(chunk) = host.response_body(0, want) {
                seen.extend_from_slice(&chunk);
            }
        }
        let id = match scan(&seen, end_of_stream) {
            Scan::More => {
                ex.answer = Some(seen);
                return;
            }
            Scan::Absent => {
                self.stats.remembered(false);
                return;
            }
            Scan::Id(id) => id,
        };
        let Some(pod) = host.upstream_address().map(|a| address_id(&a)) else {
            self.stats.remembered(false);
            return;
        };
        let entry = Entry {
            id,
            pod,
            at_ms: host.now_ms(),
        };
        let capacity = bucket_capacity(self.router.config().responses.max_entries);
        let store = self.router.fleet().store(host);
        match store.remember_response(entry, capacity) {
            Ok(()) => self.stats.remembered(true),
            Err(e) => {
                log::debug!("warmroute: a stored response's pod is not remembered: {e:?}");
                self.stats.host_error();
                self.stats.remembered(false);
                return;
            }
        }
        // A follow-up may reach another replica of this gateway: its peers pull this.
        if self.router.config().peers.is_some() {
            if let Err(e) = store.share_response(entry) {
                log::debug!("warmroute: a stored response's pod is not shared with peers: {e:?}");
                self.stats.host_error();
            }
        }
    }

    fn read_report<H: Host>(&mut self, host: &H, ex: &mut Exchange, body_size: usize) {
        let start = body_size.saturating_sub(TAIL_BYTES);
        let Some(reported) = host
            .response_body(start, body_size - start)
            .and_then(|tail| report_for(ex.endpoint, &tail))
        else {
            return;
        };
        let (Some(p), Some(b)) = (ex.awaiting_report.take(), ex.chosen) else {
            return;
        };
        if self.router.fleet().pod_id(b) != p.pod {
            return;
        }
        self.router.learn_ratio(p.bytes, reported.prompt_tokens);
        // Envoy's last try: a retry may have moved the request off the pod the
        // index credited, whose cache this report then says nothing of.
        if host
            .upstream_address()
            .is_some_and(|a| self.router.fleet().backend_at(&a) != Some(b))
        {
            return;
        }
        let verdict = self
            .router
            .reported(host, b, (p.blocks, p.of), reported, p.last_use_ms);
        // In the pod's tokens: the index's share of the prompt, against the pod's.
        let predicted =
            f64::from(p.blocks) / f64::from(p.of.max(1)) * reported.prompt_tokens as f64;
        self.stats
            .reported(predicted as u64, reported.cached_tokens, verdict);
    }

    /// The exchange is over (every outcome): counts it and releases its claim.
    pub fn on_log<H: Host>(&mut self, host: &H, ex: &mut Exchange) {
        if ex.parked {
            self.leave_gate(host, ex);
        }
        // A served answer that ended before naming its id.
        if ex.answer.take().is_some() {
            self.stats.remembered(false);
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
        if let Some(t) = ex.pending.take() {
            self.router.close(t);
        }
        let claim = std::mem::take(&mut ex.claim);
        if let Err(e) = self.router.fleet_mut().release(host, b, claim) {
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
        if answer == Answer::Served && self.router.fleet().settled(chosen, now) {
            return;
        }
        let Some(b) = host
            .upstream_address()
            .and_then(|a| self.router.fleet().backend_at(&a))
        else {
            return;
        };
        if self.router.fleet_mut().answered(b, answer, now) {
            self.stats.ejected();
            let name = self
                .router
                .fleet()
                .backend(b)
                .map_or("", |x| x.name.as_str());
            log::warn!(
                "warmroute: backend {name} out of this worker's rotation after {} failed responses",
                self.router.config().metrics.eject_after_errors
            );
        }
    }
}
