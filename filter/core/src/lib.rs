//! warmroute's core: KV-cache-aware routing for LLM inference fleets, with no
//! proxy-wasm dependency.
//!
//! Everything the filter decides is here, behind the [`host::Host`] trait:
//! the wasm crate (`filter/wasm`) is glue that implements `Host` over
//! proxy-wasm's host calls and forwards each callback to one verb of
//! [`worker::Worker`]. The same code runs natively in unit tests, against
//! [`testing::MemoryHost`] (feature `testing`), and compiled to wasm32.
//!
//! The rooms, bottom up: a room imports only rooms listed before it here
//! (`config` imports none; `prompt`, `fleet` and `gate` at most `config`;
//! the fleet never imports routing). `scripts/check_rooms.py`, run by
//! `make lint`, holds the code to it.
//!
//! | room | job |
//! |---|---|
//! | [`host`], [`codec`], [`hash`], [`phases`] | the host trait, the shared records' field codec, every stable hash, bench-only timing |
//! | [`config`] | the JSON configuration, validated; a bad field is named |
//! | [`prompt`] | request bodies → canonical prompt bytes → chained block hashes |
//! | [`fleet`] | the pods: slots and members, scrapes, health, passive ejection, LoRA state, the in-flight ledger and every shared record |
//! | [`routing`] | the index and its log, waiting prompts, feedback, load and work, the strategies, one VM's router |
//! | [`gate`] | priority classes and deadlines: the held-request queue shared by every VM |
//! | [`worker`] | the verbs each proxy-wasm callback calls, the tick, the callouts, admission, stats |

pub mod codec;
pub mod config;
pub mod fleet;
pub mod gate;
pub mod hash;
pub mod host;
pub mod phases;
pub mod prompt;
pub mod routing;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod worker;
