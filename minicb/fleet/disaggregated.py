"""Disaggregated prefill and decode at data-centre scale, SIMULATED, on virtual time.

P prefill engines and D decode engines, each the real engine (``LLMEngine``: its
scheduler, block manager, events, metrics) on its own ``SimulatedRunner`` and clock, with
its own pool (``config`` for the prefill side, ``decode_config`` for the decode side). A
request is routed to a prefill engine (the fleet's ``Router``, least loaded by default),
which computes its prompt and its first token (the request is told ``max_tokens=1`` there)
and keeps its KV (``PrefillScheduler``). It is then handed to a decode engine (the same
router over the decode side), where it waits until that pool has room (backpressure: its
KV stays on the prefill side, and the reason is in the decode plan's notes), its blocks are
allocated and its KV crosses the link (``Link``: bytes / bandwidth, the bytes from the
model's KV bytes per token), and it decodes to the end (``DecodeScheduler``). The prefill
side frees the blocks when the transfer has ended. Every transfer is recorded (bytes,
blocks, when it could have left, when it left, when it arrived).

The engines run together in time order, as ``minicb.fleet.simulated.SimulatedFleet`` runs
replicas: of the next arrival, the next hand-off or release, and the earliest start of an
engine's next step, whichever comes first (a step is done whole; what it causes, a hand-off
at its end or a release at a transfer's end, waits in a queue of timed actions until its
time). The source is an ``Arrivals`` or a ``ChatSessions`` (told of each answer, so the
next turn follows it). With a planner, the pools grow and shrink (``ClusterScaling``,
disagg_scaling.py). Its figures count each request once (disagg_figures.py); colocated runs
for comparison are ``SimulatedFleet``'s. Labelled ``simulated``. Pure Python: no torch.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.latency import tpot
from minicb.core.request import RequestMetrics
from minicb.cost_model.catalogue import load_profile
from minicb.cost_model.step_time import StepTimeModel
from minicb.fleet.disagg_figures import cluster_summary
from minicb.fleet.disagg_member import Member, TokenFn, build_member, member_load
from minicb.fleet.disagg_scaling import ClusterScaling
from minicb.fleet.fleet_figures import replica_startup_s
from minicb.fleet.kv_transfer import DecodeScheduler, PrefillScheduler, Transfer, link
from minicb.fleet.router import Router
from minicb.fleet.simulated import ArrivalSource
from minicb.fleet.sla_planner import PoolScaler
from minicb.parallel.settings import ParallelSettings
from minicb.telemetry.request_times import continued
from minicb.workload import RequestSpec


@dataclass
class Journey:
    """What one request did across the cluster: its tokens, each token's time (for the
    gaps between them), and its times, the one record of them (``RequestMetrics``): the
    prefill engine's output's once it has its first token, joined to the decode engine's
    (``continued``) once it has ended there."""

    spec: RequestSpec
    prefill: int
    token_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    times: RequestMetrics | None = None
    decode: int | None = None


class DisaggregatedCluster:
    """P prefill and D decode engines of one profile (see the module doc)."""

    def __init__(
        self,
        profile: StepTimeModel | str,
        num_prefill: int,
        num_decode: int,
        config: EngineConfig,
        *,
        decode_config: EngineConfig | None = None,
        link_name: str = "NVLink 4",
        router: str = "least-loaded",
        ttft_slo: float = 1.0,
        tpot_slo: float = 0.1,
        token_fn: TokenFn | None = None,
        planner: PoolScaler | None = None,
        startup_s: float | None = None,
    ) -> None:
        """``config``: the prefill engines' settings (and the decode engines' unless
        ``decode_config``); ``token_fn``: every request's tokens by its number in the run
        and the token's index (default: the simulated runner's constant token)."""
        if isinstance(profile, str):
            profile = load_profile(profile, ParallelSettings.of(config).tensor_parallel_size)
        self.profile, self.link = profile, link(link_name)
        self.ttft_slo, self.tpot_slo = ttft_slo, tpot_slo
        decode_config = decode_config or config
        self.config, self.decode_config, self.token_fn = config, decode_config, token_fn
        self.prefill = [self.build("prefill", i) for i in range(num_prefill)]
        self.decode = [self.build("decode", i) for i in range(num_decode)]
        self.route_prefill = Router(router, num_prefill, block_size=config.block_size)
        self.route_decode = Router(router, num_decode, block_size=decode_config.block_size)
        # With a planner, each pool grows and shrinks (disagg_scaling.py); without one,
        # the pools keep their sizes and nothing is collected for it.
        startup_s = replica_startup_s(profile) if startup_s is None else startup_s
        self.scaler = ClusterScaling(self, planner, startup_s) if planner else None
        self.journeys: list[Journey] = []
        self.transfers: list[Transfer] = []
        self._ready: dict[tuple[int, int], float] = {}  # (decode, id) -> when handed over
        self._prefill_of: dict[tuple[int, int], tuple[int, int]] = {}  # -> (prefill, id)
        self._actions: list[tuple[float, int, str, tuple]] = []  # (time, seq, kind, what)
        self._seq = itertools.count()
        self._answered: Callable[[RequestSpec, float, list[int]], None] | None = None

    # ---- building ------------------------------------------------------------------------
    def build(self, side: str, index: int) -> Member:
        """Engine ``index`` of the ``prefill`` or ``decode`` pool, on its own clock."""
        if side == "prefill":
            return build_member(index, self.profile, self.config, PrefillScheduler,
                                self.token_fn, 0)  # fmt: skip
        return build_member(index, self.profile, self.decode_config,
                            self._decode_scheduler(index), self.token_fn, 1)  # fmt: skip

    def _decode_scheduler(self, index: int) -> Callable[..., DecodeScheduler]:
        def build(*args: Any) -> DecodeScheduler:
            return DecodeScheduler(
                *args,
                clock=lambda: self.decode[index].clock(),
                transfer_s=lambda tokens: self._transfer_s(index, tokens),
                on_transfer=lambda rid, *t: self._transferred(index, rid, *t),
            )

        return build

    def kv_bytes(self, decode: int, tokens: int) -> int:
        """Bytes of the KV of ``tokens`` tokens (in the engines' KV cache dtype: an 8-bit
        cache sends its values and their scales)."""
        return tokens * self.decode[decode].runner.profile.kv_token_bytes

    def _transfer_s(self, decode: int, tokens: int) -> float:
        # The KV of a tensor-parallel group is split over its GPUs, each with its own link.
        return self.link.seconds(self.kv_bytes(decode, tokens) / self.profile.tp)

    # ---- the event loop --------------------------------------------------------------------
    def run(self, source: ArrivalSource) -> dict[str, Any]:
        """Every request of ``source`` through the cluster; the figures (``summary``)."""
        self._answered = getattr(source, "answered", None)  # a closed loop's next turns
        interval = self.scaler.planner.interval_s if self.scaler else math.inf
        next_look = interval
        while source or self._actions or any(m.engine.has_unfinished() for m in self.members):
            t_arrival = source.next_time if source.next_time is not None else math.inf
            t_action = self._actions[0][0] if self._actions else math.inf
            prefill = min(self._prefill_ready(), key=lambda m: (m.clock(), m.index), default=None)
            t_prefill = prefill.clock() if prefill else math.inf
            t_decode, decode = min(self._decode_ready(), key=lambda x: (x[0], x[1].index),
                                   default=(math.inf, None))  # fmt: skip
            t = min(t_arrival, t_action, t_prefill, t_decode, next_look)
            if t == math.inf:
                raise RuntimeError(f"the cluster is stuck with work left: {self._state()}")
            if t_arrival == t:
                for spec in source.due(t):
                    self._arrive(spec, t)
            elif t_action == t:
                self._act(*heapq.heappop(self._actions))
            elif next_look == t:
                self.scaler.look(t)
                next_look += interval
            elif t_prefill == t:
                self._step_prefill(prefill)
            else:
                decode.catch_up(t_decode)  # idle until its next transfer lands
                self._step_decode(decode)
        return self.summary()

    @property
    def members(self) -> list[Member]:
        return self.prefill + self.decode

    def _prefill_ready(self) -> list[Member]:
        return [m for m in self.prefill if m.engine.has_unfinished() and not m.stalled]

    def _decode_ready(self) -> list[tuple[float, Member]]:
        ready = ((m.role.next_step_time(m.clock()), m) for m in self.decode)
        return [(t, m) for t, m in ready if t is not None]

    def _later(self, time: float, kind: str, *what: Any) -> None:
        heapq.heappush(self._actions, (time, next(self._seq), kind, what))

    def _arrive(self, spec: RequestSpec, now: float) -> None:
        number = len(self.journeys)
        if self.scaler:
            self.scaler.prompts.append(len(spec.prompt))
        loads = [member_load(m, now) for m in self.prefill]
        member = self.prefill[self.route_prefill.route(number, list(spec.prompt), loads).replica]
        member.catch_up(now)
        member.stalled = False
        params = SamplingParams(max_tokens=1, ignore_eos=True)  # the prompt and first token
        rid = member.engine.add_request(list(spec.prompt), params, arrival_time=now)
        member.numbers[rid] = number
        if spec.output_tokens == 1 and spec.stops_early:  # its only token is EOS, as colocated
            member.runner.output_lengths[rid] = 1
        self.journeys.append(Journey(spec, member.index))

    def _step_prefill(self, member: Member) -> None:
        result = member.engine.step()
        # Nothing ran nor was preempted: its pool is full of KV waiting to leave; it waits
        # for a release (or a new arrival) rather than spin.
        member.stalled = not result.plan.scheduled and not result.plan.preempted
        now = member.clock()
        for out in result.finished:
            number = member.numbers.pop(out.request_id)
            journey = self.journeys[number]
            journey.token_ids.extend(out.token_ids)
            journey.token_times.append(now)
            journey.times = out.metrics
            if self.scaler:
                self.scaler.ttfts.append(now - out.metrics.arrival_time)
            if journey.spec.output_tokens == 1:  # nothing to decode: done here
                self._done(journey, now)
                self._act(now, 0, "release", (member.index, out.request_id))
            else:
                self._later(now, "hand_off", number, member.index, out.request_id)

    def _act(self, now: float, _seq: int, kind: str, what: tuple) -> None:
        if kind == "release":  # the KV has left: its blocks go back to the prefill pool
            member = self.prefill[what[0]]
            member.role.release(what[1])
            member.engine.publish_kv_changes()
            member.catch_up(now)
            member.stalled = False
            return
        number, prefill, prefill_rid = what  # hand_off: to the least loaded decode engine
        journey = self.journeys[number]
        loads = [member_load(m, now) for m in self.decode]
        route = self.route_decode.route(number, list(journey.spec.prompt), loads)
        member = self.decode[route.replica]
        member.catch_up(now)
        spec = journey.spec
        params = SamplingParams(max_tokens=spec.max_tokens - 1, ignore_eos=not spec.stops_early)
        rid = member.engine.add_request(
            list(spec.prompt) + journey.token_ids[:1], params, arrival_time=now,
            expected_output_tokens=spec.output_tokens - 1,
        )  # fmt: skip
        member.numbers[rid] = number
        if spec.stops_early:
            member.runner.output_lengths[rid] = spec.output_tokens - 1
        journey.decode = member.index
        self._ready[(member.index, rid)] = now
        self._prefill_of[(member.index, rid)] = (prefill, prefill_rid)

    def _transferred(
        self, decode: int, rid: int, tokens: int, blocks: int, start: float, end: float
    ) -> None:
        """A decode engine has started receiving a request's KV: record it, and free the
        prefill side's blocks when it has arrived."""
        prefill, prefill_rid = self._prefill_of.pop((decode, rid))
        member = self.decode[decode]
        held_back = rid in member.role.refused
        self.transfers.append(Transfer(member.numbers[rid], prefill, decode, tokens, blocks,
                                       self.kv_bytes(decode, tokens),
                                       self._ready.pop((decode, rid)),
                                       start, end, held_back))  # fmt: skip
        self._later(end, "release", prefill, prefill_rid)

    def _step_decode(self, member: Member) -> None:
        result = member.engine.step()
        now = member.clock()
        for delta in result.new_tokens:
            self.journeys[member.numbers[delta.request_id]].token_times.append(now)
        for out in result.finished:
            journey = self.journeys[member.numbers.pop(out.request_id)]
            journey.token_ids.extend(out.token_ids)
            journey.times = continued(journey.times, out.metrics)
            if self.scaler:  # the planner is told each request's length and decode ITL
                decoded = journey.token_times[1:]  # the gaps on the decode side
                if len(decoded) >= 2:
                    self.scaler.itls.append(tpot(decoded[0], decoded[-1], len(decoded)))
                self.scaler.outputs.append(len(journey.token_ids))
            self._done(journey, now)

    def _done(self, journey: Journey, now: float) -> None:
        if self._answered is not None:  # the next turn sends back what the model said
            self._answered(journey.spec, now, journey.token_ids)

    @property
    def scaling(self) -> list[dict[str, Any]]:
        """The planner's decisions, each with its time, pool, reason and the pools' sizes."""
        return self.scaler.log if self.scaler else []

    def summary(self) -> dict[str, Any]:
        """The cluster's figures (simulated; disagg_figures.py)."""
        return cluster_summary(self)

    def _state(self) -> str:
        parts = [f"prefill {m.index}: {m.engine.queue_sizes()}" for m in self.prefill]
        parts += [f"decode {m.index}: {m.engine.queue_sizes()}" for m in self.decode]
        return "; ".join(parts)

