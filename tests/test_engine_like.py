"""The four engine-shaped things fit the protocols the driver and the API drive them by.

minicb/core/engine_like.py draws ``EngineLike`` (what the API reads of any name it serves)
and its two kinds: ``SteppedEngine`` (``LLMEngine``, a fleet's ``Replica``) and
``RoutingFleet`` (``Fleet``, ``DisaggregatedFleet``). Nothing enforces a Protocol at run
time, so this test does: each class must have every member of its protocol, and each
method a signature that accepts every call the protocol's allows. A member may be set in
``__init__`` (an engine's ``bus``, its ``clock``): ``LLMEngine`` is built on FakeRunner
(cheap); the others start processes, so their ``__init__`` is read instead (its source,
every ``self.x = ...``). A class that lacks a member fails (the last test).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import time
from typing import Any, Protocol

import pytest

from minicb import EngineConfig, FakeRunner, LLMEngine, SamplingParams
from minicb.core.engine_like import EngineLike, RoutingFleet, SteppedEngine
from minicb.core.runner import VirtualClock
from minicb.fleet.disagg_fleet import DisaggregatedFleet
from minicb.fleet.fleet import Fleet
from minicb.fleet.replica import Replica

POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
ANY_MORE = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def members(protocol: type) -> dict[str, Any]:
    """A protocol's members, its bases' included: name -> function or property."""
    found: dict[str, Any] = {}
    for klass in reversed(protocol.__mro__):
        if klass in (object, Protocol) or not getattr(klass, "_is_protocol", False):
            continue
        for name, value in vars(klass).items():
            member = inspect.isfunction(value) or isinstance(value, property)
            if member and not name.startswith("_"):
                found[name] = value
    return found


def set_in_init(cls: type) -> set[str]:
    """Every ``self.x`` that ``cls.__init__`` assigns (tuple targets too)."""
    if "__init__" not in vars(cls):
        return set()
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            for part in ast.walk(target) if target is not None else ():
                if isinstance(part, ast.Attribute) and getattr(part.value, "id", None) == "self":
                    names.add(part.attr)
    return names


def without_self(fn: Any) -> inspect.Signature:
    sig = inspect.signature(fn)
    return sig.replace(parameters=list(sig.parameters.values())[1:])


def misfit(wanted: inspect.Signature, given: inspect.Signature) -> str | None:
    """Why ``given`` cannot take every call that ``wanted`` allows, or None."""
    params = list(given.parameters.values())
    if any(p.kind in ANY_MORE for p in params):
        return None  # *args / **kwargs: anything goes
    positional = [p for p in params if p.kind in POSITIONAL]
    matched = set()
    for i, want in enumerate(wanted.parameters.values()):
        if want.kind in POSITIONAL:
            if i >= len(positional) or positional[i].name != want.name:
                return f"parameter {i} must be {want.name!r}"
            got = positional[i]
        else:
            got = given.parameters.get(want.name)
            if got is None or got.kind == inspect.Parameter.POSITIONAL_ONLY:
                return f"no keyword parameter {want.name!r}"
        if want.default is not inspect.Parameter.empty and got.default is inspect.Parameter.empty:
            return f"{want.name!r} must have a default"
        matched.add(got.name)
    unset = inspect.Parameter.empty
    extra = [p.name for p in params if p.name not in matched and p.default is unset]
    return f"{extra} are required but never passed" if extra else None


def problems(cls: type, protocol: type, instance: Any = None) -> list[str]:
    """What ``cls`` lacks of ``protocol``, in words (empty: it fits)."""
    assigned = set_in_init(cls) if instance is None else set()
    found = []
    for name, member in members(protocol).items():
        if instance is not None and name in vars(instance):
            value, bound = vars(instance)[name], True  # set in __init__: its value, seen
        elif hasattr(cls, name):
            value, bound = inspect.getattr_static(cls, name), False
        elif name in assigned:
            continue  # set in __init__ of a class too costly to build: its source says so
        else:
            found.append(f"{cls.__name__} has no {name}")
            continue
        if isinstance(member, property):
            continue  # an attribute: a property, a class attribute or one set in __init__
        if isinstance(value, property) or not callable(value):
            found.append(f"{cls.__name__}.{name} is not a method")
            continue
        given = inspect.signature(value) if bound else without_self(value)
        why = misfit(without_self(member), given)
        if why:
            found.append(f"{cls.__name__}.{name}: {why}")
    return found


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    # A virtual clock: its signature can be read (time.time, a builtin's, cannot).
    runner = FakeRunner(num_kv_blocks=16)
    return LLMEngine(config=EngineConfig(num_kv_blocks=16), runner=runner, clock=VirtualClock())


def test_an_engine_on_the_fake_runner_is_a_stepped_engine(engine):
    assert problems(LLMEngine, SteppedEngine, engine) == []


@pytest.mark.parametrize("cls", [Replica])
def test_a_replica_is_a_stepped_engine(cls):
    assert problems(cls, SteppedEngine) == []


@pytest.mark.parametrize("cls", [Fleet, DisaggregatedFleet])
def test_the_fleets_are_routing_fleets(cls):
    assert problems(cls, RoutingFleet) == []


def test_both_kinds_hold_the_shared_part_whole():
    shared = set(members(EngineLike))
    assert shared <= set(members(SteppedEngine)) and shared <= set(members(RoutingFleet))
    assert {"tokenize", "kv_snapshot", "queue_sizes", "clock"} <= shared


def test_a_class_that_lacks_a_member_or_takes_other_arguments_fails(engine):
    class Incomplete:
        """An engine without ``abort_all``, whose ``tokenize`` wants a second argument and
        whose ``add_request`` names its first parameter otherwise."""

        bus = config = max_model_len = tokenizer = None
        clock = kv_snapshot = queue_sizes = apply_chat_template = LLMEngine.queue_sizes
        step = has_unfinished = abort_request = describe = LLMEngine.step
        kv_snapshot_event = live_requests = LLMEngine.live_requests

        def tokenize(self, prompt: str, add_bos: bool) -> list[int]:
            return []

        def add_request(self, text: str, params: Any = None) -> int:
            return 0

    found = problems(Incomplete, SteppedEngine)
    assert "Incomplete has no abort_all" in found
    assert any(p.startswith("Incomplete.tokenize:") for p in found), found
    assert any(p.startswith("Incomplete.add_request:") for p in found), found
    assert any(p.startswith("Incomplete.apply_chat_template:") for p in found), found
    assert problems(Incomplete, RoutingFleet)  # nor is it a fleet (no replicas, no health)


# ---- the one replica contract, by behaviour --------------------------------------------------
# The same conformance tests run against every kind of replica a fleet can route to: an
# engine in this process, an engine in a replica process (minicb/fleet/replica.py) and a
# simulated replica (an engine on the simulated runner, minicb/fleet/simulated.py). A Ray
# actor (issue 56, minicb/fleet/ray/) joins as one more entry in REPLICA_KINDS: a builder
# that returns the engine-shaped handle and a closer.
GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8] * 5, [9, 10, 11]]
CONTRACT = dict(dtype="float32", num_kv_blocks=32, max_num_seqs=4)


def _in_process(model: str) -> tuple[Any, Any]:
    return LLMEngine(model, EngineConfig.from_kwargs(**CONTRACT)), None


def _replica_process(model: str) -> tuple[Any, Any]:
    replica = Replica(0, model, EngineConfig.from_kwargs(**CONTRACT), threads=1).ready()
    return replica, replica.close


def _simulated(model: str) -> tuple[Any, Any]:
    from minicb.fleet.simulated import SimulatedFleet

    config = EngineConfig(num_kv_blocks=32, max_num_seqs=4)
    return SimulatedFleet("L4:smollm2-135m", config, "round-robin", 1).replicas[0].engine, None


# name -> (builder, whether its tokens are the model's: the simulated runner makes its own)
REPLICA_KINDS = {
    "in-process": (_in_process, True),
    "replica-process": (_replica_process, True),
    "simulated": (_simulated, False),
}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(k, marks=pytest.mark.slow) if k == "replica-process" else k
        for k in REPLICA_KINDS
    ],  # fmt: skip
)
def replica(request, tiny_llama_dir):
    build, real_tokens = REPLICA_KINDS[request.param]
    handle, close = build(tiny_llama_dir)
    try:
        yield request.param, handle, real_tokens
    finally:
        if close is not None:
            close()


@pytest.fixture(scope="module")
def greedy_reference(tiny_llama_dir) -> list[list[int]]:
    engine = LLMEngine(tiny_llama_dir, EngineConfig.from_kwargs(**CONTRACT))
    ids = [engine.add_request(p, GREEDY) for p in PROMPTS]
    tokens: dict[int, list[int]] = {i: [] for i in ids}

    def listen(evs):
        for e in evs:
            for d in e.deltas():
                tokens[d.request_id].append(d.token_id)

    engine.bus.subscribe(listen, kinds=["tokens"])
    while engine.has_unfinished():
        engine.step()
    return [tokens[i] for i in ids]


def _drive(handle: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while handle.has_unfinished():
        assert time.monotonic() < deadline, "the replica never finished its requests"
        handle.step()


def _pool_is_free(handle: Any) -> None:
    kv = handle.kv_snapshot()
    assert kv.block_tables == {} and kv.num_free == kv.num_blocks, "a block leaked"
    assert handle.queue_sizes() == {"waiting": 0, "running": 0, "swapped": 0}


def test_contract_requests_run_to_their_end_and_free_their_blocks(replica, greedy_reference):
    kind, handle, real_tokens = replica
    tokens: dict[int, list[int]] = {}
    finished: list[int] = []

    def listen(evs):
        for e in evs:
            if e.kind == "finished":
                finished.append(e.request_id)
            else:
                for d in e.deltas():
                    tokens.setdefault(d.request_id, []).append(d.token_id)

    handle.bus.subscribe(listen, kinds=["tokens", "finished"])
    try:
        ids = [handle.add_request(p, GREEDY) for p in PROMPTS]
        assert handle.has_unfinished()
        _drive(handle)
    finally:
        handle.bus.unsubscribe(listen)
    assert sorted(finished) == sorted(ids)
    assert [len(tokens[i]) for i in ids] == [GREEDY.max_tokens] * len(ids)
    if real_tokens:  # greedy: the same tokens whichever kind runs the model
        assert [tokens[i] for i in ids] == greedy_reference, kind
    _pool_is_free(handle)
    assert isinstance(handle.describe(), dict)


def test_contract_an_abort_frees_the_request_at_once(replica):
    _, handle, _ = replica
    rid = handle.add_request(PROMPTS[0], SamplingParams(max_tokens=40, ignore_eos=True))
    assert [r for r in handle.live_requests() if r["request_id"] == rid]
    handle.step()
    assert handle.abort_request(rid) is True
    _drive(handle)
    _pool_is_free(handle)
    assert handle.abort_request(rid) is False  # gone: nothing to abort


def test_contract_a_prompt_that_can_never_fit_is_refused(replica):
    _, handle, _ = replica
    with pytest.raises(ValueError):
        handle.add_request([1] * (handle.max_model_len + 1), GREEDY)
    _pool_is_free(handle)
