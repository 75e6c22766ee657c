"""hotloop: an LLM serving toolkit (paged KV cache, continuous batching, OpenAI-compatible server)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hotloop.config import EngineConfig, PytorchEngineConfig, TurbomindEngineConfig
from hotloop.messages import GenerationConfig, Response

__version__ = "0.1.0"

if TYPE_CHECKING:
    from hotloop.api.pipeline import Pipeline


def pipeline(
    model_path: str | None = None, backend_config: EngineConfig | None = None, **kwargs: Any
) -> Pipeline:
    """Build a :class:`hotloop.api.pipeline.Pipeline` (LMDeploy-compatible signature).

    ``model_path`` is a local Hugging Face folder, a ``.gguf`` file, or None for the embedded
    default model (SmolLM2-135M-Instruct).
    """
    from hotloop.api.pipeline import Pipeline

    return Pipeline(model_path, backend_config=backend_config, **kwargs)


__all__ = [
    "EngineConfig",
    "GenerationConfig",
    "PytorchEngineConfig",
    "Response",
    "TurbomindEngineConfig",
    "pipeline",
    "__version__",
]
