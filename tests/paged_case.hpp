// Paged K/V cases (attn.block_table) shared by the CPU suite (test_paged.cpp) and the GPU suite
// (gpu/paged_test.cpp): the same keys once as pages in a shuffled order and once as a contiguous cache, so that a
// paged call must reproduce the contiguous call of the same backend bit for bit (the contiguous path is the one
// checked against the float64 reference). Slots past a sequence's keys, pages no sequence uses and the
// contiguous cache's rows past seqused_k hold NaN, and table entries past a sequence's last page are -1: a
// backend that read any of them would show it in the output.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/numeric.hpp"
#include "flashattn/flashattn.h"

namespace flashattn::paged_testing {

struct PagedCase {
  std::string name;
  fa_dtype dtype = FA_BFLOAT16;
  int64_t batch = 2, sq = 1, hq = 4, hkv = 2, d = 64, dv = 64;
  int64_t page_size = 16, max_pages = 4;
  std::vector<int32_t> used;  // keys per sequence (seqused_k); empty: every sequence uses the whole capacity
  bool causal = false;
  int64_t window_left = -1;
  int num_splits = 0;
  fa_backend backend = FA_BACKEND_AUTO;
  int64_t table_pad = 0;  // extra (never read) columns per table row: a row stride other than max_pages
  bool seqused = true;    // pass seqused_k (else every sequence uses the whole capacity)
};

inline size_t elem_bytes(fa_dtype t) { return t == FA_FLOAT32 ? 4 : t == FA_FLOAT8_E4M3 ? 1 : 2; }
// What out is stored in: bfloat16 for FP8 inputs (flashattn.h).
inline fa_dtype out_dtype(fa_dtype t) { return t == FA_FLOAT8_E4M3 ? FA_BFLOAT16 : t; }

// Host images of every tensor of a case.
struct PagedData {
  int64_t num_pages = 0, capacity = 0;
  std::vector<uint8_t> q, k_pages, v_pages, k_contig, v_contig;
  std::vector<int32_t> table, used;
};

inline void put(std::vector<uint8_t>& buf, fa_dtype t, size_t i, float x) {
  if (t == FA_FLOAT8_E4M3) {  // the values as e4m3 codes (no factors: the call passes none); NaN stays NaN
    buf[i] = cpu::float_to_e4m3(x);
    return;
  }
  if (t == FA_FLOAT32) {
    std::memcpy(buf.data() + 4 * i, &x, 4);
    return;
  }
  const uint16_t h = t == FA_BFLOAT16 ? cpu::float_to_bf16(x) : cpu::float_to_fp16(x);
  std::memcpy(buf.data() + 2 * i, &h, 2);
}
inline void copy_elem(std::vector<uint8_t>& dst, size_t di, const std::vector<uint8_t>& src, size_t si, size_t e) {
  std::memcpy(dst.data() + di * e, src.data() + si * e, e);
}

inline PagedData make_data(const PagedCase& c, uint32_t seed) {
  PagedData g;
  const size_t e = elem_bytes(c.dtype);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  g.capacity = c.max_pages * c.page_size;
  g.num_pages = c.batch * c.max_pages + 3;  // a few pages no sequence maps
  g.used = c.used.empty() || !c.seqused ? std::vector<int32_t>(size_t(c.batch), int32_t(g.capacity)) : c.used;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);

  g.q.resize(size_t(c.batch * c.sq * c.hq * c.d) * e);
  for (size_t i = 0; i < size_t(c.batch * c.sq * c.hq * c.d); ++i) put(g.q, c.dtype, i, u(rng));

  const size_t k_row = size_t(c.hkv * c.d), v_row = size_t(c.hkv * c.dv);  // elements per key row
  g.k_pages.resize(size_t(g.num_pages * c.page_size) * k_row * e);
  g.v_pages.resize(size_t(g.num_pages * c.page_size) * v_row * e);
  for (size_t i = 0; i < size_t(g.num_pages * c.page_size) * k_row; ++i) put(g.k_pages, c.dtype, i, nan);
  for (size_t i = 0; i < size_t(g.num_pages * c.page_size) * v_row; ++i) put(g.v_pages, c.dtype, i, nan);
  g.k_contig.resize(size_t(c.batch * g.capacity) * k_row * e);
  g.v_contig.resize(size_t(c.batch * g.capacity) * v_row * e);
  for (size_t i = 0; i < size_t(c.batch * g.capacity) * k_row; ++i) put(g.k_contig, c.dtype, i, nan);
  for (size_t i = 0; i < size_t(c.batch * g.capacity) * v_row; ++i) put(g.v_contig, c.dtype, i, nan);

