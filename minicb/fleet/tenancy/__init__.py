"""Tenants and the fair queue: many clients sharing one fleet, each keeping its share.

A request names its tenant (an API key, tenant.py), and waits in the fair queue
(fair_queue.py) until a replica has room: per-tenant FIFO queues, strict priority bands,
deficit round robin over uncached prompt tokens (uncached.py) within a band, a bound on
each tenant's queue and a token-rate limit per tenant (token_bucket.py). Pure Python and
clock-free, so the simulated fleet (minicb/fleet/simulated.py, on virtual time) and the
server's real fleet (minicb/server/tenant_gate.py, on wall time) run the same queue;
noisy_neighbour.py measures what it guarantees: one tenant sending ten times another's
load, with and without the queue (``python -m minicb.fleet.tenancy.noisy_neighbour``).
"""
