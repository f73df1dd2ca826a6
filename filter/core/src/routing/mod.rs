//! Routing: this VM's picture of which pod holds which prefix, what each pod
//! has to do, and the strategies that weigh the two into a decision.
//!
//! | module | job |
//! |---|---|
//! | [`index`] | this VM's replica of which pod holds which block |
//! | [`index_log`] | the shared change log that replicates the index across VMs |
//! | [`exchange`] | the index events gateway replicas pull from each other |
//! | [`pending`] | the prompts waiting for their first token per pod (the sole holder's guard) |
//! | [`feedback`] | a pod's own cache report against the index's prediction |
//! | [`load`] | per-pod load and saturation from in-flight counts and scrapes |
//! | [`work`] | work in flight per pod, in typical requests |
//! | [`models`] | which pods may serve a request's model; LoRA adapter tiers |
//! | [`policy`] | the six strategies |
//! | [`router`] | one VM's routing: observe the fleet, decide, commit |

pub mod exchange;
pub mod feedback;
pub mod index;
pub mod index_log;
pub mod load;
pub mod models;
pub mod pending;
pub mod policy;
pub mod router;
pub mod work;
