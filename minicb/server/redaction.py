"""What a client that may not read texts receives: an allow-list over the events.

    shown = redact_event(event)   # event: one event as a JSON dict (telemetry.event_json.to_dict)

A viewer of the timeline (and, in serve mode, anyone but the page that typed a prompt)
must not learn what the API's users wrote or got back. Blanking the few keys known to hold
text is a deny-list: the first new field or reason that renders tokens leaks (the drafted
reasons once quoted the matched n-gram as text, and ``arrived`` carried the stop strings).
So this keeps, per event type, only the keys listed below, recursing into the step
event's rows and decisions; a key not listed is dropped, an event type not listed keeps
only who and when. Text keys the page looks up stay present but blank (``prompt`` None,
``text`` "", ``token_id`` None: an id gives its token's text away), and words the
scheduler writes (reasons, notes, errors) pass through ``text_free``, which cuts out
anything quoted. ``redacted: True`` marks an event that lost anything.

A field added to an event must be added here to reach viewers
(tests/server/test_redaction.py fails until it is classified). Pure Python.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container
from typing import Any

# A rule turns a value into what a text-free view shows, and says whether it changed it.
Rule = Callable[[Any], tuple[Any, bool]]

QUOTED = re.compile(r"""['"`].*['"`]|['"`].*$""", re.DOTALL)  # first quote to the last
ELIDED = "…"


def text_free(words: str) -> str:
    """``words`` (a reason, a note, an error) with everything from its first quote mark to
    its last cut out: a message that quotes a request's text ("the chat template refused
    these messages: 'my secret'") shows "…" there. The scheduler's own reasons quote
    nothing, so they pass unchanged."""
    return QUOTED.sub(ELIDED, words)


def _keep(value: Any) -> tuple[Any, bool]:
    return value, False


def _blank(blank: Any) -> Rule:
    return lambda value: (blank, value != blank)


def _words(value: Any) -> tuple[Any, bool]:
    if not isinstance(value, str):
        return None, value is not None
    shown = text_free(value)
    return shown, shown != value


def _each(rule: Rule) -> Rule:
    """A list, ``rule`` applied to each item."""

    def apply(value: Any) -> tuple[Any, bool]:
        if not isinstance(value, list):
            return [], True
        pairs = [rule(item) for item in value]
        return [shown for shown, _ in pairs], any(changed for _, changed in pairs)

    return apply


def _fields(spec: dict[str, Rule]) -> Rule:
    """A dict, with only the keys of ``spec``, each through its rule."""

    def apply(value: Any) -> tuple[Any, bool]:
        if not isinstance(value, dict):
            return {}, True
        out, changed = {}, False
        for key, item in value.items():
            rule = spec.get(key)
            if rule is None:
                changed = True
                continue
            out[key], touched = rule(item)
            changed |= touched
        return out, changed

    return apply


def _keeping(*names: str, **rules: Rule) -> dict[str, Rule]:
    return {**dict.fromkeys(names, _keep), **rules}


WHO = ("type", "time", "request_id", "step")  # every request event's who and when
PROMPT = _blank(None)
ROW = _fields(
    _keeping(
        "request_id",
        "phase",
        "num_tokens",
        "start_position",
        "context_len",
        "block_table",
        "num_blocks",
        "store_kv",
        "samples",
        "num_draft_tokens",
        "num_accepted_tokens",
    )
)
DECISION = _fields(_keeping("request_id", "mode", "num_cached_tokens", reason=_words))
# Sampling settings that are numbers; the stop strings and stop ids are left out.
PARAMS = _fields(_keeping("max_tokens", "temperature", "top_k", "top_p", "seed", "ignore_eos"))
STEP_FIGURES = (
    "step", "batching", "block_size", "swap_out_map", "swap_in_map", "budget_used",
    "budget_limit", "slots_used", "slots_limit", "kv_used", "kv_free", "kv_total",
    "kv_swapped", "kv_cached", "kv_shared", "prefix_query_tokens", "prefix_hit_tokens",
    "offload_map", "reload_map", "kv_host_cached", "prefix_host_hit_tokens",
    "num_waiting", "num_swapped", "block_tables", "swap_tables", "cached_blocks", "kv_ops",
    "wall_start", "wall_end", "schedule_s", "forward_s", "sample_s",
    "tensor_parallel_size", "collective_s", "bandwidth_util", "flop_util", "busy_s",
    "device_start", "prepare_s", "process_s",  # the host's and the device's lanes
    # a frame's digest of a step (server/frames.py): counts, and rows as lists of numbers
    "useful_rows", "padding_rows", "num_tokens", "padding_tokens", "prefill_tokens",
    "generated", "row_changes", "rows", "drafts",
    "proposer",  # the word of the setting speculative (SpeculationSettings), never text
)  # fmt: skip
DECISIONS = ("admitted", "preempted", "swapped_out", "swapped_in", "drafted", "finished")

ALLOWED: dict[str | None, dict[str, Rule]] = {
    "step": _keeping(
        "type",
        *STEP_FIGURES,
        scheduled=_each(ROW),
        notes=_each(_words),
        **dict.fromkeys(DECISIONS, _each(DECISION)),
    ),
    "arrived": _keeping(
        *WHO, "num_prompt_tokens", "max_tokens", "priority", prompt=PROMPT, params=PARAMS
    ),
    "admitted": _keeping(*WHO, reason=_words),
    "first_token": _keeping(*WHO),
    # which request got how many tokens stays; which tokens they were does not
    "tokens": _keeping(
        "type", "time", "step", "request_ids", "indexes",
        token_ids=_each(_blank(None)), texts=_each(_blank("")),
    ),  # fmt: skip
    "preempted": _keeping(*WHO, "mode", reason=_words),
    "swapped_out": _keeping(*WHO, reason=_words),
    "swapped_in": _keeping(*WHO, reason=_words),
    "finished": _keeping(
        *WHO,
        "finish_reason",
        "num_prompt_tokens",
        "num_output_tokens",
        "num_preemptions",
        "num_draft_tokens",
        "num_accepted_tokens",
        reason=_words,
    ),
    "aborted": _keeping(*WHO, "num_output_tokens"),
    "rejected": _keeping(*WHO, "num_prompt_tokens", prompt=PROMPT, error=_words),
    # the router's reason is counts only ("96 of 128 prompt tokens cached"); _words anyway
    "routed": _keeping(*WHO, "replica", "policy", "cached_tokens", reason=_words),
    # a KV transfer between engines: names of engines, counts and times; reason in words
    "kv_transfer": _keeping(
        *WHO, "from_engine", "to_engine", "blocks", "bytes", "seconds", "status", reason=_words
    ),
    # the rebuilt engine's settings and pool sizes (EngineConfig, runner): no request's text
    "reset": _keeping("type", "time", "info"),
    # changes to the pool between two steps: block ids and counts
    "kv_changes": _keeping("type", "time", "step", "kv_ops", "kv_used", "kv_free", "kv_cached"),
    "kv_snapshot": _keeping(
        "type",
        "time",
        "step",
        "block_tables",
        "swap_tables",
        "cached_blocks",
        "host_cached_blocks",
    ),
    # no type: a request as a page that joins is told of it (LLMEngine.live_requests, and
    # server/frames.py's view: its row, its phases' history, its end)
    None: _keeping(
        "request_id",
        "arrival",
        "start_step",
        "num_prompt_tokens",
        "max_tokens",
        "first_token_time",
        "arrival_busy_s",
        "first_token_busy_s",
        "first_token_step",
        "history",  # [step, phase code] at each change of its row: no text
        "end_step",
        "finish_reason",
        "row",
        prompt=PROMPT,
    ),
}
UNKNOWN = _keeping(*WHO)  # an event type not listed above: who and when only


def with_own_tokens(
    shown: dict[str, Any], event: dict[str, Any], own: Container[int]
) -> dict[str, Any]:
    """A redacted ``tokens`` event (``shown``) with the entries of the requests in ``own``
    as ``event`` has them: one event holds every request's tokens of a step, and a page
    sees the text of what it typed itself. ``shown`` is not modified."""
    keep = [i for i, rid in enumerate(event["request_ids"]) if rid in own]
    if not keep:
        return shown
    token_ids, texts = list(shown["token_ids"]), list(shown["texts"])
    for i in keep:
        token_ids[i], texts[i] = event["token_ids"][i], event["texts"][i]
    return {**shown, "token_ids": token_ids, "texts": texts}


def redact_event(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` as a client that may not read texts receives it: only the allow-listed
    keys of its type, text keys blanked, words made text-free, and ``redacted: True`` if
    anything was removed or changed. Pure: ``event`` is not modified (unchanged parts are
    shared with it, not copied)."""
    spec = ALLOWED.get(event.get("type"), UNKNOWN)
    shown, changed = _fields({**spec, "redacted": _keep})(event)
    if changed:
        shown["redacted"] = True
    return shown
