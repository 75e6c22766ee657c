"""The one place that picks an op's implementation: Triton on CUDA tensors, the torch reference elsewhere.

The choice follows the tensor's device (fixed when the model is built on it), so the CPU path never
imports Triton and the GPU path never falls back silently. ``set_triton_enabled(False)`` forces the
reference everywhere (parity debugging). The environment switches read here:

- ``HOTLOOP_DENSE_GEMV=0`` turns off the one-row decode path (``one_row_fusion``);
- ``HOTLOOP_ONE_ROW_ROPE=0`` keeps its rotary embedding and KV write out of the q/k/v GEMV
  (``one_row_rope``);
- ``HOTLOOP_ONE_ROW_ROPE_QUANT=1`` lets that fusion write int8 / int4 caches too (off by default:
  ``one_row_rope_quant``);
- ``HOTLOOP_ONE_ROW_LM_HEAD=0`` keeps its LM head on cuBLAS (``lm_head_logits``);
- ``HOTLOOP_ONE_ROW_MERGE=0`` keeps its decode splits' merge in a launch of its own instead of in the
  o projection, where the partials are small (``one_row_merge``);
- ``HOTLOOP_GREEDY_ARGMAX=0`` keeps ``torch.argmax`` for a few rows (``greedy_argmax``).
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

import torch
import torch.nn.functional as F

from hotloop.kernels import reference

_state: dict[str, bool] = {
    "enabled": importlib.util.find_spec("triton") is not None,
    "one_row": os.environ.get("HOTLOOP_DENSE_GEMV", "1") != "0",
    # the rotary embedding and the KV write fused into the q/k/v GEMV (measured on an H200 at batch
    # 1, 2026-11-30: Llama-3-8B 254.0 -> 256.1 tokens/s, SmolLM2-135M 2,129 -> 2,175)
    "one_row_rope": os.environ.get("HOTLOOP_ONE_ROW_ROPE", "1") != "0",
    # the same into an int8 / int4 cache (each head quantized by its last program): correct on the
    # GPU, but slower than the separate quantized write at batch 1 (int8 249.77 against 250.90,
    # BENCHMARKS.md "HOTLOOP_ONE_ROW_ROPE_QUANT")
    "one_row_rope_quant": os.environ.get("HOTLOOP_ONE_ROW_ROPE_QUANT", "0") == "1",
    # the decode splits merged in the one-row o projection (dense_gemv_merged), not in a launch
    # (H200, SmolLM2-135M batch 1: 2,376-2,380 against 2,310-2,318 tokens/s, BENCHMARKS.md)
    "one_row_merge": os.environ.get("HOTLOOP_ONE_ROW_MERGE", "1") != "0",
    # the one-row LM head through dense_gemv instead of cuBLAS + a cast
    "one_row_lm_head": os.environ.get("HOTLOOP_ONE_ROW_LM_HEAD", "1") != "0",
    # the greedy argmax of a few rows in one Triton launch instead of torch.argmax
    "greedy_argmax": os.environ.get("HOTLOOP_GREEDY_ARGMAX", "1") != "0",
}


def set_triton_enabled(enabled: bool) -> None:
    """Turn the Triton kernels on or off for CUDA tensors (on by default when Triton is installed)."""
    _state["enabled"] = enabled


def use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda and bool(_state["enabled"])


def set_one_row_fusion(enabled: bool) -> None:
    """Turn the one-row decode path on or off (on by default; ``HOTLOOP_DENSE_GEMV=0`` starts it off)."""
    _state["one_row"] = enabled


# The fused norm prologue holds the row in registers: wider models keep the unfused layer.
ONE_ROW_MAX_HIDDEN = 8192


def one_row_fusion(x: torch.Tensor) -> bool:
    """Whether a decoder should run the one-row ``x [1, hidden]`` through ``fused_linear`` (batch-1
    decode on CUDA, ``hidden <= ONE_ROW_MAX_HIDDEN``): the norms, SiLU and residual adds ride in the
    projections' launches."""
    return x.shape[0] == 1 and x.shape[-1] <= ONE_ROW_MAX_HIDDEN and use_triton(x) and bool(_state["one_row"])


def set_one_row_rope(enabled: bool) -> None:
    """Fuse the rotary embedding and the KV-cache write into the one-row q/k/v GEMV (on by
    default; ``HOTLOOP_ONE_ROW_ROPE=0`` starts it off)."""
    _state["one_row_rope"] = enabled


def one_row_rope() -> bool:
    return _state["one_row_rope"]


