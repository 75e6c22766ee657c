// Decode attention over an int8 paged KV cache, head_dim 128, on the tensor cores, with the cache
// streamed through a cp.async ring in shared memory. Compiled by cuda_jit.py at first use; launched by
// kernels/kv_int8_decode_cuda.py in place of the Triton kernel's QUANT=8 path.
//
// Why: the Triton decode kernel reads int8 codes into registers and turns them into fp16 with byte
// permutes before its dots; Triton does not pipeline such loads, so each warp waits on its tile's
// loads, and at batch 128 x 4k the kernel ran at 60% of DRAM bandwidth with no eligible warp in 59% of
// cycles (BENCHMARKS.md, seventeenth session). Here every 64-token tile is copied with cp.async
// STAGES - 1 tiles ahead of the arithmetic, so about 150 KB per SM are in flight.
//
// The cache format is kv_quant.py's (BS = 2^log2_bs tokens per block): per block, codes [BS, KV, 128] uint8, then (scale, zero) pairs
// [BS, KV] in the model dtype; x ~= code * scale + zero. As in the Triton kernel, the dots run in fp16
// on 1024 + code (a byte permute builds the fp16 bits 0x64cc), and the offset and the zero points are
// taken back through row sums: s = ((q . (1024 + c)) - 1024 sum(q)) * k_scale + sum(q) * k_zero, and
// o = sum_n p'_n (1024 + c_n) + sum_n (p_n v_zero_n - 1024 p'_n) with p' = fp16(p * v_scale).
//
// One block of 4 warps per (sequence, KV head, split); a stage holds 64 tokens (K codes 8 KB, V codes
// 8 KB, their pairs 512 B) and warp w takes tokens 16w .. 16w + 15 of each stage, with its own
// running max, sum and output (merged across warps at the end, through shared memory).
// mma.sync m16n8k16, fragments as in the PTX ISA (lane = 4g + t):
// - scores S = Q K^T: A = q (rows: the group's heads, zero past G; G <= 8, so rows 8-15 are zero),
//   B = codes of 8 tokens (column g: token 8j + g). The order of head dims inside the dot is free as
//   long as A and B agree: lane t's k-slots of chunk c are dims 32t + 4c + {0,1} (slots 2t, 2t+1) and
//   32t + 4c + {2,3} (slots 2t+8, 2t+9), so each lane reads 32 contiguous bytes of its token's row.
// - O += P V: A = p' (the scores' accumulator layout is P's A layout: k-slot = token), B = V codes,
//   column g of n-tile i is dim 16g + i, so a lane reads 16 contiguous bytes of each of its 4 token
//   rows and pairs tokens with byte permutes. Its output columns are then dims 32t + i and 32t + 16 + i.
// - Rows in shared memory are 128 bytes with their 16-byte chunks XOR-swizzled by (row & 7): both
//   read patterns are free of bank conflicts.

#include "decode_common.cuh"

#define HD 128                                    // head dim = code bytes per row
#define CODE_BYTES (TILE * HD)                    // 8192
#define STAGE_BYTES (2 * CODE_BYTES + 2 * TILE * 4)  // K codes, V codes, K pairs, V pairs: 16896

__device__ __forceinline__ void cp_async4(u32 dst, const void* src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(pred ? 4 : 0));
}

__device__ __forceinline__ void sts128(u32 addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}

__device__ __forceinline__ u32 lds32(u32 addr) {
  u32 v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}

__device__ __forceinline__ void sts32(u32 addr, u32 v) { asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v)); }

__device__ __forceinline__ uint2 lds64(u32 addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}

__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// bytes 0 and 1 (LO) or 2 and 3 of x as the fp16 pair (1024 + byte, 1024 + byte)
__device__ __forceinline__ u32 expand_lo(u32 x) { return __byte_perm(x, 0x64646464u, 0x4140); }
__device__ __forceinline__ u32 expand_hi(u32 x) { return __byte_perm(x, 0x64646464u, 0x4342); }

__device__ __forceinline__ u32 pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<u32*>(&h);
}

// the (scale, zero) pair of a cache row, as stored: low 16 bits the scale, high the zero
template <typename T>
__device__ __forceinline__ float2 pair_to_float(u32 p) {
  unsigned short lo = (unsigned short)(p & 0xFFFFu), hi = (unsigned short)(p >> 16);
  T s = *reinterpret_cast<T*>(&lo), z = *reinterpret_cast<T*>(&hi);
  return make_float2(to_float<T>(s), to_float<T>(z));
}

