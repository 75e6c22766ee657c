// The W4A16 GEMM for many token rows on Hopper (sm_90a): CUTLASS 3's mixed-input collective, which
// converts the int4 weights to bf16 in registers on their way to `wgmma` (TMA feeds both operands).
// Used by kernels/w4a16_cutlass.py (HOTLOOP_W4A16_KERNEL=cutlass), which compiles it with nvcc and the
// nvidia-cutlass wheel's headers into a shared library and calls the C entry points below.
//
// Y[M, N] = X[M, K] . W[N, K]^T, computed as D^T = W . X^T so that the narrow operand is the MMA's A
// (which `wgmma` may read from registers):
//   A = W, int4 (two's complement, q - 8), K-major [N, K], in CUTLASS's reordered ("shuffled") layout
//       so that a thread's values of one MMA are one load, values in [0,2,4,6,1,3,5,7] order;
//   B = X, bf16 [M, K] row-major (a K x M column-major matrix);
//   D = Y^T, column-major [N, M], the same bytes as Y [M, N] row-major;
//   scales and zeros bf16 [K / group, N] (AutoAWQ's `scales` layout), so that
//   W[n, k] = (q - 8) * scale[k / g, n] + zero[k / g, n], with zero = (8 - z) * scale for AutoAWQ's z.
//
// One translation unit per configuration (W4C_CFG = its index), compiled in parallel; the one built with
// W4C_TABLE holds the C entry points, the table and the reorder helper.

#include "w4a16_cutlass_gemm.cuh"

template <int I>
struct Cfg;
#define W4C_CFG_DEF(i, label, ...)           \
  template <>                                  \
  struct Cfg<i> {                              \
    using P = __VA_ARGS__;                     \
    static constexpr const char* name = label; \
  };
// Tile = (weight rows N, token rows M, K); K = 64 (128 bytes of bf16 per row, a TMA box). Six of the eight
// the probe (benchmarks/w4a16_cutlass_probe.py at d4a0eb1, forty-ninth session, H100) found fastest for some Llama-3-8B
// projection at some M: 16-row token tiles up to M = 16, the larger ones above. Left out for compile time:
// a 2 x 1 cluster (down at M = 1,040, 2% ahead) and cooperative 128 x 16 without stream-K (gate/up at
// M <= 16, 3% ahead).
W4C_CFG_DEF(0, "coop 128x128", Gemm4<Shape<_128, _128, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, Bf16>)
W4C_CFG_DEF(1, "coop 128x256", Gemm4<Shape<_128, _256, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, Bf16>)
W4C_CFG_DEF(2, "ping 64x128", Gemm4<Shape<_64, _128, _64>, Shape<_1, _1, _1>, Ping, PingEpi, Bf16>)
W4C_CFG_DEF(3, "ping 64x256", Gemm4<Shape<_64, _256, _64>, Shape<_1, _1, _1>, Ping, PingEpi, Bf16>)
W4C_CFG_DEF(4, "ping 64x16", Gemm4<Shape<_64, _16, _64>, Shape<_1, _1, _1>, Ping, PingEpi, Bf16>)
W4C_CFG_DEF(5, "coop 128x16 stream-K", Gemm4<Shape<_128, _16, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, Bf16,
                                                cutlass::gemm::StreamKScheduler>)
// Stream-K forms of the two wide cooperative tiles: where the tiles are a little over one wave (q/k/v at
// 384 rows: 144 tiles of 128 x 128 on 132 SMs; o and down at 1,040: 160), the probe's data-parallel
// launches run a second, nearly empty wave. CUTLASS's heuristic splits the K loop of the tail tiles
// across the SMs (deterministic fix-up in the workspace), or keeps data-parallel where waves are whole.
W4C_CFG_DEF(6, "coop 128x128 stream-K", Gemm4<Shape<_128, _128, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, Bf16,
                                                 cutlass::gemm::StreamKScheduler>)
W4C_CFG_DEF(7, "coop 128x256 stream-K", Gemm4<Shape<_128, _256, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, Bf16,
                                                 cutlass::gemm::StreamKScheduler>)
