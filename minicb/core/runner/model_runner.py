"""ModelRunner: StepPlan -> one flat ragged batch -> model -> sampled tokens.

The runner of the real model (see minicb.core.runner for the seam it fills).

It owns the model weights (built by build_model.py) and the KV pools (minicb.core.runner.kv_pool,
sized by kv_setup.py): one on the device of shape ``(num_layers, 2, num_blocks, block_size,
num_kv_heads, head_dim)`` (and, for an 8-bit KV cache, its scales) and a host twin for
swapped-out blocks. Each iteration it copies blocks the plan swaps out, then those it swaps
in (``kv_pool.copy_blocks``, the one way a block moves between pools), flattens the plan
into one ragged batch (minicb.core.runner.step_inputs: ids, positions and attention metadata
for every scheduled token, no padding between requests), runs the model, and samples one
token for each request whose uncomputed tokens are now all computed (and, for a row that
verifies speculative drafts, one after each draft too).

With ``tensor_parallel_size`` N > 1 this runner is rank 0 of N: it holds 1/N of every
layer (minicb.parallel.tensor_parallel) and 1/N of the KV heads, sends each plan to the
workers (minicb.parallel.tp_group) and samples; a worker runs the same class with its
``shard``, through ``run_shard`` (minicb.parallel.tp_worker).
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Iterator

import torch

from minicb.core.attention import get_backend
from minicb.core.config import EngineConfig
from minicb.core.runner import RunnerOutput
from minicb.core.runner.build_model import build_model, check_shareable, model_config
from minicb.core.runner.dtype import choose_dtype
from minicb.core.runner.kv_pool import copy_blocks
from minicb.core.runner.kv_setup import allocate_pools
from minicb.core.runner.llama import LlamaModel
from minicb.core.runner.loader import ModelFiles, open_model
from minicb.core.runner.runner_views import ModelRunnerViews
from minicb.core.runner.sampler import sample
from minicb.core.runner.step_inputs import StepInputs, step_inputs
from minicb.core.scheduler.plan import StepPlan
from minicb.cuda_graphs.capture import maybe_capture
from minicb.kernels.batch_invariant import BatchInvariantBackend
from minicb.parallel.tensor_parallel import Shard, shard_config
from minicb.utilisation.occupancy import Occupancy
from minicb.utilisation.probes import MachineRates

# A step's logits from its inputs: ``ModelRunner.logits``, or a wrapper's (``execute``).
Forward = Callable[[StepInputs], "torch.Tensor | None"]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA device")
    return device


class ModelRunner(ModelRunnerViews):
    """``ModelRunner(model, config)``: model None is the embedded default; a path or hub id
    otherwise. ``with_config`` makes another runner on the same weights; what it tells
    outsiders (``describe``, its dtypes and block size) is in runner_views.py."""

    def __init__(
        self,
        model: str | None,
        config: EngineConfig,
        *,
        files: ModelFiles | None = None,
        shared_model: LlamaModel | None = None,
        shard: Shard | None = None,
        tp_shared: int | None = None,
        machine_rates: MachineRates | None = None,
    ) -> None:
        """``shard``: set on a tensor-parallel worker (rank 1..N-1); ``tp_shared``: the
        handle of the rank-0 runner whose workers hold ``shared_model``'s shards;
        ``machine_rates``: the rates ``measure_utilisation`` measures against (None: probe
        this machine, once per process)."""
        self.config = config
        self.files = files or open_model(model)
        self.model_name = self.files.name
        self.tokenizer = self.files.tokenizer
        self.stop_token_ids = self.files.stop_token_ids
        self.device = resolve_device(config.device)
        self.dtype_choice = choose_dtype(config.dtype, self.device)  # "auto": by capability
        self.dtype = self.dtype_choice.dtype
        # Before the weights load: a backend that cannot run here is refused at once.
        self.backend = (
            BatchInvariantBackend()
            if config.batch_invariant
            else get_backend(config.attention_backend, self.device)
        )
        self.model_config = model_config(self.files.hf_config)
        world = config.tensor_parallel_size
        # Each step's utilisation of this machine's measured rates (rank 0 only: it samples).
        self.occupancy = None
        if config.measure_utilisation and shard is None:
            self.occupancy = Occupancy.measure(
                self.files.path, self.device, self.dtype, world, machine_rates
            )
        self.tp = None  # rank 0's handle on its workers (tp_group.TPGroup) when world > 1
        if world > 1:
            self.model_config = shard_config(self.model_config, world)  # this rank's part
            if shard is None:
                from minicb.parallel.tp_group import get_group

                self.tp = get_group(world, self.device)
                shard = self.tp.shard
        self.shard = shard
        cfg = self.model_config
        self.vocab_size = cfg.vocab_size
        self.max_model_len = min(
            config.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings
        )
        # The model as this runner needs it: shape, settings, device, dtype and context.
        wanted = (self.model_config, config, self.device, self.dtype, self.max_model_len)
        if shared_model is not None:
            # A second engine on the same weights (static beside continuous): only KV is new.
            check_shareable(shared_model, *wanted)
            self.model = shared_model
        else:
            self.model = build_model(self.files, *wanted, shard)
        self._allocate_kv()
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(config.seed)
        # None on CPU or when turned off; and under tensor parallelism, whose all-reduces
        # would have to be captured on every rank in step.
        self.decode_graphs = maybe_capture(self) if world == 1 else None
        if self.tp is not None:
            self._open_workers(tp_shared)

    def _open_workers(self, shared: int | None) -> None:
        """Have every worker build its shard, with the pool sizes rank 0 chose."""
        sizes = dict(num_kv_blocks=self.num_kv_blocks, num_swap_blocks=self.num_swap_blocks)
        config = self.config.with_(**sizes)
        self.tp_handle = self.tp.open(str(self.files.path), config, shared)
        weakref.finalize(self, self.tp.release, self.tp_handle)

    def _allocate_kv(self) -> None:
        """The paged KV pool on the device, its swap twin in host memory, and the prefix
        cache's host tier (kv_setup.py sizes them); the per-layer views the model takes."""
        pools = allocate_pools(
            self.config, self.model_config, self.dtype, self.device, self.max_model_len
        )
        self.kv_pool, self.swap_pool, self.offload_pool = pools.device, pools.swap, pools.host
        self.num_kv_blocks, self.num_swap_blocks = pools.device.num_blocks, pools.swap.num_blocks
        self.kv_caches = self.kv_pool.layers()  # per layer (k_cache, v_cache), as the model takes

    @property
    def kv_cache(self) -> torch.Tensor:
        """The device pool's values (num_layers, 2, num_blocks, block_size, heads, head_dim)."""
        return self.kv_pool.values

    def with_config(self, config: EngineConfig) -> ModelRunner:
        """A runner for ``config`` on these weights: only the KV cache is new."""
        shared = self.tp_handle if self.tp is not None else None
        return ModelRunner(
            None,
            config,
            files=self.files,
            shared_model=self.model,
            tp_shared=shared,
            machine_rates=self.occupancy.rates if self.occupancy else None,
        )

    # ---- one iteration ---------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, plan: StepPlan, *, forward: Forward | None = None) -> RunnerOutput:
        """One step. ``forward``: the step's logits from its inputs (default ``logits``, the
        model eager or on a captured CUDA graph); a runner that wraps this one passes its
        own (the performance lab's compiled decode step, perflab/compiled.py) and gets the
        swaps, timing, sampling and utilisation of this one."""
        with self._tp_step(plan):
            self._copy_swaps(plan)
            if plan.is_empty:
                return RunnerOutput(collective_s=self._collective_s())
            t0 = time.perf_counter()
            batch = step_inputs(plan, self.config.block_size, self.device)
            logits = (forward or self.logits)(batch)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
        t1 = time.perf_counter()
        sampled = self._sample(plan, logits)
        out = RunnerOutput(
            sampled,
            forward_s=t1 - t0,
            sample_s=time.perf_counter() - t1,
            collective_s=self._collective_s(),
        )
        if self.occupancy is not None:
            out.bandwidth_util, out.flop_util = self.occupancy.utilisation(plan, out.forward_s)
        return out

    @torch.inference_mode()
    def run_shard(self, plan: StepPlan) -> None:
        """A tensor-parallel worker's part of a step: the swaps and the forward, no sampling."""
        self._copy_swaps(plan)
        if not plan.is_empty:
            self._hidden(step_inputs(plan, self.config.block_size, self.device))

    def logits(self, batch: StepInputs) -> torch.Tensor | None:
        """(N, vocab) logits of the batch's N sampling rows, in order; None if none samples.
        The forward runs (and stores KV) whether or not a row samples."""
        hidden = self._hidden(batch)
        rows = batch.sample_rows
        return self.model.logits(hidden[rows]) if rows else None

    def replays(self, meta) -> bool:
        """Whether this step replays a captured CUDA graph (decode-only, a captured size)."""
        graphs = self.decode_graphs
        return graphs is not None and meta.is_decode_only and graphs.can_run(meta.num_requests)

    def _hidden(self, batch: StepInputs) -> torch.Tensor:
        """(T, hidden) final hidden states of the step's ragged batch, eager or on a
        captured CUDA graph."""
        ids, positions, meta = batch.input_ids, batch.positions, batch.meta
        if self.replays(meta):
            return self.decode_graphs.run(ids, positions, meta)
        return self.model(ids, positions, meta, self.kv_caches, self.backend)

    @contextlib.contextmanager
    def _tp_step(self, plan: StepPlan) -> Iterator[None]:
        """Under tensor parallelism: send the plan to the workers, and turn a failed
        collective into an error that names the rank. Otherwise: nothing."""
        if self.tp is None:
            yield
            return
        self.tp.command(("step", self.tp_handle, plan))
        with self.tp.guard():
            yield

    def _collective_s(self) -> float:
        return self.shard.timer.take() if self.shard is not None else 0.0

    def _sample(self, plan: StepPlan, logits: torch.Tensor | None) -> dict[int, int | list[int]]:
        """One token per sampling row; a row with d drafts samples at each of its last 1 + d
        positions (the token after its last real token, then after each draft)."""
        rows = [r for r in plan.scheduled if r.samples]
        if not rows:
            return {}
        widths = [1 + r.num_draft_tokens for r in rows]
        tokens = sample(
            logits,
            [r.params for r, w in zip(rows, widths, strict=True) for _ in range(w)],
            [r.num_output_tokens + i for r, w in zip(rows, widths, strict=True) for i in range(w)],
            self.generator,
        )
        sampled: dict[int, int | list[int]] = {}
        at = 0
        for r, w in zip(rows, widths, strict=True):
            sampled[r.request_id] = tokens[at] if w == 1 else tokens[at : at + w]
            at += w
        return sampled

    def _copy_swaps(self, plan: StepPlan) -> None:
        # Every read of the device first (swap-outs, the host tier's offloads): their blocks
        # may be handed to others, and written, in this same step.
        copy_blocks(self.kv_pool, self.swap_pool, plan.swap_out_map)
        copy_blocks(self.kv_pool, self.offload_pool, plan.offload_map)
        copy_blocks(self.swap_pool, self.kv_pool, plan.swap_in_map)
        copy_blocks(self.offload_pool, self.kv_pool, plan.reload_map)
