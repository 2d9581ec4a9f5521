"""The coding lab (minicb/graded_labs/coding/): a student's admission policy in the real engine,
judged by behaviour on held-back workloads.

Fast tests run the child's side (``measure``) in this process on the fake runner, so each
policy costs a fraction of a second; ``test_coding_lab_class.py`` runs the whole grader
(fresh processes, the tiny real model, the table and the CSV) in the slow tier.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minicb.graded_labs.coding import AdmissionView, WaitingRequest
from minicb.graded_labs.coding.grader import PROPERTIES, judge, measure, submissions_in
from minicb.graded_labs.coding.hidden_workloads import draw_all, run
from minicb.graded_labs.coding.plug import ChoiceRefused, broken_limit, checked_ids

ROOT = Path(__file__).resolve().parents[2]
TEACHER = ROOT / "teacher" / "coding_lab"
STARTER = ROOT / "notebooks" / "coding_lab" / "admission.py"
SEED = 5  # not the teacher's: the tests must not depend on the hidden seed
SHAPES = ["burst", "stream", "pressure"]

# Wrong policies, each what a student could write. Their names say what they get wrong.
LEAKY = """
def admit(view):  # a slot and some budget for each, the KV blocks forgotten
    out, budget = [], view.token_budget
    for w in sorted(view.waiting, key=lambda w: w.request_id)[: view.free_slots]:
        if budget == 0:
            break
        out.append(w.request_id)
        budget -= min(w.num_tokens, budget)
    return out
"""
SHORTEST_FIRST = """
def admit(view):  # shortest first, skipping whatever does not fit
    out = []
    slots, budget, blocks = view.free_slots, view.token_budget, view.free_blocks
    for w in sorted(view.waiting, key=lambda w: w.num_tokens):
        if slots == 0 or budget == 0:
            break
        n = min(w.num_tokens, budget)
        if view.blocks_for(n) > blocks:
            continue
        out.append(w.request_id)
        slots, budget, blocks = slots - 1, budget - n, blocks - view.blocks_for(n)
    return out
"""
FORGETS_PREEMPTED = """
def admit(view):  # FCFS over the requests that never ran: a preempted one is left behind
    out = []
    slots, budget, blocks = view.free_slots, view.token_budget, view.free_blocks
    for w in sorted(view.waiting, key=lambda w: w.request_id):
        if w.preempted:
            continue
        if slots == 0 or budget == 0:
            break
        n = min(w.num_tokens, budget)
        if view.blocks_for(n) > blocks:
            break
        out.append(w.request_id)
        slots, budget, blocks = slots - 1, budget - n, blocks - view.blocks_for(n)
    return out
"""
TWICE = """
def admit(view):  # the oldest request, twice: two rows of one request in a batch
    oldest = min(w.request_id for w in view.waiting)
    return [oldest, oldest]
"""
ONE_PER_STEP = """
def admit(view):  # FCFS, but at most one admission per iteration
    oldest = min(view.waiting, key=lambda w: w.request_id)
    fits = view.blocks_for(min(oldest.num_tokens, view.token_budget)) <= view.free_blocks
    return [oldest.request_id] if fits else []
"""
CRASHES = """
def admit(view):
    return [view.waiting[0].id]
"""


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Judge a policy file as the grader does, without its processes: the reference
    engine's runs and the teacher's reference policy's, computed once."""
    workloads = draw_all(SEED, SHAPES)
    engine = [json.loads(json.dumps(run(w))) for w in workloads]
    caps = [3 * r["steps"] + 100 for r in engine]
    data = [w.to_data() for w in workloads]

    def measured(path: Path) -> dict:
        reply = measure({"submission": str(path), "workloads": data, "caps": caps, "model": None})
        return json.loads(json.dumps(reply))

    reference = measured(TEACHER / "reference_admission.py")
    folder = tmp_path_factory.mktemp("policies")

    def grade(source: str | Path):
        path = source if isinstance(source, Path) else folder / f"p{hash(source) & 0xFFFF}.py"
        if not isinstance(source, Path):
            path.write_text(source)
        return judge(path, measured(path), engine, reference, workloads).verdicts

    return grade


def failed(verdicts: dict) -> set[str]:
    return {p for p, why in verdicts.items() if why}


