// Probe (benchmarks only, not an engine path): CUTLASS 3 Hopper GEMMs for the dense projections,
// Y[M, N] = X[M, K] . W[N, K]^T in bf16 with float32 accumulation, so that
// benchmarks/cutlass_probe.py can time persistent and stream-K tile schedules against cuBLAS
// (torch's F.linear) at issue 4's batch-256 step and issue 3's mixed step.
//
// Built by benchmarks/build_cutlass_probe.sh with the CUTLASS headers of the `nvidia-cutlass` wheel.
// One translation unit per configuration (PROBE_CFG = its index, so that two compile at once); the
// last one (PROBE_TABLE) holds the C entry points and the table of configurations.
//
// Layouts: X row-major [M, K] is CUTLASS's A (K-major); W row-major [N, K] is B as a column-major
// K x N matrix (K-major); Y row-major [M, N] is D. "swap" configurations compute D^T = W . X^T
// instead (A = W, B = X, D column-major [N, M]: the same bytes as Y), so that the weight's N takes
// the tile's M side. There is no C operand (beta = 0, ElementC void).

#include <cstdint>
#include <cstdio>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;

using Bf16 = cutlass::bfloat16_t;
using Acc = float;

template <class Tile, class Cluster, class Schedule, class EpiSchedule, class Scheduler, bool Swap>
struct Probe {
  // not swapped: A = X [M, K] row-major, B = W (K x N column-major), D = Y [M, N] row-major
  // swapped:     A = W [N, K] row-major, B = X (K x M column-major), D = Y^T [N, M] column-major
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = std::conditional_t<Swap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int Align = 8;  // 16 bytes of bf16

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, Acc, Acc, void, LayoutD, Align, Bf16, LayoutD, Align,
      EpiSchedule>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, LayoutA, Align, Bf16, LayoutB, Align, Acc,
      Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      Schedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments args(const void* x, const void* w, void* y, int m, int n, int k, int sms) {
    const int gm = Swap ? n : m, gn = Swap ? m : n;  // the GEMM's own M and N
    const Bf16* a = static_cast<const Bf16*>(Swap ? w : x);
    const Bf16* b = static_cast<const Bf16*>(Swap ? x : w);
    auto sa = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, make_shape(gm, k, 1));
    auto sb = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(gn, k, 1));
    auto sd = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, make_shape(gm, gn, 1));
    cutlass::KernelHardwareInfo hw;
    hw.device_id = 0;
    hw.sm_count = sms;
    typename Gemm::Arguments arguments{cutlass::gemm::GemmUniversalMode::kGemm,
                                       {gm, gn, k, 1},
                                       {a, sa, b, sb},
                                       {{}, nullptr, sd, static_cast<Bf16*>(y), sd},
                                       hw};
    arguments.epilogue.thread.alpha = 1.0f;
    arguments.epilogue.thread.beta = 0.0f;
    return arguments;
  }

  static size_t workspace(int m, int n, int k, int sms) {
    return Gemm::get_workspace_size(args(nullptr, nullptr, nullptr, m, n, k, sms));
  }

  // 0: launched; 1: cannot implement; 2: initialize failed; 3: launch failed
  static int run(const void* x, const void* w, void* y, int m, int n, int k, void* ws, int sms, cudaStream_t s) {
    auto arguments = args(x, w, y, m, n, k, sms);
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
using Persist = cutlass::gemm::PersistentScheduler;
using StreamK = cutlass::gemm::StreamKScheduler;

// The configurations: (name, Probe<...>). Keep PROBE_NUM and the table below in step.
#define PROBE_CONFIGS(X)                                                                       \
  X(0, "coop 128x128 c1 persistent", Probe<Shape<_128, _128, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, Persist, false>) \
  X(1, "coop 128x128 c1 streamk", Probe<Shape<_128, _128, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, StreamK, false>)    \
  X(2, "coop 128x256 c1 persistent", Probe<Shape<_128, _256, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, Persist, false>) \
  X(3, "coop 128x256 c1 streamk", Probe<Shape<_128, _256, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, StreamK, false>)    \
  X(4, "coop 256x128 c1x2 streamk", Probe<Shape<_256, _128, _64>, Shape<_1, _2, _1>, Coop, CoopEpi, StreamK, false>)  \
  X(5, "swap coop 128x128 c1 streamk", Probe<Shape<_128, _128, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, StreamK, true>) \
  X(6, "swap coop 128x256 c2x1 streamk", Probe<Shape<_128, _256, _64>, Shape<_2, _1, _1>, Coop, CoopEpi, StreamK, true>) \
  X(7, "ping 64x128 c1 persistent", Probe<Shape<_64, _128, _64>, Shape<_1, _1, _1>, Ping, PingEpi, Persist, false>)
#define PROBE_NUM 8

#if defined(PROBE_CFG)
// (variadic: the template's commas split it into several macro arguments)
#define PROBE_DEFINE(i, name, ...)                                                                  \
  using Probe##i = __VA_ARGS__;                                                                     \
  extern "C" size_t probe_workspace_##i(int m, int n, int k, int sms) {                             \
    return Probe##i::workspace(m, n, k, sms);                                                       \
  }                                                                                                 \
  extern "C" int probe_run_##i(const void* x, const void* w, void* y, int m, int n, int k, void* ws, \
                               int sms, cudaStream_t s) {                                           \
    return Probe##i::run(x, w, y, m, n, k, ws, sms, s);                                             \
  }
