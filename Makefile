# Two commands do all the set-up:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.heedful-installed
CORE   := $(VENV)/.heedful-core

.PHONY: demo test test-all lint method family bench bench-decomposition bench-ferret bench-generation bench-scale clean-venv

# heedful and torch alone: all `make demo` needs (the extras below are for tests, serving, benchmarks).
PIN    := -c constraints.txt
CORE_PACKAGES := torch==2.13.0 -e .

# uv (from PyPI) installs torch and the rest in seconds where pip takes minutes
# (benchmarks/results/first_heatmap.md): the uv on the PATH, else one pip installs into the venv;
# pip alone where uv cannot be had or fails, or with INSTALLER=pip. uv reads pip's find-links (a
# folder of local wheels, such as a CPU torch) from UV_FIND_LINKS, filled in from
# PIP_FIND_LINKS or pip's configuration when unset.
INSTALLER ?= uv
$(CORE): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	@uv=; if [ "$(INSTALLER)" = uv ]; then uv=$$(command -v uv || true); \
	if [ -z "$$uv" ] && $(BIN)/python -m pip install --quiet uv >/dev/null 2>&1; then uv=$(BIN)/uv; fi; fi; \
	links=$${UV_FIND_LINKS:-$${PIP_FIND_LINKS:-$$($(BIN)/python -m pip config get global.find-links 2>/dev/null || true)}}; \
	if [ -n "$$uv" ] && env $${links:+UV_FIND_LINKS="$$links"} "$$uv" pip install --quiet --python $(BIN)/python $(PIN) $(CORE_PACKAGES); then \
		echo "installed with uv ($$uv)"; \
	else \
		echo "installing with pip$${uv:+ (uv failed)}"; \
		$(BIN)/python -m pip install --quiet $(PIN) $(CORE_PACKAGES); \
	fi
	touch $(CORE)

$(STAMP): $(CORE)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(PIN) -e ".[test,serve]"
	# lxt (AttnLRP's reference, tests/test_relevance_rules.py) without its requirements:
	# bitsandbytes / open_clip_torch / torchvision would replace the pinned torch
	$(BIN)/python -m pip install --quiet --no-deps lxt==2.1
	# steering-vectors (contrastive activation addition's oracle, tests/test_inside_steering.py)
	# without its requirements: it declares transformers<5, yet runs on transformers 5 as tested
	$(BIN)/python -m pip install --quiet --no-deps steering-vectors==0.12.2
	touch $(STAMP)

demo: $(CORE)  ## set up heedful alone, assemble the default model on first use (seconds), explain a sentence
	$(BIN)/heedful explain "a charming and often affecting journey" --method normxlogit --method integrated_gradients --method leave_one_out

# The suite runs in test processes side by side (pytest-xdist), one per core up to 2 (CI has 2
# cores); each test process keeps its own temporary HEEDFUL_HOME (tests/conftest.py).
XDIST := --numprocesses auto --maxprocesses 2

test: $(STAMP)  ## set up and run the default test suite
	$(BIN)/python -m pytest -q $(XDIST)

test-all: $(STAMP)  ## every suite, slow ones included
	$(BIN)/python -m pytest -q $(XDIST) -m "slow or not slow"

lint: $(STAMP)
	$(BIN)/ruff check heedful tests benchmarks
	$(BIN)/lint-imports

method: $(STAMP)  ## after adding or changing method NAME: its golden outputs, the catalog, the README table, then its checks
	@test -n "$(NAME)" || { echo "usage: make method NAME=<method>" >&2; exit 2; }
	$(BIN)/python tests/regenerate_method_outputs.py --only $(NAME)
	$(BIN)/python tests/test_method_keys.py
	$(BIN)/python -m heedful.catalog
	$(BIN)/heedful methods --markdown --write README.md
	$(BIN)/python -m pytest -q tests/test_extension_steps.py tests/test_conformance.py tests/test_oracles.py -k "steps or $(NAME)"

family: $(STAMP)  ## after adding model family TYPE (its model_type): docs/models.md, then check_family on its tiny model
	@test -n "$(TYPE)" || { echo "usage: make family TYPE=<model_type>" >&2; exit 2; }
	$(BIN)/heedful models --families --markdown > docs/models.md.part && mv docs/models.md.part docs/models.md
	$(BIN)/python -m pytest -q tests/test_extension_steps.py tests/test_families.py -k "steps or $(TYPE)"

bench: $(STAMP)
	$(BIN)/python benchmarks/core_methods.py

bench-decomposition: $(STAMP)  ## DecompX, ALTI, GlobEnc, Value Zeroing vs a forward pass and the reference formulas
	$(BIN)/python benchmarks/decomposition.py

bench-ferret: $(STAMP)  ## AOPC under the ferret protocol, heedful vs ferret on the same explanations
	$(BIN)/python -m pip install --quiet $(PIN) -e ".[bench]"
	$(BIN)/python -m pip install --quiet --no-deps ferret-xai==0.4.2
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python benchmarks/ferret_aopc.py

bench-generation: $(STAMP)  ## generation attribution, heedful vs Inseq and Captum on the same generations
	$(BIN)/python -m pip install --quiet $(PIN) -e ".[bench]"
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python benchmarks/generation.py

bench-scale: $(STAMP)  ## heedful bench: local engine vs Ray with 1 and 2 workers, and the projection for N machines
	$(BIN)/python -m pip install --quiet $(PIN) -e ".[ray]"
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python benchmarks/scale.py

clean-venv:
	rm -rf $(VENV)
