//! The fleet: which pods there are, how they answer, what they report, and
//! what every worker VM shares about them. It never imports routing: the
//! router reads the fleet, not the other way round.
//!
//! | module | job |
//! |---|---|
//! | [`membership`] | the fleet in slots: a fixed list, or the pods Envoy discovers, read from its admin |
//! | [`prometheus`] | Prometheus text parser |
//! | [`scrape`] | a pod's `/metrics` → the gauges routing uses |
//! | [`scrape_schedule`] | when each pod's scrape is due (idle → pending → idle) |
//! | [`health`] | scrape outcomes → each pod's health, and its shared record |
//! | [`passive`] | Envoy's own view: how the requests routed to each pod ended |
//! | [`lora`] | the LoRA adapters each pod reported, and their shared record |
//! | [`inflight`] | what this gateway has in flight per pod, and its changes |
//! | [`responses`] | which pod answered each stored `/v1/responses` response, for its follow-ups |
//! | [`view`] | one VM's view of all of the above: mirrored at the tick, read per request as a snapshot |
//! | [`store`] | fleet state in proxy-wasm shared data, with CAS: ledger, rotation, health, lease, slot table, LoRA state, last answers, the fleets registry, the index log's ring, the stored responses' pods |

pub mod health;
pub mod inflight;
pub mod lora;
pub mod membership;
pub mod passive;
pub mod prometheus;
pub mod responses;
pub mod scrape;
pub mod scrape_schedule;
pub mod store;
pub mod view;
