// Dense 16-bit GEMM for a few rows on tensor cores, weights streamed straight into registers:
// y [M, N] = x [M, K] @ W [N, K]^T (+ bias), M <= 16, float32 accumulation. Compiled by
// hotloop/kernels/cuda_jit.py; hotloop/kernels/skinny_mma.py owns the launch, its limits and the
// choice between this kernel and cuBLAS.
//
// Why it exists: at M = 2-16 a decode step's projections read every weight once, so they are bound
// by the weight bytes, and cuBLAS reaches 52-61% of that floor on an H200 (BENCHMARKS.md). Here no
// weight goes through shared memory:
//
// - swap A and B: D [16 weight rows, 8 x rows] = W-tile [16, 16] . x^T [16, 8] with
//   mma.sync.m16n8k16 (one or two n8 tiles cover M <= 8 or <= 16);
// - a thread (lane = 4 g + t) loads 16 bytes of weight row g and 16 of row g + 8, at K offset 8 t of
//   a 32-wide K step: 8 consecutive k each. The MMA's fragment wants k pairs (2t, 2t+1) and
//   (2t+8, 2t+9), so the 32 k of the step are renumbered: the thread's words r0..r3 (row g) and
//   s0..s3 (row g + 8) feed two MMAs, {r0, s0, r1, s1} and {r2, s2, r3, s3}, and x's 16 bytes at the
//   same k feed the matching B fragments {x0, x1} and {x2, x3}. The same renumbering on both sides
//   leaves every product's terms unchanged (only the float32 summation order differs);
// - a warp owns NT tiles of 16 weight rows and a contiguous K range, U steps of loads in flight;
//   the block's WARPS warps split the block's K slice, their partials meet in shared memory in a
//   fixed order; gridDim.y splits K across blocks, and the last block of a column tile to finish (a
//   counter per tile, reset by that block) adds the splits' float32 partials in split order, adds
//   the bias, rounds once and stores: one launch, a result that does not depend on timing.

typedef unsigned int u32;
typedef unsigned short u16;

__device__ __forceinline__ void ld_stream16(const u32* p, u32 (&v)[4]) {
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "l"(p));
}

// volatile: kept after griddepcontrol.wait (x is written by the kernel before)
__device__ __forceinline__ void ld16(const u32* p, u32 (&v)[4]) {
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "l"(p));
}

