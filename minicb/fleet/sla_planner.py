"""Autoscaling from a performance model (NVIDIA Dynamo's SLA planner) for a disaggregated
fleet: the prefill pool sized for a TTFT target and the decode pool for an ITL target,
apart. SIMULATED: its model is the simulated runner's step-time model.

The queue-length autoscaler (autoscale.py) waits for a symptom, a queue or requests that
already missed their targets, then adds one replica and waits for it. A planner with a
performance model asks instead: how many engines does the load I expect next need to meet
the targets? It sizes the two pools of a disaggregated fleet apart, because they answer to
different targets: the prefill pool to TTFT (how long a prompt waits and is computed), the
decode pool to ITL (the gap between tokens, which grows with the decode batch). Every
``interval_s`` it

1. predicts the next interval's load from what arrived in the last ones (requests per
   second, mean prompt length; the mean output length from what finished): ``constant``
   (the next is the last) or ``trend`` (the last plus its change since the one before: a
   ramp rewards it, noise punishes it);
2. reads its performance model (``PerformanceModel``, profiled from the step-time model,
   minicb/cost_model/step_time.py, as Dynamo profiles an engine before it deploys it): the
   seconds to compute one prompt and a busy prefill engine's prompt tokens per second give
   TTFT against load (``prefill_s / (1 - utilisation)``: a queue that grows without bound
   as the load nears what the pool computes); a decode step's time at each batch size
   gives ITL against the batch;
3. corrects the model by what it measured: the observed TTFT and ITL of the last interval
   over what the model predicted for the load that produced them, smoothed (``smoothing``:
   the weight of the newest ratio). A factor over 1 says the model was optimistic (a
   backlog it does not model, chunks that share steps), and the planner asks for more;
4. sizes each pool: prefill, the fewest engines whose predicted TTFT times its correction
   meets the target; decode, the largest batch whose ITL times its correction meets the
   target gives one engine's tokens per second, and the pool is the predicted output
   tokens per second over that (Dynamo's ``ceil(predicted load / engine throughput)``).

It adds every engine a pool lacks at once (each takes its start-up delay), and takes away
one per pool per look (a removed engine drains what it holds first, and a prediction that
falls may rise again before a second start-up would pay off). Each decision says why in
words. ``DisaggregatedCluster`` (disaggregated.py) calls ``decide`` on virtual time. Pure
Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from minicb.core.config import EngineConfig
from minicb.cost_model.step_time import StepTimeModel
from minicb.fleet.autoscale import ScaleDecision
from minicb.sim.simulated_runner import GPU_MEMORY_UTILIZATION

POOLS = ("prefill", "decode")


@dataclass(frozen=True)
class PerformanceModel:
    """TTFT against load and ITL against batch size of one engine of each role."""

    profile: StepTimeModel
    prefill_budget: int  # a prefill engine's tokens per step (max_num_batched_tokens)
    max_batch: int  # a decode engine's slots (max_num_seqs)
    decode_kv_tokens: int  # tokens a decode engine's KV pool holds

    @classmethod
    def of(
        cls, profile: StepTimeModel, prefill: EngineConfig, decode: EngineConfig | None = None
    ) -> PerformanceModel:
        decode = decode or prefill
        blocks = decode.num_kv_blocks or profile.num_kv_blocks(
            decode.block_size, GPU_MEMORY_UTILIZATION
        )
        return cls(profile, prefill.max_num_batched_tokens, decode.max_num_seqs,
                   blocks * decode.block_size)  # fmt: skip

    # ---- prefill: TTFT against load ------------------------------------------------------
    def prefill_s(self, prompt: float) -> float:
        """Seconds to compute one prompt alone: its chunks of the budget, a step each."""
        length, done, seconds = max(1, round(prompt)), 0, 0.0
        while done < length:
            n = min(self.prefill_budget, length - done)
            done += n
            seconds += self.profile.terms([(n, done, done == length)])["step_s"]
        return seconds

    def prefill_tokens_per_s(self, prompt: float) -> float:
        """A busy prefill engine's prompt tokens per second: every step a full budget of
        prompts of this length (or one chunk of a longer one)."""
        length = max(1, round(prompt))
        if length >= self.prefill_budget:
            rows = [(self.prefill_budget, length, False)]
        else:
            rows = [(length, length, True)] * (self.prefill_budget // length)
        return sum(r[0] for r in rows) / self.profile.terms(rows)["step_s"]

    def ttft(self, prompt: float, load_tok_s: float, engines: int) -> float:
        """Predicted mean TTFT of prompts of this length arriving at ``load_tok_s`` prompt
        tokens per second over ``engines`` prefill engines (inf: more than they compute)."""
        if engines < 1:
            return math.inf
        utilisation = load_tok_s / (engines * self.prefill_tokens_per_s(prompt))
        return math.inf if utilisation >= 1 else self.prefill_s(prompt) / (1 - utilisation)

    # ---- decode: ITL against batch ---------------------------------------------------------
    def itl(self, batch: float, context: float) -> float:
        """Seconds of a decode step of ``batch`` rows of ``context`` tokens each."""
        b = max(1, round(batch))
        c = round(context)
        return self.profile.totals_terms(b, b, b * c, b * c)["step_s"]

    def decode_batch(self, itl_target: float, context: float, kv_share: float = 1.0) -> int:
        """The largest batch whose step meets ``itl_target`` and whose KV fits in
        ``kv_share`` of the pool (0: none)."""
        room = self.decode_kv_tokens * kv_share
        fits = min(self.max_batch, int(room // max(1.0, context)))
        best = 0
        for b in range(1, fits + 1):  # ITL grows with the batch: stop at the first miss
            if self.itl(b, context) > itl_target:
                break
            best = b
        return best


@dataclass(frozen=True)
class Pool:
    """One pool as the planner sees it at a look."""

    ready: int
    starting: int
    held: dict[int, int]  # ready engine -> requests it holds (the one to remove: the fewest)
    waiting: int = 0  # requests waiting for a slot on the ready engines
    since_ready_s: float | None = None  # since its newest added engine became ready


@dataclass(frozen=True)
class PoolsState:
    """What the planner is told at each look about the interval since the last one."""

    now: float
    arrived: int  # requests that arrived
    prompt_tokens: int  # their prompt tokens
    ttft_s: list[float]  # TTFT of the requests that got their first token
    itl_s: list[float]  # mean gap between decode tokens of the requests that finished
    output_tokens: list[int]  # output lengths of the requests that finished
    decode_running: int  # requests decoding on ready decode engines now
    prefill: Pool
    decode: Pool


class PoolScaler(Protocol):
    """What a disaggregated fleet calls every ``interval_s``: this planner, or the
    queue-length autoscaler run on each pool (pool_autoscale.py)."""

    interval_s: float

    def decide(self, state: PoolsState) -> list[tuple[str, ScaleDecision]]: ...


@dataclass
class SLAPlanner:
    """Dynamo's SLA planner over a ``PerformanceModel`` (see the module doc)."""

    model: PerformanceModel
    ttft_target_s: float = 1.0
    itl_target_s: float = 0.1
    interval_s: float = 10.0
    predictor: str = "trend"  # or "constant"
    lookahead_s: float = 0.0  # trend: predict this far past the next look (a start-up)
    kv_share: float = 0.8  # of a decode engine's KV pool the planned batch may fill
    down_after_s: float = 30.0  # a pool shrinks only after needing less for this long
    smoothing: float = 0.5  # weight of the newest measured/predicted ratio
    min_engines: int = 1
    max_engines: int = 8  # per pool
    prior_output_tokens: float = 128.0  # the mean output length until one has finished
    ttft_correction: float = 1.0
    itl_correction: float = 1.0
    rates: list[float] = field(default_factory=list)  # each interval's arrivals per second
    low_since: dict[str, float] = field(default_factory=dict)  # pool -> needing less since
    prompt_mean: float | None = None
    output_mean: float | None = None

    def __post_init__(self) -> None:
        if self.predictor not in ("constant", "trend"):
            raise ValueError(f"predictor must be 'constant' or 'trend', got {self.predictor!r}")
        if not 1 <= self.min_engines <= self.max_engines:
            raise ValueError(f"need 1 <= min_engines <= max_engines, got {self.min_engines} "
                             f"and {self.max_engines}")  # fmt: skip
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {self.smoothing}")

    # ---- 1. what comes next ----------------------------------------------------------------
    def _observe(self, state: PoolsState) -> None:
        self.rates.append(state.arrived / self.interval_s)
        if state.arrived:
            self.prompt_mean = state.prompt_tokens / state.arrived
        if state.output_tokens:
            self.output_mean = sum(state.output_tokens) / len(state.output_tokens)

    def predicted_rate(self) -> float:
        """Requests per second in the next interval."""
        if not self.rates:
            return 0.0
        if self.predictor == "constant" or len(self.rates) < 2:
            return self.rates[-1]
        steps = 1 + self.lookahead_s / self.interval_s  # intervals from the last one's middle
        return max(0.0, self.rates[-1] + (self.rates[-1] - self.rates[-2]) * steps)

    # ---- 3. what the model got wrong -------------------------------------------------------
    def _correct(self, state: PoolsState) -> None:
        prompt = self.prompt_mean or 1.0
        if state.ttft_s and state.prefill.ready:
            load = state.prompt_tokens / self.interval_s
            expected = self.model.ttft(prompt, load, state.prefill.ready)
            if math.isfinite(expected):  # an overload has no steady state to compare with
                measured = sum(state.ttft_s) / len(state.ttft_s)
                self.ttft_correction = self._smooth(self.ttft_correction, measured / expected)
        if state.itl_s and state.decode.ready and state.decode_running:
            batch = state.decode_running / state.decode.ready
            expected = self.model.itl(batch, self.context())
            measured = sum(state.itl_s) / len(state.itl_s)
            self.itl_correction = self._smooth(self.itl_correction, measured / expected)

    def _smooth(self, old: float, ratio: float) -> float:
        return (1 - self.smoothing) * old + self.smoothing * ratio

    def context(self) -> float:
        """A decoding request's mean context: its prompt and half its output."""
        output = self.output_mean or self.prior_output_tokens
        return (self.prompt_mean or 1.0) + output / 2

    # ---- 4. how many engines -----------------------------------------------------------------
    def prefill_needed(self, rate: float) -> tuple[int, str]:
        """Prefill engines for ``rate`` requests per second, and why."""
        prompt = self.prompt_mean or 1.0
        load = rate * prompt
        for n in range(self.min_engines, self.max_engines + 1):
            predicted = self.model.ttft(prompt, load, n) * self.ttft_correction
            if predicted <= self.ttft_target_s:
                break
        shown = "over its capacity" if math.isinf(predicted) else f"TTFT {predicted:.2f} s"
        why = (f"{rate:.1f} req/s x {prompt:.0f} prompt tokens = {load:,.0f} tok/s: "
               f"{n} engine(s) give {shown} with the measured correction "
               f"x{self.ttft_correction:.2f} (target {self.ttft_target_s:g} s)")  # fmt: skip
        return n, why

    def decode_needed(self, rate: float) -> tuple[int, str]:
        """Decode engines for ``rate`` requests per second, and why."""
        output = self.output_mean or self.prior_output_tokens
        load = rate * output
        context = self.context()
        batch = self.model.decode_batch(self.itl_target_s / self.itl_correction, context,
                                        self.kv_share)  # fmt: skip
        if batch == 0:
            return self.max_engines, (f"no batch meets ITL {self.itl_target_s * 1e3:g} ms with "
                                      f"the correction x{self.itl_correction:.2f}")  # fmt: skip
        per_engine = batch / self.model.itl(batch, context)
        n = min(self.max_engines, max(self.min_engines, math.ceil(load / per_engine)))
        why = (f"{rate:.1f} req/s x {output:.0f} output tokens = {load:,.0f} tok/s; a batch of "
               f"{batch} meets ITL {self.itl_target_s * 1e3:g} ms (measured correction "
               f"x{self.itl_correction:.2f}) within {self.kv_share:.0%} of the KV pool, "
               f"{per_engine:,.0f} tok/s an engine: {n} engine(s)")  # fmt: skip
        return n, why

    def decide(self, state: PoolsState) -> list[tuple[str, ScaleDecision]]:
        """Each pool's additions and removal, in words (empty: nothing to change)."""
        self._observe(state)
        self._correct(state)
        rate = self.predicted_rate()
        out: list[tuple[str, ScaleDecision]] = []
        for name, (needed, why) in zip(POOLS, (self.prefill_needed(rate),
                                               self.decode_needed(rate)), strict=True):  # fmt: skip
            pool: Pool = getattr(state, name)
            have = pool.ready + pool.starting
            if needed >= have:
                self.low_since.pop(name, None)
            if needed > have:
                out += [(name, ScaleDecision("add", None, f"{name}: {why}; {have} now"))
                        for _ in range(needed - have)]  # fmt: skip
            elif needed < have and not pool.starting and pool.held:
                since = self.low_since.setdefault(name, state.now)
                if state.now - since >= self.down_after_s:
                    replica = min(pool.held, key=lambda r: (pool.held[r], -r))
                    why += f"; {have} now, fewer needed for {state.now - since:.0f} s"
                    out.append((name, ScaleDecision("remove", replica, f"{name}: {why}")))
                    self.low_since[name] = state.now  # the next one waits as long again
        return out
