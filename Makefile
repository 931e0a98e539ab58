# The two commands of the README:
#   make repro   set up, then reproduce the seed race (CUDA if present, else the simulator)
#   make test    set up, then run the test suite (pytest -n auto)
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
XGRAMMAR ?= xgrammar==0.2.9

.PHONY: setup upstream upstream-releases repro test matrix bench litmus upstream-gate releases releases-ci release-gate release-gate-ci lock clean example-reports check-reports vllm-gate vllm-release-tests

setup: $(VENV)/.specrace-ready

# A machine that already has torch (a CUDA box) reuses it through system site-packages;
# otherwise the pinned CPU build goes in first, so nothing pulls a multi-GB CUDA wheel.
$(VENV)/.specrace-ready: pyproject.toml requirements.txt requirements.lock
	@if python3 -c "import torch" 2>/dev/null; then \
	    echo "setup: reusing the installed torch"; python3 -m venv --system-site-packages $(VENV); \
	else python3 -m venv $(VENV) && $(PY) -m pip install -q "$(TORCH)"; fi
	$(PY) -m pip install -q --no-deps "$(XGRAMMAR)"
	$(PY) -m pip install -q -r requirements.txt -c requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@touch $@

# The sglang target (README "Verifying installed sglang"): the released wheel and the
# pure-Python packages its driven modules import, --no-deps (sglang's own metadata pins
# torch 2.14.1 and CUDA-only wheels, which the code under test never needs).
# `make upstream SGLANG=0.5.17`: that release in an environment of its own, with its own
# pins (.releases/sglang/0.5.17; targets/envs.py). `make releases` runs the release gate
# on every release set up. A release reaches the shell only as the quoted value of its
# variable ("$$SGLANG": make exports command-line variables), never as recipe text, and
# targets.envs refuses anything but a version in the supported range.
ifdef SGLANG
upstream: setup
	$(PY) -m targets.envs sglang setup "$$SGLANG"
else ifdef VLLM
# `make upstream TARGET=vllm VLLM=0.17.0`: a vLLM release in an environment of its own
# (.releases/vllm/0.17.0: the wheel's Python files only; docs/vllm-target.md)
upstream: setup
	$(PY) -m targets.envs vllm setup "$$VLLM"
else
upstream: $(VENV)/.specrace-upstream
endif

$(VENV)/.specrace-upstream: $(VENV)/.specrace-ready requirements-upstream.txt
	$(PY) -m pip install -q --no-deps -r requirements-upstream.txt
	@touch $@

repro: setup
	$(VENV)/bin/specrace repro ngram-filter-race --variant pre-fix --war-barrier fine --expect race

test: setup
	$(PY) -m pytest -n auto -q

matrix: setup
	$(VENV)/bin/specrace matrix --backend sim

# The upstream gate: the seed race on installed sglang (pre-fix reproduced, released code
# clean) and the upstream mutation matrix.
upstream-gate: upstream
	$(VENV)/bin/specrace repro ngram-filter-race --target sglang --variant pre-fix --war-barrier fine --expect race --no-report
	$(VENV)/bin/specrace repro ngram-filter-race --target sglang --variant fixed --expect clean --no-report
	$(VENV)/bin/specrace repro dspark-confidence-ring --target sglang --trials 5 --expect race --no-report
	$(VENV)/bin/specrace repro dspark-confidence-ring --target sglang --variant fixed --trials 5 --expect clean --no-report
	$(VENV)/bin/specrace repro dspark-result-readback --target sglang --trials 5 --expect race --no-report
	$(VENV)/bin/specrace repro dspark-result-readback --target sglang --variant fixed --trials 5 --expect clean --no-report
	$(VENV)/bin/specrace repro eagle-v2 --target sglang --variant plan-stream --trials 3 --expect clean --no-report
	$(VENV)/bin/specrace matrix --target sglang

