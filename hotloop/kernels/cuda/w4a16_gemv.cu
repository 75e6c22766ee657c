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
// - the block's TK partial rows are summed through shared memory in slot order; with a split, the
//   last block of a column tile to finish (an atomic counter per tile, reset by that block) adds the
//   splits' float32 partials in split order and writes the output: one launch, and a result that
//   does not depend on timing.
// - the decoder's neighbours ride along (the one-row W4A16 layer, models/llama.py), with the
//   unfused layer's roundings (kernels/reference.py): a prologue PRO makes the row from the input,
//   1: RMSNorm (each block sums the squares of the whole row itself, its weight loads already in
//   flight), 2: SiLU-and-mul of a [gate | up] input of 2K values; the epilogue adds a bias and a
//   residual row (each rounded to 16 bits, as the separate adds are).

typedef unsigned int u32;

#define THREADS 256
#define ROWS 8

__device__ __forceinline__ void ldg_stream4(const u32* p, u32& a, u32& b, u32& c, u32& d) {
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
      : "l"(p));
}

__device__ __forceinline__ void ldg4(const u32* p, u32& a, u32& b, u32& c, u32& d) {
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p));
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
// compiler emits an AND and an OR)
template <bool BF16>
__device__ __forceinline__ u32 and_or_magic(u32 v, u32 m) {
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(v), "r"(m), "n"(BF16 ? 0x43004300u : 0x64006400u));
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

__device__ __forceinline__ float to_f32(unsigned short h, bool bf16) {
  if (bf16) return __uint_as_float(((u32)h) << 16);
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

// float32 rounded to the 16-bit type and back (the rounding a 16-bit tensor op does)
template <bool BF16>
__device__ __forceinline__ float round16(float v) {
  return to_f32(to16<BF16>(v), BF16);
}

// the block's sum of v over its threads (every thread gets it)
__device__ __forceinline__ float block_sum(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float t = 0.0f;
#pragma unroll
  for (int w = 0; w < THREADS / 32; ++w) t += scratch[w];
  return t;
}

// the 16-bit values of rows [k, k + R) of a row, R / 2 words (k a multiple of 8)
template <int R>
__device__ __forceinline__ void load_rows(const unsigned short* __restrict__ in, int k, u32 (&v)[R / 2]) {
  const u32* p = reinterpret_cast<const u32*>(in) + k / 2;
#pragma unroll
  for (int j = 0; j < R / 8; ++j) ldg4(p + 4 * j, v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
}

// 1 / rms of the whole row (every thread gets it): the RMSNorm prologue's row pass
template <bool BF16>
__device__ __forceinline__ float row_rstd(const unsigned short* __restrict__ in, int K, float eps, float* scratch) {
  float ss = 0.0f;
  const u32* words = reinterpret_cast<const u32*>(in);
  for (int i = threadIdx.x * 4; i < K / 2; i += THREADS * 4) {
    u32 q[4];
    ldg4(words + i, q[0], q[1], q[2], q[3]);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float lo, hi;
      halves<BF16>(q[e], lo, hi);
      ss += lo * lo + hi * hi;
    }
  }
  return rsqrtf(block_sum(ss, scratch) / (float)K + eps);
}

// 1 / rms of the whole row from the producer's per-tile sums of squares (nparts a multiple of 4).
// Each thread adds them all itself, in order: the same value in every thread, without a barrier.
__device__ __forceinline__ float parts_rstd(const float* __restrict__ parts, int nparts, int K, float eps) {
  float s = 0.0f;
  for (int i = 0; i < nparts; i += 4) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(parts + i));
    s += v.x;
    s += v.y;
    s += v.z;
    s += v.w;
  }
  return rsqrtf(s / (float)K + eps);
}

// one word (two rows) of the normed row: round16(w * round16(x * rstd)), as reference.rms_norm
template <bool BF16>
__device__ __forceinline__ u32 norm_word(u32 v, u32 e, float rstd) {
  float a0, a1, b0, b1;
  halves<BF16>(v, a0, a1);
  halves<BF16>(e, b0, b1);
  return (u32)to16<BF16>(b0 * round16<BF16>(a0 * rstd)) | ((u32)to16<BF16>(b1 * round16<BF16>(a1 * rstd)) << 16);
}

