"""A Hypothesis state machine over the engine: arrivals, steps, stalls, drains.

Rules are what a server sees and what a fault plan can do: a request arrives (prompt,
budget, optional JSON schema), the scheduler steps, a stream is stalled at a named fault
point, the next step's host order is flipped (process before launch), everything drains. After every rule the oracles are invariants:

* stale values: every accept value and committed result the host sees equals the
  request's *solo* reference (the engine is batch-invariant: a request's tokens and
  accept lengths do not depend on its batch-mates, so each request is checked against a
  synchronous run of it alone, computed when it arrives);
* happens-before: no unordered conflicting access in the trace so far;
* once drained, the outputs (``harness.oracle.outputs``): the solo references' token for
  token, each unconstrained one the target model's greedy continuation, each constrained
  one a sentence of its grammar.

Runs on the simulator (deterministic, so Hypothesis can shrink) and, with
``SPECRACE_BACKEND=cuda``, the printed shrunk program replays on a GPU.
"""
from __future__ import annotations

import contextlib
import os
from typing import Dict

from hypothesis import HealthCheck, Phase
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import targets
from seams import faults
from harness.detect import HBDetector
from harness.trials.drive import grammar_backend
from harness.trials.reference import reference
from harness.policies import parse_policy
from seams.faults.plan import FaultPlan
from harness.runtime import open_runtime, resolve_backend

from harness.oracle.outputs import judge_outputs
from harness.oracle.stale import Reference, StaleValueOracle
from harness.oracle.workload import RequestSpec, Workload
from scenarios.axes import draws
from scenarios.grammar import SCHEMAS
from seams.vocab import Backend

# Settings for running these machines as tests: one bug reported (the shrunk one), not a
# group; no deadline (an example is an engine run plus its reference runs); no explain
# phase, which re-runs the shrunk program once per argument to mark which ones matter --
# minutes for a program whose every run is an engine, and tests read only the program
# and the error.
TEST_SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None,
                     report_multiple_bugs=False,
                     phases=[p for p in Phase if p is not Phase.explain])

POLICIES = ["eager", "lazy", "stall(forward)", "random(1)", "random(2)", "pct(1,3)", "pct(2,2)"]
# Request-pool rows (slot 0 is the padding row): the server's default, which these
# programs never fill, first -- programs shrink to it unless a smaller pool matters --
# then pools of 3, 2 and 1 slots, which every few arrivals wrap around: a finished
# request's slot goes to the next one while its last forward may still be in flight.
POOL_SIZES = [64, 4, 3, 2]
SMALL_POOLS = [4, 3, 2]  # every program wraps around (``SmallPoolEngineMachine``)
# KV slots: the server's default first (programs shrink to it), then pools a request's
# whole lifetime fits (prompt <= 40, budget <= 12, 3 * draft <= 15) but only a few do at
# once -- freed slots go to waiting requests within the program
KV_POOL_SIZES = [4096, 72, 96, 128]
SMALL_KV_POOLS = [72, 96, 128]
KV_LAYOUTS = draws("swa")  # plain slots; slots paired with SWA slots by a mapping
# chunked prefill: off, or a budget that cuts the drawn prompts (up to 12 tokens) and
# the histories of retracted requests into two or more chunks
CHUNK_SIZES = draws("chunked-prefill")
# admission: a request's whole lifetime reserved (programs shrink to it), or its prefill
# alone -- decode then runs the pool short and requests are retracted under that
# pressure (not beside chunked prefill: ServerArgs.validate)
ADMISSIONS = draws("pressure")
MAX_REQUESTS = 12  # arrivals per program: enough to wrap the small pools several times
STALL_POINTS = ["forward.after_read_done", "forward.before_verify", "future_map.before_stash",
                "forward.before_attn_metadata"]


def _start_draws(pools, kv_pools) -> Dict[str, st.SearchStrategy]:
    """What a machine's ``start`` draws: a schedule policy, the draft length, a request
    pool of ``pools`` and a KV pool of ``kv_pools``, the KV layout, the chunked-prefill
    budget, the admission rule."""
    return dict(policy=st.sampled_from(POLICIES), draft=st.integers(2, 5),
                pool=st.sampled_from(pools), kv=st.sampled_from(kv_pools),
                layout=st.sampled_from(KV_LAYOUTS), chunk=st.sampled_from(CHUNK_SIZES),
                admission=st.sampled_from(ADMISSIONS))


