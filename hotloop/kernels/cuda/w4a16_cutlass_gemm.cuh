// The CUTLASS 3 Hopper mixed-input W4A16 GEMM as a template (Gemm4), instantiated once per configuration
// by the engine's library (w4a16_cutlass.cu): the weight's reordered layout, the collective builders,
// arguments, workspace and launch. The operand contract is in w4a16_cutlass.cu's header. (The forty-ninth
// session's probe, benchmarks/cuda/w4a16_cutlass_probe.cu at d4a0eb1, included it too.)
#pragma once

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
