// W4A16 GEMV for 1-8 rows on the tensor cores: y[m] = x[m] @ W, W int4 in hotloop's MMA layout
// (hotloop/kernels/w4a16_mma.py: mma_layout), zero points and scales in the AutoAWQ layout
// (qzeros [K/G, N/8] int32, scales [K/G, N] in x's dtype). Compiled by cuda_jit.py at first use.
//
// Why: the one-row GEMV of w4a16_gemv.cu spends about 21 instructions per 32-bit word of weights in
// its inner loop (unpack, zero point, a packed multiply-add per column pair, float32 sums every 8
// rows); this kernel was written to test whether fewer would make it faster (BENCHMARKS.md, sixteenth
// session: not settled). Here one mma.sync m16n8k16 does the multiply-adds
// of a 16 x 16 weight tile: W^T is the A operand (16 columns by 16 rows of K), x^T the B operand (its
// 8 columns are the activation rows: row 0 only at batch 1; the other columns' sums are not used).
//
// - The MMA layout gives each lane of a warp, per 16 x 16 tile, one 32-bit word that holds exactly its
//   A fragment: lane 4g + t, nibble i (bits 4i .. 4i + 3) and i + 4 (bits 16 + 4i ..) are the two
//   16-bit halves of A register i: register 0 = W[2t, 2t+1][g], 1 = W[2t, 2t+1][g + 8],
//   2 = W[2t+8, 2t+9][g], 3 = W[2t+8, 2t+9][g + 8] (rows of the tile, then its column). A lane's four
//   words of 4 consecutive K tiles are one 16-byte load; a warp's load is 512 contiguous bytes.
// - Unpacking: bf16: (v >> 4i) & 0x000F000F | 0x4300 (128 + q in both halves), one packed add of
//   -(128 + z): q - z exactly. fp16: magic 1024 (0x6400), nibbles 4-7 masked in place (1024 + 16 q)
//   and scaled by 1/16 in a packed fma (exact). 3 shifts (bf16) or 1 (fp16), 4 lop3, 4 packed ops and
//   one mma per word.
// - The mma sums x (q - z) over a group in float32; each group's sums are scaled by the column's
//   scale into float32 totals (exact integers in, float32 out: no 16-bit partial sums).
// - A block is 4 warps on 4 neighbouring 16-column tiles (64 columns) and one K slice (gridDim.y
//   slices). Its slice of x and of the zero points and scales is staged in shared memory first (an
//   activation load from global memory before every mma made the warps wait on L2: ncu saw 55% of
//   stalls there and the DRAM at 40%). With a split, each block writes float32 partials; the last
//   block of a column tile to arrive (a counter, reset by that block) adds them in slice order: one
//   launch, a result that does not depend on timing.
// - On the H200 (BENCHMARKS.md, sixteenth session) it is faster than w4a16_gemv.cu in isolation (the
//   four GEMMs of a Llama-3-8B layer: 54.2 against 61.6 us) but was not faster in the engine at
//   batch 1, so the engine does not use it.

typedef unsigned int u32;

#define WARPS 4
#define THREADS (32 * WARPS)

__device__ __forceinline__ void ldg_stream4(const u32* p, uint4& v) {
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
}

