// ops/cuda/gemm_cutlass_wgrad.cu — fp8 WGrad dW (+)= dyᵀ·x through CUTLASS's sm90 block-scaled
// FP8 GEMM. The only file that includes CUTLASS: its templates are slow to compile (two kernels:
// ~55 s of CPU and 3.5 GB of memory for nvcc).
//
// Mapping (CUTLASS's GEMM is D[M, N] = A[M, K] · B[N, K]ᵀ with both operands K-contiguous):
//   M = N_out, N = K_in, K = Tp (tokens, padded to 128 with zeros)
//   A = dy_t.data, row-major [M, Tp]; B = x_t.data, [N, Tp] with Tp contiguous (CUTLASS's
//   "column-major B"); D = C = dw, row-major fp32 [M, N]; beta 1 accumulates, beta 0 overwrites
//   (and then C is not read: the epilogue skips its load and clears the registers).
//   Scales: one per (row, 128-token block) on both sides, Sm90BlockwiseScaleConfig<1, 1, 128>
//   with both scale tensors MN-major: scale (r, kb) at kb * rows + r, which is the Fp8Rows layout
//   of numerics/quantize.h as it is.
// Math (sm90_mma_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp): every 128-deep K tile is
// one tensor-core partial sum started from zero, then acc += partial · sa[row] · sb[col] in fp32,
// blocks in increasing order — the CPU reference's scheme (it rounds sa·sb first; the kernel
// multiplies partial·sa first: a rounding apart). acc starts at zero for every tile a persistent
// CTA takes (CuTe value-initializes register fragments). Each warpgroup waits for its K tile's
// MMAs before scaling, so the scaling hides behind the other warpgroup's MMAs only.
// Scale loads: with 128 scales per tile along M and along N the collective loads neither by TMA but
// with the producer warp's 32 lanes (4-byte cp.async each, predicated on the problem bounds), so
// scales need only 4-byte alignment. A, B, C, D go through TMA: 16-byte aligned base pointers and
// row strides (Tp, K_in multiples of 128 give the strides).
// Tiles: 128×128×128, two consumer warpgroups (cooperative), each thread holding 64 accumulators
// and 64 partial sums; 128×256 would need 256 registers for those alone. The configs differ in the
// cluster: 0 pairs CTAs along M that share (multicast) their x_t tile, halving the L2 reads of
// x_t; 1 is a lone CTA.
#include <cutlass/cutlass.h>

#include <cute/tensor.hpp>
#include <cutlass/detail/blockwise_scale_layout.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "ops/gemm_backends.h"

namespace lockstep::cuda {

namespace {

using namespace cute;

template <class ClusterShape>
struct WgradGemm {
  using TileShape = cute::Shape<_128, _128, _128>;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 1, kQuantGroup, GMMA::Major::MN, GMMA::Major::MN>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  static constexpr int kAlignFp8 = 16, kAlignF32 = 4;  // elements in 16 bytes (TMA)

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,  //
      float, cutlass::layout::RowMajor, kAlignF32,                   // C
      float, cutlass::layout::RowMajor, kAlignF32,                   // D
      cutlass::epilogue::TmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<float, float, float, float>>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,                                //
      cutlass::float_e4m3_t, cute::tuple<cutlass::layout::RowMajor, LayoutSFA>, kAlignFp8,     // A
      cutlass::float_e4m3_t, cute::tuple<cutlass::layout::ColumnMajor, LayoutSFB>, kAlignFp8,  // B
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<int(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

void check_status(cutlass::Status status, const char* step, int64_t m, int64_t n, int64_t k) {
  LOCKSTEP_CHECK(status == cutlass::Status::kSuccess, "gemm_wgrad (fp8, CUTLASS): ", step, " failed for M=", m,
                 " N=", n, " K=", k, ": ", cutlassGetStatusString(status));
}

template <class ClusterShape>
void run_wgrad(float* dw, const Fp8Rows& dy_t, const Fp8Rows& x_t, bool accumulate) {
  using Gemm = typename WgradGemm<ClusterShape>::Gemm;
  using ScaleConfig = typename WgradGemm<ClusterShape>::ScaleConfig;
  using Kernel = typename Gemm::GemmKernel;
  const int64_t m = dy_t.rows(), n = x_t.rows(), k = x_t.cols();
  // CUTLASS's problem shape is int; scale layouts index with int32 (kb * M + m < M·K/128).
  LOCKSTEP_CHECK(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX, "gemm_wgrad (fp8, CUTLASS): M=", m, " N=", n,
                 " K=", k, " exceed int32");
  const auto shape = make_shape(int(m), int(n), int(k), 1);
  const typename Kernel::StrideA stride_a = make_stride(k, Int<1>{}, m * k);
  const typename Kernel::StrideB stride_b = make_stride(k, Int<1>{}, n * k);
  const typename Kernel::StrideC stride_c = make_stride(n, Int<1>{}, m * n);
  const typename Kernel::StrideD stride_d = make_stride(n, Int<1>{}, m * n);

  typename Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = shape;
  args.mainloop = {reinterpret_cast<const cutlass::float_e4m3_t*>(dy_t.data.data()), stride_a,
                   reinterpret_cast<const cutlass::float_e4m3_t*>(x_t.data.data()), stride_b,
                   dy_t.scales.data_as<float>(), ScaleConfig::tile_atom_to_shape_SFA(shape),
                   x_t.scales.data_as<float>(), ScaleConfig::tile_atom_to_shape_SFB(shape)};
  args.epilogue.ptr_C = dw;
  args.epilogue.dC = stride_c;
  args.epilogue.ptr_D = dw;
  args.epilogue.dD = stride_d;
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = accumulate ? 1.0f : 0.0f;
  int device = 0;
  LOCKSTEP_CUDA_CHECK(cudaGetDevice(&device));
  args.hw_info.device_id = device;
  LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&args.hw_info.sm_count, cudaDevAttrMultiProcessorCount, device));

  Gemm gemm;
  check_status(gemm.can_implement(args), "can_implement (alignment of the operands and strides)", m, n, k);
  const size_t workspace_bytes = Gemm::get_workspace_size(args);
  const Tensor workspace =
      workspace_bytes ? Tensor::empty({int64_t(workspace_bytes)}, DType::e4m3, Device::cuda) : Tensor();
  cudaStream_t stream = current_stream();
  check_status(gemm.initialize(args, workspace.data(), stream), "initialize", m, n, k);
  check_status(gemm.run(stream), "launch", m, n, k);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace

const char* gemm_wgrad_fp8_cutlass_config(int config) {
  switch (config) {
    case 0: return "128x128x128 cooperative, cluster 2x1";
    case 1: return "128x128x128 cooperative, cluster 1x1";
    default: fail(detail::concat("gemm_wgrad (fp8, CUTLASS): no config ", config));
  }
}

void gemm_wgrad_fp8_cutlass(float* dw, const Fp8Rows& dy_t, const Fp8Rows& x_t, bool accumulate, int config) {
  switch (config) {
    case 0: return run_wgrad<cute::Shape<_2, _1, _1>>(dw, dy_t, x_t, accumulate);
    case 1: return run_wgrad<cute::Shape<_1, _1, _1>>(dw, dy_t, x_t, accumulate);
    default: fail(detail::concat("gemm_wgrad (fp8, CUTLASS): no config ", config));
  }
}

}  // namespace lockstep::cuda
