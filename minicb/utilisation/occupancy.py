"""How busy the hardware was in a step of the real model: its forward time against the
roofline minimum measured on this machine.

For one StepPlan whose forward pass took ``forward_s`` seconds:

    bytes, flops   = the step-time model's work of the plan's rows (ModelShape.step_work of
                     step_totals, minicb/cost_model/step_time.py), divided by the ranks
    bandwidth_util = bytes / (copy bandwidth x forward_s)
    flop_util      = flops / (matmul FLOP/s x forward_s)

The rates are this machine's, measured by minicb.utilisation.probes (a copy of at least 256 MiB
and twice the weights; a square matmul in the engine's dtype), the same probes as the
benchmark's decode roofline, so 1.0 is the roofline. The bytes are counted from the model's
config, as the simulated GPU counts them: the weights once per step (the layers and the
lm_head), whatever the runner keeps (packed bf16 weights are a second copy in memory, not a
second read), plus each row's KV context.

Two things put ``bandwidth_util`` above 1: weights that fit in a CPU's caches, read faster
than the DRAM copy runs, and a probe slowed by other work on a shared machine (the rates
are measured once, at start-up). It is reported as measured; the page draws it at 100 %
and says so (docs/simulation.md).

``UtilisationRunner`` adds the two figures to each step of the runner it wraps, at the runner
seam (minicb/core/runner/wrappers.py: ``measure_utilisation``), on rank 0 only: it samples,
and it times the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minicb.core.runner.wrappers import Forward, RunnerWrapper, find_layer
from minicb.cost_model.catalogue import model_shape
from minicb.cost_model.step_time import ModelShape, plan_rows, step_totals
from minicb.parallel.settings import ParallelSettings
from minicb.utilisation.probes import MachineRates, copy_bytes, machine_rates

if TYPE_CHECKING:
    from minicb.core.config import EngineConfig
    from minicb.core.runner import Runner, RunnerOutput
    from minicb.core.scheduler.plan import StepPlan


@dataclass(frozen=True)
class Occupancy:
    """A model's step work and this machine's rates: a step's utilisation from its time."""

    shape: ModelShape
    rates: MachineRates
    elem_bytes: int  # bytes per weight and KV element in the engine's dtype
    tp: int = 1  # ranks the model is split over (each reads and computes 1/tp)

    @classmethod
    def measure(
        cls,
        model_dir: Path,
        device: Any,
        dtype: Any,
        tp: int = 1,
        rates: MachineRates | None = None,
    ) -> Occupancy:
        """The shape in ``model_dir``'s config.json and ``rates`` (None: this machine's,
        probed once per process on ``device`` in ``dtype``)."""
        shape = model_shape(str(model_dir))
        elem = dtype.itemsize
        if rates is None:
            rates = machine_rates(str(device), dtype, copy_bytes(shape.streamed_params * elem))
        return cls(shape, rates, elem, tp)

    def utilisation(self, plan: StepPlan, forward_s: float) -> tuple[float | None, float | None]:
        """(bandwidth_util, flop_util) of ``plan``'s step; None for an empty or untimed one."""
        if not plan.scheduled or forward_s <= 0:
            return None, None
        totals = step_totals(plan_rows(plan.scheduled))
        nbytes, flops = self.shape.step_work(self.elem_bytes, *totals)
        return (
            nbytes / self.tp / (self.rates.copy_bandwidth * forward_s),
            flops / self.tp / (self.rates.matmul_flops * forward_s),
        )


class UtilisationRunner(RunnerWrapper):
    """A runner whose every step carries its utilisation of this machine's measured rates
    (``RunnerOutput.bandwidth_util``, ``flop_util``), which its description names."""

    def __init__(self, inner: Runner, rates: MachineRates | None = None) -> None:
        """``rates``: what to measure against (None: probe this machine, once per process)."""
        super().__init__(inner)
        tp = ParallelSettings.of(inner.config).tensor_parallel_size
        self.occupancy = Occupancy.measure(
            Path(inner.model_path), inner.device, inner.dtype, tp, rates
        )

    @classmethod
    def wrap(cls, inner: Runner, config: EngineConfig, sibling: Runner | None) -> Runner:
        like = find_layer(sibling, cls)  # a sibling's rates: nothing probed again
        return cls(inner, like.occupancy.rates if like is not None else None)

    def execute(self, plan: StepPlan, *, forward: Forward | None = None) -> RunnerOutput:
        out = self.inner.execute(plan, forward=forward)
        out.bandwidth_util, out.flop_util = self.occupancy.utilisation(plan, out.forward_s)
        return out

    def describe(self) -> dict[str, Any]:
        # What the page's utilisation chart is measured against.
        return self.inner.describe() | {"machine_rates": self.occupancy.rates.describe()}
