"""The runner: the one seam between deciding (the scheduler) and computing (a model).

The engine hands a runner each iteration's StepPlan and gets back one sampled token per
request whose uncomputed tokens are now all computed; for a row that verifies speculative
drafts (``num_draft_tokens > 0``), the tokens sampled at each of its last ``1 + d``
positions, as a list. Who the runner is, the engine does
not know or care:

- ``ModelRunner`` (minicb.core.runner.model_runner): the real model, paged KV tensors, an
  attention backend; a feature may wrap it (tensor parallelism, CUDA graphs, utilisation:
  wrappers.py, seam 3), and a wrapped runner answers the same call;
- ``FakeRunner`` (minicb.core.runner.fake): no model and no torch; deterministic tokens, for
  tests and for timing the scheduler alone;
- ``SimulatedRunner`` (minicb.sim.simulated_runner): FakeRunner with a named GPU's KV pool and
  a step-time model of that GPU (docs/simulation.md): data-centre scale, simulated.

A runner also tells the engine what it was built with: how many KV and swap blocks exist,
the longest context, the vocabulary and the tokenizer. It performs the plan's swaps
(``swap_out_map`` before the forward pass, ``swap_in_map`` after those). ``with_config``
gives a runner for new settings on the same weights (the demo rebuilds its engines that
way, and static batching shares one copy of the weights with continuous).

With overlap scheduling (minicb/overlap/pipeline.py) ``execute`` runs on the engine's worker thread,
one plan at a time and in order, while the engine's thread plans the next one: a runner
reads only the plan it was given, and its tokens go back in the ``RunnerOutput``.

The engine's clock is injectable too: by default the wall clock, or a ``VirtualClock``
that a runner advances by the time a step would take, so events carry exact, known times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from minicb.core.config import EngineConfig
    from minicb.core.scheduler.plan import StepPlan


@dataclass
class RunnerOutput:
    """What one ``execute`` gives back."""

    # request id -> new token id; for a row with d drafts, the 1 + d tokens sampled after its
    # last real token and after each draft (a runner that gives one int verifies nothing).
    sampled: dict[int, int | list[int]] = field(default_factory=dict)
    forward_s: float = 0.0
    sample_s: float = 0.0
    # Tensor parallelism: the ranks the step ran on, and seconds in collectives (sending
    # the plan, and the all-reduces, which are also inside forward_s); 0 on one rank.
    tensor_parallel_size: int = 1
    collective_s: float = 0.0
    # How busy the hardware was, 0..1 of the peaks over the step (None: not known, as on a
    # fake): bytes streamed / HBM bandwidth and FLOPs / peak FLOP/s, each over the step's time.
    bandwidth_util: float | None = None
    flop_util: float | None = None
    # A simulated host (SimulatedRunner with a host-time model, minicb/sim/host_time.py):
    # (schedule_s, device_wait_s, process_s), the host's seconds around this step and the
    # device's wait before it, inside the step's time on the virtual clock. The step event
    # draws these lanes instead of the engine's own (microseconds of Python, off that clock).
    host_lanes: tuple[float, float, float] | None = None


class Runner(Protocol):
    model_name: str
    tokenizer: Any | None  # a transformers tokenizer, or None: prompts are token ids
    stop_token_ids: list[int]
    vocab_size: int
    max_model_len: int
    num_kv_blocks: int
    num_swap_blocks: int

    def execute(self, plan: StepPlan) -> RunnerOutput: ...

    def with_config(self, config: EngineConfig) -> Runner: ...

    def describe(self) -> dict[str, Any]: ...  # JSON-safe: device, dtype, pool size, ...


class VirtualClock:
    """A clock that moves only when told: ``clock()`` reads it, ``advance(s)`` moves it."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
