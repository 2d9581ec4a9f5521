"""The coding lab's reference solution (the teacher's copy: keep it out of the students').

First come, first served with head-of-line blocking, as minicb's own continuous scheduler
admits: take the waiting requests by arrival, give each a slot, ``min(its tokens, budget
left)`` tokens of this iteration's budget and the blocks for them, and stop at the first
that does not fit. Stopping there, rather than skipping it, is what keeps a long prompt
from starving: the blocks that running requests free accumulate for it.
"""

from minicb.graded_labs.coding import AdmissionView


def admit(view: AdmissionView) -> list[int]:
    chosen = []
    slots, budget, blocks = view.free_slots, view.token_budget, view.free_blocks
    for req in sorted(view.waiting, key=lambda w: w.request_id):  # ids come in arrival order
        if slots == 0 or budget == 0:
            break
        n = min(req.num_tokens, budget)  # chunked prefill: the rest in later iterations
        need = view.blocks_for(n)
        if need > blocks:
            break  # head of line: nobody passes the oldest request
        chosen.append(req.request_id)
        slots, budget, blocks = slots - 1, budget - n, blocks - need
    return chosen
