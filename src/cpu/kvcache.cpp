// fa_kvcache_append on the CPU (flashattn.h): the new tokens' rows rotated (rotary embedding, float32 math rounded
// once to the storage type, as flashattn.flash_attn_with_kvcache does with torch) and copied into their cache
// slots; q rotated in place. The validation (validate_kvcache) has checked every index this reads. Built with
// -ffp-contract=off (CMakeLists.txt): no fused multiply-adds, the rounding steps written here.
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/problem.hpp"
#include "cpu/numeric.hpp"

namespace flashattn::cpu {
namespace {

size_t element_bytes(fa_dtype t) { return t == FA_FLOAT32 ? 4 : t == FA_FLOAT8_E4M3 ? 1 : 2; }

// Row `row` (d elements at src + off_src) rotated at position pos into dst + off_dst (which may be the same row):
// the first 2 * half columns in pairs, the rest copied.
void rotate_row(const detail::KvcacheProblem& p, const void* src, int64_t off_src, void* dst, int64_t off_dst,
                int64_t pos, std::vector<float>& tmp) {
  const int64_t d = p.dim, half = p.rot_half;
  tmp.resize(size_t(d));
  for (int64_t c = 0; c < d; ++c) tmp[size_t(c)] = load_float(p.dtype, src, off_src + c);
  const float* cs = p.cos + pos * p.cos_row;
  const float* sn = p.sin + pos * p.sin_row;
  for (int64_t c = 0; c < half; ++c) {
    const int64_t i = p.interleaved ? 2 * c : c, j = p.interleaved ? 2 * c + 1 : c + half;
    const float x0 = tmp[size_t(i)], x1 = tmp[size_t(j)];
    tmp[size_t(i)] = x0 * cs[c] - x1 * sn[c];
    tmp[size_t(j)] = x0 * sn[c] + x1 * cs[c];
  }
  for (int64_t c = 0; c < d; ++c) store_float(p.dtype, dst, off_dst + c, tmp[size_t(c)]);
}

}  // namespace
}  // namespace flashattn::cpu

namespace flashattn::detail {

Error kvcache_append_cpu(const KvcacheProblem& p) {
  using namespace flashattn::cpu;
  const size_t es = element_bytes(p.dtype);
  std::vector<float> tmp;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t len = p.seqlens[b * p.seqlens_stride];
    for (int64_t t = 0; t < p.new_tokens; ++t) {
      const int64_t pos = len + t;
      // The cache row (contiguous: the sequence's row; paged: the page) and slot of position pos.
      int64_t row, slot;
      if (p.paged) {
        row = p.block_table[b * p.table_row + pos / p.page_size * p.table_col];
        slot = pos % p.page_size;
      } else {
        row = p.batch_idx ? p.batch_idx[b * p.batch_idx_stride] : b;
        slot = pos;
      }
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        const int64_t kc = row * p.kc_stride[0] + slot * p.kc_stride[1] + h * p.kc_stride[2];
        const int64_t vc = row * p.vc_stride[0] + slot * p.vc_stride[1] + h * p.vc_stride[2];
        const int64_t kn = b * p.k_stride[0] + t * p.k_stride[1] + h * p.k_stride[2];
        const int64_t vn = b * p.v_stride[0] + t * p.v_stride[1] + h * p.v_stride[2];
        if (p.rot_half > 0) {
          rotate_row(p, p.k, kn, p.k_cache, kc, pos, tmp);
        } else {
          std::memcpy(static_cast<char*>(p.k_cache) + kc * int64_t(es),
                      static_cast<const char*>(p.k) + kn * int64_t(es), size_t(p.dim) * es);
        }
        std::memcpy(static_cast<char*>(p.v_cache) + vc * int64_t(es), static_cast<const char*>(p.v) + vn * int64_t(es),
                    size_t(p.dim_v) * es);
      }
    }
    if (p.q != nullptr)
      for (int64_t t = 0; t < p.seqlen_q; ++t)
        for (int64_t h = 0; h < p.heads_q; ++h) {
          const int64_t off = b * p.q_stride[0] + t * p.q_stride[1] + h * p.q_stride[2];
          rotate_row(p, p.q, off, p.q, off, p.q_per_token ? len + t : len, tmp);
        }
  }
  return ok();
}

}  // namespace flashattn::detail
