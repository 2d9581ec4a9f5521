"""Where the exercises of a notebook are.

Every notebook ends with exercises in one shape: a markdown heading ``**Exercise N.**``,
its Chinese twin, then code cells: the student's cell (``answer_... = None`` or a function
to write), the worked solution (a cell that starts ``# Solution``, filling in the answer
only when it is still ``None``) and the check (the next code cell). The check's first line
names the answers it reads, ``# Check (answers: answer_padding_rows)``: those, and only
those, are what the grader carries to it from the student's kernel. It compares them with
what the engine did and ends in ``correct: ...`` or a ``Wrong`` (``minicb.graded_labs.verdict``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

HEADING = re.compile(r"\*\*Exercise (\d+)\.\*\*")
SOLUTION = "# Solution"
CHECK = re.compile(r"# Check \(answers: ([\w, ]+)\)")


@dataclass(frozen=True)
class Exercise:
    number: int
    heading: int  # index of its English heading cell
    solution: int  # index of the worked solution cell
    check: int  # index of the check cell
    answers: tuple[str, ...]  # the names the check reads from the student's cells


def is_solution(cell: Any) -> bool:
    return cell.cell_type == "code" and cell.source.lstrip().startswith(SOLUTION)


def find_exercises(nb: Any) -> list[Exercise]:
    """The exercises of a teacher's notebook, in order; a malformed one is an error."""
    found = []
    cells = nb.cells
    for i, cell in enumerate(cells):
        match = HEADING.search(cell.source) if cell.cell_type == "markdown" else None
        if match is None:
            continue
        solution = next((j for j in range(i + 1, len(cells)) if is_solution(cells[j])), None)
        if solution is None:
            raise ValueError(f"exercise {match[1]}: no '{SOLUTION}' cell after its heading")
        check = next(
            (j for j in range(solution + 1, len(cells)) if cells[j].cell_type == "code"), None
        )
        if check is None:
            raise ValueError(f"exercise {match[1]}: no check cell after its solution")
        names = CHECK.match(cells[check].source)
        if names is None:
            raise ValueError(f"exercise {match[1]}: its check does not start with "
                             "'# Check (answers: NAME, ...)'")  # fmt: skip
        answers = tuple(n.strip() for n in names[1].split(",") if n.strip())
        found.append(Exercise(int(match[1]), i, solution, check, answers))
    return found
