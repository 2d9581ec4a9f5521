"""Frames: what a browser gets, folded from the engine's events at a rate it can draw.

A step event is the scheduler's whole plan (every row); at a GPU's 256 slots that is tens
of kilobytes an iteration, and a simulated H100 runs hundreds of iterations a second. A
page draws a few frames a second. So the server folds each engine's events into *frames*,
a bounded number a second, and every browser of the same kind (one that may read texts,
one that may not) gets the same frame, encoded and zlib-compressed once (broadcast.py):

    engine thread ──► one Subscription per engine (the frame hub's, never a browser's)
                          │  every 1/FRAME_HZ s: drain, fold (StepFolder), encode and
                          │  compress per class
                          ▼
                      each browser's outbox (bounded) ──► its socket

What a frame keeps and what it folds:
- every iteration's figures, as a *digest* (``digest``): the plan's own numbers (step,
  times, slots, budget, KV pool, queues), its decisions with their reasons, and what the
  rows add up to (useful and padding rows, tokens, padding tokens, tokens generated),
  plus the rows that changed phase since the iteration before (``row_changes``). Nothing
  is lost: the charts and counters get every iteration's numbers, and a request's row on
  the timeline is rebuilt exactly from its changes;
- where a step has few rows (the real demo's 8 slots), each row's detail (``rows``) and
  the request events of every token, as before;
- the rows that verified a speculative draft (``drafts``: guesses and accepted), at any
  batch size: a few numbers for each row that drafted, nothing in a step that did not;
- the KV map: where the pool is small enough to draw block by block, each digest carries
  its step's ``kv_ops`` (exact: block ids); at a GPU's scale the frame carries a
  ``kv_grid`` a few times a second instead, one cell for several blocks.

A browser that joins, or one that falls behind (its outbox full: a slow tab), gets a
*view*: the folder's state as of the last frame (the requests held and the latest that
ended, each with the phases its row went through: request_history.py; the last
iterations' digests, the KV map) and then the frames after it. A class that opens the
page between two bursts so sees the last burst drawn, not an empty timeline. A slow tab
gets coarser pictures, never a broken one, and never makes the engine or another tab
wait. Pure Python.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from minicb.core.events import StepEvent
from minicb.core.scheduler.plan import DECISION_LISTS, StepPlan
from minicb.server.request_history import RequestHistory
from minicb.telemetry.event_json import kv_ops_copy, to_dict
from minicb.telemetry.kv_state import KVState

FRAME_HZ = 12  # frames a second to each browser: smooth enough, and few enough to stay light
DETAIL_ROWS = 64  # a step with this many rows or fewer keeps each row's detail and tokens
EXACT_BLOCKS = 4096  # a pool this small is drawn block by block: digests carry kv_ops
KV_GRID_CELLS = 2048  # at most this many cells in a large pool's folded map
KV_GRID_EVERY = 4  # frames between two grids of a large pool (about 3 a second)
RECENT_STEPS = 300  # digests a view carries: the charts' longest window
TRANSFERS_KEPT = 14  # kv_transfer events a view carries: the page's strip lists as many
# Phase codes, as the page's timeline numbers them (viz/model.js PHASE).
PHASE_CODES = {"prefill": 1, "decode": 2, "padding": 3}
NOT_SCHEDULED = -1  # a row change: this request ran no row in this iteration
# The plan's figures a digest keeps as they are.
STEP_FIELDS = (
    "step", "batching", "block_size", "budget_used", "budget_limit", "slots_used",
    "slots_limit", "kv_used", "kv_free", "kv_total", "kv_swapped", "kv_cached", "kv_shared",
    "prefix_query_tokens", "prefix_hit_tokens", "kv_host_cached", "prefix_host_hit_tokens",
    "num_waiting", "num_swapped", "notes", "admitted", "preempted", "swapped_out",
    "swapped_in", "drafted", "proposer", "finished",
)  # fmt: skip
CLOCK_FIELDS = ("wall_start", "wall_end", "busy_s", "device_start")
TIMING_FIELDS = (
    "schedule_s", "forward_s", "sample_s", "tensor_parallel_size", "collective_s",
    "bandwidth_util", "flop_util", "prepare_s", "process_s",  # the last two: the lanes
)  # fmt: skip


class StepFolder:
    """One engine's events folded into digests, and the state a joining browser needs.

    ``info`` is the engine's description (LLMEngine.describe, with its live requests and
    its KV snapshot event under "requests" and "kv"), read in the engine thread at the
    moment this folder's subscription began, so no event falls between them.
    """

    def __init__(self, info: dict[str, Any], kv: KVState) -> None:
        self.reset(info, kv)

    def reset(self, info: dict[str, Any], kv: KVState | None = None) -> None:
        name = info.get("name") or getattr(self, "info", {}).get("name")  # a reset's info has none
        self.info = {k: v for k, v in info.items() if k != "requests"} | {"name": name}
        self.kv_total = int(info.get("kv_total") or 0)
        self.exact = self.kv_total <= EXACT_BLOCKS
        self.kv = kv or KVState()
        self.rows: dict[int, int] = {}  # request id -> phase code of its row last iteration
        # each request's life as a page draws it, the live ones and the latest that ended
        self.history = RequestHistory(info.get("requests", ()), int(info.get("ended") or 0))
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_STEPS)
        # The latest KV transfers into this engine (disaggregated): a page that joins after
        # a request's KV arrived still lists it between the panels.
        self.transfers: deque[dict[str, Any]] = deque(maxlen=TRANSFERS_KEPT)

    # ---- folding ---------------------------------------------------------------------------
    def fold(self, events: Iterable[Any], tokens: bool) -> list[dict[str, Any]]:
        """The frame's events: a digest per step event, the request events as dicts (token
        events only where ``tokens``), in the order they came."""
        out = []
        for e in events:
            if isinstance(e, StepEvent):
                out.append(self.digest(e))
                continue
            data = to_dict(e)
            kind = data["type"]
            if kind == "reset":
                self.reset(data["info"])
            elif kind == "kv_snapshot":  # a trace's whole map (live, the bus carries none)
                self.kv = KVState.from_snapshot(e)
            elif kind == "kv_changes":  # made between two steps: the map changes now
                self.kv.apply(e.kv_ops)
                if not self.exact:
                    continue  # a large pool's map travels as a grid
            else:
                self.history.note(data, self._last_step())
                if kind == "kv_transfer":
                    self.transfers.append(data)
                if kind == "tokens" and not tokens:
                    continue
                data.pop("params", None)  # every sampling setting: the page draws none of them
            out.append(data)
        return out

    def digest(self, e: StepEvent) -> dict[str, Any]:
        """One iteration as a page draws it (see the module docstring)."""
        plan = e.plan
        data: dict[str, Any] = {"type": "step", **_plan_figures(plan)}
        # The step's durations to the microsecond (shorter numbers, fewer bytes); its clock
        # readings as they are: the page adds them up into each side's own clock.
        data.update((name, getattr(e, name)) for name in CLOCK_FIELDS)
        data.update((name, _short(getattr(e, name))) for name in TIMING_FIELDS)
        useful = padding = tokens = padding_tokens = prefill_tokens = generated = 0
        rows: dict[int, int] = {}
        detail = len(plan.scheduled) <= DETAIL_ROWS
        details = []
        drafts = []  # [request id, guesses, accepted] of each row that verified a draft
        for row in plan.scheduled:
            code = PHASE_CODES.get(row.phase, 2)
            rows[row.request_id] = code
            tokens += row.num_tokens
            if code == 3:
                padding += 1
                padding_tokens += row.num_tokens
                continue
            useful += 1
            prefill_tokens += row.num_tokens if code == 1 else 0
            generated += (1 + row.num_accepted_tokens) if row.samples else 0
            if row.num_draft_tokens:
                drafts.append([row.request_id, row.num_draft_tokens, row.num_accepted_tokens])
            if detail:
                details.append([row.request_id, row.num_tokens, row.context_len])
        changes = [[rid, code] for rid, code in rows.items() if self.rows.get(rid) != code]
        changes += [[rid, NOT_SCHEDULED] for rid in self.rows if rid not in rows]
        self.rows = rows
        self.history.note_step(plan, rows, changes)
        data.update(
            useful_rows=useful, padding_rows=padding, num_tokens=tokens,
            padding_tokens=padding_tokens, prefill_tokens=prefill_tokens, generated=generated,
            row_changes=changes,
        )  # fmt: skip
        if detail:
            data["rows"] = details
        if drafts:  # at any batch size: a step's drafts cost what it drafted
            data["drafts"] = drafts
        self.kv.apply(plan.kv_ops)
        if self.exact:  # a small pool: its changes, block by block
            data["kv_ops"] = kv_ops_copy(plan.kv_ops)
        self.recent.append(data)
        for d in plan.finished:
            self.history.end(d.request_id, plan.step)
        return data

    def _last_step(self) -> int:
        return self.recent[-1]["step"] if self.recent else int(self.info.get("step") or 0)

    # ---- what a joining page gets ------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        """The engine as of the last fold: its description, the requests it holds (with the
        phase of their last row) and the latest that ended (with ``end_step`` and
        ``finish_reason``), each with its ``history``, in the order they came; how many
        ended in all (``ended_total``); the recent digests, the latest KV transfers into it,
        and its KV map (exact or folded)."""
        view = {**self.info, "requests": self.history.listed(self.rows)}
        view["recent"] = list(self.recent)
        view["ended_total"] = self.history.ended_total
        view["transfers"] = list(self.transfers)
        if self.exact:
            view["kv"] = {
                "block_tables": {str(r): t for r, t in self.kv.block_tables.items()},
                "swap_tables": {str(r): t for r, t in self.kv.swap_tables.items()},
                "cached_blocks": self.kv.cached_blocks,
            }
        else:
            view["kv_grid"] = self.grid()
        return view

    def grid(self) -> dict[str, Any]:
        """The pool folded into at most KV_GRID_CELLS cells of ``per`` blocks each: a cell
        shows the request holding most of its blocks if any is held (a pool's blocks are
        scattered: a majority rule would hide most of them), else -2 if any is cached, else
        -1 (free)."""
        total = self.kv_total
        per = max(1, -(-total // KV_GRID_CELLS))
        owners = self.kv.owners(total)
        cells = []
        for start in range(0, total, per):
            counts: dict[int, int] = {}
            for owner in owners[start : start + per]:
                counts[owner] = counts.get(owner, 0) + 1
            held = [o for o in counts if o >= 0]
            cells.append(max(held, key=counts.__getitem__) if held else min(counts))
        swapped = sum(len(t) for t in self.kv.swap_tables.values())
        step = self._last_step()
        return {"per": per, "total": total, "cells": cells, "swapped": swapped, "step": step}


def _short(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value


def _plan_figures(plan: StepPlan) -> dict[str, Any]:
    """The plan's STEP_FIELDS, JSON-ready (the decisions as dicts), without building a dict
    of every row as plan_to_dict does: at 256 rows those were most of a fold's time in
    the server's loop (a profile with 20 viewers), and a digest sends the rows' sums."""
    out: dict[str, Any] = {}
    for name in STEP_FIELDS:
        value = getattr(plan, name)
        if name in DECISION_LISTS:
            value = [dict(vars(d)) for d in value]
        elif name == "notes":
            value = list(value)
        out[name] = value
    return out
