"""The tensor-parallel group as rank 0 sees it: the worker processes, the two process
groups, and the commands rank 0 sends.

Rank 0 (this process) runs the whole engine; ranks 1..N-1 run ``tp_worker.serve``, a
loop that receives one command at a time and runs it on its shard. Every step rank 0
broadcasts the StepPlan itself, pickled (``send_object``, tp_messages.py): the plan is a
small pure-Python object, and each worker then builds the same ragged batch with the same
``step_inputs`` (minicb.core.runner.step_inputs) as rank 0, so there is one piece of code
that turns a plan into tensors and the workers keep no scheduler state at all.
(Broadcasting the tensors instead would need a shape message first and one broadcast per
tensor.)

Two process groups, because waiting for work and waiting for a peer are different waits:

- the **control** group (gloo, on CPU memory) carries the commands; its timeout is long,
  because an idle server sends nothing for hours and its workers must keep waiting; rank 0
  bounds its own side of each send (a gloo broadcast waits for every receiver);
- the **compute** group (the default group: NCCL on CUDA, gloo on CPU) carries the
  all-reduces inside the forward pass; its timeout is short, so a peer that hangs mid-step
  turns into an error instead of a hang.

A worker that dies closes its sockets, so a collective with it fails at once; before every
command rank 0 also checks that its worker processes are alive. Either way the error names
the rank, the group is marked broken, and every later step fails at once with the same
words (the server then answers each request with that error instead of hanging).

Workers are started with ``torch.multiprocessing`` (spawn: forking a process that has
loaded torch is unsafe), or already exist under ``torchrun`` (``env://``): every rank runs
the user's script, and ranks 1..N-1 turn into workers where the engine is built.

Who may join: spawned workers meet rank 0 through a file store in a directory only this
user can read (no TCP store listening on every interface), their sockets on loopback, and
each command carries an HMAC under a key that only the workers got (through spawn's own
pipe), checked before anything is unpickled; what workers send back is bytes, never
pickles. Under torchrun, the rendezvous (``MASTER_ADDR``) decides who joins: keep it on a
private network, and give every rank the same ``MINICB_TP_SECRET`` to sign the commands
(without one, the group refuses to start: an empty key would stop no one).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from minicb.parallel.tensor_parallel import CollectiveTimer, Shard
from minicb.parallel.tp_messages import (
    CONTROL_TIMEOUT,
    TensorParallelError,
    gather_statuses,
    send_object,
    wait_until_let_go,
)

log = logging.getLogger(__name__)

COMPUTE_TIMEOUT_S = 120.0  # longest wait for a peer inside one step's collectives
DEATH_GRACE_S = 5.0  # after a failed collective, how long a dying worker may take to exit


def loopback_sockets() -> None:
    """Gloo's and NCCL's sockets on the loopback interface, unless the user chose one:
    spawned ranks share this host, and nothing beyond it should reach them."""
    names = [name for _, name in socket.if_nameindex() if name.startswith("lo")]
    for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if names:
            os.environ.setdefault(variable, names[0])


def _launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
    )


class TPGroup:
    """Rank 0's handle on the workers: ``command(msg)`` sends one to all of them."""

    def __init__(self, world: int, backend: str, timeout_s: float = COMPUTE_TIMEOUT_S) -> None:
        self.world = world
        self.backend = backend
        self.processes: list[Any] = []  # spawned workers, rank 1.. (empty under torchrun)
        self.broken: str | None = None  # the first failure, in words
        self.shard = Shard(0, world, timer=CollectiveTimer(sync_cuda=backend == "nccl"))
        self.timeout = timedelta(seconds=timeout_s)  # rank 0's longest wait to send a command
        self._handles = iter(range(1 << 62))
        self._released: list[int] = []  # runner handles to close with the next command
        self._closed = False
        self._store_dir: str | None = None  # the spawned group's rendezvous, removed at the end
        self.secret = b""  # signs every command (receive_object checks it before unpickling)
        if _launched_by_torchrun():
            self._join_torchrun(timeout_s)
        else:
            self._spawn(timeout_s)
        self.control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)

    def _spawn(self, timeout_s: float) -> None:
        from minicb.parallel import tp_worker

        self.secret = secrets.token_bytes(32)  # to the workers through spawn's pipe only
        loopback_sockets()  # before the workers start: they inherit the environment
        self._store_dir = tempfile.mkdtemp(prefix="minicb-tp-")  # mode 0700: this user only
        init = f"file://{os.path.join(self._store_dir, 'store')}"
        ctx = torch.multiprocessing.get_context("spawn")
        threads = torch.get_num_threads()
        for rank in range(1, self.world):
            args = (rank, self.world, init, self.backend, timeout_s, threads, self.secret)
            proc = ctx.Process(target=tp_worker.main, args=args, daemon=True, name=f"tp{rank}")
            proc.start()
            self.processes.append(proc)
        timeout = timedelta(seconds=timeout_s)
        dist.init_process_group(
            self.backend, init_method=init, rank=0, world_size=self.world, timeout=timeout
        )

    def _join_torchrun(self, timeout_s: float) -> None:
        world = int(os.environ["WORLD_SIZE"])
        if world != self.world:
            raise ValueError(
                f"tensor_parallel_size {self.world} but torchrun started {world} processes; "
                "give --nproc-per-node equal to tensor_parallel_size"
            )
        # Every rank the same key, or no group: an empty key signs commands anyone could sign.
        self.secret = os.environ.get("MINICB_TP_SECRET", "").encode()
        if not self.secret:
            raise ValueError(
                "under torchrun every rank needs the same MINICB_TP_SECRET to sign rank 0's "
                "commands, and it is unset or empty; set it before torchrun, e.g. export "
                "MINICB_TP_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))')"
            )
        if self.backend == "nccl":  # one GPU per rank on this host
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(self.backend, timeout=timedelta(seconds=timeout_s))
        rank = dist.get_rank()
        if rank != 0:
            from minicb.parallel import tp_worker

            control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
            tp_worker.serve(rank, self.world, control, self.secret)
            raise SystemExit(0)  # a worker's script ends with rank 0's engine

    # ---- commands ------------------------------------------------------------------------
    def open(self, path: str, config: Any, shared: int | None) -> int:
        """Ask every worker to build its shard of a runner; returns the runner's handle."""
        handle = next(self._handles)
        self.command(("open", handle, path, config, shared))
        # Wait (as long as loading takes) until every worker has built its shard, or says
        # why it could not: steps are only sent to workers that are ready for them.
        with self.guard():
            statuses = gather_statuses("", self.world, self.control)
        failed = [(rank, why) for rank, why in enumerate(statuses) if why]
        if failed:
            self.release(handle)
            rank, why = failed[0]
            raise TensorParallelError(f"tensor-parallel worker rank {rank} has no shard: {why}")
        return handle

    def release(self, handle: int) -> None:
        """A rank-0 runner is gone: its workers' shards go with the next command. Safe from
        a finalizer (it only appends; a collective there could interleave with another)."""
        self._released.append(handle)

    def command(self, msg: tuple) -> None:
        """Broadcast one command to the workers (rank 0 then runs its own part of it)."""
        self.check_alive()
        # pop one by one: a finalizer may append meanwhile, and nothing is lost that way
        released = [self._released.pop() for _ in range(len(self._released))]
        t0 = time.perf_counter()
        with self.guard():
            send_object((msg, released), self.control, self.timeout, self.secret)
        self.shard.timer.seconds += time.perf_counter() - t0

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """``with group.guard(): ...`` turns a failed collective into a TensorParallelError
        that names the rank, and marks the group broken."""
        try:
            yield
        except RuntimeError as err:  # torch.distributed's errors are RuntimeErrors
            if isinstance(err, TensorParallelError):
                raise
            why = self._wait_for_dead_rank()
            if why is None:  # all alive (or torchrun's, which rank 0 cannot see): it timed out
                ranks = ", ".join(str(r) for r in range(1, self.world))
                detail = str(err).splitlines()[0] if str(err) else type(err).__name__
                why = f"rank(s) {ranks}: a collective failed or timed out ({detail})"
            self.broken = _broken(why)
            raise TensorParallelError(self.broken) from err

    def _wait_for_dead_rank(self) -> str | None:
        # A peer's socket closed: its process is on its way out; give it a moment to exit.
        deadline = time.monotonic() + DEATH_GRACE_S
        why = self._dead_rank()
        while why is None and self.processes and time.monotonic() < deadline:
            time.sleep(0.05)
            why = self._dead_rank()
        return why

    def check_alive(self) -> None:
        if self.broken is not None:
            raise TensorParallelError(self.broken)
        dead = self._dead_rank()
        if dead is not None:
            self.fail(dead)

    def _dead_rank(self) -> str | None:
        for rank, proc in enumerate(self.processes, start=1):
            if not proc.is_alive():
                code = proc.exitcode
                how = f"exited with code {code}" if code >= 0 else f"was killed by signal {-code}"
                return f"rank {rank} (pid {proc.pid}) {how}"
        return None

    def fail(self, why: str) -> None:
        self.broken = _broken(why)
        raise TensorParallelError(self.broken)

    def shutdown(self) -> None:
        """Tell the workers to leave, wait for them, and take the process groups down."""
        if self._closed:
            return
        self._closed = True
        if self.broken is None and not self._dead_rank():
            try:
                self.command(("stop",))
                wait_until_let_go()  # else an exit right after may abort (see there)
            except (RuntimeError, TensorParallelError):
                log.warning("tensor-parallel workers did not take the stop command")
        for proc in self.processes:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
        self.broken = self.broken or "the tensor-parallel group was shut down"
        if dist.is_initialized():
            dist.destroy_process_group()
        if self._store_dir is not None:
            shutil.rmtree(self._store_dir, ignore_errors=True)


