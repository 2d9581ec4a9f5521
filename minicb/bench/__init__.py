"""The benchmark suite behind ``minicb bench``: workloads, systems, figures, reports.

- ``workloads`` / ``arrivals``: seeded request sets and arrival times, written down exactly
  in docs/performance.md;
- ``driver`` (minicb engines, in real time) and ``hf_systems`` (transformers' padded
  ``generate`` and its continuous batching) run them, and every run is reduced to minicb's
  own events and ``MetricsCollector`` figures, so all systems are measured alike;
- ``theory`` predicts the static-vs-continuous ratio from the lengths and a fitted step-time
  model, ``roofline`` measures the machine's ceiling, ``sched_cost`` times ``schedule()``;
- ``suite`` runs it all; ``report_md`` and ``report_html`` show it.
"""