template <typename T>
__device__ __forceinline__ unsigned short bits_of(T x);
template <>
__device__ __forceinline__ unsigned short bits_of<__half>(__half x) { return __half_as_ushort(x); }
template <>
__device__ __forceinline__ unsigned short bits_of<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
template <typename T>
__device__ __forceinline__ T from_bits(unsigned short b);
template <>
__device__ __forceinline__ __half from_bits<__half>(unsigned short b) { return __ushort_as_half(b); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_bits<__nv_bfloat16>(unsigned short b) { return __ushort_as_bfloat16(b); }

// kv_quant_triton.quant_params for int8: the scale (hi - lo) / 255 rounded up into T, and 1 / scale
template <typename T>
__device__ __forceinline__ T quant_scale(float lo, float hi, float* inv) {
  const float t = __fdiv_rn(__fsub_rn(hi, lo), 255.f);
  T r = from_float<T>(t);
  if (to_float<T>(r) < t) r = from_bits<T>((unsigned short)(bits_of<T>(r) + 1));
  const float sf = to_float<T>(r);
  *inv = sf > 0.f ? __fdiv_rn(1.f, fmaxf(sf, 1.1754943508222875e-38f)) : 0.f;
  return r;
}

// kv_quant_triton.quant_codes for int8: round-half-even(clamp((x - zero) * inv, 0, 255))
__device__ __forceinline__ uint8_t quant_code(float x, float zero, float inv) {
  const float y = fminf(fmaxf(__fmul_rn(__fsub_rn(x, zero), inv), 0.f), 255.f);
  return (uint8_t)__float2int_rn(y);
}

// the rotate-half rotation of x (first half: x cos - partner sin; second: x cos + partner sin) with
// each product and the sum rounded on its own, as rotary_kv_write computes it for quantized caches
__device__ __forceinline__ float rotate(float x, float partner, float c, float s, bool first) {
  const float a = __fmul_rn(x, c), b = __fmul_rn(partner, s);
  return first ? __fsub_rn(a, b) : __fadd_rn(a, b);
}

// the fused write's staging area after the ring: K codes, V codes, K pair, V pair, then [WARPS][4]
// floats for the block's min / max
#define FUSED_BYTES 384

// STAGES: tiles in the ring (4: 67,584 bytes of shared memory, 3 blocks per SM; 3: 50,688, room for 4)
// FUSED: the step's rotary embedding and int8 KV write done here instead of by rotary_kv_write:
// q arrives unrotated (each block rotates its heads' rows as it loads them), and the block whose
// split holds a sequence's newest token (position seq_len - 1) rotates that token's k row, quantizes
// k and v (kv_quant_triton's arithmetic), stores them at the token's slot for later steps, and puts
// the same bytes straight into its ring in place of a copy from the cache. With `rotated` (runtime,
// uniform) q and k arrive rotated (the q/k/v GEMV's rope epilogue, dense_gemv_qkv_rope_staged):
// only the quantization and the write are left.
// EARLY (FUSED, or the runtime `early`): the ring's first tiles are requested before the
// griddepcontrol.wait on the kernel before, so that their DRAM latency overlaps that kernel's tail.
// That is safe for every row but the newest token's: the kernel before this one has passed its own
// wait before letting this one start (every PDL kernel here waits, then triggers), so everything
// older is written; only that kernel itself may still be writing (rotary_kv_write: this step's
// tokens). The newest token's row is put into the ring after the wait (FUSED: from the staging area;
// else read from the cache).
// PROBE (benchmarks only: kv_attention_sweep.py's "probe" rows): the same copies through the same ring,
// grid and barriers with none of the arithmetic, to tell the access pattern's ceiling from the kernel's.
// WRING: each warp's own ring. The copier mapping below gives warp w exactly the rows it reads (tokens
// 16w .. 16w + 15 of each tile, their codes and pairs), so a warp needs no other warp's copies: it waits
// on its own cp.async groups and syncs with __syncwarp, never __syncthreads. A warp refills a slot as
// soon as it has finished with it, before it waits for its next tile, so all STAGES tiles are in flight
// while it waits (the block ring keeps STAGES - 1: its refill waits for the block's barrier, which
// comes after the next tile's data), and a warp that finishes early runs ahead instead of idling.
// (Removed after timing on the H200, benchmarks/results/gpu_2026-12-01e: the score dots in two MMA chains,
// slower at every KV-bound shape; the splits merged through a thread-block cluster instead of a merge
// launch, slower at batch 1.)
template <typename T, bool VT, int STAGES, bool FUSED, bool PROBE = false, bool WRING = false>
__device__ __forceinline__ void decode_kernel(
    const T* q, uint8_t* __restrict__ k_cache, uint8_t* __restrict__ v_cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens, T* __restrict__ out,
    float* __restrict__ part, float* __restrict__ lse_out, float scale_log2, int stride_qb, int stride_qh,
    int stride_kb, int stride_vb, int stride_bt, int stride_ob, int stride_oh, int G, int KV, int BS,
    int num_splits, int log2_bs, int heads_fastest, const T* k_new, const T* v_new, int stride_kn,
    int stride_vn, const float* cos_t, const float* sin_t, int stride_cs, const long long* __restrict__ slots,
    int rotated, int early) {
  // q, k_new, v_new, cos_t and sin_t (what the kernel before may write) are not __restrict__: ptxas
  // moves read-only (.nc) loads across griddepcontrol.wait, and these must stay after it. What it may
  // move (seq_lens, block_tables, slots, the cache) the kernel before does not write (EARLY above).
  extern __shared__ __align__(128) uint8_t smem[];
  // early: bit 0 the EARLY prologue (above); bit 1 EXCLUDE (the split merge attends to the newest token
  // and writes it, kernels/decode_merge_write.py): every split stops before position seq_lens[b] - 1,
  // whose row is not in the cache yet, so nothing is read after the wait but q
  const bool excl = (early & 2) != 0;
  const bool pre = FUSED || (early & 1) != 0;  // EARLY above: the prologue before the wait
  if (!pre) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
  }

  // grid (B, KV, splits), or (KV, B, splits) with heads_fastest: then a sequence's KV heads are
  // neighbours in the launch order, run together and share the 32-byte sectors that hold a token's
  // (scale, zero) pairs of all heads, and the token's 1 KB of codes (one DRAM read instead of several)
  const int b = heads_fastest ? blockIdx.y : blockIdx.x, kvh = heads_fastest ? blockIdx.x : blockIdx.y;
  const int split = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int H = G * KV;
  const int seq_len = seq_lens[b] - (excl ? 1 : 0);
  const int chunk = ((seq_len + num_splits - 1) / num_splits + TILE - 1) / TILE * TILE;
  const int start = split * chunk;
  const int end = min(start + chunk, seq_len);
  const int n_tiles = end > start ? (end - start + TILE - 1) / TILE : 0;
  const int* table = block_tables + (long long)b * stride_bt;
  const long long pair_base = (long long)BS * KV * HD;  // bytes of a block's codes

  // ---- the newest token (position seq_len - 1), where this split holds it and its row is not taken
  // from the cache before the wait: FUSED (and a slot to write it to), or EARLY
  uint8_t* const stage = smem + STAGES * STAGE_BYTES;  // FUSED: the staging area after the ring
  int new_pos = -1;                                    // block-uniform
  {
    const int pos = seq_len - 1;
    if (!excl && pos >= start && pos < end && (FUSED ? slots[b] >= 0 : pre)) new_pos = pos;
  }
  bool ready = !pre;  // the newest row may go into the ring (after the wait; FUSED: once staged)

  // ---- the copier's part: thread tid copies row tid / 2, code chunks 4 (tid & 1) .. + 3 of K and V,
  // and the K (tid even) or V (tid odd) pair of that row
  const int crow = tid >> 1, chalf = tid & 1;
  const uint8_t* pair_src_cache = chalf ? v_cache : k_cache;
  const int pair_stride = chalf ? stride_vb : stride_kb;
  auto page_of = [&](int tile) -> int {
    const int tok = start + tile * TILE + crow;
    return tok < end ? table[tok >> log2_bs] : -1;
  };
  auto slot_base = [&](int tile) -> u32 { return smem_addr(smem + (tile % STAGES) * STAGE_BYTES); };
  // FUSED: the newest token's bytes from the staging area into the thread's part of the row (no copy)
  auto put_staged = [&](u32 base) {
    const u32 st = smem_addr(stage);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int ch = chalf * 4 + i;
      const u32 dst = crow * HD + ((ch ^ (crow & 7)) << 4);
      sts128(base + dst, lds128(st + ch * 16));
      sts128(base + CODE_BYTES + dst, lds128(st + HD + ch * 16));
    }
    sts32(base + 2 * CODE_BYTES + chalf * (TILE * 4) + crow * 4, lds32(st + 2 * HD + 4 * chalf));
  };
  // EARLY without FUSED: the newest token's part of the row read from the cache after the wait, with
  // plain loads (a cp.async would join a later commit group than its tile's)
  auto load_row = [&](u32 base, int tok, int page) {
    const long long row = (long long)((tok & (BS - 1)) * KV + kvh);
    const uint8_t* ks = k_cache + (long long)page * stride_kb + row * HD;
    const uint8_t* vs = v_cache + (long long)page * stride_vb + row * HD;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int ch = chalf * 4 + i;
      const u32 dst = crow * HD + ((ch ^ (crow & 7)) << 4);
      sts128(base + dst, __ldcg(reinterpret_cast<const uint4*>(ks + ch * 16)));
      sts128(base + CODE_BYTES + dst, __ldcg(reinterpret_cast<const uint4*>(vs + ch * 16)));
    }
    const uint8_t* ps = pair_src_cache + (long long)page * pair_stride + pair_base + row * 4;
    sts32(base + 2 * CODE_BYTES + chalf * (TILE * 4) + crow * 4, __ldcg(reinterpret_cast<const unsigned int*>(ps)));
  };
  auto issue = [&](int tile, int page) {
    const u32 base = slot_base(tile);
    const int tok = start + tile * TILE + crow;
    const bool ok = page >= 0;
    const long long row = ok ? (long long)((tok & (BS - 1)) * KV + kvh) : 0;
    const long long pg = ok ? (long long)page : 0;
    if (tok == new_pos) {  // the newest token
      if (!ready) return;  // before the wait: put into the ring after it (below the prologue)
      if (FUSED) {         // its bytes from the staging area, no copy
        put_staged(base);
        return;
      }
    }
    const uint8_t* ks = k_cache + pg * stride_kb + row * HD;
    const uint8_t* vs = v_cache + pg * stride_vb + row * HD;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int ch = chalf * 4 + i;
      const u32 dst = crow * HD + ((ch ^ (crow & 7)) << 4);
      cp_async16(base + dst, ks + ch * 16, ok);
      cp_async16(base + CODE_BYTES + dst, vs + ch * 16, ok);
    }
    const uint8_t* ps = pair_src_cache + pg * pair_stride + pair_base + row * 4;
    cp_async4(base + 2 * CODE_BYTES + chalf * (TILE * 4) + crow * 4, ps, ok);
  };

  // prologue: the first STAGES - 1 tiles in flight (WRING: STAGES), one commit group per tile, empty or not;
  // issued before q is loaded, so that q's loads wait behind the copies instead of ahead of them
  auto ring = tile_ring<STAGES>(issue, page_of, n_tiles);
  constexpr int PRO = WRING ? STAGES : STAGES - 1;  // tiles the prologue issues
  ring.template prologue<PRO>();

  if (pre) {  // the prologue's copies are in flight: now wait for the kernel before
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
  }
  // ---- FUSED: the newest token's k / v row, quantized into the staging area and the cache
  if (FUSED && new_pos >= 0) {
    const long long slot = slots[b];
    const int d = tid;  // one head dim per thread (THREADS == HD)
    const T* kr = k_new + (long long)b * stride_kn + kvh * HD;
    const T* vr = v_new + (long long)b * stride_vn + kvh * HD;
    float kf;
    if (rotated) {
      kf = to_float<T>(kr[d]);
    } else {
      const float c = cos_t[(long long)b * stride_cs + (d & 63)], sn = sin_t[(long long)b * stride_cs + (d & 63)];
      const float x = to_float<T>(kr[d]), xp = to_float<T>(kr[d ^ 64]);
      // rotary_kv_write's x1 cos - x2 sin / x2 cos + x1 sin, rounded to T (what is quantized); each
      // product rounded on its own as there (no fma: its quantized launch turns contraction off)
      kf = to_float<T>(from_float<T>(rotate(x, xp, c, sn, d < 64)));
    }
    const float vf = to_float<T>(vr[d]);
    float mm[4] = {kf, kf, vf, vf};  // k min, k max, v min, v max
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      mm[0] = fminf(mm[0], __shfl_xor_sync(0xffffffffu, mm[0], o));
      mm[1] = fmaxf(mm[1], __shfl_xor_sync(0xffffffffu, mm[1], o));
      mm[2] = fminf(mm[2], __shfl_xor_sync(0xffffffffu, mm[2], o));
      mm[3] = fmaxf(mm[3], __shfl_xor_sync(0xffffffffu, mm[3], o));
    }
    float* scratch = reinterpret_cast<float*>(stage + 2 * HD + 16);
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < 4; ++j) scratch[warp * 4 + j] = mm[j];
    }
    __syncthreads();
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      mm[0] = fminf(mm[0], scratch[w * 4 + 0]);
      mm[1] = fmaxf(mm[1], scratch[w * 4 + 1]);
      mm[2] = fminf(mm[2], scratch[w * 4 + 2]);
      mm[3] = fmaxf(mm[3], scratch[w * 4 + 3]);
    }
    float kinv, vinv;
    const T ks = quant_scale<T>(mm[0], mm[1], &kinv), vs = quant_scale<T>(mm[2], mm[3], &vinv);
    const uint8_t kc = quant_code(kf, mm[0], kinv), vc = quant_code(vf, mm[2], vinv);
    const long long page = slot >> log2_bs;
    const long long row = (slot & (BS - 1)) * KV + kvh;
    const long long pair_off = (long long)BS * KV * HD + row * 4;
    k_cache[page * stride_kb + row * HD + d] = kc;
    v_cache[page * stride_vb + row * HD + d] = vc;
    stage[d] = kc;
    stage[HD + d] = vc;
    if (d < 2) {  // thread 0: k's (scale, zero) pair; thread 1: v's (zero: the minimum, a T value)
      const u32 pair = (u32)bits_of<T>(d ? vs : ks) | ((u32)bits_of<T>(from_float<T>(d ? mm[2] : mm[0])) << 16);
      *reinterpret_cast<u32*>((d ? v_cache + page * stride_vb : k_cache + page * stride_kb) + pair_off) = pair;
      *reinterpret_cast<u32*>(stage + 2 * HD + 4 * d) = pair;
    }
    __syncthreads();  // the staged row, for whichever thread copies it into the ring
  }
  ready = true;
  if (new_pos >= 0) {  // the newest row into its slot, if the prologue has issued its tile
    const int nt = (new_pos - start) / TILE;
    if (nt < PRO && start + nt * TILE + crow == new_pos) {
      if (FUSED)
        put_staged(slot_base(nt));
      else
        load_row(slot_base(nt), new_pos, table[new_pos >> log2_bs]);
    }
  }


  // ---- q as the A fragments of the score MMAs: row g (head kvh * G + g), dims 32t + 4c + {0,1} / {2,3}
  u32 qa[8][2];
  float qsum = 0.f;
  {
    const bool real = g < G;
    const T* qrow = q + (long long)b * stride_qb + (long long)(kvh * G + (real ? g : 0)) * stride_qh + 32 * t;
    const bool rot_q = FUSED && !rotated;
    const float* crow_cs = rot_q ? cos_t + (long long)b * stride_cs + 32 * (t & 1) : nullptr;
    const float* srow_cs = rot_q ? sin_t + (long long)b * stride_cs + 32 * (t & 1) : nullptr;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      float v[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float raw = to_float<T>(qrow[4 * c + e]);
        if (rot_q) {
          // dim 32t + 4c + e; its rotation partner (dim +- 64) is the same slot of lane t ^ 2
          const float partner = __shfl_xor_sync(0xffffffffu, raw, 2);
          const float cc = crow_cs[4 * c + e], ss = srow_cs[4 * c + e];
          raw = to_float<T>(from_float<T>(rotate(raw, partner, cc, ss, t < 2)));
        }
        // as the Triton kernel's to_dot_dtype: clamped into fp16's range, then rounded to fp16
        const float x = real ? fminf(fmaxf(raw, -65504.f), 65504.f) : 0.f;
        v[e] = __half2float(__float2half_rn(x));
        qsum += v[e];
      }
      qa[c][0] = pack_half2(v[0], v[1]);
      qa[c][1] = pack_half2(v[2], v[3]);
    }
    qsum += __shfl_xor_sync(0xffffffffu, qsum, 1);
    qsum += __shfl_xor_sync(0xffffffffu, qsum, 2);
  }
  const float qoff = 1024.f * qsum;

  float m = -INFINITY, l = 0.f, corr = 0.f;
  // !VT: 16 n-tiles of O (rows: heads g and g + 8, the latter padding); VT: 8 m-tiles of O^T
  constexpr int NACC = VT ? 8 : 16;
  float oacc[NACC][4];
