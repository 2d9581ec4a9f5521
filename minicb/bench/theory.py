"""What theory predicts for static against continuous batching, from lengths alone.

The step-time model: an iteration costs ``t = a + c * rows + p * tokens``, where ``rows``
counts one-token rows (decodes, and the padding rows static batching computes anyway) and
``tokens`` counts the tokens of longer rows (prompt chunks). ``fit_step_model`` fits
``a, c, p`` by least squares to the iterations actually measured in the run.

Both schedules are then replayed on paper from the workload's lengths (``simulate_static``,
``simulate_continuous``; the same rules as minicb's schedulers, with room in the KV pool for
everyone), summing the modelled step times: the predicted runtimes, and their ratio.

The limit case, for the docs: with output lengths exponential of mean m, steps that cost
the same whatever the batch (``c = p = 0``: memory-bound decode) and many requests, a
static batch of B lasts as long as its longest member, E[max] = m * H_B (H_B = 1 + 1/2 +
... + 1/B), while continuous batching keeps all B slots busy and spends m steps per B
requests on average: the ratio tends to H_B. No torch (numpy for the fit).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepModel:
    a: float  # seconds per iteration
    c: float  # seconds per one-token row
    p: float  # seconds per token of a longer row (prompt chunk)
    r2: float  # share of the variance of step times the model explains
    num_steps: int

    def step_time(self, rows: int, tokens: int) -> float:
        return self.a + self.c * rows + self.p * tokens

    def to_dict(self) -> dict[str, float]:
        return {"a_s": self.a, "c_s": self.c, "p_s": self.p, "r2": self.r2, "steps": self.num_steps}


def fit_step_model(steps: list[dict[str, float]]) -> StepModel:
    """Least squares of ``dt`` on (1, decode_rows, prefill_tokens) over StepLog rows."""
    if len(steps) < 3:
        raise ValueError(f"need at least 3 steps to fit the step-time model, got {len(steps)}")
    x = np.array([[1.0, s["decode_rows"], s["prefill_tokens"]] for s in steps])
    y = np.array([s["dt"] for s in steps])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / total if total > 0 else 1.0
    return StepModel(float(coef[0]), float(coef[1]), float(coef[2]), r2, len(steps))


class _Cost:
    """Accumulates the rows and tokens of one simulated iteration."""

    def __init__(self) -> None:
        self.rows = 0
        self.tokens = 0

    def add(self, n: int) -> None:
        if n == 1:
            self.rows += 1
        else:
            self.tokens += n


def _prefill_steps(prompts: list[int], budget: int, model: StepModel) -> float:
    """Prompts prefilled in order under a token budget, chunked: the seconds it takes."""
    left, total = list(prompts), 0.0
    while any(left):
        cost, room = _Cost(), budget
        for i, n in enumerate(left):
            take = min(n, room)
            if take:
                cost.add(take)
                left[i] -= take
                room -= take
        total += model.step_time(cost.rows, cost.tokens)
    return total


def simulate_static(
    prompts: list[int], outputs: list[int], batch: int, budget: int, model: StepModel
) -> float:
    """Batches of ``batch`` in order: prefill, then max(output) - 1 lockstep decode steps."""
    total = 0.0
    for b in range(0, len(prompts), batch):
        members = range(b, min(b + batch, len(prompts)))
        total += _prefill_steps([prompts[i] for i in members], budget, model)
        decode_steps = max(outputs[i] for i in members) - 1  # the first token ends prefill
        total += decode_steps * model.step_time(len(members), 0)
    return total


def simulate_continuous(
    prompts: list[int], outputs: list[int], slots: int, budget: int, model: StepModel
) -> float:
    """Iteration-level scheduling: decodes first, then prompt chunks, then admissions."""
    waiting = deque(range(len(prompts)))
    running: list[list[int]] = []  # [prompt tokens left, output tokens left]
    total = 0.0
    while waiting or running:
        cost, room = _Cost(), budget
        order = [r for r in running if r[0] == 0] + [r for r in running if r[0] > 0]
        for r in order:
            if not room:
                break
            room -= _advance(r, room, cost)
        while waiting and len(running) < slots and room:
            i = waiting.popleft()
            r = [prompts[i], outputs[i]]
            running.append(r)
            room -= _advance(r, room, cost)
        total += model.step_time(cost.rows, cost.tokens)
        running = [r for r in running if r[1] > 0]
    return total


def _advance(r: list[int], room: int, cost: _Cost) -> int:
    """One iteration of one request: a prompt chunk or a decode. Returns tokens used."""
    if r[0] == 0:
        cost.add(1)
        r[1] -= 1
        return 1
    take = min(r[0], room)
    cost.add(take)
    r[0] -= take
    if r[0] == 0:  # the prompt is done: its first token is sampled in this step
        r[1] -= 1
    return take


def harmonic(n: int) -> float:
    return sum(1.0 / k for k in range(1, n + 1))


def predict(
    prompts: list[int], outputs: list[int], slots: int, budget: int, model: StepModel
) -> dict[str, float]:
    """Predicted runtimes and the continuous-over-static throughput ratio."""
    static = simulate_static(prompts, outputs, slots, budget, model)
    continuous = simulate_continuous(prompts, outputs, slots, budget, model)
    return {
        "static_s": static,
        "continuous_s": continuous,
        "ratio": static / continuous if continuous > 0 else float("nan"),
        "harmonic_B": harmonic(slots),
    }
