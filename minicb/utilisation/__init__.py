"""Utilisation: what fraction of the machine's bandwidth and FLOPs a step used."""