#pragma unroll
  for (int i = 0; i < NACC; ++i) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;

  const u32 smem0 = smem_addr(smem);
  for (int tile = 0; tile < n_tiles; ++tile) {
    if (WRING) {
      ring.warp_next(tile);
    } else {
      cp_wait<STAGES - 2>();
      __syncthreads();  // tile's copies visible to all; every warp is done with the slot refilled below
      ring.refill(tile + STAGES - 1);
    }
    if (PROBE) continue;  // (the epilogue writes zeros: m and l keep their initial values)
    const u32 base = smem0 + (tile % STAGES) * STAGE_BYTES;
    const int tok0 = start + tile * TILE + 16 * warp;  // this warp's first token

    // scores for tokens 8j + 2t + e (j, e in {0, 1}) of the warp's 16
    float sacc[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.f;
      const int r = 16 * warp + 8 * j + g;
      const u32 rb = base + r * HD;
      const uint4 lo = lds128(rb + (((2 * t) ^ (r & 7)) << 4));
      const uint4 hi = lds128(rb + (((2 * t + 1) ^ (r & 7)) << 4));
      const u32 w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int c = 0; c < 8; ++c) mma16816(sacc[j], qa[c][0], 0u, qa[c][1], 0u, expand_lo(w[c]), expand_hi(w[c]));
    }
    const u32 kp = base + 2 * CODE_BYTES, vp = kp + TILE * 4;
    float s[2][2], vs[2][2], vz[2][2];
    float tmax = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int r = 16 * warp + 8 * j + 2 * t;
      const uint2 kk = lds64(kp + r * 4);
      const uint2 vv = lds64(vp + r * 4);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float2 kz = pair_to_float<T>(e ? kk.y : kk.x);
        const float2 vzz = pair_to_float<T>(e ? vv.y : vv.x);
        const bool ok = tok0 + 8 * j + 2 * t + e < end;
        const float x = ((sacc[j][e] - qoff) * kz.x + qsum * kz.y) * scale_log2;
        s[j][e] = ok ? x : -INFINITY;
        vs[j][e] = ok ? vzz.x : 0.f;
        vz[j][e] = ok ? vzz.y : 0.f;
        tmax = fmaxf(tmax, s[j][e]);
      }
    }
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
    const float m_new = fmaxf(m, tmax);
    if (__any_sync(0xffffffffu, m_new > m)) {
      const float alpha = m_new > m ? exp2f(m - m_new) : 1.f;  // exp2(-inf) = 0 on the first tile
      l *= alpha;
      corr *= alpha;
      if (VT) {
        // this lane's output columns are heads 2t and 2t + 1, whose factors lanes 8t and 8t + 4 hold
        const float a0 = __shfl_sync(0xffffffffu, alpha, 8 * t), a1 = __shfl_sync(0xffffffffu, alpha, 8 * t + 4);
#pragma unroll
        for (int i = 0; i < NACC; ++i) {
          oacc[i][0] *= a0;
          oacc[i][1] *= a1;
          oacc[i][2] *= a0;
          oacc[i][3] *= a1;
        }
      } else {
#pragma unroll
        for (int i = 0; i < NACC; ++i) {
          oacc[i][0] *= alpha;
          oacc[i][1] *= alpha;
        }
      }
      m = m_new;
    }
    const float mu = m == -INFINITY ? 0.f : m;
    u32 pa[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float ph[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = exp2f(s[j][e] - mu);
        const float pv = __half2float(__float2half_rn(p * vs[j][e]));
        l += p;
        corr += p * vz[j][e] - 1024.f * pv;
        ph[e] = pv;
      }
      pa[j] = pack_half2(ph[0], ph[1]);
    }

    // V: rows 2t, 2t + 1, 2t + 8, 2t + 9 of the warp's 16, bytes 16g .. 16g + 15 of each
    uint4 rv[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int r = 16 * warp + 2 * t + (k & 1) + 8 * (k >> 1);
      rv[k] = lds128(base + CODE_BYTES + r * HD + ((g ^ (r & 7)) << 4));
    }
    const u32 va[4] = {rv[0].x, rv[0].y, rv[0].z, rv[0].w};
    const u32 vb[4] = {rv[1].x, rv[1].y, rv[1].z, rv[1].w};
    const u32 vc[4] = {rv[2].x, rv[2].y, rv[2].z, rv[2].w};
    const u32 vd[4] = {rv[3].x, rv[3].y, rv[3].z, rv[3].w};
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) {
      const u32 ab_lo = __byte_perm(va[wd], vb[wd], 0x5140), ab_hi = __byte_perm(va[wd], vb[wd], 0x7362);
      const u32 cd_lo = __byte_perm(vc[wd], vd[wd], 0x5140), cd_hi = __byte_perm(vc[wd], vd[wd], 0x7362);
      if (VT) {
        // O^T += V^T P^T: A = V^T, m-tile i's rows g and g + 8 are dims 16g + 2i and 16g + 2i + 1;
        // B = P^T is the scores' accumulator layout as it stands (column g: head g)
        mma16816(oacc[2 * wd], expand_lo(ab_lo), expand_hi(ab_lo), expand_lo(cd_lo), expand_hi(cd_lo), pa[0], pa[1]);
        mma16816(oacc[2 * wd + 1], expand_lo(ab_hi), expand_hi(ab_hi), expand_lo(cd_hi), expand_hi(cd_hi), pa[0],
                 pa[1]);
      } else {
        mma16816(oacc[4 * wd + 0], pa[0], 0u, pa[1], 0u, expand_lo(ab_lo), expand_lo(cd_lo));
        mma16816(oacc[4 * wd + 1], pa[0], 0u, pa[1], 0u, expand_hi(ab_lo), expand_hi(cd_lo));
        mma16816(oacc[4 * wd + 2], pa[0], 0u, pa[1], 0u, expand_lo(ab_hi), expand_lo(cd_hi));
        mma16816(oacc[4 * wd + 3], pa[0], 0u, pa[1], 0u, expand_hi(ab_hi), expand_hi(cd_hi));
      }
    }
  }

  // ---- this warp's sums over its lanes, then the four warps merged through shared memory
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  corr += __shfl_xor_sync(0xffffffffu, corr, 1);
  corr += __shfl_xor_sync(0xffffffffu, corr, 2);
  cp_wait<0>();
  __syncthreads();  // the ring is free
  float* red = reinterpret_cast<float*>(smem);  // [WARPS][MAXG][HD] outputs, then [WARPS][MAXG] m and l
  float* red_m = red + WARPS * MAXG * HD;
  float* red_l = red_m + WARPS * MAXG;
  if (VT) {
    // columns 2t and 2t + 1 (heads), rows 16g + 2i and 16g + 2i + 1 (dims) of m-tile i
    const float c0 = __shfl_sync(0xffffffffu, corr, 8 * t), c1 = __shfl_sync(0xffffffffu, corr, 8 * t + 4);
    float* row0 = red + (warp * MAXG + 2 * t) * HD + 16 * g;
    float* row1 = row0 + HD;
#pragma unroll
    for (int i = 0; i < NACC; ++i) {
      if (2 * t < G) {
        row0[2 * i] = oacc[i][0] + c0;
        row0[2 * i + 1] = oacc[i][2] + c0;
      }
      if (2 * t + 1 < G) {
        row1[2 * i] = oacc[i][1] + c1;
        row1[2 * i + 1] = oacc[i][3] + c1;
      }
    }
  }
  if (g < G) {
    if (!VT) {
      float* row = red + (warp * MAXG + g) * HD + 32 * t;
#pragma unroll
      for (int i = 0; i < NACC; ++i) {
        row[i] = oacc[i][0] + corr;
        row[16 + i] = oacc[i][1] + corr;
      }
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
    const int head = kvh * G + h;
    if (num_splits == 1) {
      out[(long long)b * stride_ob + (long long)head * stride_oh + d] = from_float<T>(o);
    } else {
      const long long prow = ((long long)b * H + head) * num_splits + split;
      part[prow * HD + d] = o;
      if (d == 0) lse_out[prow] = lse;
    }
  }
}

