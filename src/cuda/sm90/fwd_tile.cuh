// One work tile of the sm90 forward as every role sees it: its coordinates, its sequence, its mask and the key
// blocks it visits. The producer and the consumers derive it from the same published tile index.
#pragma once

#include "cuda/sm90/fwd_traits.cuh"
#include "cuda/sm90/tile_scheduler.cuh"

namespace flashattn::cuda::sm90 {

// Opts::kPackGQA: a tile's rows are (query position, head of the group) pairs, position-major (rows_per_pos =
// group), and tiles run over KV heads; otherwise one row per position.
template <class Traits, class Opts>
struct FwdTile {
  static constexpr bool kPackGQA = Opts::kPackGQA;
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  TileScheduler::Tile t;
  SeqInfo seq;
  WindowMask mask;
  int rows_per_pos;
  int m0;            // the tile's first row
  BlockRange range;  // key blocks [lo, hi) the tile visits

  __device__ FwdTile(const FwdParams& p, const TileScheduler::Tile& tile)
      : t(tile),
        seq(p, tile.batch),
        mask(p, seq),
        rows_per_pos(kPackGQA ? p.group : 1),
        m0(tile.m_block * kBlockM),
        range(split_share(key_blocks(), p.num_splits, tile.split)) {}

  // Varlen: a sequence shorter than max_seqlen_q has no rows in its last tiles.
  __device__ bool empty() const { return m0 >= seq.len_q * rows_per_pos; }
  // The query positions [lo, hi) of tile rows [m, m + rows).
  __device__ BlockRange positions(int m, int rows) const {
    return BlockRange{m / rows_per_pos, min(seq.len_q, (m + rows + rows_per_pos - 1) / rows_per_pos)};
  }
  // Query head of the tile's first row.
  __device__ int head0(const FwdParams& p) const { return kPackGQA ? t.head * p.group : t.head; }

  // Split-KV: split s of n takes the s-th of n equal runs of the tile's key blocks; a split left without blocks
  // still writes its (empty: O = 0, LSE = -inf) partial, which the combine weighs 0.
  __device__ static BlockRange split_share(BlockRange r, int splits, int split) {
    if (splits == 1) return r;
    const int per = (r.hi - r.lo + splits - 1) / splits;
    const int lo = r.lo + split * per;
    const int hi = min(r.hi, lo + per);
    return lo < hi ? BlockRange{lo, hi} : BlockRange{0, 0};
  }

 private:
  // Unpacked tiles keep the plain form: at d64's 160-register budget ptxas spilled (140 bytes) when the range
  // went through positions() even with one row per position.
  __device__ BlockRange key_blocks() const {
    if constexpr (kPackGQA) {
      const BlockRange pos = positions(m0, kBlockM);
      return mask.blocks(pos.lo, pos.hi - pos.lo, kBlockN);
    } else {
      return mask.blocks(m0, min(kBlockM, seq.len_q - m0), kBlockN);
    }
  }
};

// Where packed row `row` (position * group + head-in-group) of a tile lives; unpacked: rows_per_pos = 1.
struct PackedRow {
  int pos, head;
  __device__ PackedRow(int row, int rows_per_pos, int head0)
      : pos(row / rows_per_pos), head(head0 + row % rows_per_pos) {}
};

}  // namespace flashattn::cuda::sm90
