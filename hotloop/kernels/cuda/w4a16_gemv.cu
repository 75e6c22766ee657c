// W4A16 one-row GEMV in CUDA C: y = x @ W for one row of 16-bit x, W in the AutoAWQ int4 GEMM layout
// (qweight [K, N/8] int32, qzeros [K/G, N/8] int32, scales [K/G, N] in x's dtype; nibble order
// [0, 2, 4, 6, 1, 3, 5, 7]: column 2j of a word in nibble j of its low half, 2j + 1 in nibble j of its
// high half). Compiled by hotloop/kernels/cuda_jit.py with nvcc at first use and launched through the
// CUDA driver; hotloop/kernels/w4a16_cuda.py owns the launch and its limits.
//
// Why it exists: the Triton one-row GEMV (w4a16_gemv.py) streams the packed words through shared
// memory at about half the H200's bandwidth. Here each thread loads its words straight into registers
// with 16-byte streaming loads, R rows at once, and the arithmetic is the Triton half2 kernel's:
//
// - a block has 256 threads: NL lanes along N, each lane 4 consecutive words (32 columns), and
//   TK = 256 / NL slots along K, each slot R consecutive rows (one group: R divides G). The block's
//   tile is BN = 32 NL columns by KB = TK R rows; gridDim.y splits K into K / KB slices.
// - dequantization and multiply-add two columns per instruction, in packed 16-bit arithmetic: one
//   lop3 makes (magic + q) for a column pair, one packed fma subtracts the zero point (exact), one
//   packed fma adds x (q - z) / D to a 16-bit partial sum over ROWS = 8 rows; the partial sums go to
//   float32 every ROWS rows. At the end each column is multiplied by its scale (float32) and by D.
//   bf16: magic 128 (0x4300), D = 1. fp16: magic 1024 (0x6400); the nibbles of the word's second byte
//   are masked in place (1024 + 16 q) and scaled by 1/256, the first byte's by 1/16, so D = 16 (the
//   partial sums are kept 16 times smaller, away from fp16's overflow).
// - the block's TK partial rows are summed through shared memory in a fixed order; with a split, the
//   last block of a column tile to finish (an atomic counter per tile, reset by that block) adds the
//   splits' float32 partials in split order and writes the output: one launch, and a result that
//   does not depend on timing.

#include "w4a16_common.cuh"

#define ROWS 8

// the loads a kernel issues before its griddepcontrol.wait: through ld.global.nc (the measured
// default; ptxas then issues them after the wait, first) or with LD through ld.global (before it)
template <bool LD>
__device__ __forceinline__ void ldg_w_early(const u32* p, u32& a, u32& b, u32& c, u32& d) {
  if (LD) {
    ldg_early_stream4(p, a, b, c, d);
  } else {
    ldg_stream4(p, a, b, c, d);
  }
}

template <bool LD>
__device__ __forceinline__ void ldg_early(const u32* p, u32& a, u32& b, u32& c, u32& d) {
  if (LD) {
    ldg_early4(p, a, b, c, d);
  } else {
    ldg4(p, a, b, c, d);
  }
}

template <bool BF16>
__device__ __forceinline__ u32 fma2(u32 a, u32 b, u32 c) {
  u32 d;
  if (BF16) {
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  } else {
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  }
  return d;
}

// (low, low) and (high, high) of a word of two 16-bit values (ptxas folds these into the fma operand)
__device__ __forceinline__ u32 bcast_lo(u32 v) {
  u32 d;
  asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {l, l}; }" : "=r"(d) : "r"(v));
  return d;
}

__device__ __forceinline__ u32 bcast_hi(u32 v) {
  u32 d;
  asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {h, h}; }" : "=r"(d) : "r"(v));
  return d;
}

// column pair i (columns 2i, 2i + 1) of the word v as (magic + q s_i) in both halves
template <bool BF16>
__device__ __forceinline__ u32 pair_magic(u32 v, int i) {
  if (BF16) {
    return and_or_magic<BF16>(v >> (4 * i), 0x000F000Fu);
  } else {
    const u32 t = (i >= 2) ? (v >> 8) : v;
    return and_or_magic<BF16>(t, (i & 1) ? 0x00F000F0u : 0x000F000Fu);
  }
}

