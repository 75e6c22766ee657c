// One row of bf16 x times an int4 weight stored in the CUTLASS W4A16 GEMM's layout (kernels/w4a16_cutlass.py,
// HOTLOOP_W4A16_KERNEL=cutlass), on the tensor cores: batch-1 decode without AutoAWQ's layout.
//
// The layout. W is [N, K], int4 two's complement (q - 8), cut into 16 x 16 atoms of 128 bytes; atom (an, ak)
// (rows 16 an.., k 16 ak..) starts at byte (an + ak N / 16) 128, so the atoms of a column of K are N / 16 apart
// and neighbours along N are adjacent. Word t (0..31) of an atom is exactly lane t's A fragment of an
// `mma.m16n8k16` (g = t / 4, c = t % 4): nibble p holds row g + 8 (p & 1), k = 2c + (p >> 2) + 8 ((p >> 1) & 1);
// so nibbles (0, 4), (1, 5), (2, 6), (3, 7) are the fragment's four bf16 pairs, each taken out by one shift and
// one lop3: (v & 0x000F000F) ^ 0x43084308 is the pair 128 + q, exact in bf16, with q = nibble ^ 8 = AutoAWQ's
// unsigned value.
//
// The product. B is x: every one of the MMA's 8 columns gets the same x, so every column of D holds the row
// sums (d0 row g, d2 row g + 8). Per group of 128 k, D = sum (128 + q) x over the group's 8 atoms (float32
// accumulate), and W = (q - 8) s + zero gives y += s D + (zero - 136 s) sum(x): one FMA pair a row and group.
//
// The work. A warp takes 64 rows (4 atoms along N: a warp's loads of one k atom are 512 contiguous bytes) and
// G groups of K; a block of W warps takes W G groups of the same 64 rows and adds its warps' sums; blocks along
// y split K, their float32 partials added by the last block of the 64 rows to finish (w4a16_common.cuh).
// Each variant also comes with PDL early weight loads and / or the SiLU-and-mul folded in (below).
#include "w4a16_common.cuh"

