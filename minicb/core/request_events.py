"""One request's life as events, and the tokens of a step; built from the engine's objects.

- ``RequestArrived`` ... ``RequestRejected``: one request's life, stamped with the engine's
  clock; ``RequestRouted`` and ``KVTransfer``: a fleet sending it to a replica, its KV moving
  from a prefill engine to a decode engine;
- ``StepTokens``: the tokens of one iteration, every request's at once;
- ``arrived``, ``rejected`` and ``step_request_events``: the engine's requests, decisions
  and tokens turned into those events, in the documented order.

The step event, the KV map's events and the kinds are in events.py, the JSON form in
event_json.py; docs/events.md documents every field. Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from minicb.core.request import TokenDelta

if TYPE_CHECKING:
    from minicb.core.events import StepEvent
    from minicb.core.request import Request, RequestOutput
    from minicb.core.scheduler.plan import StepPlan


# ---- one request's life ----------------------------------------------------------------
@dataclass(kw_only=True)
class RequestEvent:
    """Base of the request events: when, and which request."""

    kind: ClassVar[str] = "request"

    time: float  # seconds on the engine's clock (the wall clock unless a runner's virtual one)
    request_id: int


@dataclass(kw_only=True)
class RequestArrived(RequestEvent):
    kind: ClassVar[str] = "arrived"

    prompt: str | None  # the prompt text, or None when it was given as token ids
    num_prompt_tokens: int
    max_tokens: int
    priority: int
    params: dict[str, Any]  # every SamplingParams field


@dataclass(kw_only=True)
class StepRequestEvent(RequestEvent):
    """A request event caused by an iteration; ``step`` is that StepEvent's index."""

    step: int


@dataclass(kw_only=True)
class RequestAdmitted(StepRequestEvent):
    kind: ClassVar[str] = "admitted"

    reason: str


@dataclass(kw_only=True)
class RequestFirstToken(StepRequestEvent):
    kind: ClassVar[str] = "first_token"


@dataclass(kw_only=True)
class StepTokens:
    """Every token one iteration gave, in the order of its rows: one entry per token in
    each list (a request that speculated may have several). One event per step, not one
    per token: a listener handles a step's tokens in one call, a trace writes one line."""

    kind: ClassVar[str] = "tokens"

    time: float  # the step's end, when its results were ready
    step: int
    request_ids: list[int]
    token_ids: list[int]
    indexes: list[int]  # each token's place in its request's output, 0 for the first
    texts: list[str]  # the text each adds ("" while a multi-byte character is incomplete)

    def deltas(self) -> Iterator[TokenDelta]:
        """The tokens one by one, as the engine hands them out."""
        for rid, token, text, index in zip(
            self.request_ids, self.token_ids, self.texts, self.indexes, strict=True
        ):
            yield TokenDelta(rid, token, text, index)


@dataclass(kw_only=True)
class RequestPreempted(StepRequestEvent):
    kind: ClassVar[str] = "preempted"

    mode: str  # "recompute" or "swap"
    reason: str


@dataclass(kw_only=True)
class RequestSwappedOut(StepRequestEvent):
    kind: ClassVar[str] = "swapped_out"

    reason: str


@dataclass(kw_only=True)
class RequestSwappedIn(StepRequestEvent):
    kind: ClassVar[str] = "swapped_in"

    reason: str


@dataclass(kw_only=True)
class RequestFinished(StepRequestEvent):
    kind: ClassVar[str] = "finished"

    finish_reason: str | None  # "stop" or "length"
    reason: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_preemptions: int
    num_draft_tokens: int = 0  # speculative tokens verified for it over its life
    num_accepted_tokens: int = 0  # of those, the ones kept as output


@dataclass(kw_only=True)
class RequestAborted(RequestEvent):
    kind: ClassVar[str] = "aborted"

    num_output_tokens: int


@dataclass(kw_only=True)
class RequestRejected(RequestEvent):
    """A request refused at the door; it never got an id, so ``request_id`` is -1."""

    kind: ClassVar[str] = "rejected"

    request_id: int = -1
    prompt: str | None  # the prompt text, or None when it was not a string
    num_prompt_tokens: int | None  # its length when it was a list of token ids
    error: str


@dataclass(kw_only=True)
class RequestRouted(RequestEvent):
    """A fleet's router sent the request to a replica (minicb/fleet/router.py), published on
    that replica's bus just before the replica's own ``arrived``: the id is the replica's
    own request id, as its other events and the API's X-Minicb-Request-Id give it."""

    kind: ClassVar[str] = "routed"

    replica: int  # the replica's index in the fleet
    policy: str  # "round-robin", "least-loaded" or "prefix-aware"
    reason: str  # in words, counts only: "replica 1: 96 of 128 prompt tokens cached there"
    cached_tokens: int  # the router's estimate of the prompt tokens cached on that replica


