"""The step strategy (seam 5, minicb/core/step_strategy.py): the plain loop is the core's and
loads nothing outside minicb/core/; another loop enters by registering under its name; a
config that asks for an unloaded one gets an error saying what to import.

The import checks run in a fresh interpreter, since this one imported every feature
(tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys

from minicb import SamplingParams
from minicb.core.step_strategy import STEP_STRATEGIES
from tests.helpers import fake_engine

RUN = """
import sys
from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.engine import LLMEngine
from minicb.core.runner.fake import FakeRunner

engine = LLMEngine(config=EngineConfig(), runner=FakeRunner())
engine.add_request([3, 4, 5], SamplingParams(max_tokens=3, temperature=0))
assert [len(o.token_ids) for o in engine.run_until_done()] == [3]
assert engine.strategy is None
assert not [m for m in sys.modules if m.startswith("minicb.overlap")]

try:
    LLMEngine(config=EngineConfig.from_kwargs(overlap_scheduling=True), runner=FakeRunner())
except ValueError as e:
    assert "overlap_scheduling=True" in str(e) and "import minicb.features" in str(e), e
else:
    raise AssertionError("overlap_scheduling without its package: no error")

import minicb.overlap
assert "minicb.overlap.pipeline" not in sys.modules  # registering loads no loop
engine = LLMEngine(config=EngineConfig.from_kwargs(overlap_scheduling=True), runner=FakeRunner())
assert type(engine.strategy).__module__ == "minicb.overlap.pipeline"
"""


def test_the_plain_loop_needs_no_feature_and_a_missing_strategy_names_its_import():
    done = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


class CountingLoop:
    """A strategy that runs the plain loop (the engine's own step, with itself set aside)
    and counts its calls: enough to see that the engine steps through the registry."""

    def __init__(self, engine):
        self.engine, self.calls, self.in_flight = engine, 0, None

    def step(self):
        self.calls += 1
        self.engine.strategy = None
        try:
            return self.engine.step()
        finally:
            self.engine.strategy = self

    def close(self):
        pass


def test_the_engine_steps_through_the_strategy_registered_under_the_configs_name(
    monkeypatch,
):
    monkeypatch.setitem(STEP_STRATEGIES, "overlap", CountingLoop)
    engine = fake_engine(overlap_scheduling=True)
    engine.add_request([3, 4, 5], SamplingParams(max_tokens=4, temperature=0))
    outputs = engine.run_until_done()
    assert isinstance(engine.strategy, CountingLoop)
    assert engine.strategy.calls == 4 and [len(o.token_ids) for o in outputs] == [4]
