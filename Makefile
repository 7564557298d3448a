# kvgate — `make demo` runs the main job, `make test` runs every test. Both set themselves up.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The runtime dependencies are the ones the image ships: operator/image/requirements.lock
# constrains them here too, so the tests run what `make image` installs.
RUNTIME_LOCK := operator/image/requirements.lock
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(RUNTIME_LOCK) | sha256sum | cut -c1-12)

.PHONY: test test-loaded beside-e2e image image-lock image-test container-runtime cni-plugins kubelet real-node-runtime real-node-deps e2e-real-node demo lint typecheck unit conformance conformance-deps deps e2e e2e-real e2e-deps real-engine-deps system-packages lws promtool prometheus prometheus-adapter chaos bench-scale bench-fairness dashboard-images crds venv clean

KVGATE_CACHE ?= $(HOME)/.cache/kvgate
# The venv is filled by uv (PyPI, pinned; installed once with pip into a tool venv in the cache):
# torch (extra sglang-torch: the released SGLang of the conformance and real-engine tiers imports it
# from this venv; kvgate does not) brings ~5 GB of CUDA wheels, which pip unpacked in 3 min 43 s
# into every fresh clone; uv links them from its cache (~/.cache/uv) in 4 s (42 s with an empty
# cache, downloads included). UV_NATIVE_TLS: uv trusts the system's CA store, as pip does here.
UV_VERSION := 0.13.9
UV := $(KVGATE_CACHE)/tools/uv-$(UV_VERSION)/bin/uv
export UV_NATIVE_TLS := 1

# Built beside its place and renamed into it: a make interrupted half-way leaves no broken uv.
$(UV):
	@set -e; dir=$(KVGATE_CACHE)/tools/uv-$(UV_VERSION); tmp=$$dir.tmp-$$$$; \
	  mkdir -p $(KVGATE_CACHE)/tools; rm -rf $$tmp; \
	  $(PY) -m venv $$tmp; $$tmp/bin/pip install --quiet uv==$(UV_VERSION); \
	  rm -rf $$dir; mv -T $$tmp $$dir; echo "uv $(UV_VERSION) installed in $$dir"

$(STAMP): pyproject.toml $(RUNTIME_LOCK) $(UV)
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(UV) pip install --quiet --python $(BIN)/python -c $(RUNTIME_LOCK) -e '.[operator,test,reference,plot,sglang-torch]'
	@# The e2e harness is no part of the package: the venv finds it through a .pth file naming a
	@# directory that holds only a link to e2e/kvgate_e2e.
	@set -e; site=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  mkdir -p $(VENV)/e2e-harness; ln -sfn $(CURDIR)/e2e/kvgate_e2e $(VENV)/e2e-harness/kvgate_e2e; \
	  echo $(CURDIR)/$(VENV)/e2e-harness > $$site/kvgate-e2e-harness.pth
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy's cache lives outside the clone, so a fresh clone checks in ~2 s instead of 45 s: mypy
# re-reads a module whose mtime differs and rechecks it when its content hash differs.
typecheck: $(STAMP)
	$(BIN)/mypy --cache-dir $(KVGATE_CACHE)/mypy -p kvgate -p kvgate_engine -p kvgate_e2e

# Two workers (pytest-xdist): 1 min 45 s against 2 min 11 s in one process on the 2-core machine;
# fixed at 2, not auto, so a many-core machine does not start dozens of engine-starting workers.
unit: $(STAMP)
	$(BIN)/pytest -q -n 2 -m "not conformance and not image" tests

# kvgate's engine argv parsed by each supported SGLang release's own parser, in a separate
# environment (SGLang installed with --no-deps into a cache; never into .venv). What each release
# answers is cached by everything it depends on (tests/factories/release_answers.py; the
# comparisons with kvgate's tables run every time): 10 s warm, 2 min 11 s with an empty answers
# cache (each answer computed by one worker, the other waits for it);
# KVGATE_CONFORMANCE_NO_CACHE=1 asks the releases afresh.
conformance: $(STAMP)
	$(BIN)/pytest -q -n 2 -m conformance tests/conformance

