# The two commands of the README:
#   make repro   set up, then reproduce the seed race (CUDA if present, else the simulator)
#   make test    set up, then run the test suite (pytest -n auto)
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
XGRAMMAR ?= xgrammar==0.2.9

.PHONY: setup repro test matrix bench litmus clean

setup: $(VENV)/.specrace-ready

# A machine that already has torch (a CUDA box) reuses it through system site-packages;
# otherwise the pinned CPU build goes in first, so nothing pulls a multi-GB CUDA wheel.
$(VENV)/.specrace-ready: pyproject.toml requirements.txt
	@if python3 -c "import torch" 2>/dev/null; then \
	    echo "setup: reusing the installed torch"; python3 -m venv --system-site-packages $(VENV); \
	else python3 -m venv $(VENV) && $(PY) -m pip install -q "$(TORCH)"; fi
	$(PY) -m pip install -q --no-deps "$(XGRAMMAR)"
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@touch $@

repro: setup
	$(VENV)/bin/specrace repro ngram-filter-race --variant pre-fix --war-barrier fine --expect race

test: setup
	$(PY) -m pytest -n auto -q

matrix: setup
	$(VENV)/bin/specrace matrix --backend sim

litmus: setup
	$(VENV)/bin/specrace litmus

bench: setup
	$(VENV)/bin/specrace bench

clean:
	rm -rf $(VENV) .hypothesis
