// Dev benchmark: sm80 forward / backward kernels instantiated with tiles other than fwd_tiles() / bwd_tiles(),
// timed side by side with torch's FA2 by sm80_tiles.py. Each group_*.cu unit adds its variants (build.sh compiles
// them in parallel); api.cu is the C interface. Not part of the library build.
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/sm80/bwd_kernel.cuh"
#include "cuda/sm80/fwd_launch.cuh"

namespace fa = flashattn::cuda;
namespace sm80 = flashattn::cuda::sm80;

struct Variant {
  const char* name;
  int backward;  // 0 forward, 1 backward
  int head_dim;
  int causal;
  int block_q;  // backward: the dQ workspace tile rows
  cudaError_t (*fwd)(const fa::FwdParams&, cudaStream_t);
  cudaError_t (*bwd)(const sm80::BwdParams&, cudaStream_t);
};

template <int kM, int kN, int kW>
struct FT {
  static constexpr sm80::FwdTiles value{kM, kN, kW};
};
template <int kM, int kN, int kW, int kSdp, int kDkv, int kDq, int kDo>
struct BT {
  static constexpr sm80::BwdTiles value{kM, kN, kW, kSdp, kDkv, kDq, kDo};
};

// The kernel variant the library's planner would pick for these parameters (plan.cpp variant_of).
template <class Plan, int kD>
Plan dev_plan(const fa::FwdParams& p) {
  Plan plan;
  plan.variant.score_mods = p.softcap > 0.f || p.alibi != nullptr;
  plan.variant.padded_head_dim = plan.variant.score_mods || p.head_dim != kD || p.head_dim_v != kD;
  return plan;
}

template <int kD, class Tiles, bool kCausal>
cudaError_t fwd_launch(const fa::FwdParams& p, cudaStream_t s) {
  using Tr = sm80::FwdTraits<cutlass::bfloat16_t, kD, kCausal, Tiles>;
  const fa::FwdPlan plan = dev_plan<fa::FwdPlan, kD>(p);
  if constexpr (kCausal)
    return sm80::launch_variant<Tr, fa::WindowMask>(p, plan, s);
  else
    return sm80::launch_variant<Tr, fa::KeyLengthMask>(p, plan, s);
}

template <int kD, class Tiles, bool kCausal>
cudaError_t bwd_launch(const sm80::BwdParams& p, cudaStream_t s) {
  using Tr = sm80::bwd::BwdTraits<cutlass::bfloat16_t, kD, Tiles>;
  if (cudaError_t e = sm80::bwd::launch_preprocess<FA_BFLOAT16>(p, s); e != cudaSuccess) return e;
  fa::BwdPlan plan = dev_plan<fa::BwdPlan, kD>(p);
  plan.deterministic = p.deterministic;
  if constexpr (kCausal)
    return sm80::bwd::launch_main_and_dq<Tr, fa::WindowMask>(p, plan, s);
  else
    return sm80::bwd::launch_main_and_dq<Tr, fa::KeyLengthMask>(p, plan, s);
}

#define FWD(name, d, c, M, N, W) v.push_back({name, 0, d, c, M, &fwd_launch<d, FT<M, N, W>, bool(c)>, nullptr})
#define BWD(name, d, c, M, N, W, A, B, C, DO) \
  v.push_back({name, 1, d, c, M, nullptr, &bwd_launch<d, BT<M, N, W, A, B, C, DO>, bool(c)>})
