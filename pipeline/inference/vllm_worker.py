"""Runs inside vLLM's worker processes (``worker_extension_cls``): the in-place weight refresh.

vLLM's own ``reload_weights`` does the layerwise reload (it re-runs the CPU backend's weight
prepacking, which a plain ``load_weights`` leaves empty). On the CPU a tied LM head keeps a
stale prepacked copy of the embeddings, so it is packed again here. The reload's warnings about
layers that no checkpoint holds are expected and kept off the terminal.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
from vllm.platforms import current_platform

RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class ExpectedUnloaded(logging.Filter):
    """Drops the reload's "Failed to load weights" for layers no checkpoint holds: rotary
    embeddings (a computed cos/sin cache, put back as it was) and, for a model that ties them,
    the LM head (the embedding's weights, packed again below). Every other layer still warns,
    and the sampler's probe check fails a refresh whose weights did not take."""

    def __init__(self, tied_lm_head: bool) -> None:
        super().__init__()
        self.expected = {"RotaryEmbedding"} | ({"ParallelLMHead"} if tied_lm_head else set())

    def filter(self, record: logging.LogRecord) -> bool:
        layer = record.args[0] if isinstance(record.args, tuple) and record.args else None
        return not (str(record.msg).endswith("Failed to load weights") and layer in self.expected)


@contextlib.contextmanager
def expected_unloaded_quiet(tied_lm_head: bool) -> Iterator[None]:
    logger, quiet = logging.getLogger(RELOAD_LOGGER), ExpectedUnloaded(tied_lm_head)
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


class WeightRefreshExtension:
    """Mixed into vLLM's worker class; called with ``llm.collective_rpc("refresh_weights")``."""

    # the worker's own, declared for type checkers only (no class attribute shadows them)
    model_runner: Any
    reload_weights: Callable[..., None]

    def refresh_weights(self, weights_path: str) -> None:
        config = self.model_runner.model_config.hf_config
        with expected_unloaded_quiet(bool(getattr(config, "tie_word_embeddings", False))):
            self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        model = self.model_runner.get_model()
        lm_head = getattr(model, "lm_head", None)
        if current_platform.is_cpu() and lm_head is not None and hasattr(lm_head, "cpu_linear"):
            dispatch_cpu_unquantized_gemm(lm_head, remove_weight=False)
