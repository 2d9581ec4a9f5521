"""The five systems under test, built once in one process on one copy of the weights, and
how each one is run by name.

- ``minicb-continuous``, ``minicb-static`` and ``minicb-static-sorted`` (static batches drawn
  from the queue sorted by max_tokens: static given its best chance): three
  LLMEngines whose runners share one model (same weights, dtype, device, kernels, KV pool
  size and limits), so their ratios measure scheduling and nothing else; each is run by
  the minicb driver (``run_minicb``, in ``__init__.py``);
- ``hf-padded`` and ``hf-continuous``: transformers' padded ``generate`` in batches and
  its own continuous batching, on the same weights loaded by transformers, under the same
  bounds (transformers_systems.py: how each is run, and rebuilt as minicb events).

Here: the ``Systems`` of one suite (which runs any of the five by name), minicb's siblings
of one engine (the prefix-caching comparison among them), and the KV pool every system
gets. Threads are pinned before anything is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minicb.bench import RunRecord, SLOs, performance_lab, run_minicb
from minicb.bench.recipes import MINICB, MINICB_CONFIGS, BenchPlan
from minicb.bench.sanity import ImplausibleFigure
from minicb.bench.transformers_systems import run_hf_continuous, run_hf_padded
from minicb.core.config import EngineConfig
from minicb.core.engine import LLMEngine
from minicb.core.runner.loader import resolve_model_path
from minicb.core.scheduler.block_manager import blocks_needed
from minicb.workload import Workload


@dataclass
class Systems:
    plan: BenchPlan
    continuous: LLMEngine
    siblings: dict[str, LLMEngine]  # the other minicb systems, by name
    num_kv_blocks: int
    hf_model: Any = None
    hf_error: str | None = None

    def run(self, name: str, workload: Workload, trace_path: str | None = None) -> RunRecord:
        p, slo = self.plan, (self.plan.ttft_slo, self.plan.tpot_slo)
        if name in MINICB:
            # A fresh engine on the same weights for every run: an empty KV pool and prefix
            # cache, as each transformers run starts with. A reused engine would keep the
            # prefix cache of the warm-up and earlier repeats and skip their prompts' prefill.
            engine = sibling(self.siblings.get(name, self.continuous))
            return run_minicb(engine, workload, name, slo, trace_path)
        if self.hf_model is None:
            error = f"transformers unavailable: {self.hf_error}"
            return RunRecord(name, workload.name, error=error)
        try:
            if name == "hf-padded":
                return run_hf_padded(self.hf_model, workload, p.max_num_seqs, slo)
            return run_hf_continuous(
                self.hf_model, workload, slo, page_size=p.block_size,
                num_blocks=self.num_kv_blocks, max_batch_tokens=p.max_num_batched_tokens,
                max_requests_per_batch=p.max_num_seqs,
            )  # fmt: skip
        except ImplausibleFigure:  # a bug in the bench, not in transformers: stop the suite
            raise
        except Exception as err:  # report why, and let the rest of the suite go on
            return RunRecord(name, workload.name, error=f"{type(err).__name__}: {err}")


def sibling(engine: LLMEngine, **changes: Any) -> LLMEngine:
    """A separate engine (own KV pool, own bus) with ``changes`` to the config, whose runner
    shares ``engine``'s weights."""
    config = engine.config.with_(**changes)
    return LLMEngine(config=config, runner=engine.runner.with_config(config))


def minicb_siblings(continuous: LLMEngine) -> dict[str, LLMEngine]:
    """The other minicb systems, each a sibling of the continuous engine."""
    return {n: sibling(continuous, **c) for n, c in MINICB_CONFIGS.items() if c}


def compare_prefix_caching(
    engine: LLMEngine, workload: Workload, slo: SLOs = (None, None),
    order: tuple[str, ...] = ("off", "on"), traces: dict[str, str | None] | None = None,
    **changes: Any,
) -> dict[str, RunRecord]:  # fmt: skip
    """The workload with prefix caching off, then on (or in ``order``), on siblings of
    ``engine`` (the same weights, a fresh KV pool each, ``changes`` to the config):
    {"off": record, "on": record}, in one run; ``traces``: a trace path for either."""
    return {
        name: run_minicb(
            sibling(engine, enable_prefix_caching=name == "on", **changes),
            workload,
            f"minicb-cache-{name}",
            slo,
            (traces or {}).get(name),
        )
        for name in order
    }


def kv_blocks_for(workloads: list[Workload], slots: int, block_size: int) -> int:
    """A pool where every slot can hold the longest request of any workload: no preemption
    is forced by the pool size, so the comparison is about batching alone."""
    longest = max(max(w.prompt_lens) + max(w.output_lens) for w in workloads)
    return slots * blocks_needed(longest, block_size) + 1


def build_systems(
    model: str | None, plan: BenchPlan, workloads: list[Workload], **options: str
) -> Systems:
    """The suite's systems; ``options``: the engine's dtype and device, which every minicb
    system shares (its siblings share the runner), and ``compile="on"``: every minicb
    system on the performance lab's compiled runner (perflab.compiled), one compiled step
    shared by all, graphs included."""
    compiled = options.pop("compile", "off") == "on"
    blocks = kv_blocks_for(workloads, plan.max_num_seqs, plan.block_size)
    config = EngineConfig.from_kwargs(
        batching="continuous", max_num_seqs=plan.max_num_seqs, **options,
        max_num_batched_tokens=plan.max_num_batched_tokens, block_size=plan.block_size,
        num_kv_blocks=blocks, num_swap_blocks=0, seed=plan.seed,  # recompute: no swap space
    )  # fmt: skip
    if compiled:
        lab = performance_lab("compiled")
        if lab is None:
            raise ValueError(
                "--compile on is the performance lab's (perflab/, beside the package in a "
                "source checkout): run minicb bench from the repository root"
            )
        continuous = lab.compiled_engine(model, config)
    else:
        continuous = LLMEngine(model, config)
    systems = Systems(plan, continuous, minicb_siblings(continuous), blocks)
    if any(s.startswith("hf-") for s in plan.systems):
        try:  # transformers' model from the same folder, in the engine's dtype and device
            from transformers import AutoModelForCausalLM

            runner = continuous.runner
            hf = AutoModelForCausalLM.from_pretrained(resolve_model_path(model), dtype=runner.dtype)
            systems.hf_model = hf.to(runner.device).eval()
        except Exception as err:  # the minicb half of the suite still runs
            systems.hf_error = f"{type(err).__name__}: {err}"
    return systems
