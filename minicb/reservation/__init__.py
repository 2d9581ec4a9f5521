"""KV reservation baselines: how much KV a request is promised when it is admitted.

Importing this package registers the modes ``max``, ``pow2`` and ``oracle`` at the
scheduler's admission-size hook (seam 1, minicb/core/scheduler/hooks.py); ``paged`` is the
core's own.
"""

from functools import partial

from minicb.core.feature_settings import register_settings
from minicb.core.scheduler.hooks import ADMISSION_SIZES
from minicb.reservation.modes import ReservationMode
from minicb.reservation.settings import ReservationSettings

register_settings(ReservationSettings)
ADMISSION_SIZES.update({mode: partial(ReservationMode, mode) for mode in ("max", "pow2", "oracle")})
