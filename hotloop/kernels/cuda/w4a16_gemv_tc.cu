// W4A16 one-row GEMV on the tensor cores, reading the AutoAWQ layout as it is: y = x @ W for one row
// of 16-bit x (qweight [K, N/8] int32, qzeros [K/G, N/8] int32, scales [K/G, N] in x's dtype; nibble
// order [0, 2, 4, 6, 1, 3, 5, 7], so (word >> 4i) & 0x000F000F holds columns 2i and 2i + 1 of the
// word's eight). Compiled by hotloop/kernels/cuda_jit.py at first use; hotloop/kernels/w4a16_gemv_tc.py
// owns the launch and its limits.
//
// Why: the CUDA-core GEMV (w4a16_gemv.cu) spends 22-26 SASS instructions per 32-bit word of weights
// (extract, subtract the zero point, multiply-add, 16-bit partial sums flushed to float32, the
// block's reduction), and at the issue rate it reaches that caps it near 2 TB/s whatever the GPU's
// bandwidth. Here the multiply-adds and the float32 sums go to one mma.sync per word, with no
// repacked weight copy:
//
// - An AutoAWQ word is, unchanged, one lane's A fragment of an m16n8k16 MMA. Lane (g, t) = (lane / 4,
//   lane % 4) holds four 32-bit registers, register r = (magic + q) of column pair r of its word:
//   a0 = pair 0 (A row g, k' = 2t, 2t + 1), a1 = pair 1 (row g + 8), a2 = pair 2 (row g, k' = 2t + 8,
//   2t + 9), a3 = pair 3 (row g + 8). magic + q is one lop3 (bf16: 0x4300 | q = 128 + q; fp16:
//   0x6400 | q = 1024 + q), exact, and its product with x is exact in float32.
// - The MMA's k' is not K here: the B operand routes each (k', half) to its own output column. B[k'][n]
//   = x[row of lane t'] if n == sel(k') else 0, with k' = 2t' + h + 8e and sel = 4 (t' % 2) + 2e + h.
//   Then D[m][n] sums, over the lanes t' in {n / 4, n / 4 + 2}, one weight column times x of that
//   lane's row: every one of the 128 outputs of an MMA is a real column (no padded batch rows). Lane
//   (g, t)'s accumulators c0..c3 are columns 8 w + 4 (t % 2) + 0..3 of its own word w, summed over
//   the rows of lanes t / 2 and t / 2 + 2. B is two prmt per row, shared by the lane's words.
// - Per lane: 3 shifts (bf16) or 1 (fp16), 4 lop3 and one mma per word, two prmt per row.
// - Zero points, the magic and the scales are applied once per group and column, in float32, in the
//   block's reduction: y = sum_g s (A_g - (magic + z) X_g), A_g the MMA sums over the group's rows,
//   X_g the sum of x over them (fp16: pairs 1 and 3 are masked in place, 1024 + 16 q, so their
//   columns are divided by 16 there).
// - A warp covers CT = 64 WPL columns (lane g: WPL consecutive words, one 4 WPL-byte load per row)
//   by RK = 4 IT rows (lane t: IT consecutive rows); a block is WARPS warps stacked along K. Every
//   weight load of a lane is issued first, before the wait for the kernel before (the weights are not
//   written by it; through ld.global: ptxas would move the wait above ld.global.nc loads), then x (IT
//   consecutive values of a lane, vector loads).
// - The block's partial columns are summed in shared memory in a fixed order; with a K split, the
//   last block of a column tile to finish (an atomic counter per tile, reset by that block) adds the
//   splits' float32 partials in split order: one launch, a result that does not depend on timing.
//
// Measured on an H100 (BENCHMARKS.md, thirty-third session), with its weight loads then still after
// the wait (below): a layer's four GEMVs in a graph 61.1-66.0 us against the CUDA-core GEMV's
// 60.7-62.8 in the same calls; W4A16 batch 1 382.5 against 390.0 and 384.5 / 385.6 against 381.3 /
// 381.3 tokens/s. Hence opt-in (HOTLOOP_W4A16_TC=1). Tried and dropped: the L2 256-byte fetch hint on
// the weight loads, capping the blocks per multiprocessor, and clusters of 2-8 blocks along K adding
// their partials through distributed shared memory (slower on every shape); a pipelined form (each warp walking whole groups of K with
// 2-4 chunks of weights in flight in registers, commit 2239f65): 7% faster than the CUDA-core GEMV in
// a chain of a layer's four GEMVs, slower alone, and 1.3% slower in the engine at batch 1 when the
// tuner timed chains (commit ae2ef67). Fewer instructions per word did not make it faster: what holds
// both GEMVs near 2 TB/s is not their arithmetic (Nsight Compute: 61% of DRAM bandwidth, 0.28-0.38
// warp instructions issued per scheduler and cycle, about 15 of 64 warps resident per SM).

#include "w4a16_common.cuh"