def set_one_row_rope_quant(enabled: bool) -> None:
    """Let the rope fusion write int8 / int4 KV caches too (off by default;
    ``HOTLOOP_ONE_ROW_ROPE_QUANT=1`` starts it on)."""
    _state["one_row_rope_quant"] = enabled


def one_row_rope_quant() -> bool:
    return _state["one_row_rope_quant"]


def set_one_row_merge(enabled: bool) -> None:
    """Merge batch-1 decode attention's splits in the o projection's GEMV (``dense_gemv_merged``)
    instead of in a merge launch, where the partials are at most ``ONE_ROW_MERGE_MAX_BYTES`` (on by
    default; ``HOTLOOP_ONE_ROW_MERGE=0`` starts it off)."""
    _state["one_row_merge"] = enabled


# Every program of the o projection reads the whole partials row: SmolLM2-135M's 36 KiB (9 heads x
# 16 splits x 64 dims) qualifies, Llama-3-8B's 256 KiB (32 x 16 x 128) does not. The attention row
# must also fit one K step of the merged GEMV (``dense_gemv.merge_config``: the by-split merge, the
# one timed faster than the merge launch; the tiled merge over several K steps was slower).
ONE_ROW_MERGE_MAX_BYTES = 64 * 1024
ONE_ROW_MERGE_MAX_K = 1024


def one_row_merge() -> bool:
    return _state["one_row_merge"]


