"""The contract of the coding lab: what an admission policy is given, and what it returns.

Every iteration the continuous scheduler first schedules the running requests (decodes
first, then their prompt chunks), then asks the admission policy who of the waiting
requests joins the batch. The policy is one function::

    def admit(view: AdmissionView) -> list[int]: ...

It gets a read-only picture of the moment (frozen dataclasses and a tuple: it can change
nothing) and returns the ids of the requests to admit, in the order they take their share
of the token budget. The engine admits them in that order and stops at the first one the
limits refuse; the grader also checks the choice itself against the limits in the view.

A request admitted this iteration gets ``min(num_tokens, budget left)`` of its tokens
computed now (chunked prefill: the rest in later iterations) and needs a KV block for
every ``block_size`` of those tokens, from the free blocks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WaitingRequest:
    """One waiting request, as the policy sees it."""

    request_id: int  # ids are given in arrival order: a smaller id arrived earlier
    arrival_step: int  # the iteration it arrived in
    waited_steps: int  # iterations since it arrived (a preempted request keeps its count)
    num_prompt_tokens: int
    num_tokens: int  # tokens to compute once admitted: the prompt, plus its output so far
    #                  when it was preempted and must be recomputed
    priority: int  # lower is more urgent (unused by FCFS)
    preempted: bool  # it ran before and was preempted (its KV was dropped)


@dataclass(frozen=True)
class AdmissionView:
    """The moment of one admission: the waiting queue and what is left of each limit."""

    step: int  # this iteration's number
    waiting: tuple[WaitingRequest, ...]  # in the queue's order, which is NOT sorted
    free_slots: int  # batch slots left (max_num_seqs minus the running requests)
    token_budget: int  # tokens left in this iteration's budget (max_num_batched_tokens)
    free_blocks: int  # KV blocks free in the pool after the running requests took theirs
    block_size: int  # tokens per KV block

    def blocks_for(self, num_tokens: int) -> int:
        """KV blocks that ``num_tokens`` tokens of a new request occupy."""
        return -(-num_tokens // self.block_size)
