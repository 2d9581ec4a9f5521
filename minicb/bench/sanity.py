"""The benchmark's figures checked before any ratio is made or any goal judged: a figure no
correct run can give is an error (``ImplausibleFigure``) that names the system and the
figure, never a result.

Why: a bug once made every hf-padded run seem to last 1.8e9 s (a token position overwrote
the batch's start time); ``minicb bench --quick`` printed 0.0 tok/s for it, ratios near 1e9
against it, and two goals "met" on that zero (issue 52). Each check below is a fact that
every correct run obeys on any machine, so none of them can fail on a slow or busy one:

- ``check_run``, on every run as its record is made (``minicb.bench.run_record``): every
  request finished with exactly the tokens it asked for (the suite's requests run with
  exact lengths); the events lie within the run (none before its start, none after its
  end, so their span, which the rates divide by, is no longer than its wall time); every
  figure is finite; the rates are positive.
- ``check_ratios``, on each offline workload's runs before its ratio table is made
  (``Suite.workload``; the goals read that table): every paired ratio of output tokens/s
  is finite and at most ``ratio_bound``, the most that batching can explain (derived
  there), times a stated slack.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from minicb.bench.recipes import MINICB

if TYPE_CHECKING:
    from minicb.bench.run_records import RunRecord
    from minicb.workload import Workload


class ImplausibleFigure(ValueError):
    """A figure no correct run can give: a bug in how a run was measured or rebuilt."""


# Clocks: a run's events and its start and end are read from one clock, except
# hf-continuous's, whose per-token stamps (time.perf_counter) are moved to the wall clock
# once, after the run; the two clocks may drift apart by the wall clock's slewing (at most
# 0.05 % of the time that passed) and the move itself costs microseconds. 10 ms plus 1 %
# of the run covers both many times over; the bug above was off by 1.8e9 s.
CLOCK_SLACK_S = 0.01
CLOCK_SLACK = 0.01

RATES = ("output_tok_s", "total_tok_s", "req_s")


def _fail(rec: RunRecord, figure: str, why: str) -> ImplausibleFigure:
    return ImplausibleFigure(
        f"{rec.system} on {rec.workload}: {figure} {why}; no correct run gives this: the "
        "bug is in how this system's run was measured or rebuilt"
    )


def check_run(rec: RunRecord, workload: Workload) -> None:
    """Raise ``ImplausibleFigure`` if ``rec`` (a run of ``workload``) has a figure no
    correct run can give; a run that did not run (``rec.error``) has no figures to check."""
    if rec.error:
        return
    requests = rec.summary.get("requests", {})
    finished, tokens = requests.get("finished"), requests.get("tokens_generated")
    if finished != len(workload.requests):
        raise _fail(rec, "finished requests", f"= {finished} of {len(workload.requests)}")
    if tokens != sum(workload.output_lens):
        raise _fail(rec, "tokens generated", f"= {tokens}, asked {sum(workload.output_lens)}")
    wall = rec.wall_s
    if not (math.isfinite(wall) and wall > 0):
        raise _fail(rec, "wall_s", f"= {wall}")
    slack = CLOCK_SLACK_S + CLOCK_SLACK * wall
    first, last = rec.span
    if first < -slack:
        raise _fail(rec, "its first event", f"is {-first:.3g} s before the run started")
    if last > wall + slack:
        raise _fail(rec, "its last event", f"is {last - wall:.3g} s after the run ended")
    duration = rec.summary.get("duration_s", 0.0)
    if duration > wall + slack:  # what the rates divide by
        raise _fail(rec, "duration_s", f"= {duration:.3g} s is longer than the run ({wall:.3g} s)")
    figures = rec.figures
    for key, value in figures.items():
        if value is not None and not math.isfinite(value):
            raise _fail(rec, key, f"= {value}")
    for key in RATES:
        if not (figures.get(key) or 0) > 0:
            raise _fail(rec, key, f"= {figures.get(key)} after {tokens} tokens were generated")


# ---- the bound on a ratio -------------------------------------------------------------------
# Two systems x and y run the same requests, which ask for U output tokens in all, with at
# most B requests in a step (B: the suite's max_num_seqs, every system's limit). Let c(t)
# be what a step of t tokens costs: it grows with t, and never faster than t (batching
# never makes a token dearer: c(t) / t does not grow). Every output token is one row of
# one step, so x's steps hold at least U rows, at most B in each; a step of k <= B rows
# costs at least c(k) >= (k / B) c(B), so x takes at least (U / B) c(B). y's steps are
# known (t_s tokens each, padding included): each costs c(t_s) <= c(max(B, t_s)) <=
# (max(B, t_s) / B) c(B). Tokens/s being U over the time taken,
#
#     tok/s(x) / tok/s(y) = time(y) / time(x) <= sum over y's steps of max(B, t_s) / U,
#
# y's step-equivalents against the fewest any system can take: for static batching, the
# slots it kept (padding rows and empty slots) over the rows that made a token, the ratio
# of padded to useful work; 1 for a system that fills every slot. Where y's steps are not
# visible (hf-continuous), it took at most one step per token it computed (T: prompts and
# outputs), so the sum is at most (B + 1) T. On top of it, a slack for what the bound
# leaves out:
# - two minicb systems share the weights and kernels (their ratios measure scheduling and
#   nothing else): only the machine's load changing between the two runs of a pair, and a
#   short run's share of a time slice. The most seen: 0.70 of the bound on the tiny test
#   model (runs of 30 ms), 0.64 in `minicb bench --quick` on the default model (fixed,
#   sorted static over static, 1.25 against 1.94), both at load 6 to 19 on 2 cores.
#   Allowed: 4x.
# - minicb against transformers: also how much faster one's step is than the other's on the
#   same weights (the same matmuls per token; not the same Python, attention or graphs),
#   which no count of steps bounds. In that --quick run transformers' padded step took 2.6x
#   minicb static's (TPOT 446 against 169 ms) and minicb over hf-padded reached 0.97 of
#   the bound (capped-exp, 4.22 against 4.34); an H200 with CUDA graphs decodes 17 to 24x
#   faster than transformers (docs/performance.md). Allowed: 32x.
# The bug above gave 1e9.
SAME_KERNELS_SLACK = 4.0
OTHER_KERNELS_SLACK = 32.0


def step_equivalents(rec: RunRecord, workload: Workload, slots: int) -> float:
    """Sum over ``rec``'s steps of max(``slots``, its tokens); where its steps are not
    visible, the most any engine can take: (slots + 1) x every token it computed."""
    if rec.steps:
        return float(sum(max(slots, s["tokens"]) for s in rec.steps))
    computed = sum(workload.prompt_lens) + sum(workload.output_lens)
    return float((slots + 1) * computed)


def ratio_bound(num: str, den: RunRecord, workload: Workload, slots: int) -> float:
    """The most that system ``num``'s output tokens/s can be over ``den``'s on ``workload``
    with ``slots`` requests a step: the derivation above, with its slack."""
    same = num in MINICB and den.system in MINICB
    slack = SAME_KERNELS_SLACK if same else OTHER_KERNELS_SLACK
    return slack * step_equivalents(den, workload, slots) / sum(workload.output_lens)


def check_ratios(workload: Workload, runs: dict[str, list[RunRecord]], slots: int) -> None:
    """Every paired ratio of output tokens/s among ``runs`` (system -> its repeats, as
    ``ratio_table`` pairs them) finite and within ``ratio_bound``, else
    ``ImplausibleFigure`` naming both systems, the repeat and the bound. Each run is
    checked first (``check_run``): a ratio of an implausible figure is never made."""
    for rec in (r for recs in runs.values() for r in recs):
        check_run(rec, workload)
    for x, xs in runs.items():
        for y, ys in runs.items():
            for repeat, (rx, ry) in enumerate(zip(xs, ys, strict=False)):
                if x == y or rx.error or ry.error:
                    continue
                ratio = rx.figures["output_tok_s"] / ry.figures["output_tok_s"]
                bound = ratio_bound(x, ry, workload, slots)
                if not (math.isfinite(ratio) and ratio <= bound):
                    raise ImplausibleFigure(
                        f"{x} / {y} on {workload.name}, repeat {repeat + 1}: output tok/s "
                        f"ratio {ratio:.3g} is over {bound:.3g}, the most that batching "
                        f"and the slack explain ({y}'s step-equivalents over the tokens "
                        "asked): the bug is in how one of the two runs was measured"
                    )