class EngineMachine(RuleBasedStateMachine):
    relay = "future_map"
    war_barrier = "fine"
    schemas = ()  # JSON schemas requests may carry
    target = None  # the code under test; None: $SPECRACE_TARGET (pytest --specrace-target)
    # a seeded bug (``mutations.Mutation``) applied around the engine's own work
    # -- building it, stepping, draining -- and never around the solo references
    mutation = None

    def __init__(self) -> None:
        super().__init__()
        self.stack = contextlib.ExitStack()
        self.sched = None

    @initialize(**_start_draws(POOL_SIZES, KV_POOL_SIZES))
    def start(self, policy: str, draft: int, pool: int, kv: int, layout: str = "full",
              chunk: int = 0, admission: str = "lifetime") -> None:
        self.target_name = self.target or os.environ.get("SPECRACE_TARGET", "impl")
        if self.target_name == "vllm":
            # the drawn chunks (3, 7 tokens) are below what vLLM's scheduler takes as a
            # step's budget (at least max_num_seqs, 8, and room for the drafts); vLLM's
            # chunked prefill is driven by its seq-lens scenario at a chunk it accepts
            chunk = 0
        self.tgt = targets.get(self.target_name)
        self.backend = resolve_backend(os.environ.get("SPECRACE_BACKEND", "sim"))
        pol = parse_policy(policy) if self.backend == Backend.SIM else None
        self.rt = self.stack.enter_context(open_runtime(self.backend, pol))
        self.args = self.tgt.server_args(draft_token_num=draft, relay=self.relay,
                                         war_barrier=self.war_barrier, req_pool_size=pool,
                                         kv_pool_size=kv, kv_layout=layout,
                                         chunked_prefill_size=chunk,
                                         admission="lifetime" if chunk else admission)
        self.gb = grammar_backend(self.tgt) if self.schemas else None
        self.stack.enter_context(self.tgt.variant(self.args, self.rt.device))
        with self._engine():
            self.sched = self.tgt.scheduler(self.args, self.rt.device, grammar_backend=self.gb)
        for name, stream in self.sched.streams.items():
            if stream is not None:
                self.rt.label(stream, name)
        self.ref = Reference({}, {})
        self.oracle = StaleValueOracle(self.ref, stop_early=False)
        self.plan = FaultPlan(observer=self.oracle, runtime=self.rt)
        self.stack.enter_context(faults.installed(self.plan))
        self.detector = HBDetector(self.rt.trace)
        self.reqs: Dict[int, object] = {}
        self.specs: Dict[int, RequestSpec] = {}

    @contextlib.contextmanager
    def _engine(self):
        """The engine's own work: the mutation (if any) applied, and a crash of the engine
        turned into a finding (an ``AssertionError``, as the oracles' are), as the
        matrix's crash oracle counts it."""
        patch = self.mutation.applied() if self.mutation is not None \
            else contextlib.nullcontext()
        with patch:
            try:
                yield
            except AssertionError:
                raise
            except Exception as exc:
                raise AssertionError(f"engine crashed: {type(exc).__name__}: {exc}") from exc

    @precondition(lambda self: self.sched is not None and len(self.specs) < MAX_REQUESTS)
    @rule(motif=st.lists(st.integers(1, 93), min_size=1, max_size=4),
          length=st.integers(1, 10), budget=st.integers(1, 12), grammar=st.integers(0, 3),
          retract=st.integers(0, 8))
    def arrive(self, motif, length, budget, grammar, retract=0) -> None:
        """A request; ``retract`` > 0 retracts it once it holds that many tokens
        (``ServerArgs.retract_at``: its solo reference retracts at the same point)."""
        schema = self.schemas[grammar % len(self.schemas)] if self.schemas and grammar else None
        self._add((motif * length)[:max(length, 1)], budget, schema,
                  retract if 0 < retract < budget else 0)

    @precondition(lambda self: self.sched is not None and len(self.specs) < MAX_REQUESTS)
    @rule(motif=st.lists(st.integers(1, 93), min_size=1, max_size=4),
          count=st.integers(2, 6))
    def wave(self, motif, count) -> None:
        """``count`` short requests at once (budgets 1, 2, 1, 2, ...; prompts the motif
        shifted per request). Through a small pool: one finishes at its prefill's result
        and the next at its first verify step -- in the iteration whose prefill refills the
        first one's slot -- and the requests still waiting take each slot as it is
        released, while its finished owner's last forward may be in flight."""
        for i in range(min(count, MAX_REQUESTS - len(self.specs))):
            self._add([(t + 7 * i - 1) % 93 + 1 for t in motif * 3], 1 + i % 2, None)

    def _add(self, prompt, budget: int, schema, retract: int = 0) -> None:
        rid = len(self.specs)
        if retract:  # the engine holds these args: the entry reaches it, as the reference
            self.args.retract_at = self.args.retract_at + ((rid, retract),)
        spec = RequestSpec(rid, 0, prompt, budget, schema)
        solo = reference(Workload([spec], self.args.draft_token_num), self.args, self.backend,
                         self.tgt)
        self.ref.results.update(solo.results)
        self.ref.outputs.update(solo.outputs)
        self.specs[rid] = spec
        g = self.gb.grammar_for_json_schema(schema) if schema else None
        self.reqs[rid] = self.tgt.request(rid, spec.prompt, budget, g)
        self.sched.add_request(self.reqs[rid])

    @precondition(lambda self: self.sched is not None)
    @rule()
    def step(self) -> None:
        if self.sched.has_work():
            with self._engine():
                self.sched.step()

    @precondition(lambda self: self.sched is not None)
    @rule(point=st.sampled_from(STALL_POINTS))
    def stall(self, point: str) -> None:
        self.plan.stall_next(point)

    @precondition(lambda self: self.sched is not None)
    @rule()
    def reorder(self) -> None:
        """Host-step reorder: the next decode step processes the previous result before it
        launches (so finishes are found, and filter/merge run, on the other side of the
        in-flight forward's stash and the next resolve)."""
        self.plan.answer_next("schedule.disable_overlap", True)

    @precondition(lambda self: self.sched is not None)
    @rule()
    def drain(self) -> None:
        with self._engine():
            self.sched.run_to_completion()
            self.rt.synchronize()
        outputs = {rid: r.output() for rid, r in self.reqs.items()}
        judge_outputs(Workload(list(self.specs.values())), outputs, self.oracle,
                      lambda: self.gb)

    @invariant()
    def no_stale_value(self) -> None:
        if self.sched is not None:
            assert self.oracle.first is None, self.oracle.first.message

    @invariant()
    def no_race(self) -> None:
        if self.sched is not None:
            races = self.detector.update()
            assert not races, races[0].summary()

    def teardown(self) -> None:
        try:
            if self.sched is not None:
                with self._engine():
                    self.sched.close()
        finally:
            self.stack.close()


