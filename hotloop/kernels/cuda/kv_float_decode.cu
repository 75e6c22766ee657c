// Decode attention over a 16-bit paged KV cache (fp16 / bf16 in the queries' dtype, head dim 64 or
// 128, up to 8 query heads per KV head) for launches with context splits, the splits merged inside the
// launch: the blocks of one (sequence, KV head) form a thread-block cluster and merge their partial
// outputs through distributed shared memory. Compiled by cuda_jit.py at first use; launched by
// kernels/kv_float_decode_cuda.py in place of the Triton decode kernel and its merge launch.
//
// Why: at batch 1 (and small batches) decode attention needs splits to spread a sequence over the
// GPU, and the Triton path then launches a second kernel per layer to merge them (about 2.4 us a
// launch, 30-32 a step: 5-7% of SmolLM2-135M's step). The Triton kernel's own merge by the last split
// to arrive (atomics, partials through global memory) was slower than the launch (BENCHMARKS.md).
//
// Layout: the cache is [NB, BS, KV, HD] (rows of HD contiguous elements, any block / token / head
// strides that keep rows 16-byte aligned). One block of 4 warps per (sequence, KV head, split), grid
// (KV, B, splits), cluster (1, 1, splits). Tiles of 64 tokens stream through a cp.async ring in shared
// memory; warp w copies and reads tokens 16w .. 16w + 15 of every tile only, so each warp runs its
// own ring with __syncwarp (as kv_int8_decode.cu's WRING). mma.sync m16n8k16 in the cache's dtype:
// - scores S = Q K^T: A = q (rows: the group's heads, zero past G; rows 8-15 zero), B = K of 8 tokens
//   (column g: token 8j + g). The order of head dims inside a dot is free as long as A and B agree:
//   lane t's k-slots of MMA chunk c are dims (HD / 4) t + 4c + {0, 1} (slots 2t, 2t + 1) and
//   + {2, 3} (slots 2t + 8, 2t + 9), so each lane reads HD / 2 contiguous bytes of its token's row.
// - O += P V: A = p (the scores' accumulator layout is P's A layout: k-slot = token), B = V, n-tile i
//   = dims 8i .. 8i + 7, loaded with ldmatrix.trans from the token-major rows.
// - Shared-memory rows are swizzled in 16-byte chunks: K by chunk ^ (HD == 128 ? (chunk >> 3) << 1 : 0)
//   ^ (row & 1) (the score reads: 8 lanes, 2 rows x 4 chunk groups), V by chunk ^ (row & 7) (ldmatrix:
//   8 rows of one chunk). Both are conflict-free.
// With one split the kernel writes the output directly (no cluster).

#include "decode_common.cuh"

__device__ __forceinline__ uint4 ldmatrix_x4_trans(u32 addr) {
  uint4 v;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

template <typename T>
__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1);
template <>
__device__ __forceinline__ void mma16816<__half>(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                                        u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// two floats rounded to T, packed low / high
template <typename T>
__device__ __forceinline__ u32 pack2(float lo, float hi);
template <>
__device__ __forceinline__ u32 pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<u32*>(&h);
}
template <>
__device__ __forceinline__ u32 pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<u32*>(&h);
}

// the physical 16-byte chunk of logical chunk `chunk` in K row `row` / V row `row`
template <int HD>
__device__ __forceinline__ int k_chunk(int chunk, int row) {
  return HD == 128 ? (chunk ^ ((chunk >> 3) << 1) ^ (row & 1)) : (chunk ^ (row & 1));
}
__device__ __forceinline__ int v_chunk(int chunk, int row) { return chunk ^ (row & 7); }

