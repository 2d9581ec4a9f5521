"""Model loading and minicb's own Llama-family model."""
