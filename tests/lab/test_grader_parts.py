"""The grader's parts, without a kernel: answers as data, the verdict helpers, a function
answer in its own process, the copy detector, the student's run, and every check cell of
every notebook read for what its failures can say."""

from __future__ import annotations

import ast
import collections
import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

from minicb.graded_labs.answers import decode, encode, harvest_source, inject_source, read_harvest  # noqa: E402
from minicb.graded_labs.checker import copied_solutions, students_run  # noqa: E402
from minicb.graded_labs.exercises import find_exercises  # noqa: E402
from minicb.graded_labs.isolated import IsolatedFunction, call_each  # noqa: E402
from minicb.graded_labs.student import student_version  # noqa: E402
from minicb.graded_labs.verdict import Wrong, correct, expect, expect_int, expect_ints  # noqa: E402

from .toy import toy_teacher  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted([*(ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"),
                    *(ROOT / "notebooks").glob("lab_*.ipynb")])  # fmt: skip


def test_answers_cross_as_data_and_come_back_the_same():
    answers = {"n": 14, "x": 0.25, "pair": (3, 4), "none": None,
               "counts": collections.Counter({3: 2, 7: 1})}  # fmt: skip
    back = {k: decode(json.loads(json.dumps(encode(v)))) for k, v in answers.items()}
    assert back == {"n": 14, "x": 0.25, "pair": [3, 4], "none": None, "counts": {3: 2, 7: 1}}
    assert all(type(k) is int for k in back["counts"])  # int keys stay ints


def test_a_tensor_and_a_function_cross_as_data():
    torch = pytest.importorskip("torch")
    mask = torch.tensor([[True, False], [True, True]])
    back = decode(json.loads(json.dumps(encode(mask))))
    assert back.dtype == torch.bool and torch.equal(back, mask)
    ns: dict = {}
    exec("def spread(values):\n    return max(values) - min(values)\n", ns)
    ns["spread"].__module__ = "x"
    with pytest.raises(TypeError, match="source of function spread cannot be read"):
        encode(ns["spread"])  # exec'd code has no source file: said, not guessed
    assert isinstance(
        decode({"function": "def f(): pass", "name": "f"}, make_function=IsolatedFunction),
        IsolatedFunction,
    )


def test_an_answer_of_another_type_is_refused_by_its_type():
    with pytest.raises(TypeError, match="type object cannot be graded"):
        encode(object())


def test_the_inject_cell_is_data_only():
    """Whatever a student's answer holds, it reaches the checks as a string decoded by
    json: a string that looks like code stays a string."""
    sneaky = "__import__('os').system('echo pwned')"
    ns: dict = {}
    exec(inject_source({"answer_x": encode(sneaky), "answer_y": encode((1, 2))}), ns)
    assert ns["answer_x"] == sneaky and ns["answer_y"] == [1, 2]


def test_the_harvest_cell_prints_what_the_grader_reads(capsys):
    ns = {"answer_a": 3, "answer_b": object()}
    exec(harvest_source(["answer_a", "answer_b", "answer_c"]), ns)
    found = read_harvest(capsys.readouterr().out)
    assert found["answer_a"] == {"data": 3} and found["answer_c"] == {"data": None}
    assert "cannot be graded" in found["answer_b"]["error"]
    assert read_harvest("no marker here") is None


def test_the_verdict_helpers_say_what_is_wrong_and_not_the_answer(capsys):
    with pytest.raises(Wrong, match=r"padding rows: write an int, not None \(no answer yet\)"):
        expect_int(None, "padding rows")
    with pytest.raises(Wrong, match="write an int, not a bool"):
        expect_int(True, "x")
    with pytest.raises(Wrong, match="write 2 ints"):
        expect_ints([1], 2, "the pair")
    with pytest.raises(Wrong, match="^that is not it$"):
        expect(False, "that is not it")
    correct(14, "rows")
    assert capsys.readouterr().out == "correct: 14 rows\n"


def test_a_function_answer_runs_in_a_process_of_its_own():
    """What the student's function does stays in its child: printing a verdict or
    patching a builtin reaches nothing of the check's; its failure is a Wrong."""
    import builtins

    source = ("import builtins\n"
              "def spread(values):\n"
              "    print('correct: trust me')\n"
              "    builtins.abs = lambda x: 0\n"
              "    return max(values) - min(values)\n")  # fmt: skip
    spread = IsolatedFunction(source, "spread")
    assert call_each(spread, [([3, 1, 4],), ([5],)]) == [3, 0]
    assert builtins.abs(-2) == 2
    with pytest.raises(Wrong, match="your function spread failed: ZeroDivisionError"):
        IsolatedFunction("def spread(values):\n    return 1 / 0\n", "spread")([1])
    assert call_each(len, [([1, 2],)]) == [2]  # in a student's own notebook: a plain call


def toy_student() -> nbformat.NotebookNode:
    return student_version(toy_teacher(), "00_toy.ipynb")


def test_the_students_run_has_the_students_cells_and_no_check():
    nb = toy_student()
    answer = next(c for c in nb.cells if c.source.startswith("answer_sum = None"))
    answer.source = "answer_sum = 14  # mine"
    run = students_run(toy_teacher(), nb)
    sources = [c.source for c in run.cells]
    assert "answer_sum = 14  # mine" in sources
    assert not any(s.startswith("# Check") or s.startswith("# Solution") for s in sources)
    assert sources[-1] == harvest_source(["answer_sum", "answer_extremes", "spread"])


def test_a_changed_check_cell_is_reported():
    nb = toy_student()
    for c in nb.cells:
        c.source = c.source.replace("'the second is not the largest of xs'", "'fine'")
    with pytest.raises(ValueError, match="exercise 2: its heading or its check cell"):
        students_run(toy_teacher(), nb)


def test_a_pasted_worked_solution_is_found_whatever_its_comments_and_spacing():
    nb = toy_student()
    teacher = toy_teacher()
    solution = next(c.source for c in teacher.cells
                    if c.source.startswith("# Solution\nif answer_ext"))  # fmt: skip
    pasted = solution.replace("# Solution", "# my own work").replace("(min(xs), max(xs))",
                                                                     "( min(xs),max(xs) )")
    answer = next(i for i, c in enumerate(nb.cells) if c.source.startswith("answer_sum = None"))
    nb.cells[answer].source = "answer_sum = sum(xs)"  # the student's own words for exercise 1
    nb.cells.insert(answer + 1, nbformat.v4.new_code_cell(pasted))
    assert copied_solutions(teacher, nb) == {
        2: "your notebook contains the teacher's worked solution to this exercise"}


def check_cells() -> list:
    params = []
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        params += [pytest.param(nb, e, id=f"{path.stem}-{e.number}") for e in find_exercises(nb)]
    return params


VERDICTS = {"expect": 1, "expect_int": 1, "expect_number": 1, "expect_ints": 2,
            "expect_numbers": 2}  # fmt: skip


@pytest.mark.parametrize(("nb", "e"), check_cells())
def test_a_check_can_fail_only_in_words_written_in_it(nb, e):
    """Every failure of every check is a Wrong whose message is a string written in the
    check (never a computed value), or a plain assert with no message; and the check
    prints ``correct`` only through ``correct``."""
    tree = ast.parse(nb.cells[e.check].source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            assert node.msg is None, f"line {node.lineno}: an assert's message can leak the answer"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "print":
                raise AssertionError(f"line {node.lineno}: print the verdict with correct()")
            at = VERDICTS.get(node.func.id)
            if at is not None:
                message = node.args[at] if len(node.args) > at else None
                assert isinstance(message, ast.Constant) and isinstance(message.value, str), (
                    f"line {node.lineno}: {node.func.id}'s message must be a written string")
    assert "correct(" in nb.cells[e.check].source


@pytest.mark.parametrize(("nb", "e"), check_cells())
def test_each_answer_a_check_reads_starts_as_none_in_the_students_cell(nb, e):
    """An untouched student notebook answers None everywhere (or a function that returns
    None), so it fails every check: the answer cells say so, and the student copies are
    these cells (test_lab.py)."""
    cells = [c for c in nb.cells[e.heading + 1 : e.solution] if c.cell_type == "code"]
    tree = ast.parse("\n".join(c.source for c in cells))
    left_none = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            left_none |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
            if all(isinstance(v, ast.Constant) and v.value is None for v in node.value.elts):
                left_none |= {n.id for t in node.targets if isinstance(t, ast.Tuple)
                              for n in t.elts}  # fmt: skip
        if isinstance(node, ast.FunctionDef) and isinstance(node.body[-1], ast.Return):
            value = node.body[-1].value
            if isinstance(value, ast.Constant) and value.value is None:
                left_none.add(node.name)
    assert set(e.answers) <= left_none, (e.answers, left_none)


def test_an_exercise_without_its_check_line_is_refused():
    nb = toy_teacher()
    for c in nb.cells:
        c.source = c.source.replace("# Check (answers: spread)\n", "")
    with pytest.raises(ValueError, match="exercise 3: its check does not start with"):
        find_exercises(nb)
