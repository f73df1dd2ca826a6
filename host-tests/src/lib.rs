//! Stateful proxy-wasm host emulator.
