"""A disaggregated scenario: a prefill engine and a decode engine on the page, and the KV
cache crossing between them (SIMULATED).

The two sides of such a scenario are ``prefill0`` and ``decode0``, each the real engine on
its own simulated GPU and clock, with the scheduler of its role from
minicb/fleet/kv_transfer.py (the one the data-centre cluster, fleet/disaggregated.py, runs):
the prefill engine is told ``max_tokens=1`` and keeps a finished prompt's KV until it has
been sent; the decode engine takes the request (prompt plus first token), waits for room,
allocates its blocks, receives the KV over the scenario's link (bytes / bandwidth, the
catalogue's figures) and decodes to the end.

``Handoffs`` is the scenario player's part of it, called before each round: it hands every
prompt the prefill engine finished to the decode engine, publishes each transfer as the
``kv_transfer`` events the real disaggregated fleet publishes (so the page draws them in
the strip between the two panels, viz/transfers.js), and frees the prefill side's blocks
when the KV has arrived.

The player runs its engines in rounds, one step each, and each engine has its own clock;
the hand-off keeps the order of time on the decode side: a prompt finished at prefill time
``t`` is handed over once the decode engine's clock reaches ``t`` (an idle decode engine's
clock is brought forward to it, as the cluster brings an idle engine's). The prefill side
frees a sent prompt's blocks at the round after its KV arrived, which may be later on its
own clock than in the cluster; a scenario sized so that the prefill pool never fills sees
no difference.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.request_events import KVTransfer
from minicb.core.runner import VirtualClock
from minicb.fleet.kv_transfer import DecodeScheduler, PrefillScheduler, link
from minicb.scenarios.scenario import DECODE, PREFILL, Scenario
from minicb.sim.simulated_runner import SimulatedRunner

if TYPE_CHECKING:
    from minicb.core.engine import LLMEngine

# The scheduler each engine of a disaggregated scenario was built with: the hand-off drives
# the roles (a held prompt's release, the decode side's inbox and transfers), which the
# engine's own views do not show, as fleet/disaggregated.py keeps its members' roles.
ROLES: weakref.WeakKeyDictionary[Any, PrefillScheduler | DecodeScheduler] = (
    weakref.WeakKeyDictionary()
)


@dataclass
class RolePart:
    """One side of a disaggregated scenario before its engine exists: its settings, its
    simulated GPU and clock, and what builds the scheduler of its role (the engine calls
    ``build_scheduler`` once; ``register`` then files that scheduler under the engine)."""

    config: EngineConfig
    runner: SimulatedRunner
    clock: VirtualClock
    role: Callable[..., PrefillScheduler | DecodeScheduler]
    built: list = field(default_factory=list)

    def build_scheduler(self, *args: Any) -> PrefillScheduler | DecodeScheduler:
        self.built.append(self.role(*args))
        return self.built[-1]

    def register(self, engine: LLMEngine) -> LLMEngine:
        ROLES[engine] = self.built[-1]
        return engine


def role_parts(scenario: Scenario) -> dict[str, RolePart]:
    """The prefill and decode sides of ``scenario``, by name, on its simulated GPU."""
    from minicb.cost_model.catalogue import load_profile

    profile = load_profile(scenario.runner)
    wire = link(scenario.link)
    parts = {}
    for side in scenario.sides:
        config = EngineConfig.from_kwargs(**side.engine)
        clock = VirtualClock()
        runner = SimulatedRunner(profile, config, clock=clock)
        per_token = runner.profile.kv_token_bytes  # in this side's KV cache dtype

        def decode_role(*args: Any, clock: VirtualClock = clock, per_token: int = per_token):
            return DecodeScheduler(
                *args, clock=clock, transfer_s=lambda tokens: wire.seconds(tokens * per_token)
            )

        role = PrefillScheduler if side.name == PREFILL else decode_role
        parts[side.name] = RolePart(config, runner, clock, role)
    return parts


def disaggregated_engines(scenario: Scenario) -> dict[str, LLMEngine]:
    """The scenario's prefill and decode engines, on its simulated GPU, each with its own
    clock, pool and the scheduler of its role."""
    from minicb.core.engine import LLMEngine

    return {
        name: part.register(LLMEngine(config=part.config, runner=part.runner,
                                      clock=part.clock, scheduler=part.build_scheduler))
        for name, part in role_parts(scenario).items()
    }  # fmt: skip


@dataclass
class Sent:
    """A prompt on its way: its ids on both sides, and its transfer once it began."""

    prefill_id: int
    decode_id: int
    tokens: int = 0  # tokens of KV it moves: the prompt's
    end: float | None = None  # the decode engine's clock when its KV has arrived


class Handoffs:
    """Moves each prompt the prefill engine finished to the decode engine (module doc)."""

    def __init__(self, engines: dict[str, LLMEngine], groups: dict[str, dict[int, str]]) -> None:
        """``groups``: the player's request groups by side and id (a hand-off's decode id
        joins its group there)."""
        self.prefill, self.decode = engines[PREFILL], engines[DECODE]
        self.prefill_role, self.decode_role = ROLES[self.prefill], ROLES[self.decode]
        self.groups = groups
        self.prompts: dict[int, tuple[list[int], int]] = {}  # prefill id -> prompt, max_tokens
        self.first: dict[int, int] = {}  # prefill id -> its first token
        self.ready: list[tuple[float, int]] = []  # (prefill clock at its end, prefill id)
        self.done_here: list[int] = []  # prefill ids of one-token requests: only to free
        self.sent: dict[int, Sent] = {}  # decode id -> its hand-off
        self.prefill.bus.subscribe(self._heard, kinds=["tokens", "finished"])

    def detach(self) -> None:
        self.prefill.bus.unsubscribe(self._heard)

    def add(self, ids: list[int], max_tokens: int) -> int:
        """A new request, to the prefill engine: its prompt and first token only."""
        rid = self.prefill.add_request(ids, SamplingParams(max_tokens=1, ignore_eos=True))
        self.prompts[rid] = (ids, max_tokens)
        return rid

    def _heard(self, events: list[Any]) -> None:
        for e in events:
            if e.kind == "tokens":
                for rid, token in zip(e.request_ids, e.token_ids, strict=True):
                    self.first.setdefault(rid, token)
            elif self.prompts[e.request_id][1] == 1:  # nothing left to decode
                del self.prompts[e.request_id]
                self.done_here.append(e.request_id)
            else:
                self.ready.append((e.time, e.request_id))

    def __call__(self) -> None:
        """Before a round: hand-offs whose time has come, then the transfers' news."""
        for prefill_id in self.done_here:  # freed here, between steps, not while it reports
            self.prefill_role.release(prefill_id)
        self.done_here.clear()
        self.prefill.publish_kv_changes()
        decode = self.decode_role
        busy = decode.running or decode.waiting or decode.inbox or decode.receiving
        if self.ready and not busy:  # an idle decode engine waits for the next hand-off
            _catch_up(self.decode, self.ready[0][0])
        while self.ready and self.ready[0][0] <= self.decode.clock():
            _, prefill_id = self.ready.pop(0)
            self._hand_off(prefill_id)
        self._follow_transfers()
        if decode.receiving and not (decode.running or decode.waiting):
            _catch_up(self.decode, min(decode.receiving.values()))  # nothing to do till then

    def _hand_off(self, prefill_id: int) -> None:
        ids, max_tokens = self.prompts.pop(prefill_id)
        params = SamplingParams(max_tokens=max_tokens - 1, ignore_eos=True)
        decode_id = self.decode.add_request(ids + [self.first.pop(prefill_id)], params)
        if prefill_id in self.groups[PREFILL]:  # a lesson's request (a typed one has no group)
            self.groups[DECODE][decode_id] = self.groups[PREFILL][prefill_id]
        self.sent[decode_id] = Sent(prefill_id, decode_id)

    def _follow_transfers(self) -> None:
        """Publish each transfer that began or ended in the last round; free the prefill
        side's blocks of each KV that has arrived."""
        scheduler = self.decode_role
        for decode_id, sent in list(self.sent.items()):
            if sent.end is None and decode_id in scheduler.receiving:
                sent.end = scheduler.receiving[decode_id]
                sent.tokens = scheduler.requests[decode_id].num_tokens - 1
                start = sent.end - scheduler.transfer_s(sent.tokens)
                self._publish(sent, start, "receiving", 0, 0.0,
                              f"{sent.tokens} prompt tokens on their way")  # fmt: skip
            elif sent.end is not None and decode_id not in scheduler.receiving:
                nbytes = sent.tokens * self.decode.runner.profile.kv_token_bytes
                self._publish(sent, sent.end, "done", nbytes,
                              scheduler.transfer_s(sent.tokens),
                              f"the KV of {sent.tokens} prompt tokens has arrived")  # fmt: skip
                self.prefill_role.release(sent.prefill_id)
                self.prefill.publish_kv_changes()  # the map shows the KV gone, not held
                del self.sent[decode_id]

    def _publish(
        self, sent: Sent, time: float, status: str, nbytes: int, seconds: float, why: str
    ) -> None:
        self.decode.bus.emit(
            KVTransfer(
                time=time,
                request_id=sent.decode_id,
                from_engine=PREFILL,
                to_engine=DECODE,
                blocks=len(self.decode.block_table(sent.decode_id)),
                bytes=nbytes,
                seconds=seconds,
                status=status,
                reason=why,
            )
        )


def _catch_up(engine: LLMEngine, t: float) -> None:
    """Bring an idle engine's clock forward to ``t`` (its idle time is not its own)."""
    if engine.clock() < t:
        engine.clock.advance(t - engine.clock())
