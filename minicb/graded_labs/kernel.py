"""Run a notebook in a fresh kernel of this interpreter, in a scratch folder.

Both of the grader's runs (the student's cells, then the teacher's checks) go through
``run_notebook``. The kernel runs ``sys.executable`` (the Python with minicb installed,
whatever kernelspecs the machine has) with its working directory and its temp folder
inside one temporary directory, which is removed afterwards with everything the notebook
wrote there. So a submission cannot reach the teacher's notebooks by a relative path, and
a run leaves nothing behind in the system's temp folder.

It is not a sandbox: the kernel runs as the caller, and a submission's code can do
whatever the caller can (docs/labs.md says how to grade in a container or as another user).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

KERNEL_NAME = "minicb-lab"
CELL_TIMEOUT_S = 600


def run_notebook(nb: Any, timeout: int = CELL_TIMEOUT_S) -> list[str]:
    """Execute ``nb`` in place, errors allowed; each code cell's reply status ("ok" or
    "error"), by cell index ("" for markdown)."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    status = [""] * len(nb.cells)

    def executed(cell: Any, cell_index: int, execute_reply: dict) -> None:
        status[cell_index] = execute_reply["content"]["status"]

    with tempfile.TemporaryDirectory(prefix="minicb-lab-") as scratch:
        root = Path(scratch)
        spec = root / "kernels" / KERNEL_NAME
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "minicb lab", "language": "python",
        }))  # fmt: skip
        (root / "work").mkdir()
        (root / "tmp").mkdir()
        specs = KernelSpecManager(kernel_dirs=[str(root / "kernels")])
        km = AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs,
                                connection_file=str(root / "kernel.json"))  # fmt: skip
        env = {**os.environ, "TMPDIR": str(root / "tmp"), "TEMP": str(root / "tmp")}
        client = NotebookClient(nb, km=km, timeout=timeout, allow_errors=True,
                                on_cell_executed=executed,
                                resources={"metadata": {"path": str(root / "work")}})  # fmt: skip
        # the kernel's own log (a warning that it listens on local TCP) is not the lab's news
        client.execute(env=env, stderr=subprocess.DEVNULL, cleanup_kc=True)
    return status
