# Every target bootstraps .venv itself, idempotently. torch is installed first and pinned
# (TORCH_SPEC=... overrides), so that nothing else pulls an unpinned torch with CUDA packages.
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev,bench,finance,mujoco,envpool,jax,ray,marl,render,export,wandb,tune,atari,playground,docs
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(subst =,-,$(subst $(comma),_,$(TORCH_SPEC)))-$(subst $(comma),_,$(EXTRAS))
comma := ,
export TORCH_SPEC  # tests/test_wheel.py installs the same torch into a fresh virtualenv

.PHONY: venv demo test test-all bench lint docs clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	# gymnax declares gymnasium<1.4 but runs on 1.4 (see pyproject.toml): installed without its pins.
	case ",$(EXTRAS)," in *,jax,*) $(BIN)/python -m pip install --quiet --no-deps "gymnax>=1.0,<2" ;; esac
	rm -f $(VENV)/.installed-*
	touch $@

demo: venv
	$(BIN)/phalanx train ppo CartPole-v1 --num-envs 1024 --stop-return 475

# The suite's test files shared out over TEST_WORKERS processes (pytest-xdist), each file in one.
TEST_WORKERS ?= 2
test: venv
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-all: venv
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m ""

bench: venv
	$(BIN)/python benchmarks/run_all.py

lint: venv
	$(BIN)/ruff check src tests benchmarks examples docs/site_hooks.py
	$(BIN)/ruff format --check src tests benchmarks examples docs/site_hooks.py
	$(BIN)/mypy
	$(BIN)/python -m pytest -q tests/test_layers.py

# The documentation site (mkdocs.yml) in site/: strict, so a warning, a broken link or reference fails.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .mypy_cache