__device__ __forceinline__ u32 ldg_u32(const u32* p) {
  u32 v;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ unsigned short ldg_u16(const unsigned short* p) {
  unsigned short v;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

template <bool BF16>
__device__ __forceinline__ u32 lop_magic(u32 v, u32 m) {
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(v), "r"(m), "n"(BF16 ? 0x43004300u : 0x64006400u));
  return d;
}

template <bool BF16>
__device__ __forceinline__ u32 hadd2(u32 a, u32 b) {
  u32 d;
  if (BF16) {
    asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  } else {
    asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  }
  return d;
}

__device__ __forceinline__ u32 hfma2_f16(u32 a, u32 b, u32 c) {
  u32 d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// A register i of a word, as (q - z) in both halves. zg: the packed -(magic + z) of column g
// (registers 0 and 2); zh: that of column g + 8 (registers 1 and 3), which for fp16 is -(64 + z),
// its nibbles being masked in place (1024 + 16 q) and scaled by 1/16 first.
template <bool BF16>
__device__ __forceinline__ void unpack(u32 v, u32 zg, u32 zh, u32 (&a)[4]) {
  if (BF16) {
    a[0] = hadd2<true>(lop_magic<true>(v, 0x000F000Fu), zg);
    a[1] = hadd2<true>(lop_magic<true>(v >> 4, 0x000F000Fu), zh);
    a[2] = hadd2<true>(lop_magic<true>(v >> 8, 0x000F000Fu), zg);
    a[3] = hadd2<true>(lop_magic<true>(v >> 12, 0x000F000Fu), zh);
  } else {
    const u32 v8 = v >> 8;
    a[0] = hadd2<false>(lop_magic<false>(v, 0x000F000Fu), zg);                 // 1024 + q - (1024 + z)
    a[1] = hfma2_f16(lop_magic<false>(v, 0x00F000F0u), 0x2C002C00u, zh);     // (1024 + 16 q) / 16 - (64 + z)
    a[2] = hadd2<false>(lop_magic<false>(v8, 0x000F000Fu), zg);
    a[3] = hfma2_f16(lop_magic<false>(v8, 0x00F000F0u), 0x2C002C00u, zh);
  }
}

template <bool BF16>
__device__ __forceinline__ void mma(const u32 (&a)[4], u32 b0, u32 b1, float (&c)[4]) {
  if (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <bool BF16>
__device__ __forceinline__ float to_f32(unsigned short h) {
  if (BF16) return __uint_as_float(((u32)h) << 16);
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
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

// x: [M, K] 16-bit (row stride sx elements), qm: the MMA layout [N/16][K/64][32][4], out: [M, N].
// Shared memory (dynamic): the block's K slice of x in fragment order, [M][chunks][4 t][8] words (a
// lane's B words of a 64-row chunk are two 16-byte loads); the slice's zero-point words (2 per warp
// per group) and scales (64 per group).
// AHEAD: 16-byte weight loads in flight per lane, in registers, each refilled in place after its
// chunk is computed (copying it out first cost 4 moves a chunk). Tried and slower on the H200: 8 loads
// ahead, a per-lane cp.async ring of 8 or 16 chunks, a per-warp cp.async.bulk ring.
template <bool BF16, int AHEAD>
__device__ __forceinline__ void mma_body(const unsigned short* __restrict__ x, const u32* __restrict__ qm,
                                         const u32* __restrict__ qz, const unsigned short* __restrict__ sc,
                                         float* __restrict__ ws, unsigned short* __restrict__ out,
                                         int* __restrict__ cnt, int M, int N, int K, int G, int sx) {
  __shared__ int last;
  extern __shared__ __align__(16) u32 smem[];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int ct = blockIdx.x * WARPS + warp;  // this warp's 16-column tile
  const int n0 = ct * 16;
  const int kps = K / gridDim.y;             // rows of this block's slice (a multiple of G and 64)
  const int kb = blockIdx.y * kps;
  const int chunks = kps / 64;
  const int n8 = N >> 3;
  const int groups = kps / G;
  u32* xf = smem;  // [M][chunks][4 t][8]: lane t's B words of a chunk (see the staging below)
  u32* zs = xf + M * chunks * 32;                                         // [groups][2 WARPS]
  unsigned short* ss = reinterpret_cast<unsigned short*>(zs + groups * 2 * WARPS);  // [groups][64]
  const u32* src = qm + (((size_t)ct * (K / 64) + kb / 64) * 32 + lane) * 4;

  // the weights, zero points and scales do not depend on the kernel before: load them before the wait
  uint4 buf[AHEAD];
#pragma unroll
  for (int i = 0; i < AHEAD; ++i) {
    if (i < chunks) ldg_stream4(src + (size_t)i * 128, buf[i]);
  }
  const int g0 = kb / G;
  for (int e = threadIdx.x; e < groups * 2 * WARPS; e += THREADS) {
    const int gi = e / (2 * WARPS);
    zs[e] = ldg_u32(qz + (size_t)(g0 + gi) * n8 + blockIdx.x * 2 * WARPS + e % (2 * WARPS));
  }
  for (int e = threadIdx.x; e < groups * 16 * WARPS; e += THREADS) {
    const int gi = e / (16 * WARPS);
    ss[e] = ldg_u16(sc + (size_t)(g0 + gi) * N + blockIdx.x * 16 * WARPS + e % (16 * WARPS));
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");  // x is written by the kernel before
  asm volatile("griddepcontrol.launch_dependents;");
  // x word w of row m (rows k = 2w, 2w + 1 of the slice) to lane t's 8 words of its chunk: for K tile q,
  // (x[16q + 2t], x[16q + 2t + 1]) at 2q (b0) and (x[16q + 2t + 8], x[16q + 2t + 9]) at 2q + 1 (b1)
  for (int e = threadIdx.x; e < M * (kps / 2); e += THREADS) {
    const int m = e / (kps / 2);
    const int w = e - m * (kps / 2);
    const int k = 2 * w;
    const int r = k & 15;
    xf[((m * chunks + (k >> 6)) * 4 + ((r & 7) >> 1)) * 8 + 2 * ((k >> 4) & 3) + (r >> 3)] =
        ldg_u32(reinterpret_cast<const u32*>(x + (size_t)m * sx + kb) + w);
  }
  __syncthreads();

  // this lane's B column is activation row g (rows past M repeat the last: their sums are unused)
  const uint4* xk = reinterpret_cast<const uint4*>(xf + (min(g, M - 1) * chunks * 4 + t) * 8);
  const int zshift = 4 * ((g & 1) * 4 + (g >> 1));  // column g of a zero-point word (AutoAWQ order)
  float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  u32 zg = 0, zh = 0;
  float sg = 0.0f, sh = 0.0f;
  const int cpg = G / 64;  // 16-byte loads per group
  int gi = 0;              // the slice's group of the next chunk
  int left = 0;            // chunks left in the current group
  auto chunk = [&](const uint4 v) {
    if (left == 0) {  // a new group: its zero points and scales
      const float z0 = (float)((zs[gi * 2 * WARPS + 2 * warp] >> zshift) & 0xFu);
      const float z1 = (float)((zs[gi * 2 * WARPS + 2 * warp + 1] >> zshift) & 0xFu);
      sg = to_f32<BF16>(ss[gi * 16 * WARPS + warp * 16 + g]);
      sh = to_f32<BF16>(ss[gi * 16 * WARPS + warp * 16 + g + 8]);
      if (BF16) {
        // -(128 + z) in bf16 (exact), both halves
        const u32 bg = (u32)to16<true>(-(128.0f + z0));
        const u32 bh = (u32)to16<true>(-(128.0f + z1));
        zg = bg | (bg << 16);
        zh = bh | (bh << 16);
      } else {
        const u32 a0 = (u32)to16<false>(-(1024.0f + z0));  // registers 0 / 2: column g, low nibbles
        const u32 a1 = (u32)to16<false>(-(64.0f + z1));    // registers 1 / 3: column g + 8, high
        zg = a0 | (a0 << 16);
        zh = a1 | (a1 << 16);
      }
      ++gi;
      left = cpg;
    }
    const uint4 xa = xk[0];
    const uint4 xb = xk[1];
    xk += 8;  // the next chunk: 4 lanes x 8 words
    const u32 xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      u32 a[4];
      unpack<BF16>(w[q], zg, zh, a);
      mma<BF16>(a, xw[2 * q], xw[2 * q + 1], acc);
    }
    if (--left == 0) {  // the group ends: scale its sums into the totals
      tot[0] = fmaf(acc[0], sg, tot[0]);
      tot[1] = fmaf(acc[1], sg, tot[1]);
      tot[2] = fmaf(acc[2], sh, tot[2]);
      tot[3] = fmaf(acc[3], sh, tot[3]);
      acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
    }
  };
  for (int j0 = 0; j0 < chunks; j0 += AHEAD) {
#pragma unroll
    for (int i = 0; i < AHEAD; ++i) {
      const int j = j0 + i;
      if (j >= chunks) break;
      chunk(buf[i]);  // then refill the same registers (a copy first would cost 4 moves a chunk)
      if (j + AHEAD < chunks) ldg_stream4(src + (size_t)(j + AHEAD) * 128, buf[i]);
    }
  }

  // lane (g, t): tot[0..1] = y[2t, 2t + 1][n0 + g], tot[2..3] = y[2t, 2t + 1][n0 + g + 8]
  if (gridDim.y == 1) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = 2 * t + h;
      if (m < M) {
        out[(size_t)m * N + n0 + g] = to16<BF16>(tot[h]);
        out[(size_t)m * N + n0 + g + 8] = to16<BF16>(tot[2 + h]);
      }
    }
    return;
  }
  float* part = ws + (size_t)blockIdx.y * M * N;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = 2 * t + h;
    if (m < M) {
      part[(size_t)m * N + n0 + g] = tot[h];
      part[(size_t)m * N + n0 + g + 8] = tot[2 + h];
    }
  }
  __threadfence();  // this block's partials are visible before its arrival is counted
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&cnt[blockIdx.x], 1) == (int)gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // acquire: the other blocks' partials
  const int cols = WARPS * 16;
  for (int e = threadIdx.x; e < M * cols; e += THREADS) {
    const int m = e / cols;
    const int n = blockIdx.x * cols + e % cols;
    float v = 0.0f;
    for (int s = 0; s < (int)gridDim.y; ++s) v += __ldcg(&ws[((size_t)s * M + m) * N + n]);
    out[(size_t)m * N + n] = to16<BF16>(v);
  }
  if (threadIdx.x == 0) cnt[blockIdx.x] = 0;
}

#define MMA_ARGS                                                                                      \
  const unsigned short *__restrict__ x, const u32 *__restrict__ qm, const u32 *__restrict__ qz,      \
      const unsigned short *__restrict__ sc, float *__restrict__ ws, unsigned short *__restrict__ out, \
      int *__restrict__ cnt, int M, int N, int K, int G, int sx

extern "C" __global__ void __launch_bounds__(THREADS) w4a16_mma_bf16(MMA_ARGS) {
  mma_body<true, 5>(x, qm, qz, sc, ws, out, cnt, M, N, K, G, sx);
}
extern "C" __global__ void __launch_bounds__(THREADS) w4a16_mma_f16(MMA_ARGS) {
  mma_body<false, 5>(x, qm, qz, sc, ws, out, cnt, M, N, K, G, sx);
}