// weights: streamed past L1; with PDL through the coherent path, which ptxas leaves before
// griddepcontrol.wait (it moves .nc loads after it: w4a16_common.cuh)
template <bool PDL>
__device__ __forceinline__ u32 ldg_weight(const u32* p) {
  u32 v;
  if (PDL) {
    asm volatile("ld.global.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  } else {
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  }
  return v;
}

// x (written by the kernel before): with PDL through the coherent path, in asm volatile, so that neither
// the compiler nor ptxas (which moves ld.global.nc above griddepcontrol.wait) reads it before the wait
template <bool PDL>
__device__ __forceinline__ u32 ldg_x(const u32* p) {
  if (!PDL) return *p;
  u32 v;
  asm volatile("ld.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// x's 16-bit pair at word i: x itself, or with SILU silu(gate) * up from the row [gate (K) | up (K)]
template <bool PDL, bool SILU>
__device__ __forceinline__ u32 x_pair(const u32* x, int i, int K) {
  if (SILU) return silu_mul2<true>(ldg_x<PDL>(x + i), ldg_x<PDL>(x + (K >> 1) + i));
  return ldg_x<PDL>(x + i);
}

// (v & 0x000F000F) ^ 0x43084308: a bf16 pair 128 + q, q = nibble ^ 8 (lop3 LUT (a & b) ^ c = 0x6A)
__device__ __forceinline__ u32 pair(u32 v, u32 mask) {
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(d) : "r"(v), "r"(mask), "n"(0x43084308u));
  return d;
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float bf16_lo(u32 v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(u32 v) { return __uint_as_float(v & 0xFFFF0000u); }
__device__ __forceinline__ float bf16_at(const unsigned short* p) { return __uint_as_float(((u32)*p) << 16); }

// PDL: the first group's weights are requested before griddepcontrol.wait (the kernel before writes x,
// the output and the split buffers, never the weights), so their latency overlaps that kernel's tail;
// x is read after the wait (ldg_x), and the kernel after may launch once this one has passed it.
// SILU: x is the gate/up projection's row and the product's input silu(gate) * up, rounded as
// kernels/silu_and_mul.py rounds (the separate launch folded into the loads of x).
template <int G, int W, bool PDL, bool SILU>
__device__ __forceinline__ void gemv(const u32* __restrict__ x, const u32* __restrict__ w,
                                     const unsigned short* __restrict__ scales,
                                     const unsigned short* __restrict__ zeros, float* __restrict__ ws,
                                     unsigned short* __restrict__ out, int* __restrict__ cnt, int N, int K) {
  __shared__ float red[W][64];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int strip = blockIdx.x;  // rows 64 strip ..
  const int atoms_n = N >> 4;
  const u32 mask = 0x000F000Fu;
  float y0[4] = {0.f, 0.f, 0.f, 0.f}, y1[4] = {0.f, 0.f, 0.f, 0.f};
  for (int gi = 0; gi < G; ++gi) {
    const int grp = (blockIdx.y * W + warp) * G + gi;
    u32 wv[4][8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const size_t atom_k = (size_t)(grp * 8 + j) * atoms_n;
#pragma unroll
      for (int a = 0; a < 4; ++a) wv[a][j] = ldg_weight<PDL>(w + ((atom_k + strip * 4 + a) << 5) + lane);
    }
    if (PDL && gi == 0) {
      asm volatile("griddepcontrol.wait;" ::: "memory");
      asm volatile("griddepcontrol.launch_dependents;");
    }
    u32 xb0[8], xb1[8];
    float xs = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int kb = (grp * 8 + j) * 16;
      xb0[j] = x_pair<PDL, SILU>(x, (kb + 2 * c) >> 1, K);
      xb1[j] = x_pair<PDL, SILU>(x, (kb + 2 * c + 8) >> 1, K);
      xs += bf16_lo(xb0[j]) + bf16_hi(xb0[j]) + bf16_lo(xb1[j]) + bf16_hi(xb1[j]);
    }
    xs += __shfl_xor_sync(0xFFFFFFFFu, xs, 1);
    xs += __shfl_xor_sync(0xFFFFFFFFu, xs, 2);  // the group's sum of x, in every lane
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const int r0 = strip * 64 + a * 16 + g;
      const size_t at = (size_t)grp * N + r0;
      const float s0 = bf16_at(scales + at), s1 = bf16_at(scales + at + 8);
      const float z0 = bf16_at(zeros + at), z1 = bf16_at(zeros + at + 8);
      float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const u32 v = wv[a][j];
        mma_bf16(d, pair(v, mask), pair(v >> 4, mask), pair(v >> 8, mask), pair(v >> 12, mask), xb0[j], xb1[j]);
      }
      y0[a] += s0 * d[0] + (z0 - 136.f * s0) * xs;
      y1[a] += s1 * d[2] + (z1 - 136.f * s1) * xs;
    }
  }
  if (c == 0) {
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      red[warp][a * 16 + g] = y0[a];
      red[warp][a * 16 + g + 8] = y1[a];
    }
  }
  __syncthreads();
  float part[1] = {0.f};
  if (threadIdx.x < 64) {
#pragma unroll
    for (int i = 0; i < W; ++i) part[0] += red[i][threadIdx.x];
  }
  finish_columns<true, 1, W * 32, 64>(part, ws, out, cnt, N);
}

#define W4C_GEMV_ONE(NAME, G, W, PDL, SILU)                                                                    \
  extern "C" __global__ void __launch_bounds__(W * 32)                                                         \
      NAME(const u32* __restrict__ x, const u32* __restrict__ w, const unsigned short* __restrict__ scales,    \
           const unsigned short* __restrict__ zeros, float* __restrict__ ws, unsigned short* __restrict__ out, \
           int* __restrict__ cnt, int N, int K) {                                                              \
    gemv<G, W, PDL, SILU>(x, w, scales, zeros, ws, out, cnt, N, K);                                            \
  }
#define W4C_GEMV(G, W)                                                \
  W4C_GEMV_ONE(w4c_gemv_g##G##_w##W, G, W, false, false)              \
  W4C_GEMV_ONE(w4c_gemv_g##G##_w##W##_pdl, G, W, true, false)         \
  W4C_GEMV_ONE(w4c_gemv_g##G##_w##W##_silu, G, W, false, true)        \
  W4C_GEMV_ONE(w4c_gemv_g##G##_w##W##_pdl_silu, G, W, true, true)

// (G, W): groups of 128 k per warp, warps per block. Listed in w4a16_cutlass.py's GEMV_VARIANTS; each in
// four forms (plain, _pdl, _silu, _pdl_silu: w4a16_cutlass.gemv_name).
W4C_GEMV(1, 4)
W4C_GEMV(2, 4)
W4C_GEMV(4, 4)
W4C_GEMV(1, 2)
W4C_GEMV(2, 2)