def test_the_reference_solution_passes_every_property(graded):
    verdicts = graded(TEACHER / "reference_admission.py")
    assert list(verdicts) == list(PROPERTIES)
    assert failed(verdicts) == set()


def test_the_seam_keeps_the_engine_s_own_admission():
    """The reference policy plugged in through admission_order gives, iteration for
    iteration, what the engine's own admission gives: the seam changes nothing by itself."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ref", TEACHER / "reference_admission.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for workload in draw_all(SEED, SHAPES):
        assert run(workload, module.admit) == run(workload)


def test_a_leaky_policy_fails_on_the_kv_block_limit(graded):
    verdicts = graded(LEAKY)
    assert failed(verdicts) == {"limits"}
    assert verdicts["limits"].startswith("KV blocks: ")


def test_a_starving_policy_fails_on_the_bounded_wait(graded):
    verdicts = graded(SHORTEST_FIRST)
    assert failed(verdicts) == {"bounded wait"}
    assert "starves" in verdicts["bounded wait"]


def test_forgetting_preempted_requests_breaks_the_greedy_tokens(graded):
    verdicts = graded(FORGETS_PREEMPTED)
    assert "greedy tokens" in failed(verdicts)
    assert "never finished" in verdicts["greedy tokens"]
    assert failed(verdicts) <= {"greedy tokens", "bounded wait", "performance"}


def test_admitting_a_request_twice_is_refused_by_the_contract(graded):
    verdicts = graded(TWICE)
    assert verdicts == {"runs": verdicts["runs"]}  # nothing else judged
    assert verdicts["runs"].startswith("the admission contract: ")
    assert "twice" in verdicts["runs"]


def test_one_admission_per_iteration_fails_the_performance_bar(graded):
    verdicts = graded(ONE_PER_STEP)
    assert failed(verdicts) == {"performance"}
    assert "time to first token" in verdicts["performance"]


def test_a_crash_and_the_untouched_starter_get_clear_messages(graded, tmp_path):
    crash = graded(CRASHES)["runs"]
    assert "line 3" in crash and "AttributeError" in crash
    assert "not written yet" in graded(STARTER)["runs"]
    broken = tmp_path / "broken.py"
    broken.write_text("def admit(view)\n")
    assert "SyntaxError" in graded(broken)["runs"]


def test_messages_never_quote_the_reference_tokens(graded):
    """A failure says which property broke and what the run did; the tokens the reference
    engine produced never appear."""
    workload = draw_all(SEED, SHAPES)[2]
    tokens = {t for ts in run(workload)["tokens"].values() for t in ts}
    message = graded(FORGETS_PREEMPTED)["greedy tokens"]
    assert "[" not in message and not any(f" {t}," in message for t in tokens)


def test_the_contract_and_the_limits_judged_from_the_view():
    waiting = tuple(WaitingRequest(i, 0, 3, 40, 40, 0, False) for i in (4, 5, 6))
    view = AdmissionView(step=9, waiting=waiting, free_slots=2, token_budget=200,
                         free_blocks=9, block_size=16)  # fmt: skip
    assert broken_limit(view, [4, 5]) is None  # 3 blocks each
    assert broken_limit(view, [4, 5, 6]).startswith("batch slots: ")
    few_blocks = AdmissionView(9, waiting, 3, 200, 4, 16)
    assert broken_limit(few_blocks, [4, 5]).startswith("KV blocks: ")  # 3, then 3 of 1 left
    small_budget = AdmissionView(9, waiting, 3, 40, 9, 16)  # the first takes it all
    assert broken_limit(small_budget, [4, 5]).startswith("token budget: ")
    for bad, words in (((4, 4), "twice"), ([7], "not waiting"), ("4", "not a list"),
                       ([True], "ints")):  # fmt: skip
        with pytest.raises(ChoiceRefused, match=words):
            checked_ids(bad, view)


def test_a_folder_of_submissions_is_every_py_file_in_it(tmp_path):
    for name in ("zoe.py", "Alice Smith.py", "b.py", "notes.txt"):
        (tmp_path / name).write_text("")
    assert [p.name for p in submissions_in([tmp_path])] == ["Alice Smith.py", "b.py", "zoe.py"]
    with pytest.raises(ValueError, match="no submission"):
        submissions_in([tmp_path / "missing.py"])
