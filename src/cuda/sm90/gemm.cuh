// wgmma helpers both sm90 kernels (forward, backward) use: the shared-memory atom, accumulator views and one GEMM
// issued as one committed batch of wgmmas.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>

namespace flashattn::cuda::sm90 {

using namespace cute;

// K-major shared-memory atom with the widest swizzle whose width divides a row of kCols elements (128-byte rows:
// 64 16-bit or 128 8-bit elements): the layout wgmma reads without bank conflicts and TMA writes in one box row. The
// backward passes half the head dim for K, whose MN-major view dQ slices there.
template <class Element, int kCols>
constexpr auto smem_atom_k_major() {
  constexpr int kBytes = kCols * int(sizeof(Element));
  if constexpr (kBytes % 128 == 0)
    return GMMA::Layout_K_SW128_Atom<Element>{};
  else if constexpr (kBytes % 64 == 0)
    return GMMA::Layout_K_SW64_Atom<Element>{};
  else
    return GMMA::Layout_K_SW32_Atom<Element>{};
}

// wgmma accumulator ((2, 2, N/8), MMA_M, MMA_N) viewed as (rows, cols): value mode 0 holds two adjacent
// columns, mode 1 the row 8 below, mode 2 the 8-column groups.
template <class L>
__device__ constexpr auto rows_cols(L l) {
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<0, 2>(l), get<2>(l)));
}

// The accumulator of S reused as the register A operand of P.V: the m64nNk16 accumulator of columns
// [16j, 16j + 16) is exactly the A fragment of k-slice j, so ((2, 2, N/8), M, 1) -> ((2, 2, 2), M, N/16).
template <class L>
__device__ constexpr auto acc_as_a_operand(L l) {
  static_assert(decltype(size<2>(l))::value == 1);
  auto groups = logical_divide(layout<0, 2>(l), Layout<_2>{});  // (2, N/16)
  return make_layout(make_layout(layout<0, 0>(l), layout<0, 1>(l), layout<0>(groups)), layout<1>(l), layout<1>(groups));
}

// acc (+)= A.B over the K mode as a batch of wgmmas of one warpgroup, committed as one group: the caller waits
// for it with warpgroup_wait<N>() (N = groups it lets run on).
template <bool kZeroInit, class Mma, class TA, class TB, class TC>
__device__ __forceinline__ void wgmma_gemm(Mma& mma, const TA& a, const TB& b, TC& c) {
  // A from shared memory is a tensor of wgmma descriptors; from registers, the values themselves.
  constexpr bool kARegs = !std::is_same_v<std::decay_t<decltype(a.data())>, GMMA::DescriptorIterator>;
  if constexpr (kARegs) warpgroup_fence_operand(const_cast<TA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kARegs) warpgroup_fence_operand(const_cast<TA&>(a));
}

// One N slice J (the tiled MMA's repeat J along N) of acc (+)= A.B, committed as one group by wgmma_gemm: B's and
// acc's repeat J as one-repeat views (A: (MMA, 1, K); acc: (MMA, 1, N)).
template <bool kZeroInit, int J, class Mma, class TA, class TB, class TC>
__device__ __forceinline__ void wgmma_gemm_slice(Mma& mma, const TA& a, const TB& b, TC& c) {
  static_assert(decltype(size<1>(a))::value == 1 && decltype(size<1>(c))::value == 1);
  auto bj = b(_, J, _);  // (MMA, K)
  Tensor b_view = make_tensor(bj.data(), make_layout(layout<0>(bj), Layout<_1>{}, layout<1>(bj)));
  auto cj = c(_, _, J);  // (MMA, 1)
  Tensor c_view = make_tensor(cj.data(), append(cj.layout(), Layout<_1>{}));
  wgmma_gemm<kZeroInit>(mma, a, b_view, c_view);
}

}  // namespace flashattn::cuda::sm90
