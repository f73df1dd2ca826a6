//! Which pods may serve a request's `model`, and, for a LoRA adapter, which
//! of them to prefer.
//!
//! ```text
//! serves(b, m)  = m ∈ declared models or adapters of b     (backends[].models/adapters, pool.*)
//!               ∨ m ∈ adapters b has loaded                (its vllm:lora_requests_info)
//!               ∨ b declares nothing                       (unknown: anything may go there)
//! no member serves m, and every member declares  ⇒  404, OpenAI's error shape
//! candidates    = members with serves(b, m); the others are never chosen
//! for an adapter (m declared or seen as one), in order, the first non-empty:
//!   loaded   = candidates with m running or waiting there, not saturated
//!   free     = candidates with fewer adapters active than max_lora, not saturated
//!   then every candidate
//! ```
//! The tier is the set the strategy then weighs by prefix match and load, like
//! any request's: an adapter's requests stay on the pods that have it loaded
//! (no adapter swap, whose load stalls a batch in vLLM) until those saturate,
//! then go where a slot is free, and only then anywhere that serves it.
//!
//! Each pod's LoRA state is the fleet's ([`crate::fleet::lora`]).

use crate::config::Serves;
use crate::fleet::lora::Lora;
use crate::routing::load::BackendLoad;

/// What a request's model allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// Some member serves it; the loads are narrowed to where it should go.
    Served,
    /// No member serves it, and every member says what it serves.
    Unknown,
}

/// Narrows `loads` to the members that serve `model` (see the module doc):
/// others stop being members; for an adapter, members outside the preferred
/// tier stop being healthy, so they are chosen only if the tier is empty.
pub fn narrow<'s>(
    model: &str,
    serves: impl Fn(usize) -> Option<&'s Serves>,
    lora: &[Option<Lora>],
    loads: &mut [BackendLoad],
) -> Fit {
    let n = loads.len();
    let lora_of = |b: usize| lora.get(b).and_then(Option::as_ref);
    let loaded = |b: usize| lora_of(b).is_some_and(|l| l.loaded(model));
    let declared = |b: usize| serves(b).and_then(|s| s.knows(model));
    let candidate: Vec<bool> = (0..n)
        .map(|b| loads[b].member && (declared(b) != Some(false) || loaded(b)))
        .collect();
    if !candidate.iter().any(|&c| c) {
        let all_declared = (0..n).all(|b| !loads[b].member || declared(b).is_some());
        if all_declared && loads.iter().any(|l| l.member) {
            return Fit::Unknown;
        }
        return Fit::Served;
    }
    for (l, &c) in loads.iter_mut().zip(&candidate) {
        if !c {
            l.member = false;
            l.healthy = false;
        }
    }
    let adapter = (0..n)
        .any(|b| loaded(b) || serves(b).is_some_and(|s| s.adapters.iter().any(|a| a == model)));
    if adapter {
        let open = |b: usize| candidate[b] && loads[b].healthy && !loads[b].saturated;
        let loaded_tier: Vec<bool> = (0..n).map(|b| open(b) && loaded(b)).collect();
        let free_tier: Vec<bool> = (0..n)
            .map(|b| open(b) && lora_of(b).is_some_and(Lora::free_slot))
            .collect();
        let tier = [loaded_tier, free_tier]
            .into_iter()
            .find(|t| t.iter().any(|&x| x));
        if let Some(tier) = tier {
            for (l, &t) in loads.iter_mut().zip(&tier) {
                l.healthy &= t;
            }
        }
    }
    Fit::Served
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn member() -> BackendLoad {
        BackendLoad {
            member: true,
            healthy: true,
            ..BackendLoad::default()
        }
    }

    /// `narrow` over a table of what each slot serves.
    fn narrow_in(
        model: &str,
        table: &[Option<&Serves>],
        lora: &[Option<Lora>],
        loads: &mut [BackendLoad],
    ) -> Fit {
        narrow(model, |b| table.get(b).copied().flatten(), lora, loads)
    }

    fn serves(models: &[&str], adapters: &[&str]) -> Serves {
        Serves {
            models: models.iter().map(|m| m.to_string()).collect(),
            adapters: adapters.iter().map(|m| m.to_string()).collect(),
        }
    }

    fn state(loads: &[BackendLoad]) -> Vec<(bool, bool)> {
        loads.iter().map(|l| (l.member, l.healthy)).collect()
    }

    #[test]
    fn requests_go_only_where_their_model_is_served() {
        let a = serves(&["llama"], &[]);
        let b = serves(&["qwen"], &[]);
        let table = [Some(&a), Some(&b), Some(&a)];
        let mut loads = vec![member(); 3];
        assert_eq!(narrow_in("qwen", &table, &[], &mut loads), Fit::Served);
        assert_eq!(
            state(&loads),
            vec![(false, false), (true, true), (false, false)]
        );
        let mut loads = vec![member(); 3];
        assert_eq!(narrow_in("mistral", &table, &[], &mut loads), Fit::Unknown);
        // A pod that declares nothing may serve anything: no 404 then.
        let table = [Some(&a), None, Some(&a)];
        let mut loads = vec![member(); 3];
        assert_eq!(narrow_in("mistral", &table, &[], &mut loads), Fit::Served);
        assert_eq!(
            state(&loads),
            vec![(false, false), (true, true), (false, false)]
        );
        // An empty slot is no member and says nothing.
        let mut loads = vec![member(), BackendLoad::default(), member()];
        assert_eq!(
            narrow_in("qwen", &[Some(&a), None, Some(&a)], &[], &mut loads),
            Fit::Unknown
        );
    }

    #[test]
    fn adapter_requests_prefer_pods_that_have_it_loaded_then_a_free_slot() {
        let base = serves(&["llama"], &["sql"]);
        let table = [Some(&base); 3];
        let lora = |running: &[&str], max: u32| {
            Some(Lora {
                running: running.iter().map(|a| a.to_string()).collect(),
                waiting: vec![],
                max_lora: max,
            })
        };
        let states = [lora(&["chat"], 1), lora(&["sql"], 1), lora(&[], 1)];
        let mut loads = vec![member(); 3];
        narrow_in("sql", &table, &states, &mut loads);
        assert_eq!(
            state(&loads),
            vec![(true, false), (true, true), (true, false)]
        );
        // Saturated where it is loaded: a pod with a free slot next.
        let mut loads = vec![member(); 3];
        loads[1].saturated = true;
        narrow_in("sql", &table, &states, &mut loads);
        assert_eq!(
            state(&loads),
            vec![(true, false), (true, false), (true, true)]
        );
        // Nowhere loaded, no free slot: every pod that can serve it.
        let full = [lora(&["chat"], 1), lora(&["law"], 1), lora(&["x"], 1)];
        let mut loads = vec![member(); 3];
        narrow_in("sql", &table, &full, &mut loads);
        assert_eq!(state(&loads), vec![(true, true); 3]);
        // A base-model request is not narrowed by adapters.
        let mut loads = vec![member(); 3];
        narrow_in("llama", &table, &states, &mut loads);
        assert_eq!(state(&loads), vec![(true, true); 3]);
        // An adapter loaded on a pod that did not declare it is still served there.
        let plain = serves(&["llama"], &[]);
        let mut loads = vec![member(); 2];
        let fit = narrow_in(
            "dyn",
            &[Some(&plain), Some(&plain)],
            &[lora(&["dyn"], 2), None],
            &mut loads,
        );
        assert_eq!(fit, Fit::Served);
        assert_eq!(state(&loads), vec![(true, true), (false, false)]);
    }
}