// the weight loads, all issued before griddepcontrol.wait: through the coherent path, since ptxas
// (CUDA 13.0) moves the wait above any ld.global.nc before it
template <int WPL>
__device__ __forceinline__ void ldg_w(const u32* p, u32* w) {
  if (WPL == 4) {
    ldg_early_stream4(p, w[0], w[1], w[2], w[3]);
  } else if (WPL == 2) {
    asm volatile("ld.global.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
  } else {
    asm volatile("ld.global.L1::no_allocate.u32 %0, [%1];" : "=r"(w[0]) : "l"(p));
  }
}

// after griddepcontrol.wait (x is written by the kernel before); four words: ldg4
__device__ __forceinline__ void ldg_x2(const u32* p, u32* v) {
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v[0]), "=r"(v[1]) : "l"(p));
}

__device__ __forceinline__ u32 prmt(u32 a, u32 sel) {
  u32 d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(0u), "r"(sel));
  return d;
}

template <bool BF16>
__device__ __forceinline__ void mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  if (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// the 16-bit float at the low (h = 0) or high half of v, as float32
template <bool BF16>
__device__ __forceinline__ float half_at(u32 v, int h) {
  if (BF16) {
    return __uint_as_float(h ? (v & 0xFFFF0000u) : (v << 16));
  } else {
    float f;
    const unsigned short s = (unsigned short)(h ? (v >> 16) : (v & 0xFFFFu));
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s));
    return f;
  }
}

template <bool BF16, int WPL, int IT, int WARPS>
__device__ __forceinline__ void gemv_tc_body(const u32* __restrict__ x, const u32* __restrict__ qw,
                                             const u32* __restrict__ qz, const unsigned short* __restrict__ sc,
                                             float* __restrict__ ws, unsigned short* __restrict__ out,
                                             int* __restrict__ cnt, int N, int K, int G) {
  constexpr int CT = 64 * WPL;     // columns per block
  constexpr int RK = 4 * IT;       // rows per warp
  constexpr int BK = WARPS * RK;   // rows per block
  constexpr int T = 32 * WARPS;
  static_assert(IT % 4 == 0 && IT <= 32, "IT: 4, 8, ... 32 rows per lane");
  static_assert(CT % T == 0 || T % CT == 0, "threads and columns");
  __shared__ __align__(16) float red[WARPS][2][CT];
  __shared__ float xs[WARPS];

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int n8 = N >> 3;
  const int kb = blockIdx.y * BK;
  const int r0 = kb + warp * RK + t * IT;        // this lane's first row
  const int w0 = blockIdx.x * (CT / 8) + g * WPL;  // this lane's first word column

  u32 w[IT][WPL];
#pragma unroll
  for (int i = 0; i < IT; ++i) ldg_w<WPL>(qw + (size_t)(r0 + i) * n8 + w0, w[i]);

  // programmatic dependent launch: x is written by the kernel before (a no-op otherwise); the next
  // launch may start only after this kernel's wait (kernels/pdl.py's rule)
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  u32 xv[IT / 2];
#pragma unroll
  for (int j = 0; j < IT / 8; ++j) ldg4(x + (r0 + 8 * j) / 2, xv[4 * j], xv[4 * j + 1], xv[4 * j + 2], xv[4 * j + 3]);
  if (IT % 8) ldg_x2(x + (r0 + IT - 4) / 2, xv + IT / 2 - 2);

  // B registers: lane (g, t) holds B[2t + h + 8e][g]; nonzero (= x of its row) where g == 4 (t % 2) + 2e + h.
  // prmt selectors (byte 4 of the pair {x, 0} is zero): x's low half is bytes 0-1, high half 2-3
  const int base = 4 * (t & 1);
  u32 sel0[2], sel1[2];
#pragma unroll
  for (int hx = 0; hx < 2; ++hx) {
    const u32 on = hx ? 0x32u : 0x10u;  // the row's two bytes
    const u32 off = 0x44u;
    sel0[hx] = (g == base ? on : off) | ((g == base + 1 ? on : off) << 8);
    sel1[hx] = (g == base + 2 ? on : off) | ((g == base + 3 ? on : off) << 8);
  }

  float acc[WPL][4];
#pragma unroll
  for (int j = 0; j < WPL; ++j) {
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[j][c] = 0.0f;
  }
  const u32 lo4 = 0x000F000Fu;
  const u32 hi4 = 0x00F000F0u;
#pragma unroll
  for (int i = 0; i < IT; ++i) {
    const u32 xp = xv[i / 2];
    const u32 b0 = prmt(xp, sel0[i & 1]);
    const u32 b1 = prmt(xp, sel1[i & 1]);
#pragma unroll
    for (int j = 0; j < WPL; ++j) {
      const u32 v = w[i][j];
      u32 a0, a1, a2, a3;
      if (BF16) {
        a0 = and_or_magic<true>(v, lo4);
        a1 = and_or_magic<true>(v >> 4, lo4);
        a2 = and_or_magic<true>(v >> 8, lo4);
        a3 = and_or_magic<true>(v >> 12, lo4);
      } else {  // pairs 1 and 3 in place: 1024 + 16 q
        const u32 v8 = v >> 8;
        a0 = and_or_magic<false>(v, lo4);
        a1 = and_or_magic<false>(v, hi4);
        a2 = and_or_magic<false>(v8, lo4);
        a3 = and_or_magic<false>(v8, hi4);
      }
      mma<BF16>(acc[j], a0, a1, a2, a3, b0, b1);
    }
  }

  // the warp's sum of x (lanes of one t share rows: g == 0 lanes add theirs up)
  float sx = 0.0f;
#pragma unroll
  for (int i = 0; i < IT; ++i) sx += half_at<BF16>(xv[i / 2], i & 1);
  sx += __shfl_xor_sync(0xFFFFFFFFu, sx, 1);
  sx += __shfl_xor_sync(0xFFFFFFFFu, sx, 2);
  if (lane == 0) xs[warp] = sx;
  // lane (g, t), word j: columns 8 (g WPL + j) + 4 (t % 2) + 0..3 of the block's tile, row subset t / 2
#pragma unroll
  for (int j = 0; j < WPL; ++j) {
    *reinterpret_cast<float4*>(&red[warp][t >> 1][8 * (g * WPL + j) + 4 * (t & 1)]) =
        make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
  }
  __syncthreads();

  // the block's reduction: thread -> column(s); zero point, magic and scale per group, in float32
  const float magic = BF16 ? 128.0f : 1024.0f;
  float part[(CT + T - 1) / T];
#pragma unroll
  for (int q = 0; q < (CT + T - 1) / T; ++q) {
    const int c = tid + q * T;
    part[q] = 0.0f;
    if (CT % T == 0 || c < CT) {
      const int n = blockIdx.x * CT + c;
      const int cw = c & 7;                       // column within its word
      const int slot = (cw & 1) * 4 + (cw >> 1);  // its nibble (AutoAWQ order)
      // fp16: pairs 1 and 3 (columns 2, 3, 6, 7 of a word) were masked in place, 16 times q
      const float inv = (!BF16 && (cw & 2)) ? 0.0625f : 1.0f;
      // warps per group: a power of two (w4a16_gemv_tc.fits); a block within one group, or whole groups
      const int wpg = G / RK;
      const int grp = kb / G;
      const u32* zp = qz + (size_t)grp * n8 + (n >> 3);
      const unsigned short* sp = sc + (size_t)grp * N + n;
      float v = 0.0f, a = 0.0f, xsum = 0.0f;
#pragma unroll
      for (int wi = 0; wi < WARPS; ++wi) {
        a += red[wi][0][c] + red[wi][1][c];
        xsum += xs[wi];
        if (wi == WARPS - 1 || ((wi + 1) & (wpg - 1)) == 0) {
          const float z = (float)((__ldg(zp) >> (4 * slot)) & 0xF);
          const float s = half_at<BF16>((u32)__ldg(sp), 0);
          v += s * ((a - magic * xsum) * inv - z * xsum);
          a = 0.0f;
          xsum = 0.0f;
          zp += n8;
          sp += N;
        }
      }
      part[q] = v;
    }
  }

  finish_columns<BF16, (CT + T - 1) / T, T, CT>(part, ws, out, cnt, N);
}

