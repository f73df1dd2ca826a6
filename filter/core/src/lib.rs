//! warmroute's core: KV-cache-aware routing for LLM inference fleets, with no
//! proxy-wasm dependency.
//!
//! Everything the filter decides is here, behind the [`host::Host`] trait:
//! the wasm crate (`filter/wasm`) is glue that implements `Host` over
//! proxy-wasm's host calls and forwards each callback to one verb of
//! [`worker::Worker`]. The same code runs natively in unit tests, against
//! [`testing::MemoryHost`] (feature `testing`), and compiled to wasm32.
//!
//! | module | job |
//! |---|---|
//! | [`config`] | the JSON configuration, validated; a bad field is named |
//! | [`json`] | a validating JSON reader that borrows every value from the body |
//! | [`openai`] | request bodies → canonical prompt bytes → [`prefix::PromptKey`] |
//! | [`prefix`] | canonical bytes → chained block hashes and the conversation anchor |
//! | [`hash`] | every stable hash: murmur3, splitmix, rendezvous order, ids |
//! | [`index`] | this VM's replica of which pod holds which block |
//! | [`index_log`] | the shared change log that replicates the index across VMs |
//! | [`inflight`] | what this gateway has in flight per pod, and its changes |
//! | [`membership`] | the fleet in slots: a fixed list, or the pods Envoy discovers, read from its admin |
//! | [`store`] | fleet state in proxy-wasm shared data, with CAS: ledger, rotation, health, lease, log, slot table, LoRA state, last answers, the fleets registry |
//! | [`codec`] | the little-endian field codec of every shared-data record |
//! | [`prometheus`] | Prometheus text parser |
//! | [`scrape`] | a pod's `/metrics` → the gauges routing uses |
//! | [`health`] | scrape outcomes → each pod's health, and its shared record |
//! | [`passive`] | Envoy's own view: how the requests routed to each pod ended |
//! | [`scheduler`] | when each pod's scrape is due (idle → pending → idle) |
//! | [`load`] | per-pod load and saturation from in-flight counts and scrapes |
//! | [`work`] | work in flight per pod, in typical requests |
//! | [`models`] | which pods may serve a request's model; LoRA adapter tiers |
//! | [`feedback`] | a pod's own cache report against the index's prediction |
//! | [`waiting`] | the prompts waiting for their first token per pod (the sole holder's guard) |
//! | [`gate`] | priority classes and deadlines: the held-request queue shared by every VM, its release order |
//! | [`policy`] | the six strategies |
//! | [`router`] | one VM's routing: observe the fleet, decide, commit |
//! | [`steering`] | the header that steers Envoy, and the client headers stripped |
//! | [`stats`] | the filter's Envoy stats |
//! | [`worker`] | the verbs each proxy-wasm callback calls |
//! | [`phases`] | bench-only timing of the request path inside Envoy |

pub mod codec;
pub mod config;
pub mod feedback;
pub mod gate;
pub mod hash;
pub mod health;
pub mod host;
pub mod index;
pub mod index_log;
pub mod inflight;
pub mod json;
pub mod load;
pub mod membership;
pub mod models;
pub mod openai;
pub mod passive;
pub mod phases;
pub mod policy;
pub mod prefix;
pub mod prometheus;
pub mod router;
pub mod scheduler;
pub mod scrape;
pub mod stats;
pub mod steering;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod waiting;
pub mod work;
pub mod worker;
