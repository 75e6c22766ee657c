"""M-RoPE position ids (Qwen2-VL family): three position rows (temporal, height, width) per token.

Text tokens have three equal rows that count up by one. An image's tokens, a ``t x h x w`` grid of
merged patches (``ImageInput.extra["mrope_grid"]``), take ``start + (t_i, h_i, w_i)`` where
``start`` is the position the next text token would have had; the text after the image resumes
at one past the largest position the image used. So every token past the prompt sits at
``index + position_delta`` with the same value in all three rows, which is why decode steps (and
their CUDA graphs) keep plain 1-D positions and only steps covering prompt tokens of such a
request pass ``[3, T]`` positions to the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

GRID_KEY = "mrope_grid"


def prompt_positions(num_prompt_tokens: int, mm_inputs: Sequence[Any]) -> tuple[torch.Tensor, int] | None:
    """``([3, P] int64 positions, position_delta)`` for a prompt whose images carry an M-RoPE grid,
    or ``None`` when none does (the model then uses ordinary positions)."""
    if not any(GRID_KEY in m.extra for m in mm_inputs):
        return None
    pos = torch.empty(3, num_prompt_tokens, dtype=torch.int64)
    cursor = 0  # index of the next token to place
    nxt = 0  # position of the next text token
    for m in mm_inputs:
        n_text = m.offset - cursor
        pos[:, cursor : m.offset] = torch.arange(nxt, nxt + n_text)
        nxt += n_text
        t, h, w = (int(v) for v in m.extra[GRID_KEY])
        if t * h * w != m.length:
            raise ValueError(f"an image grid of {t}x{h}x{w} does not fill its {m.length} tokens")
        ti = torch.arange(t).view(t, 1, 1).expand(t, h, w).reshape(-1)
        hi = torch.arange(h).view(1, h, 1).expand(t, h, w).reshape(-1)
        wi = torch.arange(w).view(1, 1, w).expand(t, h, w).reshape(-1)
        pos[:, m.offset : m.end] = torch.stack([ti, hi, wi]) + nxt
        nxt = int(pos[:, m.offset : m.end].max()) + 1
        cursor = m.end
    pos[:, cursor:] = torch.arange(nxt, nxt + num_prompt_tokens - cursor)
    delta = int(pos[:, -1].max()) + 1 - num_prompt_tokens if num_prompt_tokens else 0
    return pos, delta


def ensure_positions(scheduled: Sequence[Any]) -> None:
    """Compute (once, when first scheduled) the M-RoPE positions of requests whose images need them."""
    for s in scheduled:
        req = s.request
        if req.mm_inputs and req.mrope_positions is None:
            got = prompt_positions(req.num_prompt_tokens, req.mm_inputs)
            if got is not None:
                req.mrope_positions, req.position_delta = got


def needs_3d(scheduled: Sequence[Any]) -> bool:
    """Whether this step covers prompt tokens of a request with M-RoPE positions."""
    return any(
        s.request.mrope_positions is not None and s.start < s.request.num_prompt_tokens for s in scheduled
    )


def step_positions(scheduled: Sequence[Any], positions: torch.Tensor) -> torch.Tensor:
    """The step's ``[T]`` positions, or ``[3, T]`` when it covers a prompt with M-RoPE positions
    (other rows repeat their 1-D position in all three rows)."""
    if not needs_3d(scheduled):
        return positions
    rows = positions.unsqueeze(0).expand(3, -1).clone()
    t = 0
    for s in scheduled:
        req = s.request
        mp = req.mrope_positions
        if mp is not None:
            lo, hi = s.start, min(s.start + s.num_tokens, req.num_prompt_tokens)
            if lo < hi:
                rows[:, t : t + hi - lo] = mp[:, lo:hi].to(rows.device)
        t += s.num_tokens
    return rows