#endif

#if defined(PROBE_CFG)
#if PROBE_CFG == 0
PROBE_DEFINE(0, "", Probe<Shape<_128, _128, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, Persist, false>)
#elif PROBE_CFG == 1
PROBE_DEFINE(1, "", Probe<Shape<_128, _128, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, StreamK, false>)
#elif PROBE_CFG == 2
PROBE_DEFINE(2, "", Probe<Shape<_128, _256, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, Persist, false>)
#elif PROBE_CFG == 3
PROBE_DEFINE(3, "", Probe<Shape<_128, _256, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, StreamK, false>)
#elif PROBE_CFG == 4
PROBE_DEFINE(4, "", Probe<Shape<_256, _128, _64>, Shape<_1, _2, _1>, Coop, CoopEpi, StreamK, false>)
#elif PROBE_CFG == 5
PROBE_DEFINE(5, "", Probe<Shape<_128, _128, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, StreamK, true>)
#elif PROBE_CFG == 6
PROBE_DEFINE(6, "", Probe<Shape<_128, _256, _64>, Shape<_2, _1, _1>, Coop, CoopEpi, StreamK, true>)
#elif PROBE_CFG == 7
PROBE_DEFINE(7, "", Probe<Shape<_64, _128, _64>, Shape<_1, _1, _1>, Ping, PingEpi, Persist, false>)
#endif
#endif

#if defined(PROBE_TABLE)
#define PROBE_DECLARE(i, name, ...)                                      \
  extern "C" size_t probe_workspace_##i(int, int, int, int);           \
  extern "C" int probe_run_##i(const void*, const void*, void*, int, int, int, void*, int, cudaStream_t);
PROBE_CONFIGS(PROBE_DECLARE)

typedef size_t (*WsFn)(int, int, int, int);
typedef int (*RunFn)(const void*, const void*, void*, int, int, int, void*, int, cudaStream_t);
#define PROBE_ENTRY(i, name, ...) {name, probe_workspace_##i, probe_run_##i},
static const struct {
  const char* name;
  WsFn ws;
  RunFn run;
} kTable[] = {PROBE_CONFIGS(PROBE_ENTRY)};

extern "C" int probe_num_configs() { return PROBE_NUM; }
extern "C" const char* probe_config_name(int i) { return (i >= 0 && i < PROBE_NUM) ? kTable[i].name : ""; }
extern "C" size_t probe_workspace(int i, int m, int n, int k, int sms) { return kTable[i].ws(m, n, k, sms); }
extern "C" int probe_gemm(int i, const void* x, const void* w, void* y, int m, int n, int k, void* ws, int sms,
                          void* stream) {
  if (i < 0 || i >= PROBE_NUM) return 4;
  int rc = kTable[i].run(x, w, y, m, n, k, ws, sms, static_cast<cudaStream_t>(stream));
  if (rc == 0 && cudaPeekAtLastError() != cudaSuccess) return 5;
  return rc;
}
#endif
