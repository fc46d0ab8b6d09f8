// Named switches of the sm90 forward kernel's mechanisms (plain C++: the host dispatcher names them too).
#pragma once

#include <type_traits>

namespace flashattn::cuda::sm90 {

// Named switches of the kernel's mechanisms. The default kernel has every one on; the ablation build
// (FLASHATTN_SM90_ABLATIONS) instantiates the kernel with one of them off to measure what it is worth.
struct NoPingpong {};           // consumer warpgroups issue their GEMMs unordered
struct NoIntraWgOverlap {};     // softmax waits for the block's GEMMs (S, then P.V) to finish
struct NotPersistent {};        // one CTA per tile instead of one per SM walking the tiles
struct SmemEpilogue {};         // O always leaves through shared memory (stmatrix + TMA store / vector stores)
struct LateQRelease {};         // the next tile's Q load waits for this tile's last P.V, not its last Q.K^T
struct NoIdleSkip {};           // a packed warpgroup whose rows all lie past the sequence still runs its GEMMs
struct SerialRowReductions {};  // the softmax's row max and row sum as one dependent chain per row
struct EagerStoreWait {};       // a warpgroup's O store is waited for right after its issue, not before its next one
struct SingleQ {};              // one Q buffer: the next tile's Q loads only once this tile's is released
struct DrawAtStepTop {};        // dropout: a key block's mask is drawn before its GEMMs issue, not while they run
struct PlainPvWait {};          // the P.V wait as one statement after the softmax (ptxas hoists it to the row max)
struct EagerRescale {};         // O rescaled right after the P.V wait, not under the next step's Q.K^T
struct LateClaim {};            // dynamic schedule: warp 0 claims the next tile after a tile's loads (no claim warp)
template <int N>
struct KvStages {};  // K/V pipeline depth instead of the tile table's
template <int N>
struct KvBlock {};  // keys per main-loop step instead of the tile table's

template <class T>
struct StagesOf : std::integral_constant<int, 0> {};
template <int N>
struct StagesOf<KvStages<N>> : std::integral_constant<int, N> {};
template <class T>
struct BlockOf : std::integral_constant<int, 0> {};
template <int N>
struct BlockOf<KvBlock<N>> : std::integral_constant<int, N> {};

template <class... Options>
struct Mechanisms {
  static constexpr bool kPingpong = !(false || ... || std::is_same_v<Options, NoPingpong>);
  static constexpr bool kIntraWgOverlap = !(false || ... || std::is_same_v<Options, NoIntraWgOverlap>);
  static constexpr bool kPersistent = !(false || ... || std::is_same_v<Options, NotPersistent>);
  static constexpr bool kDirectEpilogue = !(false || ... || std::is_same_v<Options, SmemEpilogue>);
  static constexpr bool kEarlyQRelease = !(false || ... || std::is_same_v<Options, LateQRelease>);
  static constexpr bool kIdleSkip = !(false || ... || std::is_same_v<Options, NoIdleSkip>);
  static constexpr int kRowPartials = (false || ... || std::is_same_v<Options, SerialRowReductions>) ? 1 : 4;
  static constexpr bool kLateStoreWait = !(false || ... || std::is_same_v<Options, EagerStoreWait>);
  static constexpr bool kDoubleQ = !(false || ... || std::is_same_v<Options, SingleQ>);
  static constexpr bool kDrawUnderGemms = !(false || ... || std::is_same_v<Options, DrawAtStepTop>);
  static constexpr bool kPinnedPvWait = !(false || ... || std::is_same_v<Options, PlainPvWait>);
  static constexpr bool kRescaleUnderQk = !(false || ... || std::is_same_v<Options, EagerRescale>);
  static constexpr bool kClaimWarp = !(false || ... || std::is_same_v<Options, LateClaim>);
  static constexpr int kStages = (0 + ... + StagesOf<Options>::value);  // 0: the tile table's depth
  static constexpr int kBlockN = (0 + ... + BlockOf<Options>::value);   // 0: the tile table's block
};

// What one compiled forward kernel handles beyond the plain case, as named options: FwdVariant<> is the plain
// kernel. Each combination is its own instantiation (FwdVariantOf below names them from the table's flags).
namespace variant {
struct ScoreMods {};  // softcap and/or ALiBi (their registers would crowd the plain kernel)
struct PackGQA {};    // the query heads of a KV group share a tile (short query sequences, fwd_tile.cuh)
struct Dropout {};    // dropout_p > 0: the mainloop's probability slot draws the mask (fwd_mainloop.cuh DropoutProbs)
}  // namespace variant

template <class... Options>
struct FwdVariant {
  static constexpr bool kScoreMods = (false || ... || std::is_same_v<Options, variant::ScoreMods>);
  static constexpr bool kPackGQA = (false || ... || std::is_same_v<Options, variant::PackGQA>);
  static constexpr bool kDropout = (false || ... || std::is_same_v<Options, variant::Dropout>);
};

// The variant of one kernel table entry (CMake generates the flags) with the plan's packing; an option that is off is
// void, which matches none. Packed tiles never take dropout (plan.cpp: the mask is keyed by query head and position).
template <bool kScoreMods, bool kDropout, bool kPackGQA>
using FwdVariantOf = FwdVariant<std::conditional_t<kScoreMods, variant::ScoreMods, void>,
                                std::conditional_t<kDropout, variant::Dropout, void>,
                                std::conditional_t<kPackGQA, variant::PackGQA, void>>;

}  // namespace flashattn::cuda::sm90