def _broken(why: str) -> str:
    return f"tensor-parallel worker {why}; this engine cannot step again: build a new one"


_current: TPGroup | None = None


def get_group(world: int, device: torch.device, timeout_s: float = COMPUTE_TIMEOUT_S) -> TPGroup:
    """The process's tensor-parallel group of ``world`` ranks, started on first use (with
    ``timeout_s``, the longest wait for a peer) and shared by every runner after (one
    process holds one group: torch.distributed's)."""
    global _current
    if _current is not None and _current.broken is None and _current.world == world:
        return _current
    if _current is not None:
        _current.shutdown()
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and torch.cuda.device_count() < world and not _launched_by_torchrun():
        raise ValueError(
            f"tensor_parallel_size {world} needs {world} GPUs (NCCL runs one rank per GPU) but "
            f"torch sees {torch.cuda.device_count()}; use fewer ranks, or device='cpu' (gloo)"
        )
    _current = TPGroup(world, backend, timeout_s)
    atexit.register(_current.shutdown)
    return _current


def shutdown_group() -> None:
    """Stop the process's tensor-parallel workers now (they also stop when it exits)."""
    if _current is not None:
        _current.shutdown()


def worker_pids() -> list[int]:
    """The process ids of the spawned workers, rank 1 first ([] if none are running)."""
    if _current is None or _current.broken is not None:
        return []
    return [p.pid for p in _current.processes]
