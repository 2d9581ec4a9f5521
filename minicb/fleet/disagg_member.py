"""One engine of the simulated disaggregated cluster (disaggregated.py): the real engine on
its own simulated GPU and clock, built in its role.

The role is its scheduler: ``PrefillScheduler`` (keeps a request's KV after its first token
until the transfer has ended) or ``DecodeScheduler`` (requests wait in its inbox for room,
then for their KV to cross the link), kv_transfer.py's, the protocol's side of the engine
as vLLM's connectors have a scheduler side. The cluster runs its members together in time
order; a member's clock only moves by its own steps, or forward to ``now`` when something
reaches it then (``catch_up``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minicb.core.config import EngineConfig
from minicb.core.engine import LLMEngine
from minicb.core.runner import VirtualClock
from minicb.cost_model.step_time import StepTimeModel
from minicb.fleet.kv_transfer import DecodeScheduler, PrefillScheduler
from minicb.fleet.router import ReplicaLoad
from minicb.sim.simulated_runner import SimulatedRunner
from minicb.telemetry.metrics import MetricsCollector

TokenFn = Callable[[int, int], int]  # (request number in the run, token index) -> token


@dataclass
class Member:
    """One engine of the cluster, on its own simulated GPU and clock."""

    index: int
    engine: LLMEngine
    runner: SimulatedRunner
    # Its scheduler, built here in its role: the transfer protocol's side of it (release
    # held KV, the inbox, when a transfer lands), as vLLM's connectors have a scheduler side.
    role: PrefillScheduler | DecodeScheduler
    metrics: MetricsCollector = field(default_factory=MetricsCollector)  # its steps
    numbers: dict[int, int] = field(default_factory=dict)  # engine id -> request number
    stalled: bool = False  # a prefill engine whose last step ran nothing: wait for a change
    # A planner's engine (sla_planner.py): asked for at ``added`` (it costs from then),
    # routed to from ``ready_at`` (its start-up), taken out of the router at ``removed``.
    added: float = 0.0
    ready_at: float = 0.0
    removed: float | None = None

    @property
    def clock(self) -> VirtualClock:
        return self.runner.clock

    def catch_up(self, now: float) -> None:
        """Bring its clock to ``now`` if behind. Safe whenever something reaches it at
        ``now``: the loop runs events in time order, so an engine whose clock is behind
        has nothing to do before ``now`` (idle, stalled, or waiting for a transfer)."""
        if self.clock() < now:
            self.clock.advance(now - self.clock())


def build_member(
    index: int,
    profile: StepTimeModel,
    config: EngineConfig,
    scheduler: Callable[..., Any],
    token_fn: TokenFn | None,
    shift: int,
) -> Member:
    """Engine ``index`` of a side, its scheduler built by ``scheduler``; ``token_fn`` gives
    every request's tokens by its number in the run, ``shift`` where this side starts (a
    decode engine's token 0 is the request's token 1)."""
    clock = VirtualClock()
    runner = SimulatedRunner(profile, config, clock=clock)
    built = []  # the engine builds its scheduler: keep the one of this role

    def build(*args: Any) -> Any:
        built.append(scheduler(*args))
        return built[-1]

    engine = LLMEngine(config=config, runner=runner, clock=clock, scheduler=build)
    member = Member(index, engine, runner, built[0])
    engine.bus.subscribe(member.metrics, kinds=["step"])
    if token_fn is not None:
        numbers = member.numbers
        runner.token_fn = lambda rid, n: token_fn(numbers[rid], n + shift)
    return member


def member_load(member: Member, now: float) -> ReplicaLoad:
    """What the router reads of a member at ``now`` (one still starting is not alive)."""
    return ReplicaLoad.of(member.index, member.engine.queue_sizes(), alive=member.ready_at <= now)
