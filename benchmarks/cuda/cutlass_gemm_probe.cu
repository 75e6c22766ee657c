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
    if constexpr (cute::is_same_v<Scheduler, cutlass::gemm::StreamKScheduler>) {
      // Force the stream-K decomposition: by default CUTLASS's heuristic keeps plain data-parallel
      // tiles when the last wave is at least half full (the forty-sixth session's first round never
      // split K for gate/up's 224 tiles: its "stream-K" launches had no workspace)
      arguments.scheduler.decomposition_mode = cutlass::gemm::kernel::detail::DecompositionMode::StreamK;
    }
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

// The configurations: Cfg<i> names a type and a label. Only aliases here, so the table unit
// instantiates no kernel; the unit built with PROBE_CFG=i instantiates Cfg<i>'s.
// Rounds so far (benchmarks/results/gpu_2026-12-07e, H100; the source of each is in git):
// - `call6` (4d3aae9): cooperative 128x128 / 128x256 persistent and "stream-K", 256x128 c1x2
//   "stream-K", swapped 128x128 / 128x256 "stream-K", pingpong 64x128. The stream-K launches were
//   CUTLASS's heuristic, which split K only for the 128x128 tiles (448 tiles at M = 256); the
//   224-tile ones ran data-parallel.
// - `call7` (a7c99b3): pingpong 64 x 64 / 96 / 128 / 192 / 224 / 256 and cooperative 128x224 /
//   128x256, persistent. The wave-filling widths were slower; at M = 256 pingpong 64x128 beat cuBLAS
//   on down and o, cooperative 128x256 on the LM head by 1% (within the spread between hosts).
// - gpu_2026-12-07f `call1` (6856d92, this source): stream-K forced (`decomposition_mode`), against
//   the same tiles persistent and pingpong 64x128. Slower than cuBLAS on every shape (gate/up at
//   M = 256: 109.1-115.4 us against 101.7); the three rounds' best saves 0.17 ms a batch-256 step.
template <int I>
struct Cfg;
#define PROBE_CFG_DEF(i, label, ...)           \
  template <>                                  \
  struct Cfg<i> {                              \
    using P = __VA_ARGS__;                     \
    static constexpr const char* name = label; \
  };
PROBE_CFG_DEF(0, "ping 64x128 persistent", Probe<Shape<_64, _128, _64>, Shape<_1, _1, _1>, Ping, PingEpi, Persist, false>)
PROBE_CFG_DEF(1, "coop 128x256 persistent", Probe<Shape<_128, _256, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, Persist, false>)
PROBE_CFG_DEF(2, "coop 128x256 streamk forced", Probe<Shape<_128, _256, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, StreamK, false>)
PROBE_CFG_DEF(3, "coop 256x128 c1x2 streamk forced", Probe<Shape<_256, _128, _64>, Shape<_1, _2, _1>, Coop, CoopEpi, StreamK, false>)
PROBE_CFG_DEF(4, "swap coop 128x256 c2x1 streamk forced", Probe<Shape<_128, _256, _64>, Shape<_2, _1, _1>, Coop, CoopEpi, StreamK, true>)
PROBE_CFG_DEF(5, "coop 128x128 streamk forced", Probe<Shape<_128, _128, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, StreamK, false>)
#define PROBE_NUM 6

#define PROBE_PASTE2(a, b) a##b
#define PROBE_PASTE(a, b) PROBE_PASTE2(a, b)

#if defined(PROBE_CFG)
extern "C" size_t PROBE_PASTE(probe_workspace_, PROBE_CFG)(int m, int n, int k, int sms) {
  return Cfg<PROBE_CFG>::P::workspace(m, n, k, sms);
}
extern "C" int PROBE_PASTE(probe_run_, PROBE_CFG)(const void* x, const void* w, void* y, int m, int n, int k,
                                                   void* ws, int sms, cudaStream_t s) {
  return Cfg<PROBE_CFG>::P::run(x, w, y, m, n, k, ws, sms, s);
}
#endif

#if defined(PROBE_TABLE)
#define PROBE_DECLARE(i)                                       \
  extern "C" size_t probe_workspace_##i(int, int, int, int); \
  extern "C" int probe_run_##i(const void*, const void*, void*, int, int, int, void*, int, cudaStream_t);
PROBE_DECLARE(0)
PROBE_DECLARE(1)
PROBE_DECLARE(2)
PROBE_DECLARE(3)
PROBE_DECLARE(4)
PROBE_DECLARE(5)

typedef size_t (*WsFn)(int, int, int, int);
typedef int (*RunFn)(const void*, const void*, void*, int, int, int, void*, int, cudaStream_t);
#define PROBE_ENTRY(i) {Cfg<i>::name, probe_workspace_##i, probe_run_##i},
static const struct {
  const char* name;
  WsFn ws;
  RunFn run;
} kTable[] = {PROBE_ENTRY(0) PROBE_ENTRY(1) PROBE_ENTRY(2) PROBE_ENTRY(3) PROBE_ENTRY(4) PROBE_ENTRY(5)};
static_assert(sizeof(kTable) / sizeof(kTable[0]) == PROBE_NUM, "one table entry per configuration");

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
