//! `Host`: one emulated Envoy process: compiled module, shared data, clock, stats,
//! outgoing HTTP calls, and any number of VM instances of the same module.

use crate::abi;
use crate::clock::{VirtualClock, DEFAULT_EPOCH_NS};
use crate::http_call::{HttpCall, HttpCallReply};
use crate::metrics::{MetricValue, Metrics};
use crate::shared_data::{SharedDataStore, SharedQueues};
use crate::state::{CallRegistry, SendCell, Shared, SharedSetHook, VmState};
use crate::types::{LogLevel, Status};
use crate::vm::{Vm, VmInner};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::rc::Rc;
use std::sync::{Arc, Mutex, OnceLock};
use wasmtime::{bail, format_err, Engine, Extern, Linker, Module, Result, Store};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::WasiCtxBuilder;

/// Fuel each VM of a metering host starts with: far more than any test spends, so
/// metering measures and never traps.
pub(crate) const FUEL_BUDGET: u64 = u64::MAX;

/// Compiled modules are cached per process (keyed by a hash of the bytes and whether the
/// code meters fuel) so that each test can build its own `Host` cheaply. No host *state* is
/// global.
fn compile(bytes: &[u8], fuel: bool) -> Result<(Engine, Module)> {
    type Cache = Mutex<HashMap<(u64, usize, bool), (Engine, Module)>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    let key = (h.finish(), bytes.len(), fuel);
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((e, m)) = cache.get(&key) {
        return Ok((e.clone(), m.clone()));
    }
    // Metered code checks its fuel at every block: compiled only for the tests that ask.
    let engine = Engine::new(wasmtime::Config::new().consume_fuel(fuel))?;
    let module = Module::new(&engine, bytes)?;
    cache.insert(key, (engine.clone(), module.clone()));
    Ok((engine, module))
}

/// Options for a `Host`.
#[derive(Clone, Debug)]
pub struct HostOptions {
    /// Initial virtual wall-clock time, ns since the Unix epoch.
    pub start_ns: u64,
    /// Level reported by `proxy_get_log_level` (all logs are captured regardless).
    pub log_level: LogLevel,
    /// If Some, `proxy_http_call` to other clusters answers BadArgument.
    pub known_clusters: Option<Vec<String>>,
    /// Time out pending HTTP calls automatically when `advance` passes their deadline.
    pub auto_timeout: bool,
    /// Print guest logs to stderr as they happen (also enabled by env HOST_TESTS_ECHO_LOGS=1).
    pub echo_logs: bool,
    /// Max captured log lines per VM before old non-warning lines are dropped.
    pub max_logs: usize,
    /// Seed for the guest's WASI random source (deterministic).
    pub seed: u64,
    /// Meter the guest's work in wasmtime fuel (about one unit per wasm instruction, one
    /// per byte of a bulk copy or fill; host calls cost nothing): [`Vm::fuel_used`].
    /// Deterministic, unlike time, so a test can assert on it. Off by default: metered
    /// code runs slower and is compiled separately.
    pub fuel: bool,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            start_ns: DEFAULT_EPOCH_NS,
            log_level: LogLevel::Trace,
            known_clusters: None,
            auto_timeout: true,
            echo_logs: std::env::var("HOST_TESTS_ECHO_LOGS").is_ok_and(|v| v == "1"),
            max_logs: 20_000,
            seed: 0x5eed,
            fuel: false,
        }
    }
}

/// Options for one VM.
#[derive(Clone, Debug)]
pub struct VmOptions {
    /// Plugin configuration (`proxy_get_buffer_bytes(PluginConfiguration)`).
    pub plugin_config: Vec<u8>,
    /// VM configuration (`proxy_on_vm_start` size / VmConfiguration buffer).
    pub vm_config: Vec<u8>,
    /// Shared-data namespace; VMs with the same vm_id share keys (Envoy: `vm_config.vm_id`).
    pub vm_id: String,
    /// Extra properties (path segments, value).
    pub properties: Vec<(Vec<String>, Vec<u8>)>,
    pub plugin_name: String,
}

impl VmOptions {
    pub fn new(plugin_config: impl Into<Vec<u8>>) -> Self {
        VmOptions {
            plugin_config: plugin_config.into(),
            vm_config: Vec::new(),
            vm_id: "warmroute".into(),
            properties: Vec::new(),
            plugin_name: "warmroute".into(),
        }
    }
}

