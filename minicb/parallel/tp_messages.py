"""What rank 0 and its tensor-parallel workers say to each other, on the control group:
signed commands one way, statuses the other.

Rank 0 broadcasts each command pickled (``send_object``), after an HMAC-SHA256 tag under the
group's secret; a worker checks the tag before it unpickles a byte (``receive_object``),
since pickle runs whatever code its bytes name. What workers send back is a status in
bytes (``gather_statuses``), never a pickle. tp_group.py (rank 0) and tp_worker.py (the
workers) both speak it; neither imports the other for it.
"""

from __future__ import annotations

import hashlib
import hmac
import pickle
import time
import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

CONTROL_TIMEOUT = timedelta(days=30)  # workers wait this long for the next command
STATUS_BYTES = 512  # a worker's answer to "open": empty (ready) or why not, UTF-8, cut here
TAG_BYTES = 32  # the HMAC-SHA256 tag before each command
LET_GO_S = 5.0  # the longest a leaving rank waits for gloo to drop its last message

_last_message: list[weakref.ref] = []  # this process's last message's tensors, weakly


class TensorParallelError(RuntimeError):
    """A tensor-parallel rank died or stopped answering; the message names it."""


def sign(secret: bytes, data: bytes) -> bytes:
    """The tag of ``data`` under ``secret``."""
    return hmac.new(secret, data, hashlib.sha256).digest()


def send_object(obj: Any, group: Any, timeout: timedelta, secret: bytes) -> None:
    """Rank 0: broadcast ``obj`` pickled, after its HMAC under ``secret`` (the length, then
    tag and bytes), waiting at most ``timeout`` for each part: a receiver that has stopped
    answering raises, never hangs."""
    data = pickle.dumps(obj)
    payload = torch.frombuffer(bytearray(sign(secret, data) + data), dtype=torch.uint8)
    parts = (torch.tensor([payload.numel()], dtype=torch.int64), payload)
    for tensor in parts:
        dist.broadcast(tensor, src=0, group=group, async_op=True).wait(timeout)
    _last_message[:] = [weakref.ref(t) for t in parts]


def receive_object(group: Any, secret: bytes) -> Any:
    """Ranks 1..N-1: the next object ``send_object`` broadcasts (waits as long as the
    group's timeout allows). Its tag is checked before a byte is unpickled: pickle runs
    whatever code its bytes name, so only rank 0's commands are read."""
    size = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(size, src=0, group=group)
    payload = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(payload, src=0, group=group)
    _last_message[:] = [weakref.ref(size), weakref.ref(payload)]
    return pickle.loads(checked(payload.numpy().tobytes(), secret))


def wait_until_let_go(timeout_s: float = LET_GO_S) -> None:
    """Return once gloo has dropped the tensors of this process's last message (or after
    ``timeout_s``). Called by a rank about to leave the group, after the "stop" command.

    A gloo worker thread drops a finished collective a moment after the caller's wait has
    returned, and dropping its tensors needs the GIL (Python made them). If the interpreter
    is finalizing by then, the thread cannot take it and the process aborts ("terminate
    called without an active exception": rank 0 at exit under torchrun, about 1 run in 10
    on a loaded machine). A tensor that only gloo still holds keeps its Python object, so
    the weak references tell when gloo has let go."""
    deadline = time.monotonic() + timeout_s
    while any(ref() is not None for ref in _last_message) and time.monotonic() < deadline:
        time.sleep(0.001)


def checked(signed: bytes, secret: bytes) -> bytes:
    """The bytes after the tag, if the tag is theirs under ``secret``; else the error."""
    tag, data = signed[:TAG_BYTES], signed[TAG_BYTES:]
    if not hmac.compare_digest(tag, sign(secret, data)):
        raise TensorParallelError("a command failed its signature check: it is not rank 0's")
    return data


def gather_statuses(status: str, world: int, group: Any) -> list[str]:
    """Every rank's status (rank order): UTF-8 bytes in a fixed-size tensor, so nothing
    a rank sends is unpickled by another."""
    data = status.encode("utf-8")[:STATUS_BYTES]
    mine = torch.zeros(STATUS_BYTES, dtype=torch.uint8)
    mine[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    every = [torch.zeros(STATUS_BYTES, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    return [bytes(t.numpy()).rstrip(b"\0").decode("utf-8", "replace") for t in every]
