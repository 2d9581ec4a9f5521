"""A request's cost in the fair queue: the prompt tokens it will have to compute.

The router remembers which prompt prefixes it sent to each replica (router.py's prefix
record), so before a request is dispatched it can say how much of its prompt the best
replica probably holds: the longest match over the replicas' records. The cost is the
prompt's length less that; with no record (a router that keeps none, or a new prefix)
it is the whole prompt. An estimate, as the record is: a wrong one shifts a turn of the
fair queue, never an answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from minicb.fleet.router import Router, block_keys


def uncached_tokens(router: Router, prompt_token_ids: Sequence[int]) -> int:
    """The prompt tokens no replica is expected to hold cached."""
    if not router.records:
        return len(prompt_token_ids)
    keys = block_keys(prompt_token_ids, router.block_size)
    cached = max(record.matched(keys) for record in router.records.values()) * router.block_size
    return len(prompt_token_ids) - cached