// the packed factor S_i that takes (magic + q s_i) to (magic + q s_i) S_i, and its negation
template <bool BF16>
__device__ __forceinline__ u32 pair_scale(int i) {
  return BF16 ? 0x3F803F80u : ((i & 1) ? 0x1C001C00u : 0x2C002C00u);  // 1; 1/256, 1/16
}

template <bool BF16>
__device__ __forceinline__ u32 pair_neg_scale(int i) {
  return BF16 ? 0xBF80BF80u : ((i & 1) ? 0x9C009C00u : 0xAC00AC00u);
}

// SILU: x is the gate/up projection's row [gate (K) | up (K)] and the product's input is
// silu(gate) * up (the separate silu_and_mul launch folded into this one's loads of x)
template <bool BF16, int NL, int R, int THREADS, int EARLY, bool LD_EARLY, bool SILU = false>
__device__ __forceinline__ void gemv_body(const u32* __restrict__ x, const u32* __restrict__ qw,
                                          const u32* __restrict__ qz, const u32* __restrict__ sc,
                                          float* __restrict__ ws, unsigned short* __restrict__ out,
                                          int* __restrict__ cnt, int N, int K, int G) {
  constexpr int TK = THREADS / NL;
  constexpr int BN = 32 * NL;
  constexpr int PER = THREADS / BN;  // threads per column in the block's reduction
  static_assert(R % ROWS == 0, "R must be a multiple of ROWS");
  static_assert(TK >= PER, "too few slots");
  static_assert(BN <= THREADS, "a thread finishes at most one column");
  static_assert(EARLY >= 0 && EARLY <= R, "EARLY is a count of this thread's rows");
  __shared__ __align__(16) float red[TK][BN + 4];

  const int tid = threadIdx.x;
  const int lane_n = tid % NL;
  const int slot = tid / NL;
  const int n8 = N >> 3;
  const int kps = K / gridDim.y;
  const int k0 = blockIdx.y * kps + slot * R;
  const int w0 = blockIdx.x * (BN / 8) + lane_n * 4;  // this thread's first word column
  const int g = k0 / G;
  u32 w[R][4];
  u32 zv[4];
  u32 sv[4][4];

  // programmatic dependent launch: x is written by the kernel before (a no-op otherwise). With
  // EARLY > 0 the first EARLY rows of weights, the zero points and the scales are requested before
  // the wait: the kernel before does not write them, so their loads overlap its last blocks (EARLY = R:
  // all of them; the same loads, but all held across the wait, so more registers live at once). The next launch may start only after this kernel's wait (kernels/pdl.py's rule).
  if (EARLY > 0) {
#pragma unroll
    for (int r = 0; r < EARLY; ++r) {
      ldg_w_early<LD_EARLY>(qw + (size_t)(k0 + r) * n8 + w0, w[r][0], w[r][1], w[r][2], w[r][3]);
    }
    ldg_early<LD_EARLY>(qz + (size_t)g * n8 + w0, zv[0], zv[1], zv[2], zv[3]);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      ldg_early<LD_EARLY>(sc + ((size_t)g * N + (size_t)(w0 + c) * 8) / 2, sv[c][0], sv[c][1], sv[c][2], sv[c][3]);
    }
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

#pragma unroll
  for (int r = EARLY; r < R; ++r) {
    ldg_stream4(qw + (size_t)(k0 + r) * n8 + w0, w[r][0], w[r][1], w[r][2], w[r][3]);
  }
  u32 xv[R / 2];
  if (SILU) {
#pragma unroll
    for (int j = 0; j < R / 8; ++j) {
      u32 gv[4], uv[4];
      ldg4(x + (k0 + 8 * j) / 2, gv[0], gv[1], gv[2], gv[3]);
      ldg4(x + (K + k0 + 8 * j) / 2, uv[0], uv[1], uv[2], uv[3]);
#pragma unroll
      for (int c = 0; c < 4; ++c) xv[4 * j + c] = silu_mul2<BF16>(gv[c], uv[c]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < R / 8; ++j) {
      ldg4(x + (k0 + 8 * j) / 2, xv[4 * j], xv[4 * j + 1], xv[4 * j + 2], xv[4 * j + 3]);
    }
  }
  if (EARLY == 0) {
    ldg4(qz + (size_t)g * n8 + w0, zv[0], zv[1], zv[2], zv[3]);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      ldg4(sc + ((size_t)g * N + (size_t)(w0 + c) * 8) / 2, sv[c][0], sv[c][1], sv[c][2], sv[c][3]);
    }
  }

  u32 Z[4][4];  // -(magic + z s_i) S_i per word and column pair (exact)
#pragma unroll
  for (int c = 0; c < 4; ++c) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      Z[c][i] = fma2<BF16>(pair_magic<BF16>(zv[c], i), pair_neg_scale<BF16>(i), 0x80008000u);
    }
  }

  float acc[4][4][2];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc[c][i][0] = 0.0f;
      acc[c][i][1] = 0.0f;
    }
  }
