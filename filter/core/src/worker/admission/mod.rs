//! The worker's side of the gate ([`crate::gate`]): admitting, holding,
//! releasing and shedding this VM's requests, and waking other VMs whose
//! held requests were granted.
//!
//! A held request's [`Exchange`] and prompt key stay here (Envoy keeps its
//! body); its HTTP context only knows it is parked. Released, it is routed
//! from whichever callback freed the capacity, under its own context
//! ([`Host::enter_context`]), resumed, and its state is handed back to its
//! context's next callback ([`Worker::reclaim`]). Every callback does this
//! last, after its own exchange's host calls, and goes back to its own
//! context when it had one.

use super::{Exchange, Step, Worker};
use crate::codec::{put, Reader};
use crate::fleet::store::update_after;
use crate::gate::{mask, shed_body, Queue, Shed, Ticket};
use crate::host::Host;
use crate::phases::Laps;
use crate::prompt::prefix::PromptKey;
use crate::routing::router::{Look, Request};
use crate::worker::stats::{GateEvent, Unread};
use std::collections::HashMap;

/// What the gate does with a new request.
#[derive(Debug)]
pub(super) enum Admission {
    /// Route it now; on the gate's look at the fleet, if it took one.
    Go(Option<Look>),
    /// Hold it, under this ticket.
    Hold(Ticket),
    /// Answer 429.
    Shed(Shed),
}

/// A request held in this VM.
#[derive(Debug)]
struct Parked {
    ex: Exchange,
    key: Option<PromptKey>,
    why: Option<Unread>,
    since_ms: u64,
    deadline_ms: u64,
    /// Its place in the gate's record, to put back if the record lost it.
    ticket: Ticket,
}

/// This VM's held requests.
#[derive(Debug)]
pub(super) struct Holding {
    /// This VM's wake-up queue (0: none could be registered).
    wake: u32,
    /// Held requests by HTTP context.
    held: HashMap<u32, Parked>,
    /// Released requests whose context has not taken its state back yet.
    resumed: HashMap<u32, Exchange>,
    /// This VM's grants to route before the current callback returns.
    granted: Vec<u32>,
}

impl Holding {
    /// Registers this VM's wake-up queue.
    pub(super) fn new<H: Host>(host: &H, vm: u64) -> Holding {
        let wake = host
            .register_queue(&format!("warmroute.wake.{vm:016x}"))
            .unwrap_or_else(|e| {
                log::warn!(
                    "warmroute: no wake-up queue ({e:?}): this worker's held requests are \
                     released at the gate's check only"
                );
                0
            });
        Holding {
            wake,
            held: HashMap::new(),
            resumed: HashMap::new(),
            granted: Vec::new(),
        }
    }
}

/// A wake-up: the VM and the context of a granted request.
fn wake_message(vm: u64, context: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(12);
    put(&mut m, vm);
    put(&mut m, context);
    m
}

impl Worker {
    /// Releases between two that go to a lower class ([`crate::config::GateConfig::lower_every`]).
    fn lower_every(&self) -> u64 {
        self.router
            .config()
            .gate
            .as_ref()
            .map_or(0, |g| g.lower_every())
    }

