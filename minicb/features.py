"""Every optional feature, loaded so that each one registers itself at its seam.

The core (``minicb/core/``) names its seams and their registries, never the features
behind them: a feature's package registers what it adds (a runner wrapper, a step
strategy, a KV layer, a scheduler hook) when it is imported, and this module imports them
all. ``import minicb`` does it before it hands out a public name, and so do the command
line, the server and the tests; a program that builds ``minicb.core.engine.LLMEngine``
by hand and asks for a feature imports this first (the engine's error says so).
"""

import minicb.cuda_graphs  # noqa: F401
import minicb.host_tier  # noqa: F401
import minicb.kernels  # noqa: F401
import minicb.overlap  # noqa: F401
import minicb.packing  # noqa: F401
import minicb.parallel  # noqa: F401
import minicb.quant  # noqa: F401
import minicb.reservation  # noqa: F401
import minicb.speculation  # noqa: F401
import minicb.utilisation  # noqa: F401
