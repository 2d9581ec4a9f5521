"""The engine a student reads: requests, the paged KV cache's block manager and prefix
cache, the schedulers (continuous, static, preemption, abort and undo), the engine's step,
the runner protocol with the model runner, the Llama model, attention (the reference
definition and the torch path), the sampler, the fake runner and its virtual clock, the
detokenizer, and the events with the bus that carries them.

Nothing here imports from outside ``minicb/core/``; every optional feature enters through
a seam (docs/architecture.md names them), and ``tests/test_architecture.py`` holds that.
"""