// output column n: round16(y), then + bias, then + residual, each rounded to 16 bits
template <bool BF16>
__device__ __forceinline__ float epilogue(float y, int n, const unsigned short* __restrict__ bias,
                                          const unsigned short* __restrict__ residual) {
  float v = round16<BF16>(y);
  if (bias != nullptr) v = round16<BF16>(v + to_f32(bias[n], BF16));
  if (residual != nullptr) v = round16<BF16>(v + to_f32(residual[n], BF16));
  return v;
}

// round16(round16(silu(g)) * u) of the rounded gate and up outputs, as reference.silu_and_mul
template <bool BF16>
__device__ __forceinline__ float silu_mul(float g, float u) {
  return round16<BF16>(round16<BF16>(__fdividef(g, 1.0f + __expf(-g))) * u);
}

// PRO: 0 the row as given, 1 RMSNorm with a row pass, 2 RMSNorm from the producer's sums of squares.
// SILU: the weight is [gate | up] (N columns); a block takes BN / 2 columns of each half and writes
// N / 2 outputs silu(gate) * up. ss_out (nullable): this launch's output sums of squares per
// column tile, for the next launch's PRO 2.
template <bool BF16, int NL, int R, int PRO, bool SILU>
__device__ __forceinline__ void gemv_body(const unsigned short* __restrict__ x, const u32* __restrict__ qw,
                                          const u32* __restrict__ qz, const u32* __restrict__ sc,
                                          float* __restrict__ ws, unsigned short* __restrict__ out,
                                          int* __restrict__ cnt, int N, int K, int G,
                                          const unsigned short* __restrict__ nw, float eps,
                                          const unsigned short* __restrict__ bias,
                                          const unsigned short* __restrict__ residual,
                                          const float* __restrict__ ss_in, int ss_parts, float* __restrict__ ss_out) {
  constexpr int TK = THREADS / NL;
  constexpr int BN = 32 * NL;
  constexpr int PER = THREADS / BN;  // threads per column in the block's reduction
  static_assert(R % ROWS == 0, "R must be a multiple of ROWS");
  static_assert(TK >= PER, "too few slots");
  static_assert(!SILU || NL >= 2, "SILU pairs lanes");
  __shared__ __align__(16) float red[TK][BN + 4];
  __shared__ float scratch[THREADS / 32];
  __shared__ int last;

  const int tid = threadIdx.x;
  const int lane_n = tid % NL;
  const int slot = tid / NL;
  const int n8 = N >> 3;
  const int kps = K / gridDim.y;
  const int k0 = blockIdx.y * kps + slot * R;
  // this thread's first word column (SILU: the first half of the lanes on gate columns, the second
  // on the same up columns)
  const int w0 = SILU ? (lane_n / (NL / 2)) * (n8 / 2) + blockIdx.x * (BN / 16) + (lane_n % (NL / 2)) * 4
                      : blockIdx.x * (BN / 8) + lane_n * 4;
  // the weight column of reduction column c of this block
  auto column = [&](int c) {
    return SILU ? (c / (BN / 2)) * (N / 2) + blockIdx.x * (BN / 2) + c % (BN / 2) : blockIdx.x * BN + c;
  };

  // programmatic dependent launch: the input row, the residual and the sums of squares come from
  // the kernel before (a no-op where the launch is not programmatic). Waiting before the weight
  // loads, not after: with the wait (a compiler barrier) after them every load is issued before any
  // arithmetic, which needs R x 4 registers at once and was slower.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  // the row pass's barrier comes before the weight loads: they cannot cross it, and all R rows in
  // flight at once take too many registers
  float rstd = 1.0f;
  if (PRO == 1) rstd = row_rstd<BF16>(x, K, eps, scratch);
  if (PRO == 2) rstd = parts_rstd(ss_in, ss_parts, K, eps);  // (after the loads: 2x the registers)
  u32 w[R][4];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    ldg_stream4(qw + (size_t)(k0 + r) * n8 + w0, w[r][0], w[r][1], w[r][2], w[r][3]);
  }
  const int g = k0 / G;
  u32 zv[4];
  ldg4(qz + (size_t)g * n8 + w0, zv[0], zv[1], zv[2], zv[3]);
  u32 sv[4][4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    ldg4(sc + ((size_t)g * N + (size_t)(w0 + c) * 8) / 2, sv[c][0], sv[c][1], sv[c][2], sv[c][3]);
  }
  u32 xv[R / 2];
  load_rows<R>(x, k0, xv);
  u32 ev[PRO == 0 ? 1 : R / 2];  // the norm weight's words
  if (PRO != 0) load_rows<R>(nw, k0, reinterpret_cast<u32(&)[R / 2]>(ev));

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
    if (PRO != 0) {  // this chunk's words of the normed row, made as they are needed (few registers)
#pragma unroll
      for (int j = r0 / 2; j < (r0 + ROWS) / 2; ++j) xv[j] = norm_word<BF16>(xv[j], ev[PRO == 0 ? 0 : j], rstd);
    }
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
  const int ncol = column(tid % BN);  // (threads past BN compute an unused column)
  float total = 0.0f;
  if (tid < BN) {
#pragma unroll
    for (int q = 0; q < PER; ++q) total += red[q][tid];
  }
  if (gridDim.y > 1) {
    if (tid < BN) ws[(size_t)blockIdx.y * N + ncol] = total;
    __threadfence();  // this block's partials are visible before its arrival is counted
    __syncthreads();
    if (tid == 0) last = atomicAdd(&cnt[blockIdx.x], 1) == (int)gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    if (tid < BN) {
      total = 0.0f;
      for (int sp = 0; sp < (int)gridDim.y; ++sp) total += __ldcg(&ws[(size_t)sp * N + ncol]);
    }
    if (tid == 0) cnt[blockIdx.x] = 0;
  }
  // the finishing block: the epilogue, and this tile's sum of squares of what it writes
  float sq = 0.0f;
  if (SILU) {
    __syncthreads();  // red is free again
    if (tid < BN) red[0][tid] = epilogue<BF16>(total, ncol, bias, nullptr);
    __syncthreads();
    if (tid < BN / 2) {
      const int n = blockIdx.x * (BN / 2) + tid;
      const float v = silu_mul<BF16>(red[0][tid], red[0][tid + BN / 2]);
      out[n] = to16<BF16>(v);
      sq = v * v;
    }
  } else if (tid < BN) {
    const float v = epilogue<BF16>(total, ncol, bias, residual);
    out[ncol] = to16<BF16>(v);
    sq = v * v;
  }
  if (ss_out != nullptr) {
    const float t = block_sum(sq, scratch);
    if (tid == 0) ss_out[blockIdx.x] = t;
  }
}