template <bool BF16>
__device__ __forceinline__ void mma16816(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  if (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

template <bool BF16>
__device__ __forceinline__ float from16(u16 v) {
  if (BF16) return __uint_as_float(((u32)v) << 16);
  float f;
  asm("{ .reg .f16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "h"(v));
  return f;
}

template <bool BF16>
__device__ __forceinline__ u16 to16(float v) {
  u16 r;
  if (BF16) {
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
  } else {
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(v));
  }
  return r;
}

// MT: n8 tiles along M (1: M <= 8, 2: M <= 16); NT: 16-row weight tiles per warp; U: 32-wide K steps
// a warp has in flight; WARPS: warps per block
template <bool BF16, int MT, int NT, int U, int WARPS>
__device__ __forceinline__ void skinny_body(const u16* __restrict__ x, const u16* __restrict__ w,
                                            const u16* __restrict__ bias, float* __restrict__ ws,
                                            u16* __restrict__ out, int* __restrict__ cnt, int M, int N,
                                            int K) {
  constexpr int BN = 16 * NT;      // weight rows (output columns) per block
  constexpr int BM = 8 * MT;       // x rows covered
  constexpr int OUTS = BN * BM;    // outputs per block
  __shared__ float red[WARPS][OUTS];
  __shared__ int last;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int n0 = blockIdx.x * BN;
  const int kpb = K / gridDim.y;  // this block's K slice
  const int kpw = kpb / WARPS;    // this warp's
  const int kw0 = blockIdx.y * kpb + warp * kpw;

  float acc[NT][MT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;

  // x rows this thread feeds to the B fragments: g (and g + 8); rows past M read as zeros
  const bool has_x0 = g < M;
  const bool has_x1 = MT > 1 && g + 8 < M;
  const u32* xr0 = reinterpret_cast<const u32*>(x + (size_t)(has_x0 ? g : 0) * K + 8 * t);
  const u32* xr1 = reinterpret_cast<const u32*>(x + (size_t)(has_x1 ? g + 8 : 0) * K + 8 * t);
  const u32* wr[NT][2];
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    wr[i][0] = reinterpret_cast<const u32*>(w + (size_t)(n0 + 16 * i + g) * K + 8 * t);
    wr[i][1] = reinterpret_cast<const u32*>(w + (size_t)(n0 + 16 * i + g + 8) * K + 8 * t);
  }

  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  for (int kb = kw0; kb < kw0 + kpw; kb += 32 * U) {
    u32 a[U][NT][2][4];
    u32 b[U][MT][4];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        ld_stream16(wr[i][0] + (kb + 32 * u) / 2, a[u][i][0]);
        ld_stream16(wr[i][1] + (kb + 32 * u) / 2, a[u][i][1]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      // rows past M load row 0 (always there) and are zeroed by a select, not a branch, so the
      // weight loads above stay in flight across these
      ld16(xr0 + (kb + 32 * u) / 2, b[u][0]);
      if (MT > 1) ld16(xr1 + (kb + 32 * u) / 2, b[u][MT - 1]);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        b[u][0][c] = has_x0 ? b[u][0][c] : 0u;
        if (MT > 1) b[u][MT - 1][c] = has_x1 ? b[u][MT - 1][c] : 0u;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int i = 0; i < NT; ++i) {
#pragma unroll
        for (int j = 0; j < MT; ++j) {
          const u32* r = a[u][i][0];
          const u32* s = a[u][i][1];
          mma16816<BF16>(acc[i][j], r[0], s[0], r[1], s[1], b[u][j][0], b[u][j][1]);
          mma16816<BF16>(acc[i][j], r[2], s[2], r[3], s[3], b[u][j][2], b[u][j][3]);
        }
      }
    }
  }

  // D fragment: d0, d1 = (weight row g, x rows 2t, 2t + 1), d2, d3 = (row g + 8, the same x rows);
  // red[warp][m * BN + n] with n the block's column
#pragma unroll
  for (int i = 0; i < NT; ++i) {
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      const int m = 8 * j + 2 * t;
      const int n = 16 * i + g;
      red[warp][m * BN + n] = acc[i][j][0];
      red[warp][(m + 1) * BN + n] = acc[i][j][1];
      red[warp][m * BN + n + 8] = acc[i][j][2];
      red[warp][(m + 1) * BN + n + 8] = acc[i][j][3];
    }
  }
  __syncthreads();
  const bool split = gridDim.y > 1;
  for (int o = threadIdx.x; o < OUTS; o += WARPS * 32) {
    const int m = o / BN;
    const int n = n0 + o % BN;
    float v = 0.0f;
#pragma unroll
    for (int q = 0; q < WARPS; ++q) v += red[q][o];
    if (m < M) {
      if (!split) {
        if (bias != nullptr) v += from16<BF16>(bias[n]);
        out[(size_t)m * N + n] = to16<BF16>(v);
      } else {
        ws[((size_t)blockIdx.y * M + m) * N + n] = v;
      }
    }
  }
  if (!split) return;
  __threadfence();  // this block's partials are visible before its arrival is counted
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&cnt[blockIdx.x], 1) == (int)gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // acquire: the other blocks' partials, counted in before this block's arrival
  for (int o = threadIdx.x; o < OUTS; o += WARPS * 32) {
    const int m = o / BN;
    const int n = n0 + o % BN;
    if (m >= M) continue;
    float v = 0.0f;
    for (int sp = 0; sp < (int)gridDim.y; ++sp) v += __ldcg(&ws[((size_t)sp * M + m) * N + n]);
    if (bias != nullptr) v += from16<BF16>(bias[n]);
    out[(size_t)m * N + n] = to16<BF16>(v);
  }
  if (threadIdx.x == 0) cnt[blockIdx.x] = 0;
}

#define SKINNY_ARGS                                                                             \
  const u16 *__restrict__ x, const u16 *__restrict__ w, const u16 *__restrict__ bias,          \
      float *__restrict__ ws, u16 *__restrict__ out, int *__restrict__ cnt, int M, int N, int K

// skinny_mma.kernel_name: skinny_mma_<dtype>_m<MT>_n<NT>_u<U>_w<WARPS>
#define DEFINE_SKINNY(DT, BF16, MT, NT, U, WARPS)                                             \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                                     \
      skinny_mma_##DT##_m##MT##_n##NT##_u##U##_w##WARPS(SKINNY_ARGS) {                         \
    skinny_body<BF16, MT, NT, U, WARPS>(x, w, bias, ws, out, cnt, M, N, K);                    \
  }

#define DEFINE_BOTH(MT, NT, U, WARPS)         \
  DEFINE_SKINNY(bf16, true, MT, NT, U, WARPS) \
  DEFINE_SKINNY(f16, false, MT, NT, U, WARPS)

// skinny_mma.VARIANTS: (MT, NT, U, WARPS)
DEFINE_BOTH(1, 1, 4, 4)
DEFINE_BOTH(1, 2, 2, 4)
DEFINE_BOTH(1, 2, 4, 4)
DEFINE_BOTH(1, 1, 8, 4)
DEFINE_BOTH(2, 1, 4, 4)
DEFINE_BOTH(2, 2, 2, 4)
DEFINE_BOTH(2, 2, 4, 4)
DEFINE_BOTH(2, 1, 8, 4)
