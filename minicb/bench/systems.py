"""The four systems under test, built once in one process on one copy of the weights.

- ``minicb-continuous`` and ``minicb-static``: two LLMEngines sharing one model (same
  weights, dtype, device, kernels, KV pool size and limits), so their ratio measures
  scheduling and nothing else;
- ``hf-padded`` and ``hf-continuous``: transformers' model loaded from the same folder in
  the same dtype on the same device, run with the same batch limits.

Threads are pinned by the caller (``torch.set_num_threads``) before anything is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minicb.bench.driver import run_minicb
from minicb.bench.hf_continuous import run_hf_continuous
from minicb.bench.hf_padded import run_hf_padded
from minicb.bench.presets import BenchPlan
from minicb.bench.records import RunRecord, failed_run
from minicb.bench.workloads import Workload
from minicb.scheduler.block_manager import blocks_needed
from minicb.config import EngineConfig
from minicb.engine import LLMEngine


def kv_blocks_for(workloads: list[Workload], slots: int, block_size: int) -> int:
    """A pool where every slot can hold the longest request of any workload: no preemption
    is forced by the pool size, so the comparison is about batching alone."""
    longest = max(max(w.prompt_lens) + max(w.output_lens) for w in workloads)
    return slots * blocks_needed(longest, block_size) + 1


@dataclass
class Systems:
    plan: BenchPlan
    continuous: LLMEngine
    static: LLMEngine
    num_kv_blocks: int
    hf_model: Any = None
    hf_error: str | None = None

    def run(self, name: str, workload: Workload, trace_path: str | None = None) -> RunRecord:
        p = self.plan
        slo = (p.ttft_slo, p.tpot_slo)
        if name == "minicb-continuous":
            return run_minicb(self.continuous, workload, name, *slo, trace_path=trace_path)
        if name == "minicb-static":
            return run_minicb(self.static, workload, name, *slo, trace_path=trace_path)
        if self.hf_model is None:
            return failed_run(
                name, workload.name, f"transformers model unavailable: {self.hf_error}"
            )
        if name == "hf-padded":
            try:
                return run_hf_padded(self.hf_model, workload, p.max_num_seqs, *slo)
            except Exception as err:  # report why, and let the rest of the suite go on
                return failed_run(name, workload.name, f"{type(err).__name__}: {err}")
        if name == "hf-continuous":
            return run_hf_continuous(
                self.hf_model,
                workload,
                max_num_seqs=p.max_num_seqs,
                max_batch_tokens=p.max_num_batched_tokens,
                page_size=p.block_size,
                num_blocks=self.num_kv_blocks,
                ttft_slo=p.ttft_slo,
                tpot_slo=p.tpot_slo,
            )
        raise ValueError(f"unknown system {name!r}")

    def engine_config(self, **changes: Any) -> EngineConfig:
        return self.continuous.config.with_(**changes)

    def sibling(self, **changes: Any) -> LLMEngine:
        """Another minicb engine on the same weights (for the decode sweep)."""
        return LLMEngine(config=self.engine_config(**changes), share_weights_with=self.continuous)


def build_systems(
    model: str | None, dtype: str, device: str, plan: BenchPlan, workloads: list[Workload]
) -> Systems:
    blocks = kv_blocks_for(workloads, plan.max_num_seqs, plan.block_size)
    config = EngineConfig(
        batching="continuous",
        dtype=dtype,
        device=device,
        max_num_seqs=plan.max_num_seqs,
        max_num_batched_tokens=plan.max_num_batched_tokens,
        block_size=plan.block_size,
        num_kv_blocks=blocks,
        num_swap_blocks=0,  # recompute preemption: no host swap space to allocate
        seed=plan.seed,
    )
    continuous = LLMEngine(model, config)
    static = LLMEngine(config=config.with_(batching="static"), share_weights_with=continuous)
    systems = Systems(plan, continuous, static, blocks)
    if any(s.startswith("hf-") for s in plan.systems):
        try:
            systems.hf_model = load_hf_model(continuous)
        except Exception as err:  # the minicb half of the suite still runs
            systems.hf_error = f"{type(err).__name__}: {err}"
    return systems


def load_hf_model(engine: LLMEngine) -> Any:
    """transformers' model from the engine's folder, in the engine's dtype and device."""
    from transformers import AutoModelForCausalLM

    runner = engine.runner
    model = AutoModelForCausalLM.from_pretrained(engine.files.path, dtype=runner.dtype)
    return model.to(runner.device).eval()
