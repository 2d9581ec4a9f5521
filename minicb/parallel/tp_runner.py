"""Rank 0's runner under tensor parallelism: the model runner on rank 0's shard, wrapped so
that every step is sent to the workers first.

Registered at the runner seam (minicb/core/runner/wrappers.py) as "tensor_parallel", asked
for by ``tensor_parallel_size`` > 1. Its ``part`` is rank 0's ``Shard`` (1/N of every layer,
1/N of the KV heads; tensor_parallel.py), which the model runner inside builds and holds;
this wrapper opens the same runner's shard on every worker (tp_group.py), with the pool
sizes rank 0 chose, and then each step:

1. sends the plan to the workers (each runs its shard's copies and forward pass,
   tp_worker.py), and
2. runs rank 0's own part through the model runner, whose layers all-reduce with the
   workers'; a failed collective becomes an error that names the rank (``guard``), and the
   seconds spent in collectives go into ``collective_s``.

Rank 0 alone samples: the LM head lives on it.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from minicb.core.runner.model_runner import resolve_device
from minicb.core.runner.wrappers import Forward, RunnerWrapper, find_layer
from minicb.parallel.settings import ParallelSettings
from minicb.parallel.tp_group import TPGroup, get_group

if TYPE_CHECKING:
    import torch

    from minicb.core.config import EngineConfig
    from minicb.core.runner import Runner, RunnerOutput
    from minicb.core.runner.step_inputs import StepInputs
    from minicb.core.scheduler.plan import StepPlan
    from minicb.parallel.tensor_parallel import Shard


class TensorParallelRunner(RunnerWrapper):
    """Rank 0 of N: ``inner`` holds rank 0's shard; ``tp`` is the group of workers."""

    def __init__(self, inner: Runner, group: TPGroup, shared: int | None = None) -> None:
        """``shared``: the handle of a rank-0 runner whose workers hold the shards that
        ``inner``'s weights are rank 0's part of (static beside continuous)."""
        super().__init__(inner)
        self.tp = group
        sizes = dict(num_kv_blocks=inner.num_kv_blocks, num_swap_blocks=inner.num_swap_blocks)
        self.tp_handle = group.open(inner.model_path, inner.config.with_(**sizes), shared)
        weakref.finalize(self, group.release, self.tp_handle)

    @classmethod
    def part(cls, config: EngineConfig, device: torch.device) -> Shard:
        """Rank 0's shard of the process's group (started on first use)."""
        return get_group(ParallelSettings.of(config).tensor_parallel_size, device).shard

    @classmethod
    def wrap(cls, inner: Runner, config: EngineConfig, sibling: Runner | None) -> Runner:
        like = find_layer(sibling, cls)
        size = ParallelSettings.of(config).tensor_parallel_size
        group = get_group(size, resolve_device(config.device))
        return cls(inner, group, like.tp_handle if like is not None else None)

    def execute(self, plan: StepPlan, *, forward: Forward | None = None) -> RunnerOutput:
        self.tp.command(("step", self.tp_handle, plan))
        out = self.inner.execute(plan, forward=lambda batch: self._logits(batch, forward))
        out.tensor_parallel_size = self.tp.world
        out.collective_s = self.tp.shard.timer.take()
        return out

    def _logits(self, batch: StepInputs, forward: Forward | None) -> torch.Tensor | None:
        """Rank 0's forward pass, all-reducing with the workers' inside every layer."""
        with self.tp.guard():
            return (forward or self.inner.logits)(batch)

    def describe(self) -> dict[str, Any]:
        ranks = {"tensor_parallel_size": self.tp.world, "tensor_parallel_backend": self.tp.backend}
        return self.inner.describe() | ranks
