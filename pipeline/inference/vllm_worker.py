"""Runs inside vLLM's worker processes (``worker_extension_cls``): the in-place weight refresh.

vLLM's own ``reload_weights`` does the layerwise reload (it re-runs the CPU backend's weight
prepacking, which a plain ``load_weights`` leaves empty). On the CPU a tied LM head keeps a
stale prepacked copy of the embeddings, so it is packed again here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
from vllm.platforms import current_platform


class WeightRefreshExtension:
    """Mixed into vLLM's worker class; called with ``llm.collective_rpc("refresh_weights")``."""

    # the worker's own, declared for type checkers only (no class attribute shadows them)
    model_runner: Any
    reload_weights: Callable[..., None]

    def refresh_weights(self, weights_path: str) -> None:
        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        model = self.model_runner.get_model()
        lm_head = getattr(model, "lm_head", None)
        if current_platform.is_cpu() and lm_head is not None and hasattr(lm_head, "cpu_linear"):
            dispatch_cpu_unquantized_gemm(lm_head, remove_weight=False)