# The e2e world: iproute2 + iptables (Debian), Kubernetes v1.37.2 and helm built from Go modules
# (cached by content hash; the first build takes ~13 min on 2 cores) and the LeaderWorkerSet
# v0.9.0 controller for the multi-node scenarios (86 s after that build, which warms the Go build
# cache it shares; then cached), run as root in a private network namespace.
e2e-deps: $(STAMP)
	@test "$$(id -u)" = 0 || { echo "the e2e tier needs root (it creates a network namespace)"; exit 1; }
	@command -v ip >/dev/null && command -v iptables >/dev/null || { \
	  echo "installing iproute2 and iptables from Debian"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 iptables; }
	e2e/controlplane/gen-replaces.py --check
	e2e/controlplane/build.sh
	e2e/controlplane/build-lws.sh

# LeaderWorkerSet v0.9.0 alone (part of e2e-deps): built from the Go module proxy into a cache
# outside the clone (see e2e/controlplane/build-lws.sh).
lws:
	e2e/controlplane/build-lws.sh

# The released SGLang on CPU for the real-engine scenarios: one environment per release
# outside .venv, ${KVGATE_CACHE:-~/.cache/kvgate}/sglang-cpu/<version> (see e2e/sglang-cpu/install.sh;
# the first install downloads ~1.7 GB and takes ~11 min on a loaded 2-core machine, then it is cached).
# 0.5.23 is the release the real-engine scenarios run; 0.5.19 the pre-fix one the real incident
# runs (test_scenario_real_incident.py; 6.5 min and 4.4 GB more). One target per release, so
# `make -j` (make deps) installs them side by side (each into its own directory; a cached one
# takes a second).
REAL_ENGINE_VERSIONS ?= 0.5.23 0.5.19
real-engine-deps: $(addprefix real-engine-,$(REAL_ENGINE_VERSIONS))

