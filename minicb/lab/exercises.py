"""Where the exercises of a notebook are.

Every notebook ends with exercises in one shape: a markdown heading ``**Exercise N.**``,
its Chinese twin, then code cells: the student's cell (``answer_... = None`` or a function
to write), the worked solution (a cell that starts ``# Solution``, filling in the answer
only when it is still ``None``) and the check (the next code cell, which asserts against
what the engine did and prints ``correct: ...``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

HEADING = re.compile(r"\*\*Exercise (\d+)\.\*\*")
SOLUTION = "# Solution"


@dataclass(frozen=True)
class Exercise:
    number: int
    heading: int  # index of its English heading cell
    solution: int  # index of the worked solution cell
    check: int  # index of the check cell


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
        found.append(Exercise(int(match[1]), i, solution, check))
    return found
