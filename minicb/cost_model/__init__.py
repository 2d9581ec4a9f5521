"""The step-time model (a roofline over weights, KV reads and FLOPs) and the GPU
catalogue it reads: used by the simulated runner and by the utilisation figures."""
