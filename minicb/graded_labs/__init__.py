"""Graded labs: student versions of the notebooks and the grader that checks them.

- ``exercises``: where each exercise of a teacher's notebook is (its heading, the cells a
  student fills in, the worked solution, the check and the answers it reads);
- ``student``: the student version of a notebook, generated from the teacher's (solution
  cells removed), so the two never drift (``minicb lab student``);
- ``checker``: grades submissions in two kernels, the student's cells in one and the
  teacher's checks in the other, with only the answers crossing, as data
  (``minicb lab check``); ``kernel`` runs a notebook in a scratch folder; ``answers``
  carries the answers; ``isolated`` runs a function answer in a process of its own;
  ``verdict`` is what a check says (``correct: ...`` or what the answer violated);
- ``fairness``: the fairness lab's admission policy and workload.

Needs nbformat, nbclient and ipykernel (the dev extra: ``make setup`` installs them).
"""

import minicb.features  # noqa: F401  (a product may run engines with any feature)