#define DEFINE(NAME, T, VT, STAGES, MINB, FUSED, PROBE) DEFINE_W(NAME, T, VT, STAGES, MINB, FUSED, PROBE, false)
#define DEFINE_W(NAME, T, VT, STAGES, MINB, FUSED, PROBE, WRING)                                        \
  extern "C" __global__ void __launch_bounds__(THREADS, MINB) NAME(                                       \
      const T* q, uint8_t* k_cache, uint8_t* v_cache, const int* block_tables, const int* seq_lens,       \
      T* out, float* part, float* lse_out, float scale_log2, int stride_qb, int stride_qh, int stride_kb,  \
      int stride_vb, int stride_bt, int stride_ob, int stride_oh, int G, int KV, int BS, int num_splits,  \
      int log2_bs, int heads_fastest, const T* k_new, const T* v_new, int stride_kn, int stride_vn,       \
      const float* cos_t, const float* sin_t, int stride_cs, const long long* slots, int rotated, int early) { \
    decode_kernel<T, VT, STAGES, FUSED, PROBE, WRING>(q, k_cache, v_cache, block_tables, seq_lens, out, part, lse_out,  \
                                        scale_log2, stride_qb, stride_qh, stride_kb, stride_vb,           \
                                        stride_bt, stride_ob, stride_oh, G, KV, BS, num_splits, log2_bs,  \
                                        heads_fastest, k_new, v_new, stride_kn, stride_vn, cos_t, sin_t,  \
                                        stride_cs, slots, rotated, early);                                \
  }

