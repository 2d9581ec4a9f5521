"""The one way the reports write a markdown table.

Every report of the package prints its figures as markdown tables: the simulator's
reproductions (report.py), the fleet's (minicb/fleet/fleet_report.py, disagg_report.py) and the
bench's (minicb/bench/report.py, calibration.py, speculative.py). Each builds its cells,
already formatted in words and numbers, and this renders them: a header, the alignment
row, one line per row. It lives here, on the lowest floor whose reports write tables, so
the bench and the fleet above read it without the simulator reading them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(
    header: Sequence[str], rows: Iterable[Sequence[str]], text_cols: int | None = None
) -> list[str]:
    """The table's lines: ``| a | b |`` rows under a ``|---|---:|`` alignment row. The first
    ``text_cols`` columns align left and the others right (columns of numbers); every
    column aligns left when it is None."""
    left = len(header) if text_cols is None else text_cols
    align = "|" + "---|" * left + "---:|" * (len(header) - left)
    return [_line(header), align, *(_line(row) for row in rows)]


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
