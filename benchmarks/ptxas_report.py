"""Registers, spills and load instructions of the paged decode-attention kernel compiled for sm_90,
on a machine without a GPU: Triton compiles to PTX for the target, and the ptxas bundled with Triton
reports register use and spills. This is how the quantized-KV kernels' byte loads and spills were
found (BENCHMARKS.md, "GPU, third session").

    PYTHONPATH=$PWD python benchmarks/ptxas_report.py [BLOCK_N | default | gemv]

With ``default`` each format uses its launcher's BLOCK_N. ``gemv`` reports the W4A16 CUDA-core
GEMV instead (one row: every template the tuner times, the ``half2`` ones per 16-bit dtype), per
weight. The last line per format counts the SASS instructions (per thread) of the attention loop,
the longest backward branch, per token of a tile: with the shared memory and the resident CTAs per
SM it implies with the registers (occupancy): the quantized kernels are bound by instructions and
latency, not bandwidth (BENCHMARKS.md).

Bf16, head_dim 128, GQA group 4, block size 64, 16 splits (the epilogue only: the loop is the same
at any split count); strides divisible by 16 as in the engine (a quantized cache is addressed per
block, whose codes are 16-byte aligned, ``kv_quant.py``). ``default`` takes each format's
large-batch configuration (one split). The PTX version line is lowered to what the bundled ptxas
accepts when they differ.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from typing import Any

import triton

from hotloop.kernels import aot
from hotloop.kernels.kv_quant_triton import code_mode_bits
from hotloop.kernels.paged_decode_attention import INT8_PAIRS, decode_config


def compile_decode(quant: int, block_n: int, asm: bool = True) -> str:
    """PTX of the decode kernel (bf16, 16 splits) with ``block_n`` rows per tile; ``asm`` False
    turns the PTX permutes off (the launcher's int8-pairs choice stays)."""
    return str(compile_decode_kernel(quant, block_n, asm).asm["ptx"])


def compile_decode_kernel(quant: int, block_n: int, asm: bool = True) -> Any:
    bits = code_mode_bits(True, INT8_PAIRS) & (~0 if asm else ~1)
    return aot.compile_decode(quant, "bfloat16", splits=16, block_n=block_n, asm=bits)


def occupancy(registers: int, shared: int, num_warps: int) -> int:
    """Resident CTAs per H100/H200 SM (64 K registers, allocated per warp in units of 256; 227 KiB
    of shared memory plus 1 KiB reserved per CTA; at most 64 warps and 32 CTAs)."""
    per_warp = -(-registers * 32 // 256) * 256
    by_regs = 65536 // (per_warp * num_warps)
    by_smem = (228 * 1024) // (shared + 1024)
    return min(by_regs, by_smem, 64 // num_warps, 32)


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


def loop_instructions(ptx: str) -> tuple[int, Counter[str]]:
    """SASS instructions in the kernel's longest loop (assembled with the bundled ptxas, listed with
    the bundled cuobjdump), and their opcodes."""
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(re.sub(r"^\.version \S+", ".version 8.8", ptx, flags=re.M))
        subprocess.run([os.path.join(tools, "ptxas"), "-arch=sm_90a", path, "-o", path + ".o"], check=True)
        sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", path + ".o"],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
    ops = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*)", line)
        if m:
            ops.append((int(m.group(1), 16), m.group(2), m.group(3)))
    loops = []
    for addr, op, rest in ops:
        target = re.search(r"0x([0-9a-f]+)", rest)
        if op.startswith("BRA") and target and int(target.group(1), 16) < addr:
            loops.append((int(target.group(1), 16), addr))
    if not loops:
        raise ValueError("no loop (backward branch) in the kernel's SASS")
    lo, hi = max(loops, key=lambda r: r[1] - r[0])
    body = [op.split(".")[0] for addr, op, _ in ops if lo <= addr <= hi]
    return len(body), Counter(body)


def gemv_report() -> None:
    """Registers and loop instructions per weight of the W4A16 one-row GEMV templates (the
    shift-per-column kernel and the in-place mask kernel with bf16 activations; the packed 16-bit
    ``half2`` kernel with fp16 and with bf16)."""
    from hotloop.kernels.w4a16_gemm import GEMV_HALF2_TEMPLATES, GEMV_MASK_TEMPLATES, GEMV_TEMPLATES

    for cfg, _ in GEMV_TEMPLATES + GEMV_MASK_TEMPLATES + GEMV_HALF2_TEMPLATES:
        for dtype in ("float16", "bfloat16") if cfg.unpack == "half2" else ("bfloat16",):
            kernel = aot.compile_w4a16_gemv(
                cfg.unpack, dtype, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages
            )
            ptx = str(kernel.asm["ptx"])
            n, ops = loop_instructions(ptx)
            weights = cfg.block_n * cfg.block_k
            threads = 32 * cfg.num_warps
            top = ", ".join(f"{op} {c}" for op, c in ops.most_common(8))
            print(f"W4A16 GEMV ({cfg.unpack}, {dtype}) BLOCK_N={cfg.block_n} BLOCK_K={cfg.block_k} "
                  f"warps={cfg.num_warps} stages={cfg.num_stages}: {ptxas_info(ptx)}")  # fmt: skip
            print(f"    loop: {n} SASS instructions per thread for {weights} weights, "
                  f"{n * threads / weights:.2f} thread-instructions per weight ({top})")  # fmt: skip


def main() -> int:
    arg = sys.argv[1] if len(sys.argv) > 1 else "32"
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    if arg == "gemv":
        gemv_report()
        return 0
    for quant in (0, 8, 4):
        block_n = decode_config(quant, 128)[0] if arg == "default" else int(arg)
        kernel = compile_decode_kernel(quant, block_n)
        ptx = str(kernel.asm["ptx"])
        loads = sorted(set(re.findall(r"(?:ld\.global|cp\.async)[.a-z0-9]*", ptx)))
        cvts = len(re.findall(r"cvt\.rn\.(?:bf16|f16)\.u(?:8|16|32)", ptx))
        print(f"QUANT={quant} BLOCK_N={block_n}: {ptxas_info(ptx)}")
        print(f"    loads: {', '.join(loads)}; integer-to-float code conversions: {cvts}")
        n, ops = loop_instructions(ptx)
        top = ", ".join(f"{op} {c}" for op, c in ops.most_common(8))
        print(f"    loop: {n} SASS instructions, {n / block_n:.1f} per token ({top})")
        regs = re.search(r"Used (\d+) registers", ptxas_info(ptx))
        warps = kernel.metadata.num_warps
        if regs:
            ctas = occupancy(int(regs.group(1)), kernel.metadata.shared, warps)
            print(f"    shared memory {kernel.metadata.shared} bytes, {warps} warps: {ctas} CTAs "
                  f"({ctas * warps} warps) per SM")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
