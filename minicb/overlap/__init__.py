"""Overlap scheduling: schedule step N+1 on the host while the device runs step N."""
