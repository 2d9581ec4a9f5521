"""SimulatedRunner: a GPU that is not there. No weights, no tensors, no torch.

It is ``FakeRunner`` (the same deterministic tokens, the same forced output lengths) with
two things of a real GPU: the KV pool a serving engine would size on it, and a step time
predicted by the step-time model (minicb/cost_model/step_time.py) from each plan's rows. Each
``execute`` advances the engine's ``VirtualClock`` by that time, so every event, metric and
trace carries the times the GPU would have taken. The scheduler, block manager, events,
metrics, traces, server and visualizer are the real ones: the simulator is the engine with
another runner, ``LLMEngine(runner=SimulatedRunner(...), clock=that clock)``.

A request's output length is its ``max_tokens`` when it ignores EOS; ``output_lengths``
(request id -> tokens) makes a request that does not ignore EOS stop after that many
tokens, as if the model had said EOS there (a workload's length distribution).
``describe()`` says ``simulated`` and names the profile: traces, pages and reports read it.

The prefix cache's host tier (``kv_offload_blocks``) costs its copies: each block a plan
offloads or reloads crosses the GPU's link to host memory (the catalogue's
``host_link_gb_s``, PCIe, at the catalogue's interconnect efficiency), added to the step as
if the copies did not overlap the forward (vLLM's connector overlaps them; this is the
upper bound).

With a host-time model (``host``, minicb/sim/host_time.py) each step also costs the
host's seconds for its rows: added to the device's without overlap, the longer of the two
with ``overlap`` (the host's next plan made while the device computes); the step's
``RunnerOutput.host_lanes`` say where they fall, so the events draw both lanes and the
device's idle gaps on the virtual clock.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from minicb.core.config import EngineConfig
from minicb.core.runner import RunnerOutput, VirtualClock
from minicb.core.runner.fake import FakeRunner
from minicb.core.scheduler.plan import StepPlan
from minicb.cost_model.catalogue import load_profile
from minicb.cost_model.step_time import StepTimeModel
from minicb.parallel.settings import ParallelSettings
from minicb.quant.settings import QuantSettings
from minicb.sim.host_time import HostTime, step_lanes

GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of device memory for weights + KV
ELEM_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "float32": 4}


class SimulatedRunner(FakeRunner):
    """FakeRunner with the pool sizes of a GPU and a predicted step time per plan."""

    def __init__(
        self,
        profile: StepTimeModel | str,
        config: EngineConfig | None = None,
        *,
        clock: VirtualClock,
        output_lengths: dict[int, int] | None = None,
        gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
        tokenizer: Any | None = None,
        host: HostTime | None = None,
        overlap: bool = False,
    ) -> None:
        """``profile``: a step-time model, or its name (``"H100:llama-3.1-8b"``, see
        minicb.cost_model.catalogue.load_profile); ``config``: the engine's settings (its
        block size, dtype, KV cache dtype (an 8-bit cache: smaller blocks, more of them, and
        fewer bytes read per step), weight dtype (8-bit weights: more room for the pool and
        fewer bytes streamed per step), tensor-parallel degree, and pool sizes where it fixes
        them);
        ``clock``: the engine's clock, advanced by each step's predicted time; ``host``:
        the host's time per step, if it is to be counted; ``overlap``: the host's time
        hidden behind the device's (overlap scheduling, modelled)."""
        config = config or EngineConfig()
        tp = ParallelSettings.of(config).tensor_parallel_size
        quant = QuantSettings.of(config)
        if isinstance(profile, str):
            profile = load_profile(profile, tp)
        profile = replace(
            profile,
            elem_bytes=ELEM_BYTES[config.dtype],
            tp=tp,
            kv_cache_dtype=quant.kv_cache_dtype,
            weight_dtype=quant.weight_dtype,
        )
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
            )
        blocks = config.num_kv_blocks or profile.num_kv_blocks(
            config.block_size, gpu_memory_utilization
        )
        swap = config.num_swap_blocks if config.num_swap_blocks is not None else blocks
        max_len = min(
            config.max_model_len or profile.model.max_model_len, profile.model.max_model_len
        )
        super().__init__(
            num_kv_blocks=blocks,
            max_model_len=max_len,
            num_swap_blocks=swap,
            vocab_size=profile.model.vocab_size,
            output_lengths=dict(output_lengths or {}),
            clock=clock,
            step_time_fn=self._step_time,
            model_name=profile.model.name,
            tokenizer=tokenizer,
        )
        self.profile = profile
        self.config = config
        self.gpu_memory_utilization = gpu_memory_utilization
        self._terms: dict[str, float] = {}  # the last step's terms, for its utilisation
        self.host, self.overlap = host, overlap
        self._lanes: tuple[float, tuple[float, float, float]] | None = None  # the last step's
        # Seconds to copy one block between this GPU group and host memory: each GPU moves
        # its 1/tp of the block over its own link. A profile with no host link (this CPU's,
        # the toy one) holds its "host" pool in the same memory: a read and a write there.
        moved = profile.block_bytes(config.block_size) / tp
        if profile.gpu.host_link > 0:
            self.host_copy_s = moved / (profile.gpu.host_link * profile.efficiency.interconnect)
        else:
            self.host_copy_s = 2 * moved / (profile.gpu.bandwidth * profile.efficiency.bandwidth)

    def _step_time(self, plan: StepPlan) -> float:
        self._terms = self.profile.plan_terms(plan)
        copies = len(plan.offload_map) + len(plan.reload_map)
        device = self._terms["step_s"] + copies * self.host_copy_s
        if self.host is None:
            return device
        seconds, lanes = step_lanes(self.host, len(plan.scheduled), device, self.overlap)
        self._lanes = (device, lanes)
        return seconds

    def execute(self, plan: StepPlan) -> RunnerOutput:
        """FakeRunner's step, with the model's bandwidth and FLOP utilisation of it (and,
        with a host-time model, the host's lanes: the clock moved by both)."""
        self._lanes = None
        out = super().execute(plan)
        out.bandwidth_util = self._terms["bandwidth_util"]
        out.flop_util = self._terms["flop_util"]
        out.tensor_parallel_size = self.profile.tp
        if self._lanes is not None:  # a scripted step time (step_times) has no lanes
            out.forward_s, out.host_lanes = self._lanes
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "runner": "simulated",
            "simulated": True,
            **self.profile.describe(),
            "device": f"simulated {self.profile.gpu.name}",
            "dtype": "bfloat16" if self.config.dtype == "auto" else self.config.dtype,
            "num_kv_blocks": self.num_kv_blocks,
            "bytes_per_block": self.profile.block_bytes(self.config.block_size),
            "gpu_memory_utilization": self.gpu_memory_utilization,
            # The host's time per step, if counted, and whether overlap hides it (modelled).
            "host_time": None if self.host is None else self.host.name,
            "overlap_modelled": self.overlap,
        }

    def with_config(self, config: EngineConfig) -> SimulatedRunner:
        """The same GPU and clock for new settings (the pool resized for them)."""
        return SimulatedRunner(
            self.profile,
            config,
            clock=self.clock,
            output_lengths=self.output_lengths,
            gpu_memory_utilization=self.gpu_memory_utilization,
            tokenizer=self.tokenizer,
            host=self.host,
            overlap=self.overlap,
        )