class GrammarEngineMachine(EngineMachine):
    """Requests may carry the grammar scenarios' JSON schemas (``arrive``'s ``grammar``)."""
    schemas = tuple(SCHEMAS)


class SmallPoolEngineMachine(EngineMachine):
    """Every program runs through a pool of 1-3 rows and a KV pool a few requests fill:
    rows and slots are reused in each."""

    @initialize(**_start_draws(SMALL_POOLS, SMALL_KV_POOLS))
    def start(self, policy: str, draft: int, pool: int, kv: int, layout: str = "full",
              chunk: int = 0, admission: str = "lifetime") -> None:
        super().start(policy, draft, pool, kv, layout, chunk, admission)


class PrefixEngineMachine(EngineMachine):
    """The pre-#35198 relay under the fine fence: the machine should find the seed race.
    The KV pools play no part in it: the server's default pool, full layout (two fewer
    arguments to draw and to shrink)."""
    relay = "spec_info"

    @initialize(policy=st.sampled_from(POLICIES), draft=st.integers(2, 5),
                pool=st.sampled_from(POOL_SIZES))
    def start(self, policy: str, draft: int, pool: int, kv: int = KV_POOL_SIZES[0],
              layout: str = "full") -> None:
        super().start(policy, draft, pool, kv, layout)