real-engine-%: $(STAMP)
	@command -v gcc >/dev/null || { \
	  echo "installing gcc from Debian (it builds the libcuda.so.1 stand-in)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc; }
	SGLANG_CPU_VERSIONS="$*" e2e/sglang-cpu/install.sh

# KVGATE_REQUIRE_E2E=1: a missing control-plane build fails the tier instead of skipping it.
# It includes the real-SGLang scenarios (marker real_engine: the released SGLang 0.5.23 on CPU,
# and 0.5.19 for the real incident);
# `make e2e-real` runs only those.
# One world, or two side by side (E2E_WORLDS=2; e2e/kvgate_e2e/tier.py). The SHARED world:
# E2E_WORKERS pytest-xdist workers attached to one world (KVGATE_E2E_SHARED_WORLD=1, see
# e2e/kvgate_e2e/shared_world.py and e2e/tests/conftest.py): the controller process starts the
# world while the workers collect, a file stays on one worker, and the tests of up to E2E_WORKERS
# files run at once; a test that changes what the others see (stops the operator or the API
# server, upgrades the release, switches LeaderWorkerSet on: conftest.ALONE and the lws fixture)
# waits for the running ones and runs alone. --no-loadscope-reorder keeps conftest's order (the
# files with a lone test first, longest first). With one world (the default) every file runs
# there (E2E_WORKERS=1: one at a time). With two, the SECOND world runs the files with lone tests
# (tier.SECOND_WORLD) one test at a time in a session of its own, printed at the end.
# Repeated scenarios run each case once here (KVGATE_E2E_OPERATOR_DOWN_ROUNDS=2: one shrunk
# prefill and one shrunk decode engine; KVGATE_E2E_CANARY_ROUNDS=1; the chaos default of one
# lifecycle, 4 leader kills); `make chaos` runs the long loops.
# --durations: the 30 slowest steps in the log; the summary's "MEASURED seconds per file" table
# gives each file's seconds, the time it waited for its turn and its wall span.
# E2E_TESTS: the files (or directories) to run, e.g. E2E_TESTS="e2e/tests/test_chaos.py".
E2E_WORKERS ?= 3
E2E_TESTS ?= e2e/tests
# E2E_WORLDS=2: the second world beside the shared one. Not the default: on the 2-core machine
# the two ran at 172 % CPU and the extra concurrency failed load-bound steps (smg's circuit
# breaker opening on a slow prefill engine, a 100-object kubectl apply past 120 s); see
# docs/benchmarks.md.
E2E_WORLDS ?= 1
E2E_PYTEST = KVGATE_REQUIRE_E2E=1 KVGATE_E2E_SHARED_WORLD=1 KVGATE_E2E_OPERATOR_DOWN_ROUNDS=2 \
	  KVGATE_E2E_CANARY_ROUNDS=1 $(BIN)/python -m kvgate_e2e.tier --workers $(E2E_WORKERS) \
	  $(if $(filter 1,$(E2E_WORLDS)),--one-world) --second-log $(VENV)/e2e-second-world.log \
	  $(E2E_TESTS)
e2e: e2e-deps real-engine-deps prometheus prometheus-adapter real-node-runtime
	$(E2E_PYTEST)

# The e2e tier (or E2E_TESTS) with CPU burners beside it that make a fixed CPU-bound loop
# LOAD_FACTOR times slower (kvgate_e2e/cpu_load.py: it prints the loop's seconds alone and loaded,
# samples it during the run, and stops the burners when the run ends, fails or is interrupted):
# every bound in the tier must hold on a machine at half speed.
LOAD_FACTOR ?= 2
test-loaded: e2e-deps real-engine-deps prometheus prometheus-adapter real-node-runtime
	$(BIN)/python -m kvgate_e2e.cpu_load --factor $(LOAD_FACTOR) -- \
	  env $(E2E_PYTEST)

e2e-real: e2e-deps real-engine-deps
	KVGATE_REQUIRE_E2E=1 $(BIN)/pytest -q -s -m real_engine e2e/tests

# The conformance tier's SGLang releases (tests/conformance/setup_env.sh, cached; the tier's
# fixture runs it too, a no-op by then).
conformance-deps: $(STAMP)
	tests/conformance/setup_env.sh

# The chaos loops at full length: 20 leader kills (5 lifecycles of create, update, refused
# update, delete), 20 operator-down rounds and 3 KV-canary rounds; `make test` runs 4, 2 and 1.
chaos: e2e-deps
	KVGATE_REQUIRE_E2E=1 KVGATE_E2E_CHAOS_ROUNDS=5 KVGATE_E2E_OPERATOR_DOWN_ROUNDS=20 \
	  KVGATE_E2E_CANARY_ROUNDS=3 $(BIN)/pytest -q -s e2e/tests/test_chaos.py \
	  e2e/tests/test_scenario_operator_down.py e2e/tests/test_scenario_kv_canary.py

# The scale benchmark (not part of `make test`: it takes the machine for minutes).
# `make bench-scale SCALE_ARGS="--mds 1000 --engines 8"`; see e2e/bench/scale.py.
bench-scale: e2e-deps
	$(BIN)/python e2e/bench/scale.py $(SCALE_ARGS)

# The fairness benchmark (not part of `make test`): 200 never-Ready ModelDeployments in one
# namespace against another's rollback and scale request; see e2e/bench/fairness.py.
bench-fairness: e2e-deps
	$(BIN)/python e2e/bench/fairness.py $(FAIRNESS_ARGS)

# Pictures of the chart's Grafana dashboards with real data, docs/images/dashboard-*.png (not part
# of `make test`; its own world and Prometheus, ~4 min). No Grafana here:
# e2e/bench/render_dashboards.py draws every panel's query_range with matplotlib (the optional
# `plot` extra, installed here). `make dashboard-images DASHBOARD_ARGS="--phase-seconds 120"`.
dashboard-images: e2e-deps prometheus
	$(UV) pip install --quiet --python $(BIN)/python -c $(RUNTIME_LOCK) -e '.[operator,plot]'
	$(BIN)/python e2e/bench/render_dashboards.py $(DASHBOARD_ARGS)

# Everything the tiers need, built and installed side by side (on a fresh machine the Go builds
# are CPU-bound while the SGLang installs mostly download): the control plane and helm (the
# chart tests in `unit` run the real helm), promtool (tests/chart/test_chart_promtool.py;
# KVGATE_REQUIRE_PROMTOOL=1 makes its absence a failure), SGLang for CPU, the conformance
# releases. Each is cached; a warm run costs seconds.
# Debian's packages first, alone (two apt-get runs at once fail on apt's lock).
deps: $(STAMP) system-packages
	$(MAKE) -j4 --output-sync=line e2e-deps promtool prometheus prometheus-adapter real-engine-deps conformance-deps image container-runtime cni-plugins kubelet

system-packages:
	@missing=""; \
	for pair in ip:iproute2 iptables:iptables gcc:gcc mmdebstrap:mmdebstrap; do \
	  command -v "$${pair%%:*}" >/dev/null || missing="$$missing $${pair##*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing$$missing from Debian"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# The unit and conformance tiers run beside the e2e tier, niced: at nice 15 they get only the CPU
# the e2e tier leaves (it waits on engines, kubelets and deadlines much of the time),
# so its timing-bound tests see the load they always saw. Their output is kept in $(BESIDE_LOG)
# and printed whole when they end; a failure in either fails `make test` once the e2e tier is
# done too.
BESIDE_LOG := $(VENV)/beside-e2e.log
test: lint typecheck deps
	KVGATE_REQUIRE_PROMTOOL=1 $(MAKE) -j2 e2e beside-e2e

beside-e2e: $(STAMP)
	@echo "unit and conformance tiers beside the e2e tier (nice 15; output at their end)"
	@nice -n 15 $(MAKE) --no-print-directory -k -j1 unit conformance image-test > $(BESIDE_LOG) 2>&1; \
	  rc=$$?; echo "---- unit and conformance tiers (exit $$rc) ----"; cat $(BESIDE_LOG); exit $$rc

# Prometheus' promtool from the Go module proxy, cached outside the clone (minutes on 2 cores
# the first time, nothing after): the chart's alert rules are checked and unit-tested with it.
promtool:
	tests/chart/promtool/build.sh

# The Prometheus server for the e2e world (kvgate_e2e/prometheus.py: the chart's monitors and
# alert rules against real metrics), from the same module and version as promtool, cached outside
# the clone: 195 s cold on the loaded 2-core machine with the modules already in GOMODCACHE
# (promtool's), nothing after.
prometheus:
	e2e/prometheus/build.sh

# prometheus-adapter v0.12.0 for the e2e world (kvgate_e2e/prometheus_adapter.py: custom metrics
# from the world's Prometheus, behind the API server's aggregation layer, for the real HPA
# controller), built with its own go.mod from the Go module proxy, cached outside the clone:
# 213 s with an empty Go build cache on the loaded 2-core machine, 105 s after the other Go
# builds (largest process 1.2 GB resident), nothing after.
prometheus-adapter:
	e2e/prometheus-adapter/build.sh

# The image kvgate ships, built with no daemon and no registry (operator/image/build.py): a
# Debian bookworm root filesystem from debian.lock (mmdebstrap) and /opt/kvgate from
# requirements.lock (uv, offline, hashes required), packed into an OCI archive,
# dist/kvgate-operator-<appVersion>.oci.tar, named $(IMAGE):<appVersion> inside. Two builds of one
# commit give one digest. Cached by the content of its inputs in $(KVGATE_CACHE)/image (the
# Debian packages and wheels too): 76 MiB; 72 s without the archive cache on a quiet machine,
# 8.5 min the first time (downloads) beside `make deps`, 0.1 s
# with the inputs unchanged. Needs root. Push it with skopeo or load it with docker/podman
# (docs/quickstart.md step 2). operator/Dockerfile builds the same image with BuildKit.
IMAGE ?= ghcr.io/kvgate/kvgate-operator
image: $(UV) system-packages
	$(PY) operator/image/build.py --uv $(UV) --image $(IMAGE)

# Refresh the image's three lock files to today's Debian and PyPI (review the diff, commit it).
image-lock: $(UV) system-packages
	$(PY) operator/image/build.py lock --uv $(UV)

# containerd and runc from Debian's packages, unpacked into the cache (never installed: on a
# machine with systemd, installing the package would start containerd as a system service). The
# image tests start this containerd themselves, with their own root, state and socket.
CONTAINER_RUNTIME := $(KVGATE_CACHE)/container-runtime
container-runtime:
	@test -x $(CONTAINER_RUNTIME)/bin/containerd -a -x $(CONTAINER_RUNTIME)/bin/runc || { set -e; \
	  tmp=$$(mktemp -d); cd $$tmp; \
	  apt-get download containerd runc >/dev/null 2>&1 || { apt-get update -qq && apt-get download containerd runc; }; \
	  for deb in *.deb; do dpkg-deb -x $$deb root; done; \
	  mkdir -p root/bin && cp -a root/usr/bin/containerd root/usr/bin/containerd-shim-runc-v2 root/usr/bin/ctr root/usr/sbin/runc root/bin/; \
	  ls *.deb > root/bin/VERSIONS; rm -rf $(CONTAINER_RUNTIME); mkdir -p $(KVGATE_CACHE); \
	  mv root $(CONTAINER_RUNTIME); cd /; rm -rf $$tmp; \
	  echo "containerd and runc unpacked into $(CONTAINER_RUNTIME): $$(tr '\n' ' ' < $(CONTAINER_RUNTIME)/bin/VERSIONS)"; }

# The CNI plugins of the e2e world's real nodes (bridge, host-local, portmap, loopback), from
# Debian's containernetworking-plugins 1.1.1, unpacked into the cache like containerd.
CNI_PLUGINS := $(KVGATE_CACHE)/cni-plugins
cni-plugins:
	@test -x $(CNI_PLUGINS)/bin/bridge -a -x $(CNI_PLUGINS)/bin/host-local || { set -e; \
	  tmp=$$(mktemp -d); cd $$tmp; \
	  apt-get download containernetworking-plugins >/dev/null 2>&1 || { apt-get update -qq && apt-get download containernetworking-plugins; }; \
	  dpkg-deb -x containernetworking-plugins_*.deb root; mkdir -p root/bin; \
	  for p in bridge host-local portmap loopback; do cp -a root/usr/lib/cni/$$p root/bin/; done; \
	  ls *.deb > root/bin/VERSIONS; rm -rf $(CNI_PLUGINS); mkdir -p $(KVGATE_CACHE); \
	  mv root $(CNI_PLUGINS); cd /; rm -rf $$tmp; \
	  echo "CNI plugins unpacked into $(CNI_PLUGINS): $$(cat $(CNI_PLUGINS)/bin/VERSIONS)"; }

# Everything a real node of the e2e world needs: its kubelet, containerd and runc, the CNI
# plugins (real-node-runtime) and the shipped image (e2e/kvgate_e2e/realnode/). `make e2e` takes
# only the runtime: `make test` built the image in `deps`, and the image tier beside the e2e tier
# copies the archive into dist/ again.
real-node-runtime: kubelet container-runtime cni-plugins
real-node-deps: real-node-runtime image

# The real nodes' kubelet, from the control plane's Kubernetes modules (cached by content).
kubelet: e2e-deps
	e2e/controlplane/build-kubelet.sh

# The real-node scenarios (e2e/tests/test_real_node.py).
e2e-real-node: real-node-deps
	KVGATE_REQUIRE_E2E=1 $(BIN)/pytest -q -s -m e2e e2e/tests/test_real_node.py

# The image built again (one digest) and run in real containers by that containerd and runc
# (tests/image).
image-test: image container-runtime
	KVGATE_REQUIRE_IMAGE=1 KVGATE_CONTAINER_RUNTIME=$(CONTAINER_RUNTIME)/bin \
	  $(BIN)/pytest -q -s -m image tests/image

crds: $(STAMP)
	$(BIN)/kvgate crd > crds/modeldeployment.yaml
	$(BIN)/kvgate crd --kind RoleScale > crds/rolescale.yaml
	$(BIN)/python -m kvgate.gen.chartgen
	$(BIN)/python -m kvgate.gen.rbacgen

# `make demo DEMO_ARGS=--once` exits after the summary instead of running until Ctrl-C. The
# demo's third deployment runs on the released SGLang on CPU (real-engine-deps, cached);
# DEMO_ARGS=--reference-only skips it.
demo: e2e-deps real-engine-deps
	$(BIN)/python -m kvgate_e2e.demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache  # the caches in $(KVGATE_CACHE) stay
