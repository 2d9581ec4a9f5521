"""Your admission policy for minicb's continuous scheduler (docs/coding-lab.md).

Every iteration, after the running requests have taken their share, the scheduler asks
``admit(view)`` which waiting requests join the batch now. Return their ids, in the order
they take the token budget. Grade it with

    minicb lab grade-code notebooks/coding_lab/admission.py --teacher PATH_YOUR_TEACHER_GIVES

What the grader checks (on workloads you do not see): your choice never breaks a limit in
the view (slots, token budget, free KV blocks); every request gets the same greedy tokens
as the reference engine; every KV block is back in the pool at the end; no request waits
much longer than under the reference (no starvation); and the whole workload takes about
as many iterations as under the reference.
"""

from minicb.graded_labs.coding import AdmissionView


def admit(view: AdmissionView) -> list[int]:
    """The ids of the waiting requests to admit this iteration, in order.

    ``view.waiting``: the waiting requests (in the queue's order, not sorted), each with
    its ``request_id`` (smaller arrived earlier), ``num_tokens`` (tokens to compute once
    admitted), ``waited_steps``, ``priority`` and whether it was ``preempted``.
    ``view.free_slots``, ``view.token_budget``, ``view.free_blocks``: what is left of each
    limit this iteration; ``view.blocks_for(n)``: the blocks ``n`` tokens occupy.
    A request admitted now computes ``min(num_tokens, budget left)`` tokens this
    iteration (the rest later: chunked prefill), and needs blocks for those tokens.
    """
    # TODO: choose who is admitted, under all three limits, so that nobody starves.
    raise NotImplementedError("write admit(view): which waiting requests join the batch")
