"""The simulated GPU: the real engine on a GPU that is not there, and what it is used for.

A simulation here is not a second engine. It is ``LLMEngine`` with another runner: the
same scheduler, block manager, events, metrics, traces, server and page, over a runner
that has no weights and a clock that moves by the time the GPU would have taken
(docs/simulation.md). How long one StepPlan takes on a named GPU, and the catalogue of GPUs
and model shapes, are the cost model's (minicb/cost_model/: step_time.py, catalogue.py),
which the real runner's utilisation reads too. Read the files here in this order:

- ``host_time.py``: the host's time per step beside the device's (scheduling, outputs),
  calibrated on this machine or from vLLM's published profile;
- ``runner.py``: ``SimulatedRunner``, FakeRunner with the KV pool of that GPU and each
  step's predicted time (and the host's lanes) added to the engine's ``VirtualClock``;
- ``step_rows.py``: one step event made a row of figures (what a run keeps of its steps);
- ``run.py``: a workload (``minicb/workload.py``, often of lengths alone) through the
  real engine on the simulated runner, measured by minicb's one ``MetricsCollector``;
- ``paper_reproductions.py`` and ``paper_report.py``: the papers' results (Anyscale, vLLM,
  Sarathi-Serve, static against continuous at scale) reproduced that way, their tables
  and charts; ``idle_gaps.py``: the device's idle gaps at a GPU's scale and what overlap
  scheduling recovers;
- ``demo.py``: the demo on simulated GPUs (``minicb demo --simulate``); the pacer that
  holds their virtual clocks to the wall clock for watching is the engine loop's
  (minicb/driver/pacing.py).

What uses the simulator sits above it and is not imported from here: the fleet's
reproductions (minicb/fleet/: replicas, routers, disaggregation), the bench's calibration
of a ``cpu`` profile (minicb/bench/calibration.py) and ``minicb bench --simulate``, which
runs every reproduction as one report (minicb/bench/all_reproductions.py).

Nothing here imports torch: the simulator runs on any laptop.
"""

import minicb.features  # noqa: F401  (a product may run engines with any feature)
