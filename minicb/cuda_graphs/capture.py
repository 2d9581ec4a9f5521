"""CUDA graphs for decode iterations: capture once per batch size, replay every step.

For a 135M model a decode step is a few hundred small kernel launches; on a GPU, launching
them from Python costs more than running them. A CUDA graph records the launches once and
replays them with one call. A graph is frozen: same tensor addresses, same shapes. So the
runner copies each step's inputs into static buffers, pads the batch up to the nearest
captured size (padding rows store nothing, slot -1, and attend to one token of block 0),
replays, and reads the first B rows of the static output.

Only decode-only iterations use graphs (prefill chunks vary in length), and only the
Triton backend: the torch reference reads host-side lengths, which a graph cannot follow.
If capture fails, the runner logs why and runs eagerly: graphs are an optimisation, never
a requirement.

``CudaGraphRunner`` wraps the model runner at the runner seam (minicb/core/runner/wrappers.py:
``use_cuda_graphs`` on a CUDA device, one rank): for a step it can replay, it hands the model
runner the graph's hidden states; any other step takes the forward it was given (the eager
model's, or that of a runner wrapping this one).
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

import torch

from minicb.core.attention import AttentionMetadata
from minicb.core.runner.wrappers import Forward, RunnerWrapper

if TYPE_CHECKING:
    from minicb.core.runner import Runner, RunnerOutput
    from minicb.core.runner.step_inputs import StepInputs
    from minicb.core.scheduler.plan import StepPlan

log = logging.getLogger(__name__)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, 8, then every multiple of 8 up to max_num_seqs."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs] + list(range(8, max_num_seqs + 1, 8))
    if not sizes or sizes[-1] < max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


def padded_size(batch: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds ``batch`` rows, or None if none does."""
    i = bisect.bisect_left(sizes, batch)
    return sizes[i] if i < len(sizes) else None


class DecodeGraphs:
    def __init__(self, runner, sizes: list[int]) -> None:
        self.runner = runner
        self.sizes = sizes
        device = runner.device
        max_bs = sizes[-1]
        max_blocks = -(-runner.max_model_len // runner.config.block_size)
        # Static inputs: each replay reads whatever these hold.
        self.input_ids = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_bs,), -1, dtype=torch.long, device=device)
        self.block_tables = torch.zeros((max_bs, max_blocks), dtype=torch.int32, device=device)
        self.context_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.query_start = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._capture_all()

    def _meta(self, bs: int) -> AttentionMetadata:
        max_len = self.runner.max_model_len  # fixes the kernels' launch grid for any context
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bs],
            block_tables=self.block_tables[:bs],
            context_lens=self.context_lens[:bs],
            query_start=self.query_start[: bs + 1],
            max_query_len=1,
            max_context_len=max_len,
            query_lens_host=[1] * bs,
            context_lens_host=[max_len] * bs,
        )

    def _forward(self, bs: int) -> torch.Tensor:
        r = self.runner
        return r.model(
            self.input_ids[:bs], self.positions[:bs], self._meta(bs), r.kv_caches, r.backend
        )

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None
        for bs in reversed(self.sizes):  # largest first, so smaller graphs reuse its memory
            self._forward(bs)  # eager warm-up: compiles the Triton kernels outside capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self._forward(bs)
            pool = graph.pool()
            self.graphs[bs] = (graph, out)

    def can_run(self, num_rows: int) -> bool:
        return padded_size(num_rows, self.sizes) is not None

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata):
        """Replay the graph for this decode batch; returns hidden states (B, hidden)."""
        batch = input_ids.shape[0]
        bs = padded_size(batch, self.sizes)
        self.input_ids[:batch].copy_(input_ids)
        self.positions[:batch].copy_(positions)
        self.slot_mapping[:batch].copy_(meta.slot_mapping)
        self.slot_mapping[batch:bs].fill_(-1)
        width = meta.block_tables.shape[1]
        self.block_tables[:batch, :width].copy_(meta.block_tables)
        self.context_lens[:batch].copy_(meta.context_lens)
        self.context_lens[batch:bs].fill_(1)
        graph, out = self.graphs[bs]
        graph.replay()
        return out[:batch]


def maybe_capture(runner) -> DecodeGraphs | None:
    """Decode graphs of ``runner`` (a model runner on CUDA) when its backend allows; else
    None."""
    if runner.backend.name != "triton":
        log.info("CUDA graphs need the triton attention backend; running eagerly")
        return None
    try:
        return DecodeGraphs(runner, capture_sizes(runner.config.max_num_seqs))
    except Exception as err:  # capture is an optimisation: fall back, and say why
        log.warning("CUDA graph capture failed (%s: %s); running eagerly", type(err).__name__, err)
        return None


class CudaGraphRunner(RunnerWrapper):
    """The model runner, with its decode-only steps of a captured size replayed."""

    def __init__(self, inner: Runner) -> None:
        super().__init__(inner)
        self.decode_graphs = maybe_capture(inner)  # None: eager (the reason is logged)

    def execute(self, plan: StepPlan, *, forward: Forward | None = None) -> RunnerOutput:
        return self.inner.execute(plan, forward=lambda batch: self.logits(batch, forward))

    def replays(self, meta: AttentionMetadata) -> bool:
        """Whether this step replays a captured CUDA graph (decode-only, a captured size)."""
        graphs = self.decode_graphs
        return graphs is not None and meta.is_decode_only and graphs.can_run(meta.num_requests)

    def logits(self, batch: StepInputs, forward: Forward | None = None) -> torch.Tensor | None:
        """The sampling rows' logits: from the replayed graph's hidden states where it
        replays, else from ``forward`` (default: the model runner's eager ones)."""
        if self.replays(batch.meta):
            hidden = self.decode_graphs.run(batch.input_ids, batch.positions, batch.meta)
            return self.inner.logits(batch, hidden)
        return (forward or self.inner.logits)(batch)
