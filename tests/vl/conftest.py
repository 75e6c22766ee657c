"""Vision-language fixtures for tests/vl (defined in vlm_fixtures.py, shared with tests/models)."""

from __future__ import annotations

from vlm_fixtures import images, make_tiny_llava, pasta_image

__all__ = ["images", "make_tiny_llava", "pasta_image"]