    /// Whether `ex` goes now, waits, or is shed ([`crate::gate`]'s formulas).
    /// A host error never holds a request: it goes.
    pub(super) fn admit<H: Host>(
        &mut self,
        host: &H,
        ex: &Exchange,
        key: Option<&PromptKey>,
    ) -> Admission {
        let Some((max_queue, max_bytes)) = self.router.config().gate.as_ref().and_then(|g| {
            g.classes
                .get(ex.class)
                .map(|c| (c.max_queue, g.max_held_bytes))
        }) else {
            return Admission::Go(None);
        };
        let (cap, look) = self.router.admit(
            host,
            &Request {
                key,
                session: ex.session.as_deref(),
                previous: None,
            },
        );
        // The clock as the look at the fleet read it.
        let (now, every) = (self.router.fleet().last_now(), self.lower_every());
        // No pod in rotation serves it: the router's fallback decides, not the gate.
        if !cap.servable() {
            return Admission::Go(Some(look));
        }
        let gate_key = self.router.fleet().gate_key().to_string();
        let Ok(read) = host.get_shared(&gate_key) else {
            return Admission::Go(Some(look));
        };
        let queue = Queue::decode(read.0.as_deref().unwrap_or_default());
        if cap.room() && !queue.any_held() {
            self.stats.gate(ex.class, GateEvent::Admitted);
            return Admission::Go(Some(look));
        }
        if ex.wait_ms == 0 {
            return Admission::Shed(Shed::Deadline);
        }
        let vm = self.router.fleet().vm_id();
        let ticket = Ticket {
            vm,
            context: ex.context,
            wake: self.holding.as_ref().map_or(0, |h| h.wake),
            class: ex.class as u8,
            deadline_ms: now.saturating_add(ex.wait_ms),
            bytes: u32::try_from(ex.buffered).unwrap_or(u32::MAX),
            eligible: mask(cap.eligible.iter().copied(), cap.eligible.len()),
            ..Ticket::default()
        };
        let slots = cap.slots();
        let lease = self.router.fleet().lease_ms();
        let outcome = update_after(host, &gate_key, Some(read), |v| {
            let mut q = Queue::decode(v.as_deref().unwrap_or_default());
            q.beat(vm, now, lease);
            q.sweep(now);
            let full = q.held(ex.class) >= max_queue
                || q.held_bytes() + u64::from(ticket.bytes) > max_bytes;
            q.push(ticket.clone());
            let grants = q.grant(&mut slots.clone(), now, every);
            // A full class still lets through a request that can go at once.
            if full && !grants.iter().any(|g| g.vm == vm && g.context == ex.context) {
                return (None, None);
            }
            for g in grants.iter().filter(|g| g.vm == vm) {
                q.remove(g.vm, g.context);
            }
            (Some(q.encode()), Some(grants))
        });
        let grants = match outcome {
            Ok(Some(grants)) => grants,
            Ok(None) => return Admission::Shed(Shed::QueueFull),
            Err(e) => {
                log::debug!("warmroute: gate not updated, request goes: {e:?}");
                return Admission::Go(Some(look));
            }
        };
        let mine = grants.iter().any(|g| g.vm == vm && g.context == ex.context);
        self.deliver(host, grants, ex.context);
        if mine {
            self.stats.gate(ex.class, GateEvent::Admitted);
            Admission::Go(Some(look))
        } else {
            self.stats.gate(ex.class, GateEvent::Held);
            Admission::Hold(ticket)
        }
    }

    /// Wakes the VMs of other VMs' grants; keeps this VM's (but `current`'s,
    /// which its own callback routes) for [`Worker::release_granted`].
    fn deliver<H: Host>(&mut self, host: &H, grants: Vec<Ticket>, current: u32) {
        let vm = self.router.fleet().vm_id();
        let Some(holding) = self.holding.as_mut() else {
            return;
        };
        for g in grants {
            if g.vm == vm {
                if g.context != current {
                    holding.granted.push(g.context);
                }
            } else if g.wake == 0
                || host
                    .enqueue(g.wake, &wake_message(g.vm, g.context))
                    .is_err()
            {
                // Its VM finds the grant at its next check.
                log::debug!("warmroute: a granted request's worker could not be woken");
            }
        }
    }

    /// Keeps `ex` (with its prompt's key) until the gate releases or sheds it.
    pub(super) fn park(
        &mut self,
        ex: &mut Exchange,
        key: Option<PromptKey>,
        why: Option<Unread>,
        ticket: Ticket,
    ) -> Step {
        let Some(holding) = self.holding.as_mut() else {
            return Step::Continue;
        };
        let since_ms = self.router.fleet().last_now();
        let context = ex.context;
        let parked = Parked {
            since_ms,
            deadline_ms: since_ms.saturating_add(ex.wait_ms),
            ex: std::mem::replace(ex, Exchange::new(context)),
            key,
            why,
            ticket,
        };
        holding.held.insert(context, parked);
        ex.parked = true;
        Step::Pause
    }

