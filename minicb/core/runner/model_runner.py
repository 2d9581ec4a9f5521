"""ModelRunner: StepPlan -> one flat ragged batch -> model -> sampled tokens: the runner of
the real model (see minicb.core.runner for the seam it fills).

It owns the model weights (build_model.py) and the KV pools (kv_pool.py, sized by
kv_setup.py): one on the device, ``(num_layers, 2, num_blocks, block_size, num_kv_heads,
head_dim)``, and a host twin for swapped-out blocks. Each iteration it copies the blocks the
plan swaps out, then those it swaps in (``kv_pool.copy_blocks``), flattens the plan into one
ragged batch (step_inputs.py: every scheduled token, no padding between requests), runs the
model, and samples a token for each request whose tokens are now all computed (and, for a
row that verifies speculative drafts, one after each draft too).

This is the plain path: the whole model, eager, on one device. Tensor parallelism, CUDA
graphs, utilisation, int8 or packed weights and batch invariance wrap this runner or change
how its weights are held, from their own folders, through the seam in wrappers.py;
``build_runner`` puts together the runner a config asks for.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from minicb.core.attention import get_backend
from minicb.core.config import EngineConfig
from minicb.core.runner import Runner, RunnerOutput
from minicb.core.runner.build_model import build_model, check_shareable, model_config
from minicb.core.runner.dtype import choose_dtype
from minicb.core.runner.kv_pool import copy_blocks
from minicb.core.runner.kv_setup import allocate_pools, block_bytes
from minicb.core.runner.llama import LlamaModel
from minicb.core.runner.loader import ModelFiles, open_model
from minicb.core.runner.runner_views import describe
from minicb.core.runner.sampler import sample
from minicb.core.runner.step_inputs import StepInputs, step_inputs
from minicb.core.runner.wrappers import Forward, ModelPart, weight_forms, wrappers
from minicb.core.scheduler.hooks import DraftVerifier
from minicb.core.scheduler.plan import ScheduledRequest, StepPlan


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA device")
    return device


def build_runner(model: str | None, config: EngineConfig, sibling: Runner | None = None) -> Runner:
    """The runner ``config`` asks for: a ``ModelRunner`` (of the part of the model a wrapper
    names, if one does) inside every wrapper the config asks for, innermost first.
    ``sibling``: a runner on the same weights, which the new one shares (``with_config``)."""
    device = resolve_device(config.device)
    chain = wrappers(config, device)
    part = next((p for w in chain if (p := w.part(config, device)) is not None), None)
    files, shared = (sibling.files, sibling.model) if sibling else (None, None)
    runner: Runner = ModelRunner(model, config, files=files, shared_model=shared, part=part)
    for wrapper in chain:
        runner = wrapper.wrap(runner, config, sibling)
    return runner


class ModelRunner:
    """``ModelRunner(model, config)``: model None is the embedded default; a path or hub id
    otherwise. ``with_config`` makes another runner on the same weights."""

    def __init__(
        self,
        model: str | None,
        config: EngineConfig,
        *,
        files: ModelFiles | None = None,
        shared_model: LlamaModel | None = None,
        part: ModelPart | None = None,
    ) -> None:
        """``shared_model``: weights another runner built, which this one shares;
        ``part``: the part of the model to hold (a tensor-parallel shard), None for all."""
        self.config = config
        self.files = files or open_model(model)
        self.model_name = self.files.name
        self.model_path = str(self.files.path)  # the folder of the weights and config.json
        self.tokenizer = self.files.tokenizer
        self.stop_token_ids = self.files.stop_token_ids
        self.device = resolve_device(config.device)
        self.dtype_choice = choose_dtype(config.dtype, self.device)  # "auto": by capability
        self.dtype = self.dtype_choice.dtype
        # Before the weights load: a backend that cannot run here is refused at once.
        backend = config.answer("attention backend", config.attention_backend)
        self.backend = get_backend(backend, self.device)
        self.weight_forms = weight_forms(config, self.device, self.dtype)
        cfg = model_config(self.files.hf_config)
        self.model_config = cfg = part.config(cfg) if part is not None else cfg
        self.vocab_size = cfg.vocab_size
        self.max_model_len = min(
            config.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings
        )
        # The model as this runner needs it: shape, forms, device, dtype and context.
        wanted = (cfg, self.weight_forms, self.device, self.dtype, self.max_model_len)
        if shared_model is not None:
            # A second engine on the same weights (static beside continuous): only KV is new.
            check_shareable(shared_model, *wanted)
            self.model = shared_model
        else:
            self.model = build_model(self.files, *wanted, part)
        pools = allocate_pools(config, cfg, self.dtype, self.device, self.max_model_len)
        self.kv_pool, self.swap_pool, self.offload_pool = pools.device, pools.swap, pools.host
        self.num_kv_blocks, self.num_swap_blocks = pools.device.num_blocks, pools.swap.num_blocks
        self.kv_caches = self.kv_pool.layers()  # per layer (k_cache, v_cache), as the model takes
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(config.seed)
        # Speculation's runner side (hooks.py's DraftVerifier): verifies the drafted rows
        # whose drafts came with distributions; None: every row is sampled alike.
        self.draft_verifier: DraftVerifier | None = None

    def set_draft_verifier(self, verifier: DraftVerifier) -> None:
        """Set by the drafter when the engine attaches it (hooks.attach_runner)."""
        self.draft_verifier = verifier

    @property
    def kv_cache(self) -> torch.Tensor:
        """The device pool's values (num_layers, 2, num_blocks, block_size, heads, head_dim)."""
        return self.kv_pool.values

    def with_config(self, config: EngineConfig, sibling: Runner | None = None) -> Runner:
        """A runner for ``config`` on these weights (only the KV cache is new), wrapped as
        ``config`` asks; ``sibling``: the whole chain this runner is inside, if it is."""
        return build_runner(None, config, sibling or self)

    # ---- one iteration ---------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, plan: StepPlan, *, forward: Forward | None = None) -> RunnerOutput:
        """One step. ``forward``: the step's logits from its inputs (default ``logits``, the
        eager model); a runner that wraps this one passes its own (a CUDA graph's replay,
        the performance lab's compiled decode step) and gets the copies, timing and
        sampling of this one."""
        self._copy_swaps(plan)
        if plan.is_empty:
            return RunnerOutput()
        t0 = time.perf_counter()
        batch = step_inputs(plan, self.config.block_size, self.device)
        logits = (forward or self.logits)(batch)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        sampled = self._sample(plan, logits)
        return RunnerOutput(sampled, forward_s=t1 - t0, sample_s=time.perf_counter() - t1)

    @torch.inference_mode()
    def forward_pass(self, plan: StepPlan) -> None:
        """The plan's block copies and forward pass (its KV stored), nothing sampled: a step
        on a rank that does not sample (a tensor-parallel worker)."""
        self._copy_swaps(plan)
        if not plan.is_empty:
            self._hidden(step_inputs(plan, self.config.block_size, self.device))

    def logits(self, batch: StepInputs, hidden: torch.Tensor | None = None) -> torch.Tensor | None:
        """(N, vocab) logits of the batch's N sampling rows, in order; None if none samples.
        The forward runs (and stores KV) whether or not a row samples; ``hidden``: the
        step's final hidden states where a wrapper computed them (a replayed CUDA graph)."""
        hidden = self._hidden(batch) if hidden is None else hidden
        rows = batch.sample_rows
        return self.model.logits(hidden[rows]) if rows else None

    def _hidden(self, batch: StepInputs) -> torch.Tensor:
        """(T, hidden) final hidden states of the step's ragged batch."""
        ids, positions, meta = batch.input_ids, batch.positions, batch.meta
        return self.model(ids, positions, meta, self.kv_caches, self.backend)

    def _sample(self, plan: StepPlan, logits: torch.Tensor | None) -> dict[int, int | list[int]]:
        """One token per sampling row; a row with d drafts samples at each of its last 1 + d
        positions (the token after its last real token, then after each draft)."""
        rows = [r for r in plan.scheduled if r.samples]
        if not rows:
            return {}
        sampled: dict[int, int | list[int]] = {}
        if self.draft_verifier is not None:  # drafts drawn from a distribution: verified apart
            sampled, rows, logits = self._verify_apart(rows, logits)
            if not rows:
                return sampled
        widths = [1 + r.num_draft_tokens for r in rows]
        tokens = sample(
            logits,
            [r.params for r, w in zip(rows, widths, strict=True) for _ in range(w)],
            [r.num_output_tokens + i for r, w in zip(rows, widths, strict=True) for i in range(w)],
            self.generator,
        )
        at = 0
        for r, w in zip(rows, widths, strict=True):
            sampled[r.request_id] = tokens[at] if w == 1 else tokens[at : at + w]
            at += w
        return sampled

    def _verify_apart(
        self, rows: list[ScheduledRequest], logits: torch.Tensor
    ) -> tuple[dict[int, int | list[int]], list[ScheduledRequest], torch.Tensor]:
        """The drafted rows the verifier takes (their tokens), and the other rows with only
        their logits, for the sampler."""
        starts = [0]
        for r in rows:
            starts.append(starts[-1] + 1 + r.num_draft_tokens)
        verified: dict[int, int | list[int]] = {}
        for i, r in enumerate(rows):
            if r.num_draft_tokens:
                own = self.draft_verifier.verify(
                    r, logits[starts[i] : starts[i + 1]], self.generator
                )
                if own is not None:
                    verified[r.request_id] = own
        if not verified:
            return verified, rows, logits
        keep = [i for i, r in enumerate(rows) if r.request_id not in verified]
        picks = [j for i in keep for j in range(starts[i], starts[i + 1])]
        logits = logits[torch.tensor(picks, dtype=torch.long, device=logits.device)]
        return verified, [rows[i] for i in keep], logits

    def _copy_swaps(self, plan: StepPlan) -> None:
        # Every read of the device first (swap-outs, the host tier's offloads): their blocks
        # may be handed to others, and written, in this same step.
        copy_blocks(self.kv_pool, self.swap_pool, plan.swap_out_map)
        copy_blocks(self.kv_pool, self.offload_pool, plan.offload_map)
        copy_blocks(self.swap_pool, self.kv_pool, plan.swap_in_map)
        copy_blocks(self.offload_pool, self.kv_pool, plan.reload_map)

    # ---- what it tells outsiders (runner_views.py words it) ------------------------------
    def describe(self) -> dict[str, Any]:
        return describe(self)

    def bytes_per_block(self) -> int:
        """Bytes of one block in every layer (keys, values and any scales): an 8-bit KV
        cache's block is about half a bf16 one, so a byte budget holds about twice as many."""
        return block_bytes(self.config, self.model_config, self.dtype)
