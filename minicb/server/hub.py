"""Hub: what every connected browser shares: the engines, their buses, and notices.

One Hub per app. It describes the engines to a new browser (``hello``), keeps the
scheduler's explanation of recent rounds (for the single-step control), and delivers
notices (an engine was rebuilt, so its request ids start again) into each browser's
event queues from the engine thread, so that a notice arrives in order with the events
around it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minicb.engine import LLMEngine
    from minicb.telemetry.bus import EventBus
    from minicb.request import StepResult
    from minicb.server.engine_loop import EngineLoop
    from minicb.server.workload import WorkloadFeeder
    from minicb.telemetry.bus import Subscription
    from minicb.telemetry.trace import Trace

KEEP_EXPLANATIONS = 64  # rounds whose decisions stay available to the single-step reply


@dataclass
class Notice:
    """A message for one engine's panel, queued in order with that engine's events."""

    kind = "notice"
    data: dict[str, Any]


@dataclass(eq=False)
class Client:
    """One browser: a bounded event queue per engine."""

    subs: dict[str, Subscription] = field(default_factory=dict)

    def close(self) -> None:
        for sub in self.subs.values():
            sub.close()


def engine_info(name: str, engine: LLMEngine) -> dict[str, Any]:
    """What a panel needs to know about its engine: settings, pool size, tokenizer."""
    return {
        "name": name,
        "batching": engine.config.batching,
        "config": engine.config.to_dict(),
        "kv_total": engine.scheduler.blocks.num_blocks,
        "swap_total": engine.scheduler.blocks.swap.num_blocks,
        "block_size": engine.config.block_size,
        "has_tokenizer": engine.tokenizer is not None,
        "max_model_len": engine.max_model_len,
        "step": engine.scheduler.step_count,  # iterations run before this browser came
    }


def live_requests(engine: LLMEngine) -> list[dict[str, Any]]:
    """The requests an engine holds now, for a browser that joins mid-run (it missed
    their arrival events). Read in the engine thread."""
    return [
        {
            "request_id": r.request_id,
            "arrival": r.arrival_time,
            "start_step": r.arrival_step + 1,
            "prompt": r.prompt,
            "num_prompt_tokens": r.num_prompt_tokens,
            "max_tokens": r.params.max_tokens,
            "first_token_time": r.metrics.first_token_time,
        }
        for r in engine.scheduler.requests.values()
    ]


def kv_map(engine: LLMEngine, step: int) -> dict[str, Any]:
    """Which request owns which KV block after ``step``: the real block ids.

    StepEvent rows carry only a block count per request; the block manager knows the ids,
    so the live map shows where each request's blocks really are (fragmentation included).
    Read in the engine thread, right after the step.
    """
    blocks = engine.scheduler.blocks
    return {
        "type": "kv_map",
        "step": step,
        "device": {str(rid): list(t) for rid, t in blocks.block_tables.items()},
        "swap": {str(rid): list(t) for rid, t in blocks.swap_tables.items()},
    }


class Hub:
    def __init__(
        self,
        engine_loop: EngineLoop | None,
        buses: dict[str, EventBus],
        *,
        mode: str,
        model_name: str = "",
        replay: dict[str, Trace] | None = None,
        feeder: WorkloadFeeder | None = None,
        queue_size: int = 4096,
    ) -> None:
        self.loop = engine_loop
        self.buses = buses
        self.mode = mode
        self.model_name = model_name
        self.replay = replay
        self.feeder = feeder
        self.queue_size = queue_size
        self.clients: set[Client] = set()
        self.rebuild_hooks: list[Any] = []  # called in the engine thread after a rebuild
        # round number -> {engine name: the plan's decisions in words}
        self._explained: OrderedDict[int, dict[str, list[str]]] = OrderedDict()
        if engine_loop is not None:
            engine_loop.step_hooks.append(self._record)

    # ---- browsers ------------------------------------------------------------------------
    def connect(self) -> Client:
        client = Client({n: b.subscribe_async(self.queue_size) for n, b in self.buses.items()})
        self.clients.add(client)
        return client

    def join(self) -> tuple[Client, dict[str, Any]]:
        """Subscribe a browser and describe the engines as of that moment, including the
        requests already there; run in the engine thread, so no event falls in between."""
        client = self.connect()
        hello = self.hello()
        assert self.loop is not None
        for info in hello["engines"]:
            info["requests"] = live_requests(self.loop.engines[info["name"]])
        return client, hello

    def disconnect(self, client: Client) -> None:
        self.clients.discard(client)
        client.close()

    def notify(self, engine: str, data: dict[str, Any]) -> None:
        """Queue ``data`` for every browser, in order with ``engine``'s events."""
        for client in list(self.clients):
            sub = client.subs.get(engine)
            if sub is not None:
                sub.put(Notice({**data, "engine": engine}))  # type: ignore[arg-type]

    # ---- descriptions --------------------------------------------------------------------
    def engines(self) -> list[dict[str, Any]]:
        if self.loop is None:
            return [self._replay_info(n, t) for n, t in (self.replay or {}).items()]
        return [engine_info(n, e) for n, e in self.loop.engines.items()]

    @staticmethod
    def _replay_info(name: str, trace: Trace) -> dict[str, Any]:
        config = trace.header.get("config") or {}
        kv_total = next((e.kv_total for e in trace.events if e.kind == "step"), 0)
        return {
            "name": name,
            "batching": config.get("batching", name),
            "config": config,
            "kv_total": kv_total,
            "block_size": config.get("block_size", 16),
            "has_tokenizer": True,
            "max_model_len": config.get("max_model_len"),
            "step": 0,
        }

    def hello(self) -> dict[str, Any]:
        """The first message a browser gets: mode, model, engines and the control state."""
        loop = self.loop
        model = self.model_name
        if not model and self.replay:
            model = next(iter(self.replay.values())).header.get("model") or ""
        return {
            "type": "hello",
            "mode": self.mode,
            "model": model,
            "engines": self.engines(),
            "paused": bool(loop and loop.paused),
            "delay_s": loop.delay_s if loop else 0.0,
            "rounds": loop.rounds if loop else 0,
            "workload": self.feeder.describe() if self.feeder else None,
            "controls": {
                "step": loop is not None,
                "workload": self.feeder is not None,
                "settings": self.mode == "demo",
                "prompt": loop is not None,
            },
        }

    # ---- the scheduler's explanations ----------------------------------------------------
    def _record(self, name: str, result: StepResult) -> None:
        # Step hooks run before the loop counts the round, so this round is rounds + 1.
        assert self.loop is not None
        round_no = self.loop.rounds + 1
        lines = result.plan.explain()
        self._explained.setdefault(round_no, {})[name] = lines
        while len(self._explained) > KEEP_EXPLANATIONS:
            self._explained.popitem(last=False)
        if self.clients:
            self.notify(name, kv_map(self.loop.engines[name], result.plan.step))

    def explained(self, round_no: int) -> dict[str, list[str]]:
        return dict(self._explained.get(round_no, {}))