template <typename T, int HD, int STAGES>
__device__ __forceinline__ void decode_kernel(const T* __restrict__ q, const T* __restrict__ k_cache,
                                              const T* __restrict__ v_cache, const int* __restrict__ block_tables,
                                              const int* __restrict__ seq_lens, T* __restrict__ out, float scale_log2,
                                              int stride_qb, int stride_qh, int stride_kb, int stride_kt, int stride_kh,
                                              int stride_vb, int stride_vt, int stride_vh, int stride_bt, int stride_ob,
                                              int stride_oh, int G, int BS, int num_splits, int log2_bs) {
  constexpr int RB = HD * 2;                 // bytes of a row
  constexpr int CHUNKS = RB / 16;            // 16-byte chunks of a row
  constexpr int KBYTES = TILE * RB;          // a tile's K (or V) rows
  constexpr int STAGE = 2 * KBYTES;          // K, then V
  constexpr int NCH = HD / 16;               // score MMA chunks (k = 16 dims each)
  constexpr int NT = HD / 8;                 // P V n-tiles (8 dims each)
  constexpr int LANE_WORDS = HD / 8;         // u32 words of a lane's part of a K row (HD / 4 dims)
  extern __shared__ __align__(128) uint8_t smem[];
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  const int kvh = blockIdx.x, b = blockIdx.y, split = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int seq_len = seq_lens[b];
  const int chunk = ((seq_len + num_splits - 1) / num_splits + TILE - 1) / TILE * TILE;
  const int start = split * chunk;
  const int end = min(start + chunk, seq_len);
  const int n_tiles = end > start ? (end - start + TILE - 1) / TILE : 0;
  const int* table = block_tables + (long long)b * stride_bt;

  // ---- the copier's part: lane copies token 16 warp + (lane >> 1), chunks (lane & 1) * CHUNKS / 2
  // .. + CHUNKS / 2 - 1 of its K and V rows
  const int crow = 16 * warp + (lane >> 1), chalf = lane & 1;
  auto page_of = [&](int tile) -> int {
    const int tok = start + tile * TILE + crow;
    return tok < end ? table[tok >> log2_bs] : -1;
  };
  auto issue = [&](int tile, int page) {
    const u32 base = smem_addr(smem + (tile % STAGES) * STAGE);
    const int tok = start + tile * TILE + crow;
    const bool ok = page >= 0;
    const long long pg = ok ? (long long)page : 0;
    const int slot = ok ? (tok & (BS - 1)) : 0;
    const T* ks = k_cache + pg * stride_kb + (long long)slot * stride_kt + (long long)kvh * stride_kh;
    const T* vs = v_cache + pg * stride_vb + (long long)slot * stride_vt + (long long)kvh * stride_vh;
#pragma unroll
    for (int i = 0; i < CHUNKS / 2; ++i) {
      const int ch = chalf * (CHUNKS / 2) + i;
      cp_async16(base + crow * RB + (k_chunk<HD>(ch, crow) << 4), ks + ch * 8, ok);
      cp_async16(base + KBYTES + crow * RB + (v_chunk(ch, crow) << 4), vs + ch * 8, ok);
    }
  };

  // prologue: the whole ring in flight (each warp runs its own)
  auto ring = tile_ring<STAGES>(issue, page_of, n_tiles);
  ring.template prologue<STAGES>();

  // ---- q as the A fragments of the score MMAs: row g (head kvh * G + g), dims (HD / 4) t + 4c + ..
  u32 qa[NCH][2];
  {
    const bool real = g < G;
    const T* qrow = q + (long long)b * stride_qb + (long long)(kvh * G + (real ? g : 0)) * stride_qh + (HD / 4) * t;
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
      const u32 lo = *reinterpret_cast<const u32*>(qrow + 4 * c);
      const u32 hi = *reinterpret_cast<const u32*>(qrow + 4 * c + 2);
      qa[c][0] = real ? lo : 0u;
      qa[c][1] = real ? hi : 0u;
    }
  }

  float m = -INFINITY, l = 0.f;
  float oacc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;

  const u32 smem0 = smem_addr(smem);
  for (int tile = 0; tile < n_tiles; ++tile) {
    ring.warp_next(tile);
    const u32 base = smem0 + (tile % STAGES) * STAGE;
    const int tok0 = start + tile * TILE + 16 * warp;

    // scores for tokens 8j + 2t + e (j, e in {0, 1}) of the warp's 16
    float sacc[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.f;
      const int r = 16 * warp + 8 * j + g;
      u32 w[LANE_WORDS];
#pragma unroll
      for (int i = 0; i < LANE_WORDS / 4; ++i) {
        const uint4 x = lds128(base + r * RB + (k_chunk<HD>((LANE_WORDS / 4) * t + i, r) << 4));
        w[4 * i] = x.x;
        w[4 * i + 1] = x.y;
        w[4 * i + 2] = x.z;
        w[4 * i + 3] = x.w;
      }
#pragma unroll
      for (int c = 0; c < NCH; ++c) mma16816<T>(sacc[j], qa[c][0], 0u, qa[c][1], 0u, w[2 * c], w[2 * c + 1]);
    }
    float s[2][2];
    float tmax = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool ok = tok0 + 8 * j + 2 * t + e < end;
        s[j][e] = ok ? sacc[j][e] * scale_log2 : -INFINITY;
        tmax = fmaxf(tmax, s[j][e]);
      }
    }
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
    const float m_new = fmaxf(m, tmax);
    if (__any_sync(0xffffffffu, m_new > m)) {
      const float alpha = m_new > m ? exp2f(m - m_new) : 1.f;  // exp2(-inf) = 0 on the first tile
      l *= alpha;
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        oacc[i][0] *= alpha;
        oacc[i][1] *= alpha;
      }
      m = m_new;
    }
    const float mu = m == -INFINITY ? 0.f : m;
    u32 pa[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float p0 = exp2f(s[j][0] - mu), p1 = exp2f(s[j][1] - mu);
      l += p0 + p1;
      pa[j] = pack2<T>(p0, p1);  // P in the cache's dtype, as the Triton kernel's p.to(v.dtype)
    }

    // O += P V: n-tiles 2p and 2p + 1 from one ldmatrix.x4.trans (tokens 0-7 / 8-15 x dims 16p .. 16p + 15)
    const int mat = lane >> 3, mrow = 16 * warp + (mat & 1) * 8 + (lane & 7);
