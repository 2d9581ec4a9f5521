"""The fairness lab's admission (minicb/graded_labs/fairness.py): skipping starves the long prompt
that head-of-line admission serves, and aging or a reserve bounds its wait again."""

from minicb.graded_labs.fairness import starvation_run

SEEDS = range(4)


def long_waits(policy, **knobs):
    return [starvation_run(policy, seed=s, **knobs).long_wait for s in SEEDS]


def test_skipping_starves_the_long_prompt_that_head_of_line_serves():
    fair, greedy = long_waits("head-of-line"), long_waits("fill-whatever-fits")
    assert max(fair) <= 25, fair
    assert sum(greedy) > 4 * sum(fair), (greedy, fair)
    assert max(greedy) > 100, greedy  # starved for over a hundred iterations in one seed


def test_aging_and_a_reserve_bound_the_wait():
    assert max(long_waits("fill-whatever-fits", aging_steps=20)) <= 40
    fair = long_waits("head-of-line")
    reserved = long_waits("fill-whatever-fits", reserve_blocks=20)
    assert all(w <= 1.5 * f for w, f in zip(reserved, fair, strict=True)), (reserved, fair)


def test_every_request_is_served_and_the_batch_stays_full():
    for policy in ("head-of-line", "fill-whatever-fits"):
        result = starvation_run(policy)
        assert result.long_finished and result.occupancy > 0.9, (policy, result)