#define GEMV_ARGS                                                                                   \
  const unsigned short *__restrict__ x, const u32 *__restrict__ qw, const u32 *__restrict__ qz,    \
      const u32 *__restrict__ sc, float *__restrict__ ws, unsigned short *__restrict__ out,        \
      int *__restrict__ cnt, int N, int K, int G, const unsigned short *__restrict__ nw, float eps,  \
      const unsigned short *__restrict__ bias, const unsigned short *__restrict__ residual,         \
      const float *__restrict__ ss_in, int ss_parts, float *__restrict__ ss_out

#define DEFINE_GEMV(DT, BF16, NL, R, PRO, SILU)                                                     \
  extern "C" __global__ void __launch_bounds__(THREADS)                                            \
      w4a16_gemv_##DT##_nl##NL##_r##R##_p##PRO##_s##SILU(GEMV_ARGS) {                              \
    gemv_body<BF16, NL, R, PRO, SILU>(x, qw, qz, sc, ws, out, cnt, N, K, G, nw, eps, bias, residual, \
                                      ss_in, ss_parts, ss_out);                                     \
  }

#define DEFINE_DTYPE(DT, BF16, NL, R)  \
  DEFINE_GEMV(DT, BF16, NL, R, 0, 0) \
  DEFINE_GEMV(DT, BF16, NL, R, 1, 0) \
  DEFINE_GEMV(DT, BF16, NL, R, 2, 0) \
  DEFINE_GEMV(DT, BF16, NL, R, 2, 1)

#define DEFINE_ALL(NL, R)            \
  DEFINE_DTYPE(bf16, true, NL, R)  \
  DEFINE_DTYPE(f16, false, NL, R)

// w4a16_cuda.VARIANTS: (NL, R), each with (prologue, SiLU epilogue) in w4a16_cuda.FORMS
DEFINE_ALL(2, 16)
DEFINE_ALL(4, 8)
DEFINE_ALL(4, 16)
DEFINE_ALL(4, 32)
