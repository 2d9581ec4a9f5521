"""The router's one index of what every replica holds, built from their KV events.

``block key -> replicas holding it`` (kv_events.py names the keys), as llm-d's KV-cache
indexer and Dynamo's KvIndexer keep it. The index is only as good as the events it heard,
so it watches each replica's stream:

- the records of one replica come numbered 1, 2, 3... under one epoch; a record whose
  number is not the next (one was lost) or whose epoch is new (the replica restarted: a
  fresh process with an empty cache and a new publisher) means the index no longer knows
  what that replica holds;
- it then forgets that replica's entries and marks it ``resyncing``, with the reason in
  words; the fleet asks that replica for a snapshot (``wanted`` lists whom to ask, each
  once), and the records that arrive before it are dropped (the snapshot includes them);
- ``install`` puts the snapshot in, and the stream goes on from the snapshot's number.

Until then the router counts no block on that replica and says so in its reason: a
resyncing replica looks empty, so the router sends it no prefix it may hold, which costs
hits, never a wrong answer (the engine checks its own cache). Records older than the
snapshot (a number at or below it) are duplicates and are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from minicb.fleet.kv_events import KVEventBatch, KVEventSnapshot


@dataclass
class ReplicaStream:
    """What the index knows of one replica's stream."""

    epoch: int | None = None  # None: not heard from yet
    seq: int = 0  # the last record applied
    keys: set[int] = field(default_factory=set)
    resyncing: str | None = None  # why its entries are not counted, while they are not
    asked: bool = False  # a snapshot was asked for since it started resyncing


class KVIndex:
    """One index over the fleet's replicas (see the module doc)."""

    def __init__(self) -> None:
        self.holders: dict[int, set[int]] = {}  # block key -> replicas holding it
        self.streams: dict[int, ReplicaStream] = {}
        self.resyncs = 0  # how many times a replica had to start again (a figure)

    def apply(self, replica: int, record: KVEventBatch | KVEventSnapshot) -> None:
        """One record from ``replica``'s stream, or the snapshot it was asked for."""
        if isinstance(record, KVEventSnapshot):
            self.install(replica, record)
            return
        stream = self.streams.setdefault(replica, ReplicaStream())
        if stream.epoch is None and stream.resyncing is None and record.seq == 1:
            stream.epoch = record.epoch  # a fresh publisher's first record: nothing missed
        elif stream.epoch != record.epoch:
            if stream.resyncing is None or stream.epoch is not None:
                why = "first heard mid-stream" if stream.epoch is None else "restarted"
                self._resync(replica, f"{why}: a new epoch")
            return
        elif stream.resyncing is not None or record.seq <= stream.seq:
            return  # dropped until the snapshot; or a duplicate of what it holds
        elif record.seq != stream.seq + 1:
            self._resync(replica, f"a gap: record {record.seq} after {stream.seq}")
            return
        stream.seq = record.seq
        for key in record.removed:
            stream.keys.discard(key)
            holders = self.holders.get(key)
            if holders is not None:
                holders.discard(replica)
                if not holders:
                    del self.holders[key]
        for key in record.stored:
            stream.keys.add(key)
            self.holders.setdefault(key, set()).add(replica)

    def install(self, replica: int, snapshot: KVEventSnapshot) -> None:
        """A replica's snapshot: its entries are exactly these, its stream goes on after
        the snapshot's record number, under its epoch."""
        self._clear(replica)
        self.streams[replica] = ReplicaStream(snapshot.epoch, snapshot.seq, set(snapshot.keys))
        for key in snapshot.keys:
            self.holders.setdefault(key, set()).add(replica)

    def wanted(self, reachable: Callable[[int], bool] = lambda replica: True) -> list[int]:
        """The resyncing replicas to ask for a snapshot now: those not asked yet that
        ``reachable`` says can be asked; each is marked asked."""
        out = []
        for replica, stream in self.streams.items():
            if stream.resyncing is not None and not stream.asked and reachable(replica):
                stream.asked = True
                out.append(replica)
        return out

    def drop(self, replica: int) -> None:
        """A replica removed or restarted by its fleet: its entries go, and its next stream
        starts from a fresh publisher's first record."""
        self._clear(replica)
        self.streams.pop(replica, None)

    def resyncing(self, replicas: Iterable[int]) -> dict[int, str]:
        """Of ``replicas``, those whose entries are not counted now, with why."""
        return {r: s.resyncing for r in replicas
                if (s := self.streams.get(r)) is not None and s.resyncing is not None}  # fmt: skip

    def matched(self, replica: int, keys: Sequence[int]) -> int:
        """How many of a prompt's leading block keys ``replica`` holds (0 while it is
        resyncing: its entries are gone)."""
        n = 0
        for key in keys:
            if replica not in self.holders.get(key, ()):
                break
            n += 1
        return n

    def held(self, replica: int) -> int:
        """How many blocks the index says ``replica`` holds."""
        stream = self.streams.get(replica)
        return len(stream.keys) if stream is not None else 0

    def _resync(self, replica: int, why: str) -> None:
        self._clear(replica)
        self.streams[replica] = ReplicaStream(resyncing=why)
        self.resyncs += 1

    def _clear(self, replica: int) -> None:
        stream = self.streams.get(replica)
        if stream is None:
            return
        for key in stream.keys:
            holders = self.holders.get(key)
            if holders is not None:
                holders.discard(replica)
                if not holders:
                    del self.holders[key]
        stream.keys.clear()