// 192 token rows: 384 rows (the offline decode steps on an H200) in two tiles, none half empty
W4C_CFG_DEF(8, "coop 128x192 stream-K", Gemm4<Shape<_128, _192, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, Bf16,
                                                 cutlass::gemm::StreamKScheduler>)
#define W4C_NUM 9

#define W4C_PASTE2(a, b) a##b
#define W4C_PASTE(a, b) W4C_PASTE2(a, b)

#if defined(W4C_CFG)
extern "C" size_t W4C_PASTE(hl_w4c_workspace_, W4C_CFG)(int m, int n, int k, int group, int sms) {
  return Cfg<W4C_CFG>::P::workspace(m, n, k, group, sms);
}
extern "C" int W4C_PASTE(hl_w4c_run_, W4C_CFG)(const void* x, const void* w, const void* sc, const void* z,
                                                     void* y, int m, int n, int k, int group, void* ws, int sms,
                                                     cudaStream_t s) {
  return Cfg<W4C_CFG>::P::run(x, w, sc, z, y, m, n, k, group, ws, sms, s);
}
#endif

#if defined(W4C_TABLE)
#define W4C_DECLARE(i)                                                \
  extern "C" size_t hl_w4c_workspace_##i(int, int, int, int, int); \
  extern "C" int hl_w4c_run_##i(const void*, const void*, const void*, const void*, void*, int, int, int, int, \
                                 void*, int, cudaStream_t);
W4C_DECLARE(0)
W4C_DECLARE(1)
W4C_DECLARE(2)
W4C_DECLARE(3)
W4C_DECLARE(4)
W4C_DECLARE(5)
W4C_DECLARE(6)
W4C_DECLARE(7)
W4C_DECLARE(8)

typedef size_t (*WsFn)(int, int, int, int, int);
typedef int (*RunFn)(const void*, const void*, const void*, const void*, void*, int, int, int, int, void*, int,
                     cudaStream_t);
#define W4C_ENTRY(i) {Cfg<i>::name, hl_w4c_workspace_##i, hl_w4c_run_##i},
static const struct {
  const char* name;
  WsFn ws;
  RunFn run;
} kTable[] = {W4C_ENTRY(0) W4C_ENTRY(1) W4C_ENTRY(2) W4C_ENTRY(3) W4C_ENTRY(4) W4C_ENTRY(5) W4C_ENTRY(6)
                    W4C_ENTRY(7) W4C_ENTRY(8)};
static_assert(sizeof(kTable) / sizeof(kTable[0]) == W4C_NUM, "one table entry per configuration");

extern "C" int hl_w4c_num_configs() { return W4C_NUM; }
extern "C" const char* hl_w4c_config_name(int i) { return (i >= 0 && i < W4C_NUM) ? kTable[i].name : ""; }
extern "C" size_t hl_w4c_workspace(int i, int m, int n, int k, int group, int sms) {
  return kTable[i].ws(m, n, k, group, sms);
}
extern "C" int hl_w4c_gemm(int i, const void* x, const void* w, const void* scales, const void* zeros, void* y,
                            int m, int n, int k, int group, void* ws, int sms, void* stream) {
  if (i < 0 || i >= W4C_NUM) return 4;
  int rc = kTable[i].run(x, w, scales, zeros, y, m, n, k, group, ws, sms, static_cast<cudaStream_t>(stream));
  if (rc == 0 && cudaPeekAtLastError() != cudaSuccess) return 5;
  return rc;
}
// src: int4 K-major [N, K] packed two per byte (even k in the low nibble); dst: the same bytes in
// the layout the GEMM reads (weight_layout). Synchronises the device.
extern "C" int hl_w4c_reorder(const void* src, void* dst, int n, int k) {
  auto shape = make_shape(n, k, 1);
  auto plain = make_layout(shape, cutlass::make_cute_packed_stride(StrideW{}, shape));
  cutlass::reorder_tensor(static_cast<const Quant*>(src), plain, static_cast<Quant*>(dst), weight_layout(n, k));
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
#endif
