"""Speculative decoding: propose draft tokens, verify them in one step, keep the accepted."""
