// Probe (benchmarks only): CUTLASS 3's Hopper mixed-input GEMM (int4 weights converted to bf16 in
// registers on the way to `wgmma`, group-wise scales and zero points) in nine configurations. The
// engine's copy, with six of them, is hotloop/kernels/cuda/w4a16_cutlass.cu; both take the Gemm4
// template from w4a16_cutlass_gemm.cuh there. Written for issue
// 5's offline row, where W4A16 decode steps at M = 256-384 run at 0.84x bf16 because no W4A16 GEMM
// here reaches bf16 cuBLAS's speed at large M (BENCHMARKS.md, thirtieth session).
//
// Y[M, N] = X[M, K] . W[N, K]^T, computed as D^T = W . X^T so that the narrow operand is the MMA's A
// (which `wgmma` may read from registers):
//   A = W, int4 (two's complement, q - 8), K-major [N, K], in CUTLASS's reordered ("shuffled") layout
//       so that a thread's 16 values of one MMA are one 64-bit load, values in [0,2,4,6,1,3,5,7] order;
//   B = X, bf16 [M, K] row-major (a K x M column-major matrix);
//   D = Y^T, column-major [N, M], the same bytes as Y [M, N] row-major;
//   scales and zeros [K / group, N] (N contiguous, AutoAWQ's `scales` layout), so that
//   W[n, k] = (q - 8) * scale[k / g, n] + zero[k / g, n], with zero = (8 - z) * scale for AutoAWQ's z.
//
// Built by `benchmarks/build_cutlass_probe.sh w4a16` (nvcc, the nvidia-cutlass wheel's headers). One
// translation unit per configuration (PROBE_CFG = its index); the one built with PROBE_TABLE holds the
// C entry points, the table and the reorder helper.

#include "w4a16_cutlass_gemm.cuh"  // (hotloop/kernels/cuda: the engine's Gemm4 template)

using Half = cutlass::half_t;

// Tile = (weight rows N, token rows M, K); K = 64 (128 bytes of bf16 per row, a TMA box)
template <int I>
struct Cfg;
#define PROBE_CFG_DEF(i, label, ...)           \
  template <>                                  \
  struct Cfg<i> {                              \
    using P = __VA_ARGS__;                     \
    static constexpr const char* name = label; \
  };
PROBE_CFG_DEF(0, "coop 128x128", Gemm4<Shape<_128, _128, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, Bf16>)
PROBE_CFG_DEF(1, "coop 128x256", Gemm4<Shape<_128, _256, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, Bf16>)
PROBE_CFG_DEF(2, "ping 64x128", Gemm4<Shape<_64, _128, _64>, Shape<_1, _1, _1>, Ping, PingEpi, Bf16>)
PROBE_CFG_DEF(3, "ping 64x256", Gemm4<Shape<_64, _256, _64>, Shape<_1, _1, _1>, Ping, PingEpi, Bf16>)
PROBE_CFG_DEF(4, "coop 128x128 c2x1", Gemm4<Shape<_128, _128, _64>, Shape<_2, _1, _1>, Coop, CoopEpi, Bf16>)
PROBE_CFG_DEF(5, "coop 128x128 fp16 scales", Gemm4<Shape<_128, _128, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, Half>)
// decode-sized token tiles (16 rows; issue 5's batch 1 and issue 3's batch 16)
PROBE_CFG_DEF(6, "ping 64x16", Gemm4<Shape<_64, _16, _64>, Shape<_1, _1, _1>, Ping, PingEpi, Bf16>)
PROBE_CFG_DEF(7, "coop 128x16", Gemm4<Shape<_128, _16, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, Bf16>)
PROBE_CFG_DEF(8, "coop 128x16 stream-K", Gemm4<Shape<_128, _16, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, Bf16,
                                                cutlass::gemm::StreamKScheduler>)
#define PROBE_NUM 9

#define PROBE_PASTE2(a, b) a##b
#define PROBE_PASTE(a, b) PROBE_PASTE2(a, b)

#if defined(PROBE_CFG)
extern "C" size_t PROBE_PASTE(w4probe_workspace_, PROBE_CFG)(int m, int n, int k, int group, int sms) {
  return Cfg<PROBE_CFG>::P::workspace(m, n, k, group, sms);
}
extern "C" int PROBE_PASTE(w4probe_run_, PROBE_CFG)(const void* x, const void* w, const void* sc, const void* z,
                                                     void* y, int m, int n, int k, int group, void* ws, int sms,
                                                     cudaStream_t s) {
  return Cfg<PROBE_CFG>::P::run(x, w, sc, z, y, m, n, k, group, ws, sms, s);
}
#endif

#if defined(PROBE_TABLE)
#define PROBE_DECLARE(i)                                                \
  extern "C" size_t w4probe_workspace_##i(int, int, int, int, int); \
  extern "C" int w4probe_run_##i(const void*, const void*, const void*, const void*, void*, int, int, int, int, \
                                 void*, int, cudaStream_t);
PROBE_DECLARE(0)
PROBE_DECLARE(1)
PROBE_DECLARE(2)
PROBE_DECLARE(3)
PROBE_DECLARE(4)
PROBE_DECLARE(5)
PROBE_DECLARE(6)
PROBE_DECLARE(7)
PROBE_DECLARE(8)

typedef size_t (*WsFn)(int, int, int, int, int);
typedef int (*RunFn)(const void*, const void*, const void*, const void*, void*, int, int, int, int, void*, int,
                     cudaStream_t);
#define PROBE_ENTRY(i) {Cfg<i>::name, w4probe_workspace_##i, w4probe_run_##i},
static const struct {
  const char* name;
  WsFn ws;
  RunFn run;
} kTable[] = {PROBE_ENTRY(0) PROBE_ENTRY(1) PROBE_ENTRY(2) PROBE_ENTRY(3) PROBE_ENTRY(4) PROBE_ENTRY(5) PROBE_ENTRY(6)
                PROBE_ENTRY(7) PROBE_ENTRY(8)};
static_assert(sizeof(kTable) / sizeof(kTable[0]) == PROBE_NUM, "one table entry per configuration");

extern "C" int w4probe_num_configs() { return PROBE_NUM; }
extern "C" const char* w4probe_config_name(int i) { return (i >= 0 && i < PROBE_NUM) ? kTable[i].name : ""; }
extern "C" size_t w4probe_workspace(int i, int m, int n, int k, int group, int sms) {
  return kTable[i].ws(m, n, k, group, sms);
}
extern "C" int w4probe_gemm(int i, const void* x, const void* w, const void* scales, const void* zeros, void* y,
                            int m, int n, int k, int group, void* ws, int sms, void* stream) {
  if (i < 0 || i >= PROBE_NUM) return 4;
  int rc = kTable[i].run(x, w, scales, zeros, y, m, n, k, group, ws, sms, static_cast<cudaStream_t>(stream));
  if (rc == 0 && cudaPeekAtLastError() != cudaSuccess) return 5;
  return rc;
}
// src: int4 K-major [N, K] packed two per byte (even k in the low nibble); dst: the same bytes in
// the layout the GEMM reads (weight_layout). Synchronises the device.
extern "C" int w4probe_reorder(const void* src, void* dst, int n, int k) {
  auto shape = make_shape(n, k, 1);
  auto plain = make_layout(shape, cutlass::make_cute_packed_stride(StrideW{}, shape));
  cutlass::reorder_tensor(static_cast<const Quant*>(src), plain, static_cast<Quant*>(dst), weight_layout(n, k));
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
#endif
