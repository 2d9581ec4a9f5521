"""Utilisation: what fraction of the machine's bandwidth and FLOPs a step used, added to each
step by a runner wrapper (occupancy.py's ``UtilisationRunner``) registered at the runner seam
(minicb/core/runner/wrappers.py); the factory imports it only when ``measure_utilisation``
asks for it."""

from minicb.core.feature_settings import register_settings
from minicb.core.runner.wrappers import register_wrapper
from minicb.utilisation.settings import UtilisationSettings


def _utilisation_runner():
    from minicb.utilisation.occupancy import UtilisationRunner

    return UtilisationRunner


register_settings(UtilisationSettings)
register_wrapper(
    "utilisation",
    _utilisation_runner,
    lambda config, device: UtilisationSettings.of(config).measure_utilisation,
)
