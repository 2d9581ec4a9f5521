"""The driver: the one thread that steps engines, below every product that serves them.

``engine_loop.py`` (EngineLoop) steps several engines round by round, runs the commands
other threads queue for them (``command_queue.py``), keeps each request's open stream
(``request_stream.py``, ``open_streams.py``) and, for engines on simulated time, holds
their clocks to the wall clock (``pacing.py``). The server and the fleet both drive their
engines through it, so it imports the core and nothing above: no server, fleet, simulator,
benchmark or command line.
"""

import minicb.features  # noqa: F401  (a product may run engines with any feature)
