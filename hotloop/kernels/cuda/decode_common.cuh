// What the decode-attention kernels (kv_int8_decode.cu) share: their block shape, the cp.async /
// shared-memory helpers, dtype conversions, the tile ring and the merge of a block's warps. cuda_jit.py
// hashes every .cuh of this folder into each kernel's cache key.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

typedef unsigned int u32;

#define WARPS 4
#define THREADS (32 * WARPS)
#define TILE 64         // tokens per ring slot (warp w takes tokens 16w .. 16w + 15)
#define MAXG 8          // query heads per KV head, at most

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0));
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ uint4 lds128(u32 addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// A thread's part of streaming a split's tiles through a cp.async ring of STAGES slots: `issue(tile,
// page)` copies the thread's rows of `tile` into slot tile % STAGES (page -1: zeros past the split's
// end), `page_of(tile)` looks up the block-table entry of the thread's row. One commit group per
// tile, empty or not, so that cp.async.wait_group counts tiles; each tile's page is looked up one
// refill ahead of its use.
template <int STAGES, typename Issue, typename PageOf>
struct TileRing {
  Issue issue;
  PageOf page_of;
  int n_tiles;
  int next_page;

  __device__ __forceinline__ TileRing(Issue issue_, PageOf page_of_, int n_tiles_)
      : issue(issue_), page_of(page_of_), n_tiles(n_tiles_), next_page(0) {}

  // the first AHEAD tiles in flight
  template <int AHEAD>
  __device__ __forceinline__ void prologue() {
#pragma unroll
    for (int s = 0; s < AHEAD; ++s) {
      if (s < n_tiles) issue(s, page_of(s));
      cp_commit();
    }
    if (AHEAD < n_tiles) next_page = page_of(AHEAD);
  }

  // tile nt into its slot (that of tile nt - STAGES, which every reader has finished)
  __device__ __forceinline__ void refill(int nt) {
    if (nt < n_tiles) {
      issue(nt, next_page);
      if (nt + 1 < n_tiles) next_page = page_of(nt + 1);
    }
    cp_commit();
  }

  // A warp's own ring (each warp copies exactly the rows it reads; prologue<STAGES>() before the
  // loop): tile - 1's slot refilled as soon as the warp has read it, then tile waited for. All STAGES
  // slots are in flight while the warp waits, and no warp waits for another.
  __device__ __forceinline__ void warp_next(int tile) {
    if (tile > 0) {
      __syncwarp();  // every lane of the warp is done reading tile - 1's slot
      refill(tile - 1 + STAGES);
    }
    cp_wait<STAGES - 1>();  // this lane's copies of tile have landed
    __syncwarp();           // and the other lanes' (the warp reads only its own lanes' rows)
  }
};

template <int STAGES, typename Issue, typename PageOf>
__device__ __forceinline__ TileRing<STAGES, Issue, PageOf> tile_ring(Issue issue, PageOf page_of, int n_tiles) {
  return TileRing<STAGES, Issue, PageOf>(issue, page_of, n_tiles);
}

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// The block's warps' partial results for head h, dim d merged: red [WARPS][MAXG][DIM] the warps'
// unnormalised outputs, red_m / red_l [WARPS][MAXG] their maxima (log2 units) and sums. Returns the
// output (0 where every warp was empty); *lse gets its log2-sum-exp (-inf where empty).
template <int DIM>
__device__ __forceinline__ float merge_warps(const float* red, const float* red_m, const float* red_l, int h, int d,
                                             float* lse) {
  float mm = -INFINITY;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) mm = fmaxf(mm, red_m[w * MAXG + h]);
  const float mref = mm == -INFINITY ? 0.f : mm;
  float ll = 0.f, acc = 0.f;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) {
    const float mw = red_m[w * MAXG + h];
    const float wt = mw == -INFINITY ? 0.f : exp2f(mw - mref);
    ll += red_l[w * MAXG + h] * wt;
    acc += red[(w * MAXG + h) * DIM + d] * wt;
  }
  *lse = ll > 0.f ? mref + log2f(ll) : -INFINITY;
  return ll > 0.f ? acc / ll : 0.f;
}
