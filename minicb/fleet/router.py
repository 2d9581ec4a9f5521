"""The router: which replica gets a request, and why, in words.

Five policies, one ``Router``; it decides the same way for real replicas (processes
behind the server) and simulated ones (engines on the simulated runner), because all it
reads is what it is told: at each call, the prompt's token ids and each replica's load
(``ReplicaLoad``: waiting and running requests, alive or not); and, for the last two
below, what the replicas reported they hold (``index``, which their fleet feeds).

- ``round-robin``: the next live replica in turn. Blind to load and to prompts.
- ``least-loaded``: the lowest load score, ``waiting x 4 + running``, as vLLM's
  data-parallel coordinator scores its engines (a waiting request counts four times: it
  has all its prefill ahead of it and its queue is where latency grows); ties go to the
  lowest index.
- ``prefix-aware``: as SGLang's cache-aware router. The router keeps its own record of the
  prompt prefixes it sent to each replica, and sends a request where the longest part of
  its prompt is cached, so that replica computes only the rest. Two exceptions, both
  SGLang's: when load is unbalanced past a threshold (the busiest replica's score more
  than ``balance_abs`` above the idlest's and more than ``balance_rel`` times it) it routes
  least-loaded, because a cache hit saves less than a long queue costs; and when no replica
  holds at least ``cache_threshold`` of the prompt, the request starts a new prefix, so it
  goes where the record is smallest (the replica with the most room to cache it), ties to
  the least loaded.

The record is approximate, and that is fine: it says what the router *sent*, not what the
replica *holds* (prefix_record.py says how it is kept, and why being wrong costs speed,
never correctness).

Two policies read what the replicas *report* instead: each replica publishes the blocks it
stored and removed (kv_events.py), and the router keeps one index of them (kv_index.py,
``Router.index``; the fleet feeds it):

- ``precise-prefix``: as llm-d's precise-prefix scorer. The replica that holds the longest
  run of the prompt's leading blocks, by the index (ties: the least loaded); the same
  balance exception as ``prefix-aware``, but no new-prefix rule: the approximate router
  spreads a prompt whose recorded match is short because the record may be wrong, while
  a short run the index reports is there to reuse. A replica whose stream had a gap, or
  that restarted, counts no block until its snapshot is in, and the reason says so.
- ``cost``: as Dynamo's KV router. Each replica's cost is ``w x`` the prompt's blocks it
  does not hold (prefill to compute) ``+`` its running requests (decode load); the lowest
  wins at temperature 0, and above 0 a replica is drawn with probability proportional to
  ``exp(-cost / T)`` from a seeded generator (a little randomness spreads a burst of
  equal prompts that the index has not heard of yet). The reason lists each replica's
  blocks held and cost.

A stale index costs what a stale record costs: hits, never answers.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from minicb.core.request_events import RequestRouted
from minicb.fleet.kv_events import block_keys
from minicb.fleet.kv_index import KVIndex
from minicb.fleet.prefix_record import PrefixRecord

POLICIES = ("round-robin", "least-loaded", "prefix-aware", "precise-prefix", "cost")
INDEXED = ("precise-prefix", "cost")  # the policies that read the index
WAITING_WEIGHT = 4  # vLLM's coordinator: score = waiting * 4 + running
# SGLang's cache-aware router's knobs (its defaults for the cache threshold; balance
# thresholds of the same order as its own).
CACHE_THRESHOLD = 0.5
BALANCE_ABS = 32
BALANCE_REL = 1.5
MAX_BLOCKS_PER_REPLICA = 1 << 16  # the record's bound: chunks remembered per replica
PREFILL_WEIGHT = 1.0  # the cost router's w: one uncached block against one running request


@dataclass(frozen=True)
class ReplicaLoad:
    """What the router is told about one replica when it routes."""

    replica: int
    waiting: int
    running: int
    alive: bool = True

    @property
    def score(self) -> int:
        return self.waiting * WAITING_WEIGHT + self.running

    @classmethod
    def of(cls, replica: int, queues: Mapping[str, int], alive: bool = True) -> ReplicaLoad:
        """A replica's load from its engine's ``queue_sizes()``: swapped-out requests wait
        for a slot too."""
        return cls(replica, queues["waiting"] + queues["swapped"], queues["running"], alive)


@dataclass(frozen=True)
class Route:
    """One routing decision."""

    request_id: int
    replica: int
    policy: str
    reason: str  # in words, counts only (never prompt text): it goes on the events bus
    cached_tokens: int  # the router's estimate of the prompt tokens cached on the replica

    def event(self, request_id: int, time: float) -> RequestRouted:
        """The decision as a ``routed`` event: with the id the chosen replica gave the
        request (each replica numbers its own) and the fleet's time."""
        return RequestRouted(time=time, request_id=request_id, replica=self.replica,
                             policy=self.policy, reason=self.reason,
                             cached_tokens=self.cached_tokens)  # fmt: skip