    /// Answers the current exchange 429 at once; if even that fails, it is routed.
    pub(super) fn shed_now<H: Host>(&mut self, host: &H, ex: &mut Exchange, why: Shed) -> Step {
        self.stats.gate(ex.class, GateEvent::Shed(why));
        if self.send_shed(host, ex.class, why) {
            Step::Replied
        } else {
            self.dispatch(host, ex, None, None, None, Laps::start(host))
        }
    }

    fn send_shed<H: Host>(&self, host: &H, class: usize, why: Shed) -> bool {
        let Some(g) = &self.router.config().gate else {
            return false;
        };
        let name = g.classes.get(class).map_or("", |c| c.name.as_str());
        let retry = g.retry_after_s.to_string();
        let headers = [
            ("content-type", "application/json"),
            ("retry-after", &retry),
        ];
        match host.send_response(429, &headers, &shed_body(name, why)) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("warmroute: could not answer a shed request: {e:?}");
                false
            }
        }
    }

    /// Routes this VM's granted requests, then acts on `current` again (0:
    /// a root callback, which has nothing left to do).
    pub(super) fn release_granted<H: Host>(&mut self, host: &H, current: u32) {
        let granted = match self.holding.as_mut() {
            Some(h) if !h.granted.is_empty() => std::mem::take(&mut h.granted),
            _ => return,
        };
        for context in granted {
            self.release_one(host, context);
        }
        if current != 0 {
            let _ = host.enter_context(current);
        }
    }

    /// Routes and resumes one held request under its own context.
    fn release_one<H: Host>(&mut self, host: &H, context: u32) {
        let Some(p) = self.holding.as_mut().and_then(|h| h.held.remove(&context)) else {
            return;
        };
        if host.enter_context(context).is_err() {
            log::debug!("warmroute: a released request's context is gone");
            return;
        }
        let mut ex = p.ex;
        let step = self.dispatch(
            host,
            &mut ex,
            p.key.as_ref(),
            p.why,
            None,
            Laps::start(host),
        );
        if step == Step::Continue {
            if let Err(e) = host.resume_request() {
                log::debug!("warmroute: a released request could not be resumed: {e:?}");
            }
        }
        let waited = host.now_ms().saturating_sub(p.since_ms);
        self.stats.gate(ex.class, GateEvent::Released(waited));
        if let Some(h) = self.holding.as_mut() {
            h.resumed.insert(context, ex);
        }
    }

    /// A parked exchange's next callback takes back its state, once released.
    pub(super) fn reclaim(&mut self, ex: &mut Exchange) {
        if !ex.parked {
            return;
        }
        if let Some(r) = self
            .holding
            .as_mut()
            .and_then(|h| h.resumed.remove(&ex.context))
        {
            *ex = r;
        }
    }

    /// A parked exchange ends: released, it goes on to the usual accounting;
    /// still held, its client left, and its place is given up.
    pub(super) fn leave_gate<H: Host>(&mut self, host: &H, ex: &mut Exchange) {
        self.reclaim(ex);
        let Some(p) = self
            .holding
            .as_mut()
            .and_then(|h| h.held.remove(&ex.context))
        else {
            return;
        };
        self.stats.gate(p.ex.class, GateEvent::Abandoned);
        self.remove_tickets(host, &[ex.context]);
    }

    /// Takes this VM's tickets of `contexts` out of the gate's record.
    fn remove_tickets<H: Host>(&self, host: &H, contexts: &[u32]) {
        let vm = self.router.fleet().vm_id();
        let r = update_after(host, self.router.fleet().gate_key(), None, |v| {
            let mut q = Queue::decode(v.as_deref().unwrap_or_default());
            let before = q.tickets.len();
            for &c in contexts {
                q.remove(vm, c);
            }
            ((q.tickets.len() != before).then(|| q.encode()), ())
        });
        if let Err(e) = r {
            log::debug!("warmroute: gate record not updated ({e:?}); its sweep will be");
        }
    }

    /// Capacity may have returned (a request ended, a scrape, a tick): grants
    /// the next held requests, wakes their VMs and routes this VM's.
    pub(super) fn pump<H: Host>(&mut self, host: &H, current: u32) {
        if self.holding.is_none() {
            return;
        }
        let gate_key = self.router.fleet().gate_key().to_string();
        let Ok(read) = host.get_shared(&gate_key) else {
            return;
        };
        if !Queue::decode(read.0.as_deref().unwrap_or_default()).any_held() {
            return;
        }
        let slots = self.router.capacity(host).slots();
        if slots.iter().all(|&s| s == 0) {
            return;
        }
        let (now, every) = (self.router.fleet().last_now(), self.lower_every());
        let vm = self.router.fleet().vm_id();
        let lease = self.holds_any().then(|| self.router.fleet().lease_ms());
        let grants = update_after(host, &gate_key, Some(read), |v| {
            let mut q = Queue::decode(v.as_deref().unwrap_or_default());
            if let Some(lease) = lease {
                q.beat(vm, now, lease);
            }
            q.sweep(now);
            let grants = q.grant(&mut slots.clone(), now, every);
            if grants.is_empty() {
                return (None, grants);
            }
            for g in grants.iter().filter(|g| g.vm == vm) {
                q.remove(g.vm, g.context);
            }
            (Some(q.encode()), grants)
        });
        match grants {
            Ok(grants) => self.deliver(host, grants, 0),
            Err(e) => log::debug!("warmroute: gate not pumped: {e:?}"),
        }
        self.release_granted(host, current);
    }

    /// The root's `on_queue_ready`: other VMs granted some of this VM's held
    /// requests; routes them.
    pub fn on_wake<H: Host>(&mut self, host: &H, queue: u32) {
        let vm = self.router.fleet().vm_id();
        let mut woken = Vec::new();
        while let Ok(Some(m)) = host.dequeue(queue) {
            let mut r = Reader::new(&m);
            if let (Some(v), Some(c)) = (r.get::<u64>(), r.get::<u32>()) {
                if v == vm {
                    woken.push(c);
                }
            }
        }
        if woken.is_empty() {
            return;
        }
        self.remove_tickets(host, &woken);
        if let Some(h) = self.holding.as_mut() {
            h.granted.extend(woken);
        }
        self.release_granted(host, 0);
    }

    /// The VM is going away (a reconfiguration, a drain): its held requests
    /// are routed now rather than left to Envoy's timeouts.
    pub(super) fn release_all<H: Host>(&mut self, host: &H) {
        let held: Vec<u32> = match self.holding.as_ref() {
            Some(h) if !h.held.is_empty() => h.held.keys().copied().collect(),
            _ => return,
        };
        self.remove_tickets(host, &held);
        if let Some(h) = self.holding.as_mut() {
            h.granted.extend(held);
        }
        self.release_granted(host, 0);
    }

    /// Whether this VM holds requests at the gate.
    fn holds_any(&self) -> bool {
        self.holding.as_ref().is_some_and(|h| !h.held.is_empty())
    }

    /// While this VM holds requests, renews its beat in the queue record
    /// when a third of its lease has passed: a VM that stops (crashed, torn
    /// down) loses its tickets at the first write after its lease.
    fn keep_beating<H: Host>(&self, host: &H, q: &Queue, now: u64) {
        let lease = self.router.fleet().lease_ms();
        let vm = self.router.fleet().vm_id();
        let fresh = q
            .beat_of(vm)
            .is_some_and(|b| now.saturating_sub(b) < lease / 3);
        if fresh || !self.holds_any() {
            return;
        }
        let r = update_after(host, self.router.fleet().gate_key(), None, |v| {
            let mut q = Queue::decode(v.as_deref().unwrap_or_default());
            q.beat(vm, now, lease);
            q.sweep(now);
            (Some(q.encode()), ())
        });
        if let Err(e) = r {
            log::debug!("warmroute: gate beat not written: {e:?}");
        }
    }

    /// Puts back the tickets of this VM's held requests that the record lost
    /// (a race on its first write, a damaged record, a grant swept from a
    /// stalled worker): they keep their class and deadline, not their place.
    fn requeue_lost<H: Host>(&self, host: &H, q: &Queue) {
        let vm = self.router.fleet().vm_id();
        let Some(h) = self.holding.as_ref() else {
            return;
        };
        let present = |c: u32| q.tickets.iter().any(|t| t.vm == vm && t.context == c);
        let lost: Vec<Ticket> = h
            .held
            .iter()
            .filter(|(&c, _)| !present(c))
            .map(|(_, p)| p.ticket.clone())
            .collect();
        if lost.is_empty() {
            return;
        }
        let (now, lease) = (
            self.router.fleet().last_now(),
            self.router.fleet().lease_ms(),
        );
        let r = update_after(host, self.router.fleet().gate_key(), None, |v| {
            let mut q = Queue::decode(v.as_deref().unwrap_or_default());
            q.beat(vm, now, lease);
            for t in &lost {
                if !q
                    .tickets
                    .iter()
                    .any(|o| o.vm == vm && o.context == t.context)
                {
                    q.push(t.clone());
                }
            }
            (Some(q.encode()), ())
        });
        if let Err(e) = r {
            log::debug!("warmroute: held requests not put back in the gate: {e:?}");
        }
    }

    /// The gate's check, every `gate.check_ms`, last in the tick: sheds this
    /// VM's held requests whose deadline passed, puts back tickets the record
    /// lost, routes grants a lost wake-up left behind, pumps, and refreshes
    /// the queue gauges.
    pub(super) fn check_gate<H: Host>(&mut self, host: &H, now: u64) {
        let Some(holding) = self.holding.as_mut() else {
            return;
        };
        let expired: Vec<u32> = holding
            .held
            .iter()
            .filter(|(_, p)| p.deadline_ms <= now)
            .map(|(&c, _)| c)
            .collect();
        if !expired.is_empty() {
            self.remove_tickets(host, &expired);
            for c in expired {
                let Some(p) = self.holding.as_mut().and_then(|h| h.held.remove(&c)) else {
                    continue;
                };
                let class = p.ex.class;
                if host.enter_context(c).is_ok() && self.send_shed(host, class, Shed::Deadline) {
                    self.stats.gate(class, GateEvent::Shed(Shed::Deadline));
                } else if let Some(h) = self.holding.as_mut() {
                    // Never a hang: what cannot be answered is routed.
                    h.held.insert(
                        c,
                        Parked {
                            deadline_ms: u64::MAX,
                            ..p
                        },
                    );
                    h.granted.push(c);
                }
            }
        }
        let Ok((value, _)) = host.get_shared(self.router.fleet().gate_key()) else {
            return;
        };
        let q = Queue::decode(value.as_deref().unwrap_or_default());
        let vm = self.router.fleet().vm_id();
        self.keep_beating(host, &q, now);
        self.requeue_lost(host, &q);
        if let Some(h) = self.holding.as_mut() {
            let lost: Vec<u32> = q
                .tickets
                .iter()
                .filter(|t| t.vm == vm && t.granted_ms > 0 && h.held.contains_key(&t.context))
                .map(|t| t.context)
                .collect();
            if !lost.is_empty() {
                h.granted.extend(&lost);
                self.remove_tickets(host, &lost);
            }
        }
        let classes = self
            .router
            .config()
            .gate
            .as_ref()
            .map_or(0, |g| g.classes.len());
        self.stats.queued(host, (0..classes).map(|c| q.held(c)));
        self.release_granted(host, 0);
        self.pump(host, 0);
    }
}

#[cfg(test)]
mod tests;
