//! warmroute: KV-cache-aware routing for LLM inference fleets, as a proxy-wasm filter.
