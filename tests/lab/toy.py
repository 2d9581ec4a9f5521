"""A toy teacher's notebook in the labs' exercise shape, plain Python, for the grader's
tests: a data answer, a pair, and a function answer re-checked on a hidden case."""

from __future__ import annotations

import nbformat

CHECKS = [
    ("answer_sum = None  # your answer",
     "# Solution\nif answer_sum is None:\n    answer_sum = sum(xs)",
     "# Check (answers: answer_sum)\n"
     "expect(expect_int(answer_sum, 'the sum') == sum(xs), 'that is not the sum of xs')\n"
     "correct(answer_sum)"),
    ("answer_extremes = None  # your answer: (smallest, largest)",
     "# Solution\nif answer_extremes is None:\n    answer_extremes = (min(xs), max(xs))",
     "# Check (answers: answer_extremes)\n"
     "low, high = expect_ints(answer_extremes, 2, 'the extremes')\n"
     "expect(low == min(xs), 'the first is not the smallest of xs')\n"
     "expect(high == max(xs), 'the second is not the largest of xs')\n"
     "correct(low, high)"),
    ("def spread(values):\n    return None  # your answer",
     "# Solution\nif spread(xs) is None:\n    def spread(values):\n"
     "        return max(values) - min(values)",
     "# Check (answers: spread)\n"
     "hidden = [random.SystemRandom().randrange(1000) for _ in range(9)]  # a new case each run\n"
     "got = call_each(spread, [(xs,), (hidden,)])\n"
     "expect(got == [max(xs) - min(xs), max(hidden) - min(hidden)],\n"
     "       'spread is not the largest minus the smallest value')\n"
     "correct('spread')"),
]  # fmt: skip


def toy_teacher() -> nbformat.NotebookNode:
    v4 = nbformat.v4
    cells = [
        v4.new_markdown_cell("# Toy"),
        v4.new_code_cell(
            "import random\n"
            "from minicb.graded_labs.isolated import call_each\n"
            "from minicb.graded_labs.verdict import correct, expect, expect_int, expect_ints\n"
            "xs = [3, 1, 4, 1, 5]"
        ),
    ]
    for n, (answer, solution, check) in enumerate(CHECKS, 1):
        cells += [
            v4.new_markdown_cell(f"**Exercise {n}.** ..."),
            v4.new_markdown_cell(f"**练习 {n}.** ..."),
            v4.new_code_cell(answer),
            v4.new_code_cell(solution),
            v4.new_code_cell(check),
        ]
    cells.append(v4.new_markdown_cell("the end"))
    return v4.new_notebook(cells=cells)
