"""Moving a request's KV cache from a prefill engine to a decode engine, in the simulator.

Disaggregated serving (DistServe, Splitwise, vLLM's P/D connectors) runs a request's
prompt on one engine and its decoding on another: the prefill engine computes the prompt's
KV and the first token, the KV cache crosses a link, and the decode engine continues from
it. Three pieces here, each the real scheduler with one role added (through the engine's
``scheduler=`` seam: engine.py and scheduler/ are unchanged):

- ``Link``: a named link of the catalogue (``catalogue.json``'s ``links``: NVLink,
  InfiniBand, PCIe) and the time to move a number of bytes over it:
  ``bytes / (published GB/s x the catalogue's interconnect efficiency)``. No latency term:
  at the sizes of a KV cache (megabytes) the bandwidth term dominates.
- ``PrefillScheduler``: the continuous scheduler, except that a request that stops after
  its first token (every request here: the prefill engine is told ``max_tokens=1``) keeps
  its blocks: its KV waits on the prefill side until it has been sent (``release``). Held
  blocks are real: they count in this pool, so a decode side that cannot take requests
  fills the prefill pool, and the prefill engine stops admitting (backpressure).
- ``DecodeScheduler``: the continuous scheduler with vLLM's "waiting for remote KVs" step
  in front. A request given to it was prefilled elsewhere (its prompt is the prompt plus the
  first token); it waits in ``inbox`` until this pool has room for its blocks, which are
  then allocated and the transfer starts (``on_transfer``); while the KV crosses the link
  it is ``receiving``; when it has arrived the request runs as a decode, every token but
  the last already computed. A request that is preempted here is recomputed here, as in any
  engine. Each decision carries its reason in words: "request 3 waits on the prefill side
  (its KV stays there): needs 12 blocks here, 3 free".

Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from minicb.core.config import EngineConfig
from minicb.core.request import Request, RequestStatus
from minicb.core.scheduler.block_manager import blocks_needed
from minicb.core.scheduler.continuous import ContinuousScheduler
from minicb.core.scheduler.plan import Decision, StepPlan
from minicb.cost_model.catalogue import efficiency, read_catalogue


@dataclass(frozen=True)
class Link:
    """A link between a prefill and a decode GPU: its published one-way bandwidth."""

    name: str
    gb_s: float  # published peak, GB/s (1e9 bytes) one direction per GPU
    efficiency: float  # the share of it a transfer gets (catalogue's interconnect factor)

    @property
    def bytes_per_s(self) -> float:
        return self.gb_s * 1e9 * self.efficiency

    def seconds(self, nbytes: float) -> float:
        """Time to move ``nbytes`` over the link."""
        return nbytes / self.bytes_per_s


def link(name: str) -> Link:
    """The catalogue's link of that name (any case), e.g. ``"NVLink 4"``, ``"InfiniBand NDR"``."""
    links = {k: v for k, v in read_catalogue()["links"].items() if k != "about"}
    by_lower = {k.lower(): k for k in links}
    if name.lower() not in by_lower:
        raise ValueError(f"link {name!r} is not in the catalogue; choose one of {', '.join(links)}")
    key = by_lower[name.lower()]
    return Link(key, float(links[key]), efficiency().interconnect)


@dataclass
class Transfer:
    """One request's KV cache crossing the link (what a disaggregated run records)."""

    request: int  # the request's number in the run
    prefill: int  # the prefill engine it left
    decode: int  # the decode engine it went to
    tokens: int  # tokens of KV moved (the prompt's)
    blocks: int  # blocks allocated for it on the decode side
    nbytes: int
    ready: float  # when it was handed to the decode side (its prefill's end)
    start: float  # when the decode side allocated its blocks and the transfer began
    end: float  # when the KV had arrived
    held_back: bool  # whether it was once told to wait for room (backpressure)

    @property
    def queued_s(self) -> float:
        """Seconds its KV waited on the prefill side: for the decode engine's next
        iteration, and for room there when ``held_back``."""
        return self.start - self.ready


