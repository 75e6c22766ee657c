"""Registers, spills and load instructions of the paged decode-attention kernel compiled for sm_90,
on a machine without a GPU: Triton compiles to PTX for the target, and the ptxas bundled with Triton
reports register use and spills. This is how the quantized-KV kernels' byte loads and spills were
found (BENCHMARKS.md, "GPU, third session").

    PYTHONPATH=$PWD python benchmarks/ptxas_report.py [BLOCK_N]

Bf16, head_dim 128, GQA group 4, block size 64, 16 splits; strides divisible by 16 as in the engine
(for a quantized cache the head stride is the row width, head_dim + 4 bytes, which is not). The PTX
version line is lowered to what the bundled ptxas accepts when they differ.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import hotloop.kernels.paged_decode_attention as dec

STRIDES = ["stride_qb", "stride_qh", "stride_kb", "stride_kt", "stride_kh", "stride_vb", "stride_vt", "stride_vh",
           "stride_bt", "stride_ob", "stride_oh"]  # fmt: skip
POINTERS = ["q_ptr", "k_cache_ptr", "v_cache_ptr", "block_tables_ptr", "seq_lens_ptr", "out_ptr", "lse_ptr"]


def compile_decode(quant: int, block_n: int, asm: bool = True) -> str:
    k = dec._decode_kernel
    npack = {0: 0, 8: 128, 4: 64}[quant]
    cache = "*u8" if quant else "*bf16"
    sig = {"q_ptr": "*bf16", "k_cache_ptr": cache, "v_cache_ptr": cache, "block_tables_ptr": "*i32",
           "seq_lens_ptr": "*i32", "out_ptr": "*fp32", "lse_ptr": "*fp32", "scale_log2": "fp32"}  # fmt: skip
    sig.update({n: "i32" for n in STRIDES})
    consts = dict(G=4, D=128, BS=64, NUM_SPLITS=16, WINDOW=0, BLOCK_G=16, BLOCK_D=128, BLOCK_N=block_n,
                  QUANT=quant, NPACK=npack, ROW=npack + 4 if quant else 0, ASM=int(asm) | 2 if quant else 0)  # fmt: skip
    sig.update({n: "constexpr" for n in consts})
    aligned = POINTERS + [n for n in STRIDES if not (quant and n in ("stride_kh", "stride_vh"))]
    src = ASTSource(
        fn=k,
        signature=sig,
        constexprs={(k.arg_names.index(n),): v for n, v in consts.items()},
        attrs={(k.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned},
    )
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return str(compiled.asm["ptx"])


def ptxas_info(ptx: str) -> str:
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        for version in (None, "8.8"):
            text = (
                ptx if version is None else re.sub(r"^\.version \S+", f".version {version}", ptx, flags=re.M)
            )
            with open(path, "w") as f:
                f.write(text)
            r = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(d, "k.o")],
                               capture_output=True, text=True)  # fmt: skip
            if r.returncode == 0:
                lines = [ln.strip() for ln in r.stderr.splitlines() if "registers" in ln or "spill" in ln]
                return " | ".join(lines)
    return f"ptxas failed: {r.stderr.strip()[:200]}"


def main() -> int:
    block_n = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    for quant in (0, 8, 4):
        ptx = compile_decode(quant, block_n)
        loads = sorted(set(re.findall(r"(?:ld\.global|cp\.async)[.a-z0-9]*", ptx)))
        cvts = len(re.findall(r"cvt\.rn\.(?:bf16|f16)\.u(?:8|16|32)", ptx))
        print(f"QUANT={quant} BLOCK_N={block_n}: {ptxas_info(ptx)}")
        print(f"    loads: {', '.join(loads)}; integer-to-float code conversions: {cvts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
