// What the CUDA C one-row W4A16 GEMVs share (w4a16_gemv.cu, w4a16_gemv_tc.cu, w4a16_cutlass_gemv.cu): their
// loads, the 16-bit <-> float32 conversions, the magic-number unpacking of AutoAWQ nibbles, the folded
// SiLU-and-mul, and the end of a block (its column sums to the output, or through a K split to the
// last block of the column tile).
#pragma once

typedef unsigned int u32;

// weights: streamed past L1. ptxas (CUDA 13.0) moves griddepcontrol.wait above every ld.global.nc in
// front of it, so loads meant to start before the wait go through the coherent path (the "early" forms)
__device__ __forceinline__ void ldg_stream4(const u32* p, u32& a, u32& b, u32& c, u32& d) {
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "l"(p));
}

__device__ __forceinline__ void ldg_early_stream4(const u32* p, u32& a, u32& b, u32& c, u32& d) {
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "l"(p));
}

// activations, zero points, scales. volatile, as the weight loads: the compiler keeps them after
// griddepcontrol.wait (the input row is written by the kernel before)
__device__ __forceinline__ void ldg4(const u32* p, u32& a, u32& b, u32& c, u32& d) {
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p));
}

__device__ __forceinline__ void ldg_early4(const u32* p, u32& a, u32& b, u32& c, u32& d) {
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p));
}

template <bool BF16>
__device__ __forceinline__ unsigned short to16(float v) {
  unsigned short h;
  if (BF16) {
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
  } else {
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  }
  return h;
}

// (v & m) | magic in one lop3: m goes in a register (a lop3 takes one immediate; with two, the
// compiler emits an AND and an OR). bf16 magic 128 (0x4300), fp16 1024 (0x6400): magic + q, exact
template <bool BF16>
__device__ __forceinline__ u32 and_or_magic(u32 v, u32 m) {
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(v), "r"(m), "n"(BF16 ? 0x43004300u : 0x64006400u));
  return d;
}

// the two 16-bit floats of v as float32 (exact)
template <bool BF16>
__device__ __forceinline__ void halves(u32 v, float& lo, float& hi) {
  if (BF16) {
    lo = __uint_as_float(v << 16);
    hi = __uint_as_float(v & 0xFFFF0000u);
  } else {
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }"
        : "=f"(lo), "=f"(hi)
        : "r"(v));
  }
}

// silu(gate) * up of two 16-bit pairs, rounded as kernels/silu_and_mul.py rounds (the SiLU to 16 bits,
// then the product; the exponential and the division as Triton lowers them: ex2.approx, div.full)
template <bool BF16>
__device__ __forceinline__ u32 silu_mul2(u32 g, u32 u) {
  float g0, g1, u0, u1;
  halves<BF16>(g, g0, g1);
  halves<BF16>(u, u0, u1);
  float e0, e1, s0, s1;
  asm("ex2.approx.f32 %0, %1;" : "=f"(e0) : "f"(g0 * -1.4426950408889634f));
  asm("ex2.approx.f32 %0, %1;" : "=f"(e1) : "f"(g1 * -1.4426950408889634f));
  asm("div.full.f32 %0, %1, %2;" : "=f"(s0) : "f"(g0), "f"(1.0f + e0));
  asm("div.full.f32 %0, %1, %2;" : "=f"(s1) : "f"(g1), "f"(1.0f + e1));
  float a0, a1;
  halves<BF16>((u32)to16<BF16>(s0) | ((u32)to16<BF16>(s1) << 16), a0, a1);
  return (u32)to16<BF16>(a0 * u0) | ((u32)to16<BF16>(a1 * u1) << 16);
}

// The end of a block, called by all its T threads: thread tid holds the float32 sums part[q] of the
// block's columns tid + q T (those below CT) of column tile blockIdx.x. Without a K split they are the
// output; with one they go to ws[blockIdx.y], and the last block of the tile to arrive (an atomic
// counter per tile, reset by that block) adds the splits' partials in split order and writes the
// output: one launch, a result that does not depend on timing.
template <bool BF16, int Q, int T, int CT>
__device__ __forceinline__ void finish_columns(const float (&part)[Q], float* __restrict__ ws,
                                               unsigned short* __restrict__ out, int* __restrict__ cnt,
                                               int N) {
  __shared__ int last;
  const int tid = threadIdx.x;
  if (gridDim.y == 1) {
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      const int c = tid + q * T;
      if (CT % T == 0 || c < CT) out[blockIdx.x * CT + c] = to16<BF16>(part[q]);
    }
    return;
  }
#pragma unroll
  for (int q = 0; q < Q; ++q) {
    const int c = tid + q * T;
    if (CT % T == 0 || c < CT) ws[(size_t)blockIdx.y * N + blockIdx.x * CT + c] = part[q];
  }
  __threadfence();  // this block's partials are visible before its arrival is counted
  __syncthreads();
  if (tid == 0) last = atomicAdd(&cnt[blockIdx.x], 1) == (int)gridDim.y - 1;
  __syncthreads();
  if (last) {
    __threadfence();  // acquire: the other blocks' partials, counted in before this block's arrival
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      const int c = tid + q * T;
      if (CT % T == 0 || c < CT) {
        const int n = blockIdx.x * CT + c;
        float v = 0.0f;
        for (int sp = 0; sp < (int)gridDim.y; ++sp) v += __ldcg(&ws[(size_t)sp * N + n]);
        out[n] = to16<BF16>(v);
      }
    }
    if (tid == 0) cnt[blockIdx.x] = 0;
  }
}