class Router:
    """Decides, for each request, which live replica serves it (see the module doc)."""

    def __init__(
        self,
        policy: str,
        num_replicas: int,
        *,
        block_size: int = 16,
        cache_threshold: float = CACHE_THRESHOLD,
        balance_abs: int = BALANCE_ABS,
        balance_rel: float = BALANCE_REL,
        max_blocks_per_replica: int = MAX_BLOCKS_PER_REPLICA,
        index: KVIndex | None = None,
        prefill_weight: float = PREFILL_WEIGHT,
        temperature: float = 0.0,
        seed: int = 0,
    ) -> None:
        """``index``: what the replicas reported (a fleet keeps its own across a change of
        policy); ``prefill_weight``, ``temperature``, ``seed``: the cost router's."""
        if policy not in POLICIES:
            raise ValueError(f"unknown router policy {policy!r}; choose one of {POLICIES}")
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        if temperature < 0:
            raise ValueError(f"temperature must be at least 0, got {temperature}")
        self.policy = policy
        self.block_size = block_size
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.max_blocks_per_replica = max_blocks_per_replica
        self.index = KVIndex() if index is None else index
        self.prefill_weight, self.temperature = prefill_weight, temperature
        self._draw = random.Random(seed)
        self.records: dict[int, PrefixRecord] = {}
        self.removed: set[int] = set()
        self._next_index = itertools.count()
        self._turn = 0  # round-robin: the index to try first next time
        for _ in range(num_replicas):
            self.add()

    @property
    def replicas(self) -> list[int]:
        """The replicas the router may route to (not removed), in index order."""
        return sorted(self.records)

    def add(self) -> int:
        """A new replica (autoscaling): its index, never one used before."""
        index = next(self._next_index)
        self.records[index] = PrefixRecord(self.max_blocks_per_replica)
        return index

    def remove(self, replica: int) -> None:
        """A replica died or was scaled away: never route there, forget its prefixes."""
        self.records.pop(replica, None)
        self.index.drop(replica)
        self.removed.add(replica)

    def rejoin(self, replica: int) -> None:
        """A removed replica serves again (restarted): routed to again, its record empty
        (a fresh process has an empty cache)."""
        self.removed.discard(replica)
        self.records[replica] = PrefixRecord(self.max_blocks_per_replica)
        self.index.drop(replica)

    def route(
        self, request_id: int, prompt_token_ids: Sequence[int], loads: Sequence[ReplicaLoad]
    ) -> Route:
        """The replica for this request, with the reason. ``loads``: one per replica (any
        order); a replica missing from them, not alive, or removed is never chosen."""
        live = sorted(
            (x for x in loads if x.alive and x.replica in self.records), key=lambda x: x.replica
        )
        if not live:
            raise RuntimeError(
                f"no live replica to route request {request_id} to "
                f"(told of {len(loads)}; removed: {sorted(self.removed) or 'none'})"
            )
        keys = block_keys(prompt_token_ids, self.block_size)
        if self.policy == "round-robin":
            chosen, reason = self._round_robin(live)
        elif self.policy == "least-loaded":
            chosen = _least_loaded(live)
            reason = f"replica {chosen.replica}: least loaded ({_load_words(chosen)})"
        elif self.policy == "prefix-aware":
            chosen, reason = self._prefix_aware(live, keys, len(prompt_token_ids))
        elif self.policy == "precise-prefix":
            chosen, reason = self._precise_prefix(live, keys, len(prompt_token_ids))
        else:
            chosen, reason = self._cost(live, keys)
        record = self.records[chosen.replica]
        if self.policy in INDEXED:
            cached = self.index.matched(chosen.replica, keys) * self.block_size
        else:
            cached = record.matched(keys) * self.block_size
        record.insert(keys)
        return Route(request_id, chosen.replica, self.policy, reason, cached)

    def _round_robin(self, live: list[ReplicaLoad]) -> tuple[ReplicaLoad, str]:
        chosen = next((x for x in live if x.replica >= self._turn), live[0])
        self._turn = chosen.replica + 1
        return chosen, f"replica {chosen.replica}: next in turn"

    def _unbalanced(self, live: list[ReplicaLoad]) -> tuple[ReplicaLoad, str] | None:
        """SGLang's exception: the least loaded, when load is unbalanced past both bounds."""
        busiest = max(x.score for x in live)
        idlest = _least_loaded(live)
        if busiest - idlest.score > self.balance_abs and busiest > self.balance_rel * idlest.score:
            return idlest, (
                f"replica {idlest.replica}: least loaded, load unbalanced "
                f"(score {busiest} against {idlest.score}; prefixes ignored)"
            )
        return None

    def _prefix_aware(
        self, live: list[ReplicaLoad], keys: list[int], prompt_len: int
    ) -> tuple[ReplicaLoad, str]:
        if (unbalanced := self._unbalanced(live)) is not None:
            return unbalanced
        matched = {x.replica: self.records[x.replica].matched(keys) for x in live}
        # The longest match; among equals the least loaded, then the lowest index.
        best = min(live, key=lambda x: (-matched[x.replica], x.score, x.replica))
        cached = matched[best.replica] * self.block_size
        if prompt_len and cached >= self.cache_threshold * prompt_len:
            return best, (
                f"replica {best.replica}: {cached} of {prompt_len} prompt tokens cached there"
            )
        roomiest = min(live, key=lambda x: (len(self.records[x.replica]), x.score, x.replica))
        return roomiest, (
            f"replica {roomiest.replica}: a new prefix (the longest cached anywhere: {cached} "
            f"of {prompt_len} prompt tokens, under {self.cache_threshold:.0%}); the smallest "
            f"prefix record ({len(self.records[roomiest.replica])} blocks)"
        )

    def _precise_prefix(
        self, live: list[ReplicaLoad], keys: list[int], prompt_len: int
    ) -> tuple[ReplicaLoad, str]:
        if (unbalanced := self._unbalanced(live)) is not None:
            return unbalanced
        held = {x.replica: self.index.matched(x.replica, keys) for x in live}
        # The longest run held; among equals the least loaded, then the lowest index. No
        # new-prefix rule: a short run the index reports is there, unlike a short record.
        best = min(live, key=lambda x: (-held[x.replica], x.score, x.replica))
        return best, (
            f"replica {best.replica}: {held[best.replica] * self.block_size} of {prompt_len} "
            f"prompt tokens held there ({self._held_words(live, held, len(keys))})"
        )

    def _cost(self, live: list[ReplicaLoad], keys: list[int]) -> tuple[ReplicaLoad, str]:
        held = {x.replica: self.index.matched(x.replica, keys) for x in live}
        cost = {x.replica: self.prefill_weight * (len(keys) - held[x.replica]) + x.running
                for x in live}  # fmt: skip
        if self.temperature == 0:
            chosen = min(live, key=lambda x: (cost[x.replica], x.score, x.replica))
            how = "the lowest cost"
        else:
            low = min(cost.values())  # subtracted: the weights stay finite
            weights = [math.exp(-(cost[x.replica] - low) / self.temperature) for x in live]
            chosen = self._draw.choices(live, weights)[0]
            how = f"drawn at temperature {self.temperature:g}"
        each = "; ".join(
            f"replica {x.replica} held {held[x.replica]} of {len(keys)} blocks, "
            f"{x.running} running: cost {cost[x.replica]:g}"
            for x in live
        )
        stale = self.index.resyncing(x.replica for x in live)
        return chosen, f"replica {chosen.replica}: {how} ({each}){_stale_words(stale)}"

    def _held_words(self, live: list[ReplicaLoad], held: dict[int, int], n: int) -> str:
        each = ", ".join(f"replica {x.replica} held {held[x.replica]} of {n} blocks"
                         for x in live)  # fmt: skip
        return each + _stale_words(self.index.resyncing(x.replica for x in live))


def _stale_words(stale: Mapping[int, str]) -> str:
    """The replicas whose blocks the index does not count now, and why."""
    return "".join(f"; replica {r} resyncing ({why}): its blocks not counted"
                   for r, why in sorted(stale.items()))  # fmt: skip


def _least_loaded(live: list[ReplicaLoad]) -> ReplicaLoad:
    return min(live, key=lambda x: (x.score, x.replica))


def _load_words(x: ReplicaLoad) -> str:
    return f"{x.waiting} waiting, {x.running} running: score {x.score}"
