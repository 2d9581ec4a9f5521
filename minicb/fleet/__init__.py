"""The fleet: several engines (replicas) behind one router.

One engine batches the requests it is given; a service runs several engines, each with its
own copy of the model and its own KV pool, and a router decides which engine gets each
request. ``router.py`` is that decision (round-robin, least-loaded as vLLM's data-parallel
coordinator scores load, prefix-aware as SGLang's cache-aware router), each with its reason
in words; the same ``Router`` decides for real replicas (processes behind the server) and
for simulated ones (engines on the simulated runner, at data-centre scale, on virtual
time). Pure Python here: the router never imports torch.
"""