#pragma unroll
    for (int p = 0; p < NT / 2; ++p) {
      const int ch = 2 * p + (mat >> 1);
      const uint4 bv = ldmatrix_x4_trans(base + KBYTES + mrow * RB + (v_chunk(ch, mrow) << 4));
      mma16816<T>(oacc[2 * p], pa[0], 0u, pa[1], 0u, bv.x, bv.y);
      mma16816<T>(oacc[2 * p + 1], pa[0], 0u, pa[1], 0u, bv.z, bv.w);
    }
  }

  // ---- the warp's sums over its lanes, then the four warps merged through shared memory
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  cp_wait<0>();
  __syncthreads();  // the ring is free
  float* red = reinterpret_cast<float*>(smem);  // [WARPS][MAXG][HD] outputs, then [WARPS][MAXG] m and l
  float* red_m = red + WARPS * MAXG * HD;
  float* red_l = red_m + WARPS * MAXG;
  float* c_o = red_l + WARPS * MAXG;  // [MAXG][HD] this split's outputs, then [MAXG] their lse
  float* c_lse = c_o + MAXG * HD;
  if (g < G) {
    float* row = red + (warp * MAXG + g) * HD + 2 * t;
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      row[8 * i] = oacc[i][0];
      row[8 * i + 1] = oacc[i][1];
    }
    if (t == 0) {
      red_m[warp * MAXG + g] = m;
      red_l[warp * MAXG + g] = l;
    }
  }
  __syncthreads();
  for (int idx = tid; idx < G * HD; idx += THREADS) {
    const int h = idx / HD, d = idx % HD;
    float lse;
    const float o = merge_warps<HD>(red, red_m, red_l, h, d, &lse);
    if (num_splits == 1) {
      out[(long long)b * stride_ob + (long long)(kvh * G + h) * stride_oh + d] = from_float<T>(o);
    } else {
      c_o[h * HD + d] = o;
      if (d == 0) c_lse[h] = lse;
    }
  }
  if (num_splits > 1)
    cluster_merge<T, HD>(c_o, c_lse, out + (long long)b * stride_ob, stride_oh, kvh * G, G, num_splits, split, tid);
}

#define DEFINE(NAME, T, HD, STAGES, MINB)                                                                        \
  extern "C" __global__ void __launch_bounds__(THREADS, MINB)                                                   \
      NAME(const T* q, const T* k_cache, const T* v_cache, const int* block_tables, const int* seq_lens, T* out, \
           float scale_log2, int stride_qb, int stride_qh, int stride_kb, int stride_kt, int stride_kh,          \
           int stride_vb, int stride_vt, int stride_vh, int stride_bt, int stride_ob, int stride_oh, int G,      \
           int BS, int num_splits, int log2_bs) {                                                               \
    decode_kernel<T, HD, STAGES>(q, k_cache, v_cache, block_tables, seq_lens, out, scale_log2, stride_qb,       \
                                 stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,   \
                                 stride_bt, stride_ob, stride_oh, G, BS, num_splits, log2_bs);                  \
  }

// head dim 64: 16 KB a tile, 3 tiles (48 KB); head dim 128: 32 KB a tile, 3 tiles (96 KB)
DEFINE(kv_float_decode_hd64_f16, __half, 64, 3, 4)
DEFINE(kv_float_decode_hd64_bf16, __nv_bfloat16, 64, 3, 4)
DEFINE(kv_float_decode_hd128_f16, __half, 128, 3, 2)
DEFINE(kv_float_decode_hd128_bf16, __nv_bfloat16, 128, 3, 2)
