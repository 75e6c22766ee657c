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

#include <cstdint>
#include <cstdio>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/mixed_dtype_utils.hpp"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;

using Bf16 = cutlass::bfloat16_t;
using Acc = float;
using Quant = cutlass::int4b_t;

// The weight's layout: K-major [N, K] with CUTLASS's reordering atom for a bf16 MMA
using StrideW = cutlass::detail::TagToStrideA_t<cutlass::layout::RowMajor>;
using ValueShuffle = Layout<Shape<_2, _4>, Stride<_4, _1>>;  // values [0,2,4,6,1,3,5,7]
using LayoutAtomQuant = decltype(cutlass::compute_memory_reordering_atom<Bf16, Layout<Shape<_1, _1>>, ValueShuffle>());
using LayoutW = decltype(cute::tile_to_shape(LayoutAtomQuant{}, Layout<Shape<int, int, int>, StrideW>{}));

static LayoutW weight_layout(int n, int k) { return cute::tile_to_shape(LayoutAtomQuant{}, make_shape(n, k, 1)); }

template <class Tile, class Cluster, class Schedule, class EpiSchedule, class Scale,
          class Scheduler = cutlass::gemm::PersistentScheduler>
struct Gemm4 {
  using LayoutX = cutlass::layout::ColumnMajor;  // X [M, K] row-major as a K x M column-major B
  using LayoutD = cutlass::layout::ColumnMajor;  // D = Y^T [N, M] column-major
  static constexpr int AlignX = 8;
  static constexpr int AlignW = 32;  // 16 bytes of int4
  static constexpr int AlignD = 8;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, Acc, Acc, void, LayoutD, AlignD, Bf16, LayoutD, AlignD,
      EpiSchedule>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cute::tuple<Quant, Scale, Scale>, LayoutW, AlignW, Bf16,
      LayoutX, AlignX, Acc, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      Schedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments args(const void* x, const void* w, const void* scales, const void* zeros, void* y,
                                       int m, int n, int k, int group, int sms) {
    auto sx = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(m, k, 1));
    auto sd = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, make_shape(n, m, 1));
    const int scale_k = (k + group - 1) / group;
    auto ss = cutlass::make_cute_packed_stride(typename Mainloop::StrideScale{}, make_shape(n, scale_k, 1));
    cutlass::KernelHardwareInfo hw;
    hw.device_id = 0;
    hw.sm_count = sms;
    typename Gemm::Arguments arguments{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {n, m, k, 1},
        {static_cast<const Quant*>(w), weight_layout(n, k), static_cast<const Bf16*>(x), sx,
         static_cast<const Scale*>(scales), ss, group, static_cast<const Scale*>(zeros)},
        {{}, nullptr, sd, static_cast<Bf16*>(y), sd},
        hw};
    arguments.epilogue.thread.alpha = 1.0f;
    arguments.epilogue.thread.beta = 0.0f;
    return arguments;
  }

  static size_t workspace(int m, int n, int k, int group, int sms) {
    return Gemm::get_workspace_size(args(nullptr, nullptr, nullptr, nullptr, nullptr, m, n, k, group, sms));
  }

  // 0: launched; 1: cannot implement; 2: initialize failed; 3: launch failed
  static int run(const void* x, const void* w, const void* scales, const void* zeros, void* y, int m, int n, int k,
                 int group, void* ws, int sms, cudaStream_t s) {
    auto arguments = args(x, w, scales, zeros, y, m, n, k, group, sms);
    Gemm op;
    if (op.can_implement(arguments) != cutlass::Status::kSuccess) return 1;
    if (op.initialize(arguments, ws, s) != cutlass::Status::kSuccess) return 2;
    return op.run(s) == cutlass::Status::kSuccess ? 0 : 3;
  }
};

using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using CoopEpi = cutlass::epilogue::TmaWarpSpecializedCooperative;
using Ping = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using PingEpi = cutlass::epilogue::TmaWarpSpecialized;

template <int I>
struct Cfg;
#define W4C_CFG_DEF(i, label, ...)           \
  template <>                                  \
  struct Cfg<i> {                              \
    using P = __VA_ARGS__;                     \
    static constexpr const char* name = label; \
  };
// Tile = (weight rows N, token rows M, K); K = 64 (128 bytes of bf16 per row, a TMA box). Six of the eight
// the probe (benchmarks/w4a16_cutlass_probe.py, forty-ninth session, H100) found fastest for some Llama-3-8B
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
#define W4C_NUM 6

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

typedef size_t (*WsFn)(int, int, int, int, int);
typedef int (*RunFn)(const void*, const void*, const void*, const void*, void*, int, int, int, int, void*, int,
                     cudaStream_t);
#define W4C_ENTRY(i) {Cfg<i>::name, hl_w4c_workspace_##i, hl_w4c_run_##i},
static const struct {
  const char* name;
  WsFn ws;
  RunFn run;
} kTable[] = {W4C_ENTRY(0) W4C_ENTRY(1) W4C_ENTRY(2) W4C_ENTRY(3) W4C_ENTRY(4) W4C_ENTRY(5)};
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
