"""KV reservation baselines: how much KV a request is promised when it is admitted."""