#pragma unroll
  for (int r0 = 0; r0 < R; r0 += ROWS) {
    u32 p[4][4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int i = 0; i < 4; ++i) p[c][i] = 0u;
    }
#pragma unroll
    for (int r = r0; r < r0 + ROWS; ++r) {
      const u32 xx = (r & 1) ? bcast_hi(xv[r / 2]) : bcast_lo(xv[r / 2]);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const u32 d = fma2<BF16>(pair_magic<BF16>(w[r][c], i), pair_scale<BF16>(i), Z[c][i]);  // (q - z) / D
          p[c][i] = fma2<BF16>(d, xx, p[c][i]);
        }
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float lo, hi;
        halves<BF16>(p[c][i], lo, hi);
        acc[c][i][0] += lo;
        acc[c][i][1] += hi;
      }
    }
  }

  const float D = BF16 ? 1.0f : 16.0f;
  float* row = &red[slot][lane_n * 32];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float s_lo, s_hi;
      halves<BF16>(sv[c][i], s_lo, s_hi);
      v[2 * i] = acc[c][i][0] * (s_lo * D);
      v[2 * i + 1] = acc[c][i][1] * (s_hi * D);
    }
    *reinterpret_cast<float4*>(row + 8 * c) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(row + 8 * c + 4) = make_float4(v[4], v[5], v[6], v[7]);
  }
  __syncthreads();
  const int col = tid % BN;
  const int part = tid / BN;
  float s = 0.0f;
#pragma unroll 4
  for (int t = part; t < TK; t += PER) s += red[t][col];
  __syncthreads();
  red[part][col] = s;
  __syncthreads();
  float v[1] = {0.0f};
  if (tid < BN) {
#pragma unroll
    for (int q = 0; q < PER; ++q) v[0] += red[q][tid];
  }
  finish_columns<BF16, 1, THREADS, BN>(v, ws, out, cnt, N);
}

#define GEMV_ARGS                                                                                   \
  const u32 *__restrict__ x, const u32 *__restrict__ qw, const u32 *__restrict__ qz,               \
      const u32 *__restrict__ sc, float *__restrict__ ws, unsigned short *__restrict__ out,        \
      int *__restrict__ cnt, int N, int K, int G

// w4a16_cuda.kernel_name: w4a16_gemv_<dtype>_nl<NL>_r<R>, then _t<T> for T threads other than 256,
// then _e<EARLY> where EARLY > 0, then ld for the early loads through ld.global
#define DEFINE_GEMV(NAME, BF16, NL, R, T, E, LD)                                  \
  extern "C" __global__ void __launch_bounds__(T) NAME(GEMV_ARGS) {               \
    gemv_body<BF16, NL, R, T, E, LD>(x, qw, qz, sc, ws, out, cnt, N, K, G);       \
  }

