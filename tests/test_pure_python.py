"""The scheduler, block manager, request and plan never import torch: they can be read,
tested and driven by a fake runner on any laptop."""

import subprocess
import sys

PURE_MODULES = [
    "minicb.request",
    "minicb.scheduler.block_manager",
    "minicb.scheduler",
    "minicb.config",
    "minicb.config",
    "minicb.request",
]


def test_core_modules_do_not_import_torch():
    imports = ", ".join(PURE_MODULES)
    code = f"import sys; import {imports}; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