  std::vector<int32_t> order(size_t(g.num_pages));
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  std::shuffle(order.begin(), order.end(), rng);
  const int64_t row = c.max_pages + c.table_pad;  // the table's row stride
  g.table.assign(size_t(c.batch * row), -1);
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t pages = (g.used[size_t(b)] + c.page_size - 1) / c.page_size;
    for (int64_t i = 0; i < pages; ++i) g.table[size_t(b * row + i)] = order[size_t(b * c.max_pages + i)];
    for (int64_t i = c.max_pages; i < row; ++i) g.table[size_t(b * row + i)] = 1 << 30;  // padding: never read
    for (int64_t j = 0; j < g.used[size_t(b)]; ++j) {
      const int64_t page = g.table[size_t(b * row + j / c.page_size)];
      const size_t paged_row = size_t(page * c.page_size + j % c.page_size), contig_row = size_t(b * g.capacity + j);
      for (size_t x = 0; x < k_row; ++x) {
        put(g.k_pages, c.dtype, paged_row * k_row + x, u(rng));
        copy_elem(g.k_contig, contig_row * k_row + x, g.k_pages, paged_row * k_row + x, e);
      }
      for (size_t x = 0; x < v_row; ++x) {
        put(g.v_pages, c.dtype, paged_row * v_row + x, u(rng));
        copy_elem(g.v_contig, contig_row * v_row + x, g.v_pages, paged_row * v_row + x, e);
      }
    }
  }
  return g;
}

// Pointers of one call's tensors (host memory for CPU calls, device memory for CUDA calls).
struct Buffers {
  void *q, *k, *v, *out;
  float* lse;
  int32_t *table, *used;
};

// The paged call (paged = true) or the contiguous one over the same keys.
inline fa_fwd_params make_params(const PagedCase& c, const PagedData& g, const Buffers& m, bool paged, fa_device dev) {
  fa_fwd_params p{};
  p.attn = fa_attention_default();
  const int64_t rows = paged ? g.num_pages : c.batch, cols = paged ? c.page_size : g.capacity;
  const int64_t qs[4] = {c.batch, c.sq, c.hq, c.d}, ks[4] = {rows, cols, c.hkv, c.d}, vs[4] = {rows, cols, c.hkv, c.dv};
  const int64_t os[4] = {c.batch, c.sq, c.hq, c.dv}, ls[3] = {c.batch, c.hq, c.sq}, ts[2] = {c.batch, c.max_pages};
  const int64_t us[1] = {c.batch};
  p.attn.q = fa_make_tensor(m.q, c.dtype, dev, 4, qs);
  p.attn.k = fa_make_tensor(m.k, c.dtype, dev, 4, ks);
  p.attn.v = fa_make_tensor(m.v, c.dtype, dev, 4, vs);
  if (paged) {
    p.attn.block_table = fa_make_tensor(m.table, FA_INT32, dev, 2, ts);
    p.attn.block_table.stride[0] = c.max_pages + c.table_pad;
  }
  if (c.seqused) p.attn.seqused_k = fa_make_tensor(m.used, FA_INT32, dev, 1, us);
  p.attn.causal = c.causal;
  p.attn.window_left = c.window_left;
  p.out = fa_make_tensor(m.out, out_dtype(c.dtype), dev, 4, os);
  p.lse = fa_make_tensor(m.lse, FA_FLOAT32, dev, 3, ls);
  return p;
}

// Element i of an output image as float (16-bit storage decoded), for checks of what a call wrote. `t`: the
// inputs' dtype (FP8 writes bfloat16).
inline float get(const std::vector<uint8_t>& buf, fa_dtype t, size_t i) {
  t = out_dtype(t);
  if (t == FA_FLOAT32) {
    float x;
    std::memcpy(&x, buf.data() + 4 * i, 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, buf.data() + 2 * i, 2);
  return t == FA_BFLOAT16 ? cpu::bf16_to_float(h) : cpu::fp16_to_float(h);
}

// What a correct call writes whatever the keys: finite outputs, and each row's LSE finite where the row sees a key
// (bottom-right causal / window rule of flashattn.h), -inf with out = 0 where it sees none. Empty when so, else
// the first violation.
inline std::string check_written(const PagedCase& c, const PagedData& g, const std::vector<uint8_t>& out,
                                 const std::vector<float>& lse) {
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.sq; ++i) {
        const float l = lse[size_t((b * c.hq + h) * c.sq + i)];
        const int64_t used = g.used[size_t(b)], diag = i + used - c.sq;
        const int64_t hi = c.causal ? std::min(used, diag + 1) : used;
        const int64_t lo = c.window_left >= 0 ? std::max<int64_t>(0, diag - c.window_left) : 0;
        const bool empty = hi <= lo;
        if (empty ? l != -std::numeric_limits<float>::infinity() : !std::isfinite(l))
          return "lse of (b " + std::to_string(b) + ", h " + std::to_string(h) + ", i " + std::to_string(i) + ") is " +
                 std::to_string(l);
        for (int64_t x = 0; x < c.dv; ++x) {
          const float o = get(out, c.dtype, size_t(((b * c.sq + i) * c.hq + h) * c.dv + x));
          if (!std::isfinite(o) || (empty && o != 0.f))
            return "out of (b " + std::to_string(b) + ", i " + std::to_string(i) + ", h " + std::to_string(h) +
                   ") is " + std::to_string(o);
        }
      }
  return "";
}

inline fa_exec make_exec(const PagedCase& c) {
  fa_exec x = fa_exec_default();
  x.backend = c.backend;
  x.num_splits = c.num_splits;
  return x;
}

}  // namespace flashattn::paged_testing