# The vLLM gate (docs/vllm-target.md), in vLLM 0.17.0's own environment: the seq-lens race
# as shipped and gone with its fix (hybrid and dense), #36013's pair ordered as shipped and
# racing without the valid-count wait, the input-prep fence, MRv2's draft-token copy as
# shipped and with 0.27.1's record_stream (the slice, then Model Runner V2 driven whole,
# clean as shipped without structured outputs), the mutation matrix, and the
# state machine on vLLM's loop (the race found from scratch; nothing with the fix).
# The release reaches the shell as the quoted variable, never as recipe text (as above).
VLLM_GATE ?= 0.17.0
export VLLM_GATE
VPY = ".releases/vllm/$$VLLM_GATE/bin/python" -m specrace.cli
vllm-gate: setup
	test -e ".releases/vllm/$$VLLM_GATE/.specrace-ready" -a ".releases/vllm/$$VLLM_GATE/.specrace-ready" -nt requirements-vllm.txt || $(PY) -m targets.envs vllm setup "$$VLLM_GATE"
	$(VPY) repro vllm-seq-lens-shadow --target vllm --trials 2 --expect race --no-report
	$(VPY) repro vllm-seq-lens-shadow --target vllm --variant fixed --trials 2 --expect clean --no-report
	$(VPY) repro vllm-seq-lens-shadow --target vllm --variant dense --trials 2 --expect race --no-report
	$(VPY) repro vllm-accepted-count --target vllm --trials 2 --expect clean --no-report
	$(VPY) repro vllm-accepted-count --target vllm --variant no-valid-count-wait --trials 2 --expect race --no-report
	$(VPY) repro vllm-input-prep --target vllm --trials 2 --expect clean --no-report
	$(VPY) repro vllm-draft-tokens --target vllm --trials 2 --expect race --no-report
	$(VPY) repro vllm-draft-tokens --target vllm --variant fixed --trials 2 --expect clean --no-report
	$(VPY) repro vllm-mrv2 --target vllm --trials 2 --expect clean --no-report
	$(VPY) repro vllm-mrv2-draft-tokens --target vllm --trials 2 --expect race --no-report
	$(VPY) repro vllm-mrv2-draft-tokens --target vllm --variant fixed --trials 2 --expect clean --no-report
	$(VPY) repro vllm-seq-lens-shadow --target vllm --variant sync --trials 2 --expect race --no-report
	$(VPY) repro vllm-seq-lens-shadow --target vllm --variant sync-seq-lens-fixed --trials 2 --expect clean --no-report
	$(VPY) repro vllm-v1-draft-copy --target vllm --trials 2 --expect race --no-report
	$(VPY) repro vllm-v1-draft-copy --target vllm --variant fixed-seq-lens --trials 2 --expect clean --no-report
	$(VPY) matrix --target vllm --backend sim
	".releases/vllm/$$VLLM_GATE/bin/python" -m pytest -q -n 2 -p no:cacheprovider tests/targets/vllm_v1/test_machine.py tests/targets/vllm_v1/test_mrv2_releases.py tests/targets/vllm_v1/test_mrv2_evs.py

