"""Graded labs: student versions of the notebooks and the checker a student runs.

- ``exercises``: where each exercise of a teacher's notebook is (its heading, the cells a
  student fills in, the worked solution, the check against the engine);
- ``student``: the student version of a notebook, generated from the teacher's (solution
  cells removed), so the two never drift (``minicb lab student``);
- ``checker``: runs a student's notebook with the teacher's checks and says which answers
  are right (``minicb lab check NOTEBOOK``).

Needs nbformat, nbclient and ipykernel (the dev extra: ``make setup`` installs them).
"""
