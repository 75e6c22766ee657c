"""Compiling a Triton kernel for a GPU architecture on a machine without that GPU.

Triton lowers a kernel to PTX for any target and assembles it with the ptxas it bundles, so a
GPU-less machine (CI) can check that every kernel variant the launchers use compiles for sm_90, and
read its registers and instructions (``benchmarks/ptxas_report.py``). Compiler crashes are found
here that would otherwise show up only on the GPU (one did: a float32 int4 prefill variant).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from hotloop.kernels import kv_quant
from hotloop.kernels.kv_quant_triton import code_mode_bits, split_eo_mask


def compile_for_target(
    fn: Any,
    signature: Mapping[str, str],
    constexprs: Mapping[str, Any],
    aligned: Iterable[str],
    arch: int = 90,
    num_warps: int = 4,
    num_stages: int = 3,
    maxnreg: int | None = None,
) -> Any:
    """Compile the ``@triton.jit`` function ``fn`` for CUDA compute capability ``arch``.

    ``signature`` maps each runtime argument to its Triton type (``"*bf16"``, ``"i32"``, ``"fp32"``);
    ``constexprs`` gives every ``tl.constexpr`` argument; ``aligned`` names the arguments that are
    divisible by 16 (pointers and strides, as Triton specializes them at launch). Returns Triton's
    compiled kernel (``.asm["ptx"]``, ``.asm["cubin"]``, ``.n_regs`` where available); raises what
    the compiler raises.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = dict(signature)
    sig.update({name: "constexpr" for name in constexprs})
    missing = set(fn.arg_names) - set(sig)
    if missing:
        raise ValueError(f"no type or value for {sorted(missing)} of {fn.__name__}")
    src = ASTSource(
        fn=fn,
        signature=sig,
        constexprs={(fn.arg_names.index(n),): v for n, v in constexprs.items()},
        attrs={(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned},
    )
    options: dict[str, Any] = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg  # registers per thread; ptxas spills past it
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


# -- the attention kernels, as their launchers configure them on a GPU ------------------------------
# head_dim 128, GQA group 4, 8 KV heads, block size 64; strides divisible by 16 except a quantized
# cache's token and head strides (rows of head_dim + 4 bytes for bf16; the kernels address a
# quantized cache per block, whose stride is divisible by 16)
D, G, BS, KV = 128, 4, 64, 8
_TYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
_TORCH = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _cache_consts(quant: int, dtype: str, asm: int) -> dict[str, int]:
    npack = kv_quant.packed_bytes(D, quant) if quant else 0
    # on a GPU a 16-bit model's quantized kernels get PTX permutes (bit 1); float32 reads codes directly
    return {"QUANT": quant, "NPACK": npack, "KV": KV, "ASM": asm if quant else 0}


def compile_decode(
    quant: int,
    dtype: str,
    window: int = 0,
    splits: int = 4,
    block_n: int | None = None,
    asm: int | None = None,
    bs: int = BS,
    config: tuple[int, ...] | None = None,
    merge: bool | None = None,
    early: bool = False,
    heads_first: bool = True,
) -> Any:
    """The decode kernel for cache policy ``quant``, model ``dtype`` and block size ``bs`` (``merge``:
    the last split merges, default ``FUSE_MERGE``; ``early``: the first tile before the PDL wait;
    ``heads_first``: the (KV, B, splits) grid, the default ``HOTLOOP_DECODE_GRID=heads``; False: ``seq``);
    ``block_n`` and ``asm`` (the code-reading bits, ``kv_quant_triton.code_mode_bits``) override
    the launcher's choices on a GPU; ``config`` overrides the whole launch configuration,
    ``(BLOCK_N, num_warps, num_stages[, maxnreg])``."""
    from hotloop.kernels import paged_decode_attention as dec

    t = _TYPES[dtype]
    cache = "*u8" if quant else f"*{t}"
    strides = ["stride_qb", "stride_qh", "stride_kb", "stride_kt", "stride_kh", "stride_vb", "stride_vt",
               "stride_vh", "stride_bt", "stride_ob", "stride_oh", "stride_fb", "stride_fh"]  # fmt: skip
    sig = {"q_ptr": f"*{t}", "k_cache_ptr": cache, "v_cache_ptr": cache, "block_tables_ptr": "*i32",
           "seq_lens_ptr": "*i32", "out_ptr": "*fp32", "lse_ptr": "*fp32", "fin_ptr": f"*{t}",
           "cnt_ptr": "*i32", "scale_log2": "fp32"}  # fmt: skip
    sig.update({s: "i32" for s in strides})
    default_n, warps, stages, *rest = config or dec.decode_config(quant, D, splits)
    if asm is None:  # what the launcher passes on a GPU
        asm = code_mode_bits(True, dec.INT8_PAIRS) & split_eo_mask(_TORCH[dtype], D)
    consts = {"G": G, "D": D, "BS": bs, "NUM_SPLITS": splits, "WINDOW": window, "BLOCK_G": 16, "BLOCK_D": D,
              "BLOCK_N": block_n or default_n, "PDL": True,
              "MERGE": bool(dec.FUSE_MERGE if merge is None else merge) and splits > 1, "EARLY": early,
              "HEADS_FIRST": heads_first, **_cache_consts(quant, dtype, asm)}  # fmt: skip
    aligned = [n for n in sig if n.endswith("_ptr")]
    # a quantized cache's token and head strides (rows of 132 bytes) are not divisible by 16; its
    # kernels use only the block stride
    aligned += [
        s for s in strides if not (quant and s in ("stride_kt", "stride_kh", "stride_vt", "stride_vh"))
    ]
    return compile_for_target(
        dec._decode_kernel,
        sig,
        consts,
        aligned,
        num_warps=warps,
        num_stages=stages,
        maxnreg=rest[0] if rest else None,
    )


def compile_prefill(
    quant: int,
    dtype: str,
    window: int = 0,
    max_query_len: int = 4096,
    asm: int | None = None,
    diag_split: bool | None = None,
    fresh: bool = False,
    prefix: bool = True,
) -> Any:
    """The prefill kernel for cache policy ``quant``, model ``dtype`` and a longest query; ``asm``
    overrides the code-reading bits, as in ``compile_decode``; ``diag_split`` the launcher's
    ``DIAG_SPLIT``; ``fresh``: this step's keys and values read from ``k_new`` / ``v_new``;
    ``prefix`` False: the fresh kernel without its cache loop (no row has a cached prefix)."""
    from hotloop.kernels import paged_prefill_attention as pf

    t = _TYPES[dtype]
    cache = "*u8" if quant else f"*{t}"
    strides = ["stride_qt", "stride_qh", "stride_kb", "stride_kt", "stride_kh", "stride_vb", "stride_vt",
               "stride_vh", "stride_bt", "stride_ot", "stride_oh", "stride_knt", "stride_knh", "stride_vnt",
               "stride_vnh"]  # fmt: skip
    sig = {"q_ptr": f"*{t}", "k_cache_ptr": cache, "v_cache_ptr": cache, "block_tables_ptr": "*i32",
           "seq_lens_ptr": "*i32", "query_start_ptr": "*i32", "out_ptr": f"*{t}", "kn_ptr": f"*{t}",
           "vn_ptr": f"*{t}", "scale_log2": "fp32"}  # fmt: skip
    sig.update({s: "i32" for s in strides})
    block_m, block_n, warps, stages = pf.prefill_config(D, max_query_len, quant, diag_split)
    if asm is None:  # what the launcher passes on a GPU
        asm = code_mode_bits(True, pf.INT8_PAIRS) & ~4
    consts = {"G": G, "D": D, "BS": BS, "WINDOW": window, "BLOCK_M": block_m, "BLOCK_N": block_n,
              "BLOCK_D": D, **_cache_consts(quant, dtype, asm),
              "DIAG_SPLIT": pf.DIAG_SPLIT if diag_split is None else diag_split, "FRESH": fresh,
              "PREFIX": prefix or not fresh}  # fmt: skip
    aligned = [n for n in sig if n.endswith("_ptr") and n not in pf.UNALIGNED_ARGS]
    aligned += [
        s for s in strides if not (quant and s in ("stride_kt", "stride_kh", "stride_vt", "stride_vh"))
    ]
    return compile_for_target(pf._prefill_kernel, sig, consts, aligned, num_warps=warps, num_stages=stages)


def compile_w4a16_gemv(
    unpack: str, dtype: str, block_n: int, block_k: int, num_warps: int = 4, num_stages: int = 4
) -> Any:
    """A one-row W4A16 GEMV kernel (``kernels/w4a16_gemv.py``) as ``w4a16_gemm`` launches it on a GPU
    (inline PTX on, split K with the in-kernel fixup, group 128): ``unpack`` "mask" (the in-place
    mask kernel), "half2" (packed 16-bit arithmetic; ``dtype`` float16 or bfloat16) or another mode
    (the shift-per-column kernel)."""
    from hotloop.kernels import w4a16_gemm as gemm
    from hotloop.kernels import w4a16_gemv as gemv

    t = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[dtype]
    sig = {"x_ptr": f"*{t}", "qw_ptr": "*i32", "qz_ptr": "*i32", "s_ptr": f"*{t}", "out_ptr": f"*{t}",
           "ws_ptr": "*fp32", "cnt_ptr": "*i32"}  # fmt: skip
    sig.update({n: "i32" for n in ("M", "N", "K", "n8", "stride_xm", "stride_xk", "split_k")})
    aligned = [n for n in sig if n.endswith("_ptr")] + ["N", "K", "n8", "stride_xm"]
    consts: dict[str, Any] = {"GROUP_SIZE": 128, "BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT": True,
                              "FIXUP": True, "NUM_STAGES": num_stages, "PDL": True}  # fmt: skip
    if unpack == "half2":
        fn = gemv._w4a16_gemv_half2_kernel
        consts.update(ROWS=gemm.HALF2_ROWS[getattr(torch, dtype)], ASM=1)
    elif unpack == "mask":
        fn = gemv._w4a16_gemv_mask_kernel
        consts.update(LOP3=1)
    else:
        fn = gemv._w4a16_gemv_kernel
        consts.update(BLOCK_M=1, LOP3=int(unpack == "lop3"))  # as the launcher sets it
    return compile_for_target(fn, sig, consts, aligned, num_warps=num_warps, num_stages=num_stages)


def _gemv_variants() -> dict[str, tuple[str, dict[str, Any]]]:
    """Every one-row GEMV template the W4A16 tuner times, per 16-bit dtype that its kernel takes."""
    from hotloop.kernels import w4a16_gemm as gemm

    out: dict[str, tuple[str, dict[str, Any]]] = {}
    templates = gemm.GEMV_TEMPLATES + gemm.GEMV_MASK_TEMPLATES + gemm.GEMV_HALF2_TEMPLATES
    for cfg, _ in templates:
        for dtype in ("float16", "bfloat16") if cfg.unpack == "half2" else ("bfloat16",):
            name = (f"w4a16-gemv-{cfg.unpack}-{dtype}-n{cfg.block_n}-k{cfg.block_k}-w{cfg.num_warps}"
                    f"-s{cfg.num_stages}")  # fmt: skip
            out[name] = ("gemv", {"unpack": cfg.unpack, "dtype": dtype, "block_n": cfg.block_n,
                                  "block_k": cfg.block_k, "num_warps": cfg.num_warps,
                                  "num_stages": cfg.num_stages})  # fmt: skip
    return out


def compile_dense_gemv(
    mode: str, dtype: str = "bfloat16", k: int = 4096, out: str | None = None, quant: int = 0
) -> Any:
    """The one-row dense GEMV (``kernels/dense_gemv.py``) with its default launch for a Llama-3-8B
    shape: ``mode`` ``plain``, ``norm`` (qkv), ``res`` (o, down), ``silu`` (gate/up), ``rope``
    (qkv with the rotary embedding and the KV-cache write; ``quant`` 8 / 4: into a quantized
    cache), ``staged`` (qkv with the rotary embedding, k and v handed over, no cache write) or
    ``merged`` (SmolLM2-135M's o projection + residual reading x as the merge of 16 decode splits'
    partials, ``dense_gemv_merged``); ``out`` the output dtype (float32: the LM head's logits)."""
    from hotloop.kernels import dense_gemv as dg

    t = _TYPES[dtype]
    staged = mode == "staged"
    silu, rope = mode == "silu", mode in ("rope", "staged")
    norm = mode in ("norm", "silu", "rope", "staged")
    cfg = dg.default_config(4096, k, silu, norm)
    if rope:
        base = dg.rope_default_config(k)
        cfg = dg.GemvConfig(dg.rope_pairs(128, base.block_n), base.block_k, base.num_warps)
    merged = mode == "merged"
    if merged:
        cfg = dg.merge_config(k, k)
    sig = {"x_ptr": f"*{t}", "w_ptr": f"*{t}", "b_ptr": f"*{t}", "nw_ptr": f"*{t}", "r_ptr": f"*{t}",
           "out_ptr": f"*{_TYPES[out or dtype]}", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "slot_ptr": "*i64",
           "kc_ptr": "*u8" if quant else f"*{t}", "vc_ptr": "*u8" if quant else f"*{t}", "stage_ptr": f"*{t}",
           "cnt_ptr": "*i32", "mp_ptr": "*fp32", "ml_ptr": "*fp32", "N": "i32", "K": "i32",
           "eps": "fp32"}  # fmt: skip
    strides = ["stride_xm", "stride_wn", "stride_rm", "stride_om", "stride_cs", "stride_kcs", "stride_kch",
               "stride_vcs", "stride_vch", "stride_kb", "stride_vb"]  # fmt: skip
    sig.update({s: "i32" for s in strides})
    consts = {"NORM": norm, "SILU": silu, "ROPE": rope, "H": 9 if merged else 32, "KV": 8,
              "HD": 64 if merged else 128, "RES": mode in ("res", "merged"),
              "HAS_BIAS": False, "EVEN": k % cfg.block_k == 0, "K_POW2": 1 << (k - 1).bit_length() if norm else 16,
              "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "EVICT": "evict_first", "PDL": True,
              "QUANT": quant, "BS": 64 if quant else 1, "NPACK": 128 if quant == 8 else 64 if quant else 1,
              "BLOCK_P": 128 if quant == 8 else 64 if quant else 2, "SCALE_BITS": 8 * (2 if dtype == "bfloat16" else 4),
              "STAGE_KV": staged, "NO_FMA": staged or bool(quant), "LATE": True, "MERGE": merged,
              "NUM_SPLITS": 16 if merged else 1, "BLOCK_S": 16 if merged else 2,
              "BY_SPLIT": merged and cfg.block_k >= k}  # fmt: skip
    aligned = [n for n in sig if n.endswith("_ptr")] + ["N", "K", *strides]
    return compile_for_target(dg._dense_gemv_kernel, sig, consts, aligned, num_warps=cfg.num_warps)


def compile_greedy_argmax() -> Any:
    """The few-row greedy argmax (``kernels/greedy_argmax.py``) for a 128k vocabulary."""
    from hotloop.kernels import greedy_argmax as ga

    sig = {"x_ptr": "*fp32", "part_v_ptr": "*fp32", "part_i_ptr": "*i32", "out_ptr": "*i64", "cnt_ptr": "*i32",
           "V": "i32", "P": "i32", "stride_x": "i32"}  # fmt: skip
    consts = {"CHUNK": ga.CHUNK, "P_POW2": 64, "PDL": True}
    return compile_for_target(ga._greedy_argmax_kernel, sig, consts, [n for n in sig if n.endswith("_ptr")])


def compile_w4a16_dequant(dtype: str = "bfloat16") -> Any:
    """The AWQ dequantization to a dense matrix (``kernels/w4a16_dequant.py``), group 128."""
    from hotloop.kernels import w4a16_dequant as wd

    sig = {"qw_ptr": "*i32", "qz_ptr": "*i32", "s_ptr": f"*{_TYPES[dtype]}", "out_ptr": f"*{_TYPES[dtype]}",
           "K": "i32", "N": "i32"}  # fmt: skip
    consts = {"GROUP": 128, "BLOCK_K": wd.BLOCK_K, "BLOCK_W": wd.BLOCK_W}
    aligned = [n for n in sig if n.endswith("_ptr")] + ["K", "N"]
    return compile_for_target(wd._w4a16_dequant_kernel, sig, consts, aligned)


_FORMATS = [(0, "bfloat16"), (8, "bfloat16"), (4, "bfloat16"), (0, "float32"), (8, "float32"), (4, "float32")]
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    **{f"decode-q{q}-{d}": ("decode", {"quant": q, "dtype": d}) for q, d in _FORMATS},
    **{f"prefill-q{q}-{d}": ("prefill", {"quant": q, "dtype": d}) for q, d in _FORMATS},
    "decode-q0-bfloat16-window": ("decode", {"quant": 0, "dtype": "bfloat16", "window": 512}),
    "decode-q8-bfloat16-window": ("decode", {"quant": 8, "dtype": "bfloat16", "window": 512}),
    "decode-q0-bfloat16-one-split": ("decode", {"quant": 0, "dtype": "bfloat16", "splits": 1}),
    "decode-q8-bfloat16-one-split": ("decode", {"quant": 8, "dtype": "bfloat16", "splits": 1}),
    "decode-q8-bfloat16-block16": ("decode", {"quant": 8, "dtype": "bfloat16", "bs": 16}),
    "decode-q4-bfloat16-block16": ("decode", {"quant": 4, "dtype": "bfloat16", "bs": 16}),
    "decode-q8-bfloat16-maxnreg96": ("decode", {"quant": 8, "dtype": "bfloat16", "config": (64, 4, 1, 96)}),
    # without the even/odd split dots (HOTLOOP_KV_SPLIT_EO=0): permutes and int8 pairs only
    "decode-q8-bfloat16-joined": ("decode", {"quant": 8, "dtype": "bfloat16", "asm": 3}),
    "decode-q4-bfloat16-joined": ("decode", {"quant": 4, "dtype": "bfloat16", "asm": 3}),
    "prefill-q0-bfloat16-window-1k": ("prefill", {"quant": 0, "dtype": "bfloat16", "window": 512, "max_query_len": 1024}),
    "prefill-q8-bfloat16-short": ("prefill", {"quant": 8, "dtype": "bfloat16", "max_query_len": 8}),
    # this step's keys from k_new / v_new (a quantized cache's prefill, as the attention layer launches it)
    **{f"prefill-q{q}-{d}-fresh": ("prefill", {"quant": q, "dtype": d, "fresh": True})
       for q, d in _FORMATS if q},
    "prefill-q8-bfloat16-fresh-no-prefix": ("prefill", {"quant": 8, "dtype": "bfloat16", "fresh": True, "prefix": False}),
    "prefill-q8-bfloat16-fresh-window": ("prefill", {"quant": 8, "dtype": "bfloat16", "fresh": True, "window": 512}),
    **{f"prefill-q{q}-bfloat16-diag-1k": ("prefill", {"quant": q, "dtype": "bfloat16", "max_query_len": 1024,
                                                      "diag_split": True}) for q in (0, 8, 4)},
    # the last split merges (fuse_merge)
    "decode-q0-bfloat16-merge": ("decode", {"quant": 0, "dtype": "bfloat16", "splits": 16, "merge": True}),
    "decode-q8-bfloat16-merge": ("decode", {"quant": 8, "dtype": "bfloat16", "splits": 16, "merge": True}),
    # the first tile before the PDL wait (HOTLOOP_DECODE_EARLY)
    "decode-q0-bfloat16-early": ("decode", {"quant": 0, "dtype": "bfloat16", "splits": 16, "early": True}),
    # the (B, KV, splits) grid (HOTLOOP_DECODE_GRID=seq), with the fused merge
    "decode-q0-bfloat16-seq": ("decode", {"quant": 0, "dtype": "bfloat16", "splits": 4, "merge": True,
                                          "heads_first": False}),
    "dense-gemv-staged-bfloat16": ("dense", {"mode": "staged"}),
    **{f"dense-gemv-{m}-bfloat16": ("dense", {"mode": m}) for m in ("plain", "norm", "res", "silu", "rope")},
    "dense-gemv-rope-float32": ("dense", {"mode": "rope", "dtype": "float32"}),
    "dense-gemv-silu-bfloat16-k576": ("dense", {"mode": "silu", "k": 576}),
    "dense-gemv-merged-bfloat16-k576": ("dense", {"mode": "merged", "k": 576}),
    "dense-gemv-lm-head-bfloat16": ("dense", {"mode": "plain", "out": "float32"}),
    "greedy-argmax": ("argmax", {}),
    "dense-gemv-rope-q8-bfloat16": ("dense", {"mode": "rope", "quant": 8}),
    "dense-gemv-rope-q4-bfloat16": ("dense", {"mode": "rope", "quant": 4}),
    "w4a16-dequant-bfloat16": ("dequant", {"dtype": "bfloat16"}),
    "w4a16-dequant-float16": ("dequant", {"dtype": "float16"}),
}  # fmt: skip
VARIANTS.update(_gemv_variants())
_COMPILERS: dict[str, Callable[..., Any]] = {
    "decode": compile_decode,
    "prefill": compile_prefill,
    "gemv": compile_w4a16_gemv,
    "dense": compile_dense_gemv,
    "argmax": compile_greedy_argmax,
    "dequant": compile_w4a16_dequant,
}


def main(argv: list[str] | None = None) -> int:
    """``python -m hotloop.kernels.aot [NAME ...]``: compile the attention and one-row W4A16 GEMV
    variants (all by default) for sm_90 and print one JSON object, ``{name: "ok" | error text}``. Needs TRITON_INTERPRET unset
    (interpreted kernels cannot be compiled)."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: interpreted kernels cannot be compiled", file=sys.stderr)
        return 2
    names = (argv if argv is not None else sys.argv[1:]) or list(VARIANTS)
    results = {}
    for name in names:
        kind, kwargs = VARIANTS[name]
        try:
            _COMPILERS[kind](**kwargs)
            results[name] = "ok"
        except Exception as e:  # noqa: BLE001 - every variant is reported, the first failure included
            results[name] = f"{type(e).__name__}: {str(e)[-300:]}"
    print(json.dumps(results))
    return 0 if all(v == "ok" for v in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
