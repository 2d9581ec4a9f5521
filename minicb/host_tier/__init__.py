"""The host KV tier: evicted prefix-cache blocks kept in host memory and copied back."""
