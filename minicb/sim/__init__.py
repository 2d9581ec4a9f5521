"""The simulated GPU: the real engine on a GPU that is not there, and what it is used for.

A simulation here is not a second engine. It is ``LLMEngine`` with another runner: the
same scheduler, block manager, events, metrics, traces, server and page, over a runner
that has no weights and a clock that moves by the time the GPU would have taken
(docs/simulation.md). Read the files in this order:

- ``step_time.py``: the step-time model, how long one StepPlan takes on a named GPU (a
  roofline of weight and KV bytes against FLOPs, plus the all-reduce and fixed costs);
- ``catalogue.py`` (+ ``catalogue.json``): the GPUs and model shapes, published figures,
  and profile names such as ``H100:llama-3.1-8b``;
- ``runner.py``: ``SimulatedRunner``, FakeRunner with the KV pool of that GPU and each
  step's predicted time added to the engine's ``VirtualClock``;
- ``run.py``: a workload (``minicb/workload.py``, often of lengths alone) through the
  real engine on the simulated runner, measured by minicb's one ``MetricsCollector``;
- ``reproductions.py`` and ``report.py``: the papers' results (Anyscale, vLLM,
  Sarathi-Serve, static against continuous at scale) reproduced that way, as tables and an
  offline HTML page (``minicb bench --simulate``); ``disaggregation.py``: DistServe's
  colocated against disaggregated prefill and decode, on the fleet's simulated engines;
- ``calibration.py``: a ``cpu`` profile of this machine read off a probe, and how well it
  predicts the real engine's steps and its continuous/static ratio (``minicb bench``);
- ``demo.py``: the demo on simulated GPUs (``minicb demo --simulate``); the pacer that
  holds their virtual clocks to the wall clock for watching is the engine loop's
  (minicb/driver/pacing.py).

Nothing here imports torch: the simulator runs on any laptop.
"""