# Model Runner V2's release tests -- the driven path, the 0.34.0 audit's S1 and S2 -- in
# every vLLM release environment set up here (`make upstream TARGET=vllm VLLM=V`); each
# test skips what its release lacks (S2's EVS path ships from 0.27.1).
# `make vllm-release-tests VLLM="0.34.0 0.27.1"`: those environments only (CI: the gate's
# 0.17.0 runs them in vllm-gate).
vllm-release-tests: setup
	for py in $$(if [ -n "$$VLLM" ]; then printf '.releases/vllm/%s/bin/python\n' $$VLLM; else echo .releases/vllm/*/bin/python; fi); do echo "== $$py"; "$$py" -m pytest -q -p no:cacheprovider tests/targets/vllm_v1/test_mrv2_releases.py tests/targets/vllm_v1/test_mrv2_evs.py || exit 1; done

# The release gate, on every release from the first with the NGRAM relay slice to the
# newest (`make upstream-releases` sets them all up; CI does): each as shipped (its own
# fence) is clean; the seed race is found in the pre-#35198 relay that 0.5.14-0.5.17
# shipped once the fine fence engages (their NGRAM forward published no read-done event);
# the fixed relay is clean with it; DSpark's readback race where the release has the
# slice's code; EAGLE v2 clean where it has it. Fewer releases set up here: name them,
# e.g. `make releases PREFIX_RELAY=0.5.17 FIXED_RELAY="0.5.18 0.5.23"`.
PREFIX_RELAY ?= 0.5.14 0.5.15 0.5.16 0.5.17
FIXED_RELAY  ?= 0.5.18 0.5.19 0.5.20 0.5.21 0.5.22 0.5.23
# trials a cell (five a cell took 17 minutes of the 2-core box, two 9; CI runs the rows no
# test covers, releases-ci, one trial each: a race shows in the first trial of each cell)
RELEASE_TRIALS ?= 5
# The lists reach the shell as variables too (word-split, never evaluated): each is
# "--release V" per word, which specrace checks against the version grammar.
export PREFIX_RELAY FIXED_RELAY RELEASE_TRIALS
each = $$(for v in $(1); do printf -- '--release %s ' "$$v"; done)

# The release variables hold text, never make syntax: make expands a variable's value
# again wherever it is referenced -- exporting it to a recipe's environment included -- so
# `SGLANG='$$(shell ...)'` would run that command in make itself. Each one given is
# re-bound here to its value as written ($$(value ...), into a simply-expanded variable:
# never expanded again), then exported: the shell sees the text as a quoted variable.
RELEASE_VARS := SGLANG VLLM VLLM_GATE PREFIX_RELAY FIXED_RELAY RELEASE_TRIALS
$(foreach v,$(RELEASE_VARS),$(if $(filter-out undefined,$(origin $(v))),\
    $(eval override $(v) := $$(value $(v)))$(eval export $(v))))

upstream-releases: setup
	for v in $$PREFIX_RELAY $$FIXED_RELAY; do $(PY) -m targets.envs sglang setup "$$v" || exit 1; done

releases: setup
	$(VENV)/bin/specrace releases ngram-filter-race $(call each,$$PREFIX_RELAY $$FIXED_RELAY) --trials "$$RELEASE_TRIALS" --expect clean
	$(VENV)/bin/specrace releases ngram-filter-race --war-barrier fine $(call each,$$PREFIX_RELAY) --trials "$$RELEASE_TRIALS" --expect race
	$(VENV)/bin/specrace releases ngram-filter-race --war-barrier fine $(call each,$$FIXED_RELAY) --trials "$$RELEASE_TRIALS" --expect clean
	$(VENV)/bin/specrace releases dspark-result-readback --variant as-installed $(call each,$$PREFIX_RELAY $$FIXED_RELAY) --trials "$$RELEASE_TRIALS" --expect race
	$(VENV)/bin/specrace releases eagle-v2 --variant as-installed $(call each,$$PREFIX_RELAY $$FIXED_RELAY) --trials "$$RELEASE_TRIALS" --expect clean

# CI's rows of the sweep: those no per-release test of `make test` runs (.ci/run; the
# others: test_sglang_model_runner_releases.py -- the released relay clean and the pre-fix
# relay racing on 0.5.16-0.5.22 --, test_sglang_dspark_releases.py -- DSpark on 0.5.16,
# 0.5.18, 0.5.19 --, test_sglang_eagle_releases.py -- EAGLE v2 on 0.5.15-0.5.22 -- and
# release-gate-ci's DSpark cells on 0.5.20 and 0.5.21). One trial a row: a race shows in
# the first.
releases-ci: setup
	$(VENV)/bin/specrace releases ngram-filter-race --release 0.5.14 --release 0.5.15 --trials 1 --expect clean
	$(VENV)/bin/specrace releases ngram-filter-race --war-barrier fine --release 0.5.14 --release 0.5.15 --trials 1 --expect race
	$(VENV)/bin/specrace releases dspark-result-readback --variant as-installed --release 0.5.17 --release 0.5.22 --trials 1 --expect race

# The release gate (issue 57; specrace/gate.py): every scenario of the sglang target on
# every release set up, in every configuration the release ships (no patch), one trial a
# cell under coverage.py -- its table is reports/upstream/release-gate.md. Hours on the
# 2-core box: CI runs release-gate-ci, one cell per scenario and at least one per release,
# as installed, two at a time, without coverage.py (it doubles a cell's time; the census
# coverage check is make test's, tests/targets/test_coverage.py). `python -m specrace.gate
# --subset --plan` prints the cells.
release-gate: setup
	$(PY) -m specrace.gate --coverage --jobs 2 --markdown reports/upstream/release-gate.md

release-gate-ci: setup
	$(PY) -m specrace.gate --subset --jobs 2

# The report sets committed under reports/: regenerate the simulator ones from their own
# recorded commands (after a change that moves code they point at), and check that every
# one replays with its recorded verdict (CI runs the check).
example-reports: upstream
	$(PY) tools/reports/committed.py regenerate

check-reports: upstream
	$(PY) tools/reports/committed.py check

litmus: setup
	$(VENV)/bin/specrace litmus

bench: setup
	$(VENV)/bin/specrace bench

# Re-pin requirements.lock to this core venv, and each release set up here to its venv
# (targets/{sglang,vllm}/environments/locks/), after .ci/run passes with newer packages.
lock: upstream
	{ sed -n '/^#/p' requirements.lock; $(PY) -m pip freeze --local --exclude-editable \
	    | grep -v -i -E '^(torch|xgrammar|sglang)=='; } > requirements.lock.new
	mv requirements.lock.new requirements.lock
	for v in $$($(PY) -m targets.envs sglang list); do $(PY) -m targets.envs sglang lock "$$v" || exit 1; done
	for v in $$($(PY) -m targets.envs vllm list); do $(PY) -m targets.envs vllm lock "$$v" || exit 1; done

clean:
	rm -rf $(VENV) .hypothesis .releases

# The GPU bundles (docs/gpus.md "Bundles"): what an offline GPU machine needs to run a
# server target, pinned from the locks and xz'd for the device tool's carry (64 MiB a call
# with the tree): `make gpu-bundle-sglang SGLANG=0.5.23` -> .sgbundle/, `make
# gpu-bundle-vllm VLLM=0.17.0` -> .vllmgpu/ (the GPU_* defaults below when not named).
# Each needs the GPU image's Python set in a CPython 3.12 venv (.gpuimage/, from
# tools/gpu/image.txt), which their import check runs under (tests/tools/test_gpu_bundles.py,
# in `make test`; `make gpu-check` runs it alone). The release reaches the shell only as the
# quoted value of its variable, as above; tools/gpu/bundle.py checks it is a version.
GPU_SGLANG ?= 0.5.23
GPU_VLLM   ?= 0.17.0
export GPU_SGLANG GPU_VLLM
.PHONY: gpu-image gpu-bundle-sglang gpu-bundle-vllm gpu-bundles gpu-check

gpu-image: .gpuimage/.ready

.gpuimage/.ready: tools/gpu/image.txt
	$(PY) tools/gpu/bundle.py image

gpu-bundle-sglang: setup gpu-image
	$(PY) tools/gpu/bundle.py sglang "$${SGLANG:-$$GPU_SGLANG}"

gpu-bundle-vllm: setup gpu-image
	$(PY) tools/gpu/bundle.py vllm "$${VLLM:-$$GPU_VLLM}"

gpu-bundles: gpu-bundle-sglang gpu-bundle-vllm

gpu-check: setup
	$(PY) tools/gpu/check_bundle.py .sgbundle --trial
	$(PY) tools/gpu/check_bundle.py .vllmgpu --trial