def fused_linear_merged(
    part: torch.Tensor,
    lse: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """A dense projection (and residual add) of the attention that decode partials ``part [M, H, S,
    D]`` / ``lse [M, H, S]`` merge into: one ``dense_gemv_merged`` launch on CUDA, the reference
    merge and ``fused_linear`` elsewhere."""
    if use_triton(part):
        return _kernel("dense_gemv").dense_gemv_merged(part, lse, weight, bias, residual=residual)
    x = reference.merge_decode_partials(part, lse, weight.dtype)
    return reference.fused_linear(x, weight, bias, residual=residual)


def set_one_row_lm_head(enabled: bool) -> None:
    """Run the one-row LM head through ``dense_gemv`` (on by default; ``HOTLOOP_ONE_ROW_LM_HEAD=0``
    starts it off)."""
    _state["one_row_lm_head"] = enabled


def lm_head_logits(hidden: torch.Tensor, weight: torch.Tensor, float32: bool = True) -> torch.Tensor:
    """``hidden [N, hidden]`` -> float32 logits ``[N, vocab]``, rounded to hidden's dtype first (as
    ``F.linear(hidden, weight).float()``). One row on CUDA with ``one_row_lm_head`` on: one
    ``dense_gemv`` launch that stores float32, instead of cuBLAS and a cast kernel.

    ``float32=False``: the caller takes logits in hidden's dtype where that saves the cast (the
    values are the same: the float32 logits are these, widened exactly); the one-row launch still
    stores float32."""
    if (
        one_row_fusion(hidden)
        and _state["one_row_lm_head"]
        and weight.is_cuda
        and weight.dtype == hidden.dtype
    ):
        dg = _kernel("dense_gemv")
        return dg.dense_gemv(
            hidden, weight, out_dtype=torch.float32, config=dg.lm_head_config(hidden.shape[-1])
        )
    logits = F.linear(hidden, weight)
    return logits.float() if float32 else logits


def set_greedy_argmax(enabled: bool) -> None:
    """Take the greedy argmax of a few rows in one Triton launch (on by default;
    ``HOTLOOP_GREEDY_ARGMAX=0`` starts it off)."""
    _state["greedy_argmax"] = enabled


def greedy_logits_float32(rows: int) -> bool:
    """Whether :func:`greedy_argmax` of ``rows`` rows wants float32 logits (its one-launch kernel
    takes them); otherwise it is ``torch.argmax``, which gives the same ids on the logits in the
    model dtype and reads half the bytes (at batch 256 x 128,256 it also saves a 131 MB cast)."""
    return bool(_state["greedy_argmax"]) and rows <= _kernel("greedy_argmax").MAX_ROWS


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits [M, V]`` -> int64 ``[M]``: ``torch.argmax(dim=-1)``, through
    ``kernels/greedy_argmax.py`` on CUDA for float32 logits of up to its ``MAX_ROWS`` rows."""
    if use_triton(logits) and _state["greedy_argmax"] and logits.dim() == 2 and logits.dtype == torch.float32:
        ids = _kernel("greedy_argmax").greedy_argmax(logits.contiguous())
        if ids is not None:
            return ids
    return logits.argmax(dim=-1)


def decode_advance(
    sampled: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    block_size: int,
    history: torch.Tensor,
    limits: torch.Tensor,
) -> None:
    """The next decode step's inputs from this one's sampled ids, in place (multi-step decode); rows
    past ``limits`` (their last input index) stop writing the cache."""
    args = (sampled, input_ids, positions, slots, seq_lens, block_tables, block_size, history, limits)
    if use_triton(sampled):
        _kernel("decode_advance").decode_advance(*args)
        return
    reference.decode_advance(*args)


def gather_ids(values: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[:n] = values[index]`` (1-D int64), returning ``out[:n]``: one Triton launch on CUDA."""
    if use_triton(values):
        return _kernel("gather_ids").gather_ids(values, index, out)  # type: ignore[no-any-return]
    return reference.gather_ids(values, index, out)


def _kernel(name: str) -> ModuleType:
    return importlib.import_module(f"hotloop.kernels.{name}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if use_triton(x):
        return _kernel("rms_norm").rms_norm(x, weight, eps)[0]
    return reference.rms_norm(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``."""
    if use_triton(x) and x.is_contiguous() and residual.is_contiguous():
        out, res = _kernel("rms_norm").rms_norm(x, weight, eps, residual)
        assert res is not None
        return out, res
    return reference.add_rms_norm(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if use_triton(x):
        return _kernel("silu_and_mul").silu_and_mul(x)
    return reference.silu_and_mul(x)


def fused_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    silu: bool = False,
) -> torch.Tensor:
    """A dense projection with its RMSNorm before and its SiLU-and-mul or residual add after: one
    ``dense_gemv`` launch on CUDA (meant for one row), the unfused reference elsewhere. ``weight``
    must be static (not written by the kernel just before: see ``kernels/dense_gemv.py``)."""
    fn = _kernel("dense_gemv").dense_gemv if use_triton(x) else reference.fused_linear
    return fn(x, weight, bias, norm_weight=norm_weight, eps=eps, residual=residual, silu=silu)


def fused_qkv_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    norm_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> torch.Tensor:
    """The q/k/v projection with its input norm, the rotary embedding and the KV-cache write (float
    cache, full rotary): one ``dense_gemv_qkv_rope`` launch on CUDA, the reference elsewhere.
    Returns the rotated q ``[T, H * D]``."""
    fn = _kernel("dense_gemv").dense_gemv_qkv_rope if use_triton(x) else reference.fused_qkv_rope
    return fn(
        x,
        weight,
        bias,
        norm_weight=norm_weight,
        eps=eps,
        cos=cos,
        sin=sin,
        slot_mapping=slot_mapping,
        k_cache=k_cache,
        v_cache=v_cache,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
    )


def fused_qkv_rope_staged(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    norm_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The q/k/v projection with its input norm and the rotary embedding, no cache write: one
    ``dense_gemv_qkv_rope_staged`` launch on CUDA, the reference elsewhere. Returns the rotated q
    ``[T, H * D]`` and ``kv [T, 2 KV, D]`` (k rotated, then v)."""
    fn = (
        _kernel("dense_gemv").dense_gemv_qkv_rope_staged if use_triton(x) else reference.fused_qkv_rope_staged
    )
    return fn(
        x,
        weight,
        bias,
        norm_weight=norm_weight,
        eps=eps,
        cos=cos,
        sin=sin,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
    )


def rotary_kv_write(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Rotate q in place, rotate k, and store k and v at ``slot_mapping`` (negative: skipped). A
    ``uint8`` cache is quantized as it is written: in the fused Triton kernel on CUDA, through
    ``kv_quant`` elsewhere (the same bytes)."""
    if use_triton(q):
        _kernel("rotary_kv_write").rotary_kv_write(q, k, v, cos, sin, k_cache, v_cache, slot_mapping)
    else:
        reference.rotary_kv_write(q, k, v, cos, sin, k_cache, v_cache, slot_mapping)


def write_kv_cache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store k, v ``[T, KV, D]`` at ``slot_mapping`` (negative: skipped), quantizing for a ``uint8``
    cache: one Triton launch on CUDA, the torch reference elsewhere."""
    if use_triton(k):
        _kernel("rotary_kv_write").write_kv_cache(k, v, k_cache, v_cache, slot_mapping)
        return
    keep = slot_mapping >= 0
    reference.write_kv_cache(k[keep], v[keep], k_cache, v_cache, slot_mapping[keep])
