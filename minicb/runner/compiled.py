"""The compiled forward: ``torch.compile`` of the two halves of a decoder layer.

Besides its matmuls, a decoder layer runs some forty small ops (RMSNorm's five, rope's six
for q and again for k, SiLU, the multiply, residual adds), each a separate pass over memory
and a trip through the dispatcher. Inductor fuses each half of the layer around attention
(``minicb.runner.llama.attention_inputs`` and ``layer_output``) into a few C++ loops beside
the matmuls. Attention itself stays eager: it reads the paged cache through the step's
metadata and loops over prompt chunks.

One compiled function serves every layer (the layer is an argument; its parameters are
graph inputs, not constants), and the token count is a dynamic dimension, so each function
builds at most three graphs (the first count seen, any count from 2, a single token), not
one per step; tests/runner/test_compiled_forward.py counts them.

Inductor rounds every intermediate to its dtype as eager does, so bf16 gives eager's
tokens; the packed bf16 layers (minicb.runner.packed) reach it as an opaque operator.

``EngineConfig.compile``: "off" (the default) runs eager; "on" compiles. There is no "auto":
measured on the 2-core AMX machine (docs/performance.md, "Forward pass"), a compiled decode
step took more CPU time than an eager one, at batch 1 and 32: the matmuls take three
quarters of a step, and what the fused elementwise work saves, the calls into the compiled
regions (two per layer, each evaluating Dynamo's guards) spend again. Where compilation
fails, at set-up or at the first call, the layer falls back to eager for good and says so in
one logged line; the eager functions are the reference the compiled ones are tested
against (same greedy tokens).
"""

from __future__ import annotations

import logging

import torch

from minicb.runner.llama import LayerFunctions, attention_inputs, layer_output

log = logging.getLogger(__name__)


class CompiledLayers:
    """``attention_inputs`` and ``layer_output`` compiled, with eager as the fallback."""

    def __init__(self, backend: str = "inductor") -> None:
        """``backend``: torch.compile's; tests pass "eager" (Dynamo's graphs, no codegen)."""
        self.error: str | None = None  # why it fell back to eager, once it has
        try:
            options = dict(backend=backend, dynamic=True, fullgraph=True)
            if backend == "inductor":
                # Round every intermediate to its dtype as eager does: fused bf16 chains
                # kept in fp32 would change the greedy tokens.
                options["options"] = {"emulate_precision_casts": True}
            self._inputs = torch.compile(attention_inputs, **options)
            self._output = torch.compile(layer_output, **options)
        except Exception as err:  # torch.compile unavailable on this platform or build
            self._fall_back(err)

    def _fall_back(self, err: Exception) -> None:
        self.error = f"{type(err).__name__}: {err}".splitlines()[0]
        log.warning("torch.compile failed, running the model eager: %s", self.error)

    def attention_inputs(self, layer, x, rope) -> tuple[torch.Tensor, ...]:
        if self.error is None:
            try:
                return self._inputs(layer, x, rope)
            except Exception as err:  # e.g. no working C++ compiler: the layer is pure,
                self._fall_back(err)  # so running it again eager is safe
        return attention_inputs(layer, x, rope)

    def layer_output(self, layer, x, attn) -> torch.Tensor:
        if self.error is None:
            try:
                return self._output(layer, x, attn)
            except Exception as err:
                self._fall_back(err)
        return layer_output(layer, x, attn)

    def functions(self) -> LayerFunctions:
        return LayerFunctions(self.attention_inputs, self.layer_output)

    def describe(self) -> str:
        return "eager: torch.compile failed: " + self.error if self.error else "compiled"