class PrefillScheduler(ContinuousScheduler):
    """A prefill engine's scheduler: a request that made its first token keeps its KV
    blocks until ``release`` (after its transfer), so held KV fills this pool."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 (the scheduler's)
        super().__init__(*args, **kwargs)
        self.held: set[int] = set()  # request ids whose KV waits here to be sent

    def _release(self, req: Request) -> None:
        if req.status is RequestStatus.FINISHED_LENGTH:  # its first token: the KV stays
            self.held.add(req.request_id)
            self.requests.pop(req.request_id, None)
            self.num_ended += 1  # it left this engine: a page counts it finished here
            return
        super()._release(req)

    def release(self, request_id: int) -> int:
        """Free the blocks of a request whose KV has been sent; how many were freed."""
        self.held.discard(request_id)
        return self.blocks.free(request_id)


OnTransfer = Callable[[int, int, int, float, float], None]  # (id, tokens, blocks, start, end)


class DecodeScheduler(ContinuousScheduler):
    """A decode engine's scheduler: requests arrive prefilled; they wait for room here
    (their KV still on the prefill side), receive their KV, then decode."""

    def __init__(
        self,
        config: EngineConfig,
        num_kv_blocks: int,
        max_model_len: int,
        num_swap_blocks: int | None = None,
        *,
        clock: Callable[[], float],
        transfer_s: Callable[[int], float],
        on_transfer: OnTransfer | None = None,
    ) -> None:
        """``clock``: the engine's; ``transfer_s``: seconds to receive the KV of n tokens;
        ``on_transfer``: told of each transfer as it starts (request id here, tokens,
        blocks, start, end), where given (a scenario reads ``receiving`` instead)."""
        super().__init__(config, num_kv_blocks, max_model_len, num_swap_blocks)
        self.clock, self.transfer_s, self.on_transfer = clock, transfer_s, on_transfer
        self.inbox: list[Request] = []  # prefilled, KV still on the prefill side
        self.receiving: dict[int, float] = {}  # request id -> when its KV has arrived
        self.refused: set[int] = set()  # ids that once waited for room (backpressure)
        self._tried = True  # whether the inbox was looked at since it last changed

    def add(self, req: Request) -> None:
        self.check_request(req)
        req.arrival_step = self.step_count
        req.status = RequestStatus.WAITING
        self.requests[req.request_id] = req
        self.inbox.append(req)
        self._tried = False

    def has_unfinished(self) -> bool:
        return super().has_unfinished() or bool(self.inbox or self.receiving)

    def queue_sizes(self) -> dict[str, int]:
        """A request in the inbox waits here for room, one whose KV is on its way holds its
        blocks here: a router weighs both, or it sends every hand-off to the engine that
        has not yet said it took the last ones."""
        sizes = super().queue_sizes()
        sizes["waiting"] += len(self.inbox)
        sizes["running"] += len(self.receiving)
        return sizes

    def next_step_time(self, now: float) -> float | None:
        """When a step here next has something to do: now, when a transfer lands, or None
        (nothing to do until a new request comes)."""
        if self.running or self.waiting or self.swapped or (self.inbox and not self._tried):
            return now
        return max(now, min(self.receiving.values())) if self.receiving else None

    def _fill(self, plan: StepPlan) -> None:
        self._land(plan)
        super()._fill(plan)
        if not plan.preempted:  # as swap-ins: never pull in an iteration that preempted
            self._pull(plan)
        self._tried = True

    def retire(self, plan: StepPlan) -> list[Request]:
        done = super().retire(plan)
        if done:  # their blocks are free: the inbox may fit now
            self._tried = False
        return done

    def _land(self, plan: StepPlan) -> None:
        """Requests whose KV has arrived join the batch, all but their last token computed."""
        now = self.clock()
        for rid, end in list(self.receiving.items()):
            if end <= now:
                del self.receiving[rid]
                req = self.requests[rid]
                req.num_computed_tokens = req.num_tokens - 1
                self.blocks.commit(
                    rid, req.num_computed_tokens, req.token_slice, req.params.cache_salt
                )
                self.running.append(req)
                req.status = RequestStatus.RUNNING

    def _pull(self, plan: StepPlan) -> None:
        """Allocate blocks and start the transfer of each waiting request that fits, in
        arrival order; the first that does not fit waits on the prefill side."""
        while self.inbox:
            req = self.inbox[0]
            busy = len(self.running) + len(self.receiving)
            if busy >= self.config.max_num_seqs:
                self.refused.update(r.request_id for r in self.inbox)  # all wait behind it
                plan.notes.append(
                    f"{len(self.inbox)} prefilled request(s) wait on the prefill side: all "
                    f"{self.config.max_num_seqs} slots here are taken"
                )
                return
            free = self.blocks.num_free_blocks
            if self.blocks.allocate_slots(req.request_id, req.num_tokens) is None:
                self.refused.update(r.request_id for r in self.inbox)  # all wait behind it
                need = blocks_needed(req.num_tokens, self.config.block_size)
                plan.notes.append(
                    f"request {req.request_id} waits on the prefill side (its KV stays there): "
                    f"needs {need} blocks here, {free} free"
                )
                return
            self.inbox.pop(0)
            tokens = req.num_tokens - 1  # the prompt's KV; the first token's is made here
            blocks = len(self.blocks.block_table(req.request_id))
            start = self.clock()
            end = start + self.transfer_s(tokens)
            self.receiving[req.request_id] = end
            plan.admitted.append(
                Decision(
                    req.request_id,
                    f"admitted: receiving the KV of {tokens} prompt tokens into {blocks} "
                    f"blocks ({free} were free), {(end - start) * 1e3:.2f} ms over the link",
                )
            )
            if self.on_transfer is not None:
                self.on_transfer(req.request_id, tokens, blocks, start, end)

    def abort(self, request_id: int) -> Request | None:
        req = self.requests.get(request_id)
        if req is not None and req in self.inbox:
            self.inbox.remove(req)
        self.receiving.pop(request_id, None)
        self._tried = False  # blocks freed: the inbox may fit now
        return super().abort(request_id)
