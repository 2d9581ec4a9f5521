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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minicb.cost_model.catalogue import model_shape
from minicb.cost_model.step_time import ModelShape, plan_rows, step_totals
from minicb.utilisation.probes import MachineRates, copy_bytes, machine_rates

if TYPE_CHECKING:
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
