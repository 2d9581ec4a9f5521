"""The KV hand-off of disaggregated serving through Ray's object store: a third link
beside gloo/NCCL (kv_link.py's ``Group``) and the host tier.

kv_link.py tells a transfer in order; only the wire differs here. The prefill engine's
role sends each layer's bytes in order (``send``): the bytes become an object in its
node's object store (``ray.put``), and a reference to it is posted to the decode engine's
actor (``ReplicaActor.post``, found by its name), where it waits in this process's
``MAILBOX``. The decode engine's role posted one receive per layer in the same order
(``irecv``): a thread waits for each reference and fetches its object (``ray.get``: Ray
moves the bytes from the prefill node's store to the decode node's), then copies them into
the staging pool. The two sides count the layers of one transfer alike, so the n-th send
of a tag meets the n-th receive of that tag.

What fails, and how it reads: a decode actor that cannot be found or reached fails the
send (the prefill engine frees the blocks and says so); a prefill engine that dies before
posting every layer leaves a receive waiting until ``timeout_s`` (then "failed"); one that
dies after posting takes its objects with it (Ray's OwnerDiedError, "failed" too): the
request ends with the error, as over gloo.

Placement: each engine's actor is named (``prefix`` + its name, so a peer finds it) and
needs one unit of the custom resource named after its role, "prefill" or "decode": a node
started with ``ray start --resources '{"decode": 1}'`` holds one decode engine.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from minicb.fleet.kv_link import Group


class Mailbox:
    """The references posted to this process's decode engine, by (tag, layer number)."""

    def __init__(self) -> None:
        self._posted: dict[tuple[int, int], list[Any]] = {}
        self._changed = threading.Condition()

    def put(self, key: tuple[int, int], refs: list[Any]) -> None:
        with self._changed:
            self._posted[key] = refs
            self._changed.notify_all()

    def take(self, key: tuple[int, int], timeout_s: float) -> list[Any] | None:
        """The references posted under ``key``, waiting up to ``timeout_s``; None if none
        came in that time."""
        with self._changed:
            if not self._changed.wait_for(lambda: key in self._posted, timeout_s):
                return None
            return self._posted.pop(key)


MAILBOX = Mailbox()  # one engine an actor, one actor a process: this process's engine's


@dataclass
class ObjectReceive:
    """One layer's receive: ``wait`` takes its reference from the mailbox, fetches the
    object and copies it into ``buffer``; RuntimeError if it never comes."""

    buffer: torch.Tensor
    key: tuple[int, int]
    source: str
    timeout_s: float

    def wait(self) -> None:
        import ray

        start = time.monotonic()
        refs = MAILBOX.take(self.key, self.timeout_s)
        if refs is None:
            raise RuntimeError(
                f"no KV from {self.source} within {self.timeout_s:g} s (layer {self.key[1]})"
            )
        left = max(self.timeout_s - (time.monotonic() - start), 1.0)
        try:
            data = ray.get(refs[0], timeout=left)
        except ray.exceptions.RayError as err:  # its owner (the prefill engine) died
            raise RuntimeError(f"fetching the KV from {self.source} failed: {_words(err)}") from err
        self.buffer.copy_(data)


@dataclass(frozen=True)
class RayGroup(Group):
    """The engines' group on Ray: no process group to join, the object store as the wire,
    and where each engine's actor goes (see the module doc)."""

    prefix: str = "minicb-"  # the actors' names: prefix + engine name, unique per fleet
    # per peer: the tag of its transfer under way and the next layer's number (both sides
    # count alike: sends of one transfer are consecutive, and so are its receives)
    _counts: dict[int, tuple[int, int]] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", "ray")  # what describe() and the docs name

    def join(self, rank: int) -> None:
        """Nothing to join: the actors are already in one cluster."""

    def wire_device(self, pool: Any) -> torch.device:
        return torch.device("cpu")  # an object lives in a node's (host) object store

    def actor_options(self, rank: int) -> dict[str, Any]:
        """Ray's options for rank ``rank``'s actor: its name and its role's resource."""
        role = self.names[rank].rstrip("0123456789")  # "prefill" or "decode"
        return {"name": self.prefix + self.names[rank], "resources": {role: 1}}

    def send(self, data: torch.Tensor, dst: int, tag: int) -> None:
        import ray

        key = (tag, self._next(dst, tag))
        try:
            peer = ray.get_actor(self.prefix + self.names[dst])
            ray.get(peer.post.remote(key, [ray.put(data)]), timeout=self.timeout_s)
        except (ValueError, ray.exceptions.RayError) as err:  # ValueError: no such actor
            raise RuntimeError(f"posting to {self.names[dst]} failed: {_words(err)}") from err

    def irecv(self, buffer: torch.Tensor, src: int, tag: int) -> ObjectReceive:
        key = (tag, self._next(src, tag))
        return ObjectReceive(buffer, key, self.names[src], self.timeout_s)

    def _next(self, peer: int, tag: int) -> int:
        """The number of this layer in the transfer ``tag`` with ``peer``."""
        last_tag, n = self._counts.get(peer, (tag, 0))
        n = n if last_tag == tag else 0
        self._counts[peer] = (tag, n + 1)
        return n


def _words(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__