#define DEFINE_BOTH(NL, R)                                                                \
  DEFINE_GEMV(w4a16_gemv_bf16_nl##NL##_r##R, true, NL, R, 256, 0, false)                  \
  DEFINE_GEMV(w4a16_gemv_f16_nl##NL##_r##R, false, NL, R, 256, 0, false)                  \
  DEFINE_GEMV(w4a16_gemv_bf16_nl##NL##_r##R##_e8, true, NL, R, 256, 8, false)             \
  DEFINE_GEMV(w4a16_gemv_f16_nl##NL##_r##R##_e8, false, NL, R, 256, 8, false)             \
  DEFINE_GEMV(w4a16_gemv_bf16_nl##NL##_r##R##_e8ld, true, NL, R, 256, 8, true)            \
  DEFINE_GEMV(w4a16_gemv_f16_nl##NL##_r##R##_e8ld, false, NL, R, 256, 8, true)

#define DEFINE_BOTH_T(NL, R, T)                                                           \
  DEFINE_GEMV(w4a16_gemv_bf16_nl##NL##_r##R##_t##T, true, NL, R, T, 0, false)             \
  DEFINE_GEMV(w4a16_gemv_f16_nl##NL##_r##R##_t##T, false, NL, R, T, 0, false)             \
  DEFINE_GEMV(w4a16_gemv_bf16_nl##NL##_r##R##_t##T##_e8, true, NL, R, T, 8, false)        \
  DEFINE_GEMV(w4a16_gemv_f16_nl##NL##_r##R##_t##T##_e8, false, NL, R, T, 8, false)        \
  DEFINE_GEMV(w4a16_gemv_bf16_nl##NL##_r##R##_t##T##_e8ld, true, NL, R, T, 8, true)       \
  DEFINE_GEMV(w4a16_gemv_f16_nl##NL##_r##R##_t##T##_e8ld, false, NL, R, T, 8, true)

// the SiLU-and-mul folded in (w4a16_cuda.gemv_silu_mul), with the default early loads: _e8ld_silu
#define DEFINE_GEMV_SILU(NAME, BF16, NL, R, T)                                    \
  extern "C" __global__ void __launch_bounds__(T) NAME(GEMV_ARGS) {               \
    gemv_body<BF16, NL, R, T, 8, true, true>(x, qw, qz, sc, ws, out, cnt, N, K, G); \
  }

#define DEFINE_SILU(NL, R)                                                        \
  DEFINE_GEMV_SILU(w4a16_gemv_bf16_nl##NL##_r##R##_e8ld_silu, true, NL, R, 256)   \
  DEFINE_GEMV_SILU(w4a16_gemv_f16_nl##NL##_r##R##_e8ld_silu, false, NL, R, 256)

#define DEFINE_SILU_T(NL, R, T)                                                           \
  DEFINE_GEMV_SILU(w4a16_gemv_bf16_nl##NL##_r##R##_t##T##_e8ld_silu, true, NL, R, T)      \
  DEFINE_GEMV_SILU(w4a16_gemv_f16_nl##NL##_r##R##_t##T##_e8ld_silu, false, NL, R, T)

// every row of the thread's weights before the wait (HOTLOOP_W4A16_EARLY=all): _e<R>ld, for R = 16 (at
// R = 8 that is _e8ld). Not for R = 32: holding 32 rows across the wait takes 255 registers (ptxas),
// one 256-thread block per SM, against 128 and two blocks with 8 rows early
#define DEFINE_ALL(NL, R)                                                                 \
  DEFINE_GEMV(w4a16_gemv_bf16_nl##NL##_r##R##_e##R##ld, true, NL, R, 256, R, true)        \
  DEFINE_GEMV(w4a16_gemv_f16_nl##NL##_r##R##_e##R##ld, false, NL, R, 256, R, true)

#define DEFINE_ALL_T(NL, R, T)                                                            \
  DEFINE_GEMV(w4a16_gemv_bf16_nl##NL##_r##R##_t##T##_e##R##ld, true, NL, R, T, R, true)   \
  DEFINE_GEMV(w4a16_gemv_f16_nl##NL##_r##R##_t##T##_e##R##ld, false, NL, R, T, R, true)

// w4a16_cuda.VARIANTS: (NL, R, threads)
DEFINE_BOTH(2, 16)
DEFINE_BOTH(4, 8)
DEFINE_BOTH(4, 16)
DEFINE_BOTH(4, 32)
DEFINE_BOTH_T(2, 16, 128)
DEFINE_BOTH_T(4, 16, 128)
DEFINE_BOTH_T(4, 32, 128)
DEFINE_ALL(2, 16)
DEFINE_ALL(4, 16)
DEFINE_ALL_T(2, 16, 128)
DEFINE_ALL_T(4, 16, 128)
DEFINE_SILU(2, 16)
DEFINE_SILU(4, 8)
DEFINE_SILU(4, 16)
DEFINE_SILU(4, 32)
DEFINE_SILU_T(2, 16, 128)
DEFINE_SILU_T(4, 16, 128)
DEFINE_SILU_T(4, 32, 128)