struct HostInner {
    engine: Engine,
    module: Module,
    linker: Linker<VmState>,
    shared: Arc<Shared>,
    vms: RefCell<Vec<Vm>>,
    hooks: Rc<RefCell<Vec<SharedSetHook>>>,
    opts: HostOptions,
}

/// An emulated Envoy process hosting VM instances of one wasm module.
#[derive(Clone)]
pub struct Host {
    inner: Rc<HostInner>,
}

/// What happened at one step of `Host::advance`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Tick { vm: usize, at_ms: u64 },
    HttpCallTimeout { token: u32, at_ms: u64 },
}

impl Host {
    /// Load a module from a file with default options.
    pub fn load(path: impl AsRef<Path>) -> Result<Host> {
        Self::load_with(path, HostOptions::default())
    }

    pub fn load_with(path: impl AsRef<Path>, opts: HostOptions) -> Result<Host> {
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).map_err(|e| format_err!("cannot read {}: {e}", path.display()))?;
        Self::from_bytes_with(&bytes, opts)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Host> {
        Self::from_bytes_with(bytes, HostOptions::default())
    }

    pub fn from_bytes_with(bytes: &[u8], opts: HostOptions) -> Result<Host> {
        let (engine, module) = compile(bytes, opts.fuel)?;
        let mut linker: Linker<VmState> = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s: &mut VmState| &mut s.wasi)?;
        abi::add_to_linker(&mut linker)?;
        // Loud failure for anything the module imports that we do not provide.
        let mut missing = Vec::new();
        for imp in module.imports() {
            let known = match imp.module() {
                "env" => abi::IMPLEMENTED.contains(&imp.name()),
                "wasi_snapshot_preview1" => true, // checked by instantiate below
                _ => false,
            };
            if !known {
                missing.push(format!("{}::{} ({:?})", imp.module(), imp.name(), imp.ty()));
            }
        }
        if !missing.is_empty() {
            bail!(
                "the module imports host functions the emulator does not implement:\n  {}",
                missing.join("\n  ")
            );
        }
        let shared = Arc::new(Shared {
            shared_data: Arc::new(Mutex::new(SharedDataStore::new())),
            queues: Mutex::new(SharedQueues::default()),
            metrics: Mutex::new(Metrics::default()),
            clock: VirtualClock::new(opts.start_ns),
            calls: Mutex::new(CallRegistry::default()),
            known_clusters: opts.known_clusters.clone(),
        });
        Ok(Host {
            inner: Rc::new(HostInner {
                engine,
                module,
                linker,
                shared,
                vms: RefCell::new(Vec::new()),
                hooks: Rc::new(RefCell::new(Vec::new())),
                opts,
            }),
        })
    }

    /// Names (module::name) of everything the module imports.
    pub fn module_imports(&self) -> Vec<String> {
        self.inner
            .module
            .imports()
            .map(|i| format!("{}::{}", i.module(), i.name()))
            .collect()
    }

    /// Start a VM with this plugin configuration (see `start_vm_with`).
    pub fn start_vm(&self, plugin_config: impl AsRef<[u8]>) -> Result<Vm> {
        self.start_vm_with(VmOptions::new(plugin_config.as_ref()))
    }

    /// Instantiate the module and run Envoy's start sequence:
    /// `_initialize` (or `_start`), `proxy_on_context_create(root, 0)`,
    /// `proxy_on_vm_start(root, vm_config_size)`, `proxy_on_configure(root, config_size)`.
    /// (proxy-wasm-cpp-host creates the root context before `proxy_on_vm_start`, and the Rust
    /// SDK needs that order.) Returns the VM even if on_vm_start/on_configure returned false:
    /// check `vm.vm_started()` / `vm.configured()`. Errors on instantiation failure or trap.
    pub fn start_vm_with(&self, opts: VmOptions) -> Result<Vm> {
        let h = &self.inner;
        let index = h.vms.borrow().len();
        let stderr = MemoryOutputPipe::new(4 << 20);
        let stdout = MemoryOutputPipe::new(4 << 20);
        let seed_bytes = {
            // splitmix64 stream: deterministic per (host seed, vm index).
            let mut x = h.opts.seed ^ ((index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut v = Vec::with_capacity(4096);
            for _ in 0..512 {
                x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = x;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                v.extend_from_slice(&z.to_le_bytes());
            }
            v
        };
        let wasi = WasiCtxBuilder::new()
            .stderr(stderr.clone())
            .stdout(stdout.clone())
            .wall_clock(h.shared.clock.clone())
            .monotonic_clock(h.shared.clock.clone())
            .secure_random(wasmtime_wasi::Deterministic::new(seed_bytes.clone()))
            .insecure_random(wasmtime_wasi::Deterministic::new(seed_bytes))
            .insecure_random_seed(h.opts.seed as u128)
            .build_p1();
        let root_id = 1;
        let mut properties = BTreeMap::new();
        let mut prop = |path: &[&str], v: &[u8]| {
            properties.insert(path.join("\0").into_bytes(), v.to_vec());
        };
        prop(&["plugin_name"], opts.plugin_name.as_bytes());
        prop(&["plugin_root_id"], b"");
        prop(&["plugin_vm_id"], opts.vm_id.as_bytes());
        prop(&["vm_id"], opts.vm_id.as_bytes());
        prop(&["worker_id"], index.to_string().as_bytes());
        for (p, v) in &opts.properties {
            properties.insert(p.join("\0").into_bytes(), v.clone());
        }
        let state = VmState {
            wasi,
            shared: h.shared.clone(),
            index,
            vm_id: opts.vm_id.clone(),
            root_id,
            plugin_config: opts.plugin_config.clone(),
            vm_config: opts.vm_config.clone(),
            properties,
            log_level: h.opts.log_level,
            logs: Vec::new(),
            max_logs: h.opts.max_logs,
            dropped_logs: 0,
            echo_logs: h.opts.echo_logs,
            tick_period_ms: 0,
            next_tick_ns: None,
            effective_ctx: root_id,
            streams: Default::default(),
            call_response: None,
            done_calls: 0,
            memory: None,
            alloc: None,
            hooks: SendCell(h.hooks.clone()),
        };
        let mut store = Store::new(&h.engine, state);
        if h.opts.fuel {
            store.set_fuel(FUEL_BUDGET)?;
        }
        let instance = h.linker.instantiate(&mut store, &h.module).map_err(|e| {
            format_err!("instantiating the module failed (missing or mistyped import?): {e:?}")
        })?;
        let mut exports = HashMap::new();
        let mut memory = None;
        let mut has_abi_version = None;
        for exp in instance.exports(&mut store) {
            let name = exp.name().to_string();
            if name.starts_with("proxy_abi_version_") {
                has_abi_version = Some(name.clone());
            }
            match exp.into_extern() {
                Extern::Func(f) => {
                    exports.insert(name, f);
                }
                Extern::Memory(m) if name == "memory" => memory = Some(m),
                _ => {}
            }
        }
        let Some(memory) = memory else {
            bail!("module exports no memory named `memory`");
        };
        match has_abi_version.as_deref() {
            Some("proxy_abi_version_0_2_1") | Some("proxy_abi_version_0_2_0") => {}
            other => bail!("module does not export a supported ABI version marker (found {other:?}; want proxy_abi_version_0_2_1)"),
        }
        let alloc_name = if exports.contains_key("proxy_on_memory_allocate") {
            "proxy_on_memory_allocate"
        } else {
            "malloc"
        };
        let alloc = match exports.get(alloc_name) {
            Some(f) => Some(
                f.typed::<u32, u32>(&store)
                    .map_err(|e| format_err!("{alloc_name} has a bad signature: {e}"))?,
            ),
            None => bail!("module exports neither proxy_on_memory_allocate nor malloc"),
        };
        store.data_mut().memory = Some(memory);
        store.data_mut().alloc = alloc;

        let vm = Vm {
            inner: Rc::new(RefCell::new(VmInner {
                store,
                exports,
                crashed: None,
                next_ctx: root_id + 1,
                vm_started: false,
                configured: false,
                stderr,
                stdout,
                ticks_suspended: false,
            })),
            index,
        };
        h.vms.borrow_mut().push(vm.clone());
        {
            let mut inner = vm.inner.borrow_mut();
            if inner.exports.contains_key("_initialize") {
                inner.call::<(), ()>("_initialize", root_id, ())?;
            } else if inner.exports.contains_key("_start") {
                if let Err(e) = inner.call::<(), ()>("_start", root_id, ()) {
                    // proc_exit(0) from a command module is fine.
                    let ok_exit = inner
                        .crashed
                        .as_deref()
                        .is_some_and(|c| c.contains("Exited with i32 exit status 0"));
                    if !ok_exit {
                        return Err(e);
                    }
                    inner.crashed = None;
                }
            }
            inner.call::<(u32, u32), ()>("proxy_on_context_create", root_id, (root_id, 0))?;
            let vm_cfg_len = opts.vm_config.len() as u32;
            let started = inner
                .call::<(u32, u32), u32>("proxy_on_vm_start", root_id, (root_id, vm_cfg_len))?
                .unwrap_or(1)
                != 0;
            inner.vm_started = started;
            if started {
                let n = opts.plugin_config.len() as u32;
                let ok = inner
                    .call::<(u32, u32), u32>("proxy_on_configure", root_id, (root_id, n))?
                    .unwrap_or(1)
                    != 0;
                inner.configured = ok;
            }
        }
        Ok(vm)
    }

    /// All VMs, in creation order.
    pub fn vms(&self) -> Vec<Vm> {
        self.inner.vms.borrow().clone()
    }

    pub fn vm(&self, index: usize) -> Vm {
        self.inner.vms.borrow()[index].clone()
    }

    // ---------------------------------------------------------------- clock & ticks

    /// Virtual milliseconds since the host was created.
    pub fn now_ms(&self) -> u64 {
        self.inner.shared.clock.elapsed_ms()
    }

    pub fn now_ns(&self) -> u64 {
        self.inner.shared.clock.now_ns()
    }

    /// Move the virtual clock forward by `ms`, firing due events in time order:
    /// each VM's tick timer (rescheduled every period, as Envoy does) and, if
    /// `auto_timeout`, HTTP-call timeouts (delivered as Envoy's 504 local reply).
    /// At equal times: ticks before timeouts, lower VM index / token first.
    pub fn advance(&self, ms: u64) -> Result<Vec<Event>> {
        let clock = &self.inner.shared.clock;
        let target = clock.now_ns() + ms * 1_000_000;
        let start_ns = clock.now_ns() - clock.elapsed_ms() * 1_000_000;
        let mut events = Vec::new();
        loop {
            let mut best: Option<(u64, u8, u64)> = None;
            for vm in self.vms() {
                if vm.crashed().is_some() {
                    continue;
                }
                if let Some(t) = vm.next_tick_ns() {
                    let cand = (t, 0u8, vm.index() as u64);
                    if t <= target && best.is_none_or(|b| cand < b) {
                        best = Some(cand);
                    }
                }
            }
            if self.inner.opts.auto_timeout {
                let calls = self.inner.shared.calls.lock().expect("calls lock");
                for c in calls.pending.values() {
                    if let Some(d) = c.deadline_ms() {
                        let t = start_ns + d * 1_000_000;
                        let cand = (t, 1u8, c.token as u64);
                        if t <= target && best.is_none_or(|b| cand < b) {
                            best = Some(cand);
                        }
                    }
                }
            }
            let Some((t, kind, id)) = best else { break };
            if t > clock.now_ns() {
                clock.set_ns(t);
            }
            if kind == 0 {
                events.push(Event::Tick {
                    vm: id as usize,
                    at_ms: self.now_ms(),
                });
                self.vm(id as usize).fire_scheduled_tick(t)?;
            } else {
                events.push(Event::HttpCallTimeout {
                    token: id as u32,
                    at_ms: self.now_ms(),
                });
                self.respond(id as u32, HttpCallReply::Timeout)?;
            }
            self.deliver_queue_ready()?;
        }
        clock.set_ns(target);
        Ok(events)
    }

    /// Call `proxy_on_tick` now on every VM that has a tick period set (clock unchanged).
    pub fn tick_all(&self) -> Result<()> {
        for vm in self.vms() {
            if vm.tick_period_ms() > 0 {
                vm.tick()?;
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------- http calls

    /// HTTP calls dispatched and not yet answered, in token order.
    pub fn pending_http_calls(&self) -> Vec<HttpCall> {
        self.inner
            .shared
            .calls
            .lock()
            .expect("calls lock")
            .pending
            .values()
            .cloned()
            .collect()
    }

    /// Every HTTP call ever dispatched, in order.
    pub fn http_call_history(&self) -> Vec<HttpCall> {
        self.inner
            .shared
            .calls
            .lock()
            .expect("calls lock")
            .history
            .clone()
    }

    /// Answer a pending call: calls `proxy_on_http_call_response` on the dispatching context.
    pub fn respond(&self, token: u32, reply: HttpCallReply) -> Result<()> {
        let call = self
            .inner
            .shared
            .calls
            .lock()
            .expect("calls lock")
            .pending
            .remove(&token)
            .ok_or_else(|| format_err!("no pending http call with token {token}"))?;
        self.vm(call.vm)
            .deliver_http_call(call.context_id, token, &reply)
    }

    /// Answer every pending call with `f(call)`; returns how many were answered.
    pub fn respond_all(&self, mut f: impl FnMut(&HttpCall) -> HttpCallReply) -> Result<usize> {
        let calls = self.pending_http_calls();
        for c in &calls {
            let reply = f(c);
            self.respond(c.token, reply)?;
        }
        Ok(calls.len())
    }

    // ---------------------------------------------------------------- shared queues

    /// Deliver pending `proxy_on_queue_ready` notifications.
    pub fn deliver_queue_ready(&self) -> Result<()> {
        loop {
            let next = self
                .inner
                .shared
                .queues
                .lock()
                .expect("queue lock")
                .pending_ready
                .pop_front();
            let Some((vm, ctx, q)) = next else {
                return Ok(());
            };
            // A VM that crashed never reads its queues again (as ticks skip it).
            if self.vm(vm).crashed().is_some() {
                continue;
            }
            self.vm(vm).deliver_queue_ready(ctx, q)?;
        }
    }

    // ---------------------------------------------------------------- shared data

    /// The shared-data store (shared by all VMs of this host).
    pub fn shared_data(&self) -> Arc<Mutex<SharedDataStore>> {
        self.inner.shared.shared_data.clone()
    }

    /// Read a key in the default vm_id namespace ("warmroute").
    pub fn shared_get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.shared_get_in("warmroute", key)
    }

    pub fn shared_get_in(&self, vm_id: &str, key: &str) -> Option<(Vec<u8>, u32)> {
        self.inner
            .shared
            .shared_data
            .lock()
            .expect("lock")
            .get(vm_id, key.as_bytes())
            .ok()
    }

    pub fn shared_set(&self, key: &str, value: &[u8], cas: u32) -> std::result::Result<(), Status> {
        self.inner.shared.shared_data.lock().expect("lock").set(
            "warmroute",
            key.as_bytes(),
            value,
            cas,
        )
    }

    /// Run `action` right before the next `times` `proxy_set_shared_data` calls whose key
    /// contains `key_contains` (any key if empty), made by VM `vm` (any VM if None), are
    /// applied — i.e. between the guest's get and its CAS set. Use it to emulate another
    /// worker writing concurrently (e.g. drive another VM, or `shared_set` directly).
    /// The action must not use the VM that triggered it (it is mid-call).
    pub fn before_shared_set(
        &self, vm: Option<&Vm>, key_contains: &str, times: usize,
        action: impl FnMut(&[u8]) + 'static,
    ) {
        self.inner.hooks.borrow_mut().push(SharedSetHook {
            vm: vm.map(|v| v.index()),
            key_contains: key_contains.as_bytes().to_vec(),
            action: Box::new(action),
            remaining: times,
        });
    }

    // ---------------------------------------------------------------- metrics & logs

    pub fn metric(&self, name: &str) -> Option<MetricValue> {
        self.inner
            .shared
            .metrics
            .lock()
            .expect("lock")
            .by_name(name)
            .cloned()
    }

    /// Counter or gauge value by name.
    pub fn metric_value(&self, name: &str) -> Option<i64> {
        match self.metric(name)? {
            MetricValue::Counter(c) => Some(c as i64),
            MetricValue::Gauge(g) => Some(g),
            MetricValue::Histogram(_) => None,
        }
    }

    pub fn metrics(&self) -> Vec<(String, MetricValue)> {
        self.inner.shared.metrics.lock().expect("lock").all()
    }

    /// Whether any VM logged a line containing `needle`.
    pub fn logs_contain(&self, needle: &str) -> bool {
        self.vms().iter().any(|v| v.logs_contain(needle))
    }

    /// All VMs' logs as text.
    pub fn log_text(&self) -> String {
        self.vms()
            .iter()
            .map(|v| format!("--- vm{} ---\n{}", v.index(), v.log_text()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}
