"""The coding lab: a student writes the continuous scheduler's admission policy, and a
grader plugs it into the real engine and checks what it does, on workloads the student
never sees (docs/coding-lab.md).

- ``contract.py``: what the student's ``admit(view)`` is given and must return;
- ``plug.py``: the real scheduler with a student's policy in its admission seam;
- ``workloads.py``: the held-back workloads, drawn from the teacher's seed, and one run;
- ``grader.py``: each submission in a fresh process, its runs judged against the
  reference engine and the teacher's reference policy.
"""

from minicb.graded_labs.coding.contract import AdmissionView, WaitingRequest

__all__ = ["AdmissionView", "WaitingRequest"]
