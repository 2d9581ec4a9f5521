"""The CPU performance lab: how fast minicb's step runs on this machine, and why.

Beside the package, not inside it: what a student reads and installs is the engine
(``minicb/``); this folder holds the measurements that tuned it and the variants they
compared, which a student may run from a source checkout and never needs to read:

- ``compiled``: the compiled decode step, a runner that wraps ``ModelRunner`` through the
  runner seam (``CompiledRunner``; ``compiled_engine`` builds an engine on it);
- ``roofline``: the decode roofline sweep (what a decode step of batch B costs at least,
  how close minicb's step and the model's linear layers alone come), the section of
  ``minicb bench`` it runs where this folder is importable;
- ``host``: a step's host-side costs (detokenising, instrumentation on against off);
- ``chat_bench``: the router bench on real replicas, multi-turn chat through the OpenAI
  API of ``minicb serve --replicas N --router POLICY``;
- the CPU timing scripts, each ``python -m perflab.<name>`` from the repository root.

The probes of this machine's copy bandwidth and matmul FLOP/s and the per-step utilisation
measured against them stay in the package (minicb/utilisation/probes.py, occupancy.py): the
demo's utilisation chart reads them, and a ``minicb`` installed from a wheel draws it.

Why ``perflab`` and not ``lab``: ``minicb/graded_labs/`` is the students' graded labs (``minicb
lab``), a different thing; and not ``scripts/``, which holds stand-alone scripts, while
these modules import each other and are imported by their tests (tests/perflab/) and by
``minicb bench``. The package's wheel includes ``minicb*`` only (pyproject.toml), so this
folder is never installed: run it from the repository root, where ``python -m perflab.x``
finds it on the current directory, and pytest finds it through ``pythonpath = ["."]``.
"""