#define GEMV_TC_ARGS                                                                                \
  const u32 *__restrict__ x, const u32 *__restrict__ qw, const u32 *__restrict__ qz,               \
      const unsigned short *__restrict__ sc, float *__restrict__ ws, unsigned short *__restrict__ out, \
      int *__restrict__ cnt, int N, int K, int G

// w4a16_gemv_tc.kernel_name: w4a16_gemv_tc_<dtype>_w<WPL>_i<IT>_n<WARPS>
#define DEFINE_TC(NAME, BF16, WPL, IT, WARPS)                                    \
  extern "C" __global__ void __launch_bounds__(32 * WARPS) NAME(GEMV_TC_ARGS) {  \
    gemv_tc_body<BF16, WPL, IT, WARPS>(x, qw, qz, sc, ws, out, cnt, N, K, G);    \
  }

#define DEFINE_TC_BOTH(WPL, IT, WARPS)                                                \
  DEFINE_TC(w4a16_gemv_tc_bf16_w##WPL##_i##IT##_n##WARPS, true, WPL, IT, WARPS)      \
  DEFINE_TC(w4a16_gemv_tc_f16_w##WPL##_i##IT##_n##WARPS, false, WPL, IT, WARPS)

// w4a16_gemv_tc.VARIANTS: (WPL, IT, WARPS)
DEFINE_TC_BOTH(4, 8, 8)
DEFINE_TC_BOTH(4, 16, 4)
DEFINE_TC_BOTH(4, 16, 8)
DEFINE_TC_BOTH(2, 16, 8)
DEFINE_TC_BOTH(2, 32, 4)