@dataclass(kw_only=True)
class KVTransfer(RequestEvent):
    """A request's KV cache moving from a prefill engine to a decode engine (disaggregated
    serving, minicb/fleet/disagg_fleet.py), on the decode engine's bus: the id is the
    decode engine's own request id. One event per change of ``status``: "waiting" (no room
    on the decode side: the KV stays on the prefill side, ``reason`` says why), "receiving"
    (blocks allocated here, the bytes on their way), "done" or "failed" (``reason``)."""

    kind: ClassVar[str] = "kv_transfer"

    from_engine: str  # the prefill engine's name, e.g. "prefill0"
    to_engine: str  # the decode engine's name, e.g. "decode0"
    blocks: int  # blocks allocated for it on the decode side
    bytes: int  # bytes of KV (values and 8-bit scales) sent; 0 until "done"
    seconds: float  # from the receive's start to the last byte; 0 until "done"
    status: str  # "waiting", "receiving", "done" or "failed"
    reason: str  # in words, counts only


# ---- built from the engine's objects -----------------------------------------------------
def arrived(req: Request) -> RequestArrived:
    return RequestArrived(
        time=req.arrival_time,
        request_id=req.request_id,
        prompt=req.prompt,
        num_prompt_tokens=req.num_prompt_tokens,
        max_tokens=req.params.max_tokens,
        priority=req.priority,
        params=asdict(req.params),
    )


def rejected(prompt: Any, error: str, now: float) -> RequestRejected:
    text = prompt if isinstance(prompt, str) else None
    length = len(prompt) if isinstance(prompt, list | tuple) else None
    return RequestRejected(time=now, prompt=text, num_prompt_tokens=length, error=error)


def _positions(values: list[int], wanted: int) -> Iterator[int]:
    """Where ``wanted`` is in ``values``, in order; each search is list.index's, in C."""
    row = -1
    try:
        while True:
            row = values.index(wanted, row + 1)
            yield row
    except ValueError:
        return


def step_request_events(
    step: StepEvent,
    new_tokens: list[TokenDelta],
    finished: list[RequestOutput],
    wants: Callable[[str], bool],
) -> Iterator[RequestEvent | StepTokens]:
    """The request events of one step, in the documented order: preempted, swapped out,
    swapped in, admitted (stamped ``wall_start``, when the scheduler decided), then first
    token, the step's tokens and finished (stamped ``wall_end``, when results were ready).
    Nothing is built for a kind that ``wants`` refuses."""
    plan, start, end = step.plan, step.wall_start, step.wall_end
    n = plan.step
    if wants("preempted"):
        for d in plan.preempted:
            yield RequestPreempted(
                time=start, request_id=d.request_id, step=n, mode=d.mode or "", reason=d.reason
            )
    for kind, decisions, cls in (
        ("swapped_out", plan.swapped_out, RequestSwappedOut),
        ("swapped_in", plan.swapped_in, RequestSwappedIn),
        ("admitted", plan.admitted, RequestAdmitted),
    ):
        if wants(kind):
            for d in decisions:
                yield cls(time=start, request_id=d.request_id, step=n, reason=d.reason)
    if new_tokens and (wants("tokens") or wants("first_token")):
        # The tokens' columns, one comprehension each (Python 3.11 reads a slot attribute
        # in a comprehension twice as fast as map(attrgetter(...)) does), and the first
        # tokens found by list.index, in C: at 256 rows this is most of what building a
        # step's events costs (docs/performance.md, the live view at scale).
        rids = [d.request_id for d in new_tokens]
        indexes = [d.index for d in new_tokens]
        if wants("first_token"):
            for row in _positions(indexes, 0):
                yield RequestFirstToken(time=end, request_id=rids[row], step=n)
        if wants("tokens"):
            token_ids = [d.token_id for d in new_tokens]
            texts = [d.text for d in new_tokens]
            yield StepTokens(time=end, step=n, request_ids=rids, token_ids=token_ids,
                             indexes=indexes, texts=texts)  # fmt: skip
    if wants("finished"):
        yield from _finished_events(plan, finished, end)


def _finished_events(
    plan: StepPlan, finished: list[RequestOutput], end: float
) -> Iterator[RequestFinished]:
    outputs = {o.request_id: o for o in finished}
    for d in plan.finished:
        out = outputs.get(d.request_id)
        if out is None:  # aborted between steps: already told by its aborted event
            continue
        yield RequestFinished(
            time=end,
            request_id=d.request_id,
            step=plan.step,
            finish_reason=out.finish_reason,
            reason=d.reason,
            num_prompt_tokens=len(out.prompt_token_ids),
            num_output_tokens=len(out.token_ids),
            num_preemptions=out.metrics.num_preemptions,
            num_draft_tokens=out.metrics.num_draft_tokens,
            num_accepted_tokens=out.metrics.num_accepted_tokens,
        )