// the first kernel (BENCHMARKS.md, eighteenth session; HOTLOOP_KV_CUDA_VARIANT=rows)
DEFINE(kv_int8_decode_f16, __half, false, 4, 3, false, false)
DEFINE(kv_int8_decode_bf16, __nv_bfloat16, false, 4, 3, false, false)
// the O^T variants (header), with 4 and 3 stages (nineteenth session: the default picks one by grid)
DEFINE(kv_int8_decode_vt_f16, __half, true, 4, 3, false, false)
DEFINE(kv_int8_decode_vt_bf16, __nv_bfloat16, true, 4, 3, false, false)
DEFINE(kv_int8_decode_vt3_f16, __half, true, 3, 4, false, false)
DEFINE(kv_int8_decode_vt3_bf16, __nv_bfloat16, true, 3, 4, false, false)
// the same with the step's rotary embedding and KV write fused in (FUSED above; off: slower at batch 1)
DEFINE(kv_int8_decode_vt_fw_f16, __half, true, 4, 3, true, false)
DEFINE(kv_int8_decode_vt_fw_bf16, __nv_bfloat16, true, 4, 3, true, false)
DEFINE(kv_int8_decode_vt3_fw_f16, __half, true, 3, 4, true, false)
DEFINE(kv_int8_decode_vt3_fw_bf16, __nv_bfloat16, true, 3, 4, true, false)
// the read probes (PROBE above; not a decode kernel: they write zeros)
DEFINE(kv_int8_read_probe3_f16, __half, true, 3, 4, false, true)
DEFINE(kv_int8_read_probe3_bf16, __nv_bfloat16, true, 3, 4, false, true)
DEFINE(kv_int8_read_probe4_f16, __half, true, 4, 3, false, true)
DEFINE(kv_int8_read_probe4_bf16, __nv_bfloat16, true, 4, 3, false, true)
// the O^T kernels with per-warp rings (WRING above; the default since the twentieth session: 7-12% faster
// than vt3 at batch 128-300 x 4k on the H200)
DEFINE_W(kv_int8_decode_vtw_f16, __half, true, 4, 3, false, false, true)
DEFINE_W(kv_int8_decode_vtw_bf16, __nv_bfloat16, true, 4, 3, false, false, true)
DEFINE_W(kv_int8_decode_vt3w_f16, __half, true, 3, 4, false, false, true)
DEFINE_W(kv_int8_decode_vt3w_bf16, __nv_bfloat16, true, 3, 4, false, false, true)
DEFINE_W(kv_int8_read_probe3w_f16, __half, true, 3, 4, false, true, true)
DEFINE_W(kv_int8_read_probe3w_bf16, __nv_bfloat16, true, 3, 4, false, true, true)
// per-warp rings with the fused write (FUSED above; slower at batch 1, benchmarks/results/gpu_2026-12-01f)
DEFINE_W(kv_int8_decode_vtw_fw_f16, __half, true, 4, 3, true, false, true)
DEFINE_W(kv_int8_decode_vtw_fw_bf16, __nv_bfloat16, true, 4, 3, true, false, true)
DEFINE_W(kv_int8_decode_vt3w_fw_f16, __half, true, 3, 4, true, false, true)
DEFINE_W(kv_int8_decode_vt3w_fw_bf16, __nv_bfloat16, true, 3, 4, true, false, true)
