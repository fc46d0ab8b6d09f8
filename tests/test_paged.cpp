// Paged K/V on the CPU backend: a paged call equals the contiguous call over the same keys bit for bit (the
// contiguous one is checked against the float64 reference elsewhere), and the table's rules are named errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "paged_case.hpp"

namespace flashattn::paged_testing {
namespace {

struct Outputs {
  std::vector<uint8_t> out;
  std::vector<float> lse;
};

fa_status run(const PagedCase& c, PagedData& g, bool paged, Outputs* r, fa_fwd_params* edit = nullptr) {
  r->out.assign(size_t(c.batch * c.sq * c.hq * c.dv) * elem_bytes(out_dtype(c.dtype)), 0xff);
  r->lse.assign(size_t(c.batch * c.hq * c.sq), 0.f);
  Buffers m{g.q.data(),
            paged ? g.k_pages.data() : g.k_contig.data(),
            paged ? g.v_pages.data() : g.v_contig.data(),
            r->out.data(),
            r->lse.data(),
            g.table.data(),
            g.used.data()};
  fa_fwd_params p = make_params(c, g, m, paged, FA_DEVICE_CPU);
  if (edit != nullptr) {
    *edit = p;
    return FA_OK;
  }
  const fa_exec x = make_exec(c);
  return fa_forward(&p, &x);
}

PagedCase make(const char* name, fa_dtype t, int64_t page, int64_t pages, std::vector<int32_t> used, int64_t sq,
               bool causal) {
  PagedCase c;
  c.name = name;
  c.dtype = t;
  c.page_size = page;
  c.max_pages = pages;
  c.used = std::move(used);
  c.batch = int64_t(c.used.size());
  c.sq = sq;
  c.causal = causal;
  c.d = 32;
  c.dv = 16;
  c.backend = FA_BACKEND_CPU;
  return c;
}

TEST(Paged, EqualsContiguous) {
  // clang-format off
  std::vector<PagedCase> cases = {
      make("fp32 page 1",             FA_FLOAT32,  1, 40, {37, 0, 40}, 1, false),
      make("fp32 page 3 causal",      FA_FLOAT32,  3, 14, {37, 1, 21}, 5, true),
      make("bf16 page 16",            FA_BFLOAT16, 16, 4, {64, 17, 33}, 1, false),
      make("bf16 page 16 causal q 7", FA_BFLOAT16, 16, 4, {50, 7, 64}, 7, true),
      make("fp16 page 64",            FA_FLOAT16,  64, 2, {100, 128}, 3, false),
      make("fp8 page 3 causal",       FA_FLOAT8_E4M3, 3, 14, {37, 1, 21}, 5, true),
      make("fp8 page 16",             FA_FLOAT8_E4M3, 16, 4, {64, 17, 33}, 2, false),
  };
  cases.push_back(make("bf16 page 16 table row stride 9", FA_BFLOAT16, 16, 4, {64, 5}, 2, true));
  cases.back().table_pad = 5;
  cases.push_back(make("fp32 page 5 no seqused_k", FA_FLOAT32, 5, 7, {0, 0}, 4, false));
  cases.back().seqused = false;
  // clang-format on
  uint32_t seed = 7;
  for (const PagedCase& c : cases) {
    SCOPED_TRACE(c.name);
    PagedData g = make_data(c, seed++);
    Outputs paged, contig;
    ASSERT_EQ(run(c, g, true, &paged), FA_OK) << fa_last_error();
    ASSERT_EQ(run(c, g, false, &contig), FA_OK) << fa_last_error();
    EXPECT_EQ(check_written(c, g, contig.out, contig.lse), "") << "contiguous call";
    EXPECT_EQ(check_written(c, g, paged.out, paged.lse), "") << "paged call";
    EXPECT_EQ(std::memcmp(paged.out.data(), contig.out.data(), paged.out.size()), 0) << "out differs";
    EXPECT_EQ(std::memcmp(paged.lse.data(), contig.lse.data(), paged.lse.size() * 4), 0) << "lse differs";
  }
}

TEST(Paged, CacheWithoutPages) {
  PagedCase c = make("no pages", FA_BFLOAT16, 16, 2, {0, 0}, 3, false);
  PagedData g = make_data(c, 5);
  g.num_pages = 0;
  g.k_pages.clear();
  g.v_pages.clear();
  Outputs r;
  ASSERT_EQ(run(c, g, true, &r), FA_OK) << fa_last_error();
  EXPECT_EQ(check_written(c, g, r.out, r.lse), "");
}

TEST(Paged, TableRulesAreNamedErrors) {
  PagedCase c = make("rules", FA_FLOAT32, 4, 5, {17, 9}, 2, false);
  PagedData g = make_data(c, 3);
  Outputs r;
  fa_fwd_params p{};
  ASSERT_EQ(run(c, g, true, &r, &p), FA_OK);
  const fa_exec x = make_exec(c);
  auto expect = [&](fa_fwd_params q, fa_status code, const char* msg) {
    const fa_status st = fa_forward(&q, &x);
    EXPECT_EQ(st, code) << fa_last_error();
    EXPECT_NE(std::string(fa_last_error()).find(msg), std::string::npos) << fa_last_error();
  };
  ASSERT_EQ(fa_forward(&p, &x), FA_OK) << fa_last_error();

  std::vector<int32_t> bad = g.table;
  bad[size_t(1 * c.max_pages + 2)] = int32_t(g.num_pages);  // sequence 1 reads pages 0..2
  fa_fwd_params q = p;
  q.attn.block_table.data = bad.data();
  expect(q, FA_ERROR_INVALID_ARGUMENT, "block_table: entry (1, 2)");
  bad = g.table;
  bad[0] = -1;
  q.attn.block_table.data = bad.data();
  expect(q, FA_ERROR_INVALID_ARGUMENT, "must be a page index");
  bad = g.table;
  bad[size_t(1 * c.max_pages + 4)] = 1000;  // past sequence 1's last page: never read
  q.attn.block_table.data = bad.data();
  EXPECT_EQ(fa_forward(&q, &x), FA_OK) << fa_last_error();

  q = p;
  q.attn.block_table.dtype = FA_FLOAT32;
  expect(q, FA_ERROR_INVALID_ARGUMENT, "block_table: dtype must be int32");
  q = p;
  q.attn.block_table.shape[0] = 1;
  expect(q, FA_ERROR_INVALID_ARGUMENT, "block_table: must have one row per batch entry");
  q = p;
  q.attn.block_table.ndim = 1;
  expect(q, FA_ERROR_INVALID_ARGUMENT, "block_table: must have 2 dimensions");
  q = p;
  std::vector<int32_t> used = g.used;
  used[0] = int32_t(g.capacity + 1);
  q.attn.seqused_k.data = used.data();
  expect(q, FA_ERROR_INVALID_ARGUMENT, "seqused_k: entry 0");
  q = p;
  q.attn.v.shape[1] = c.page_size + 1;
  expect(q, FA_ERROR_INVALID_ARGUMENT, "v: shape");

  // Varlen and the backward take contiguous K/V.
  std::vector<int32_t> cu = {0, 2, 4};
  const int64_t ncu[1] = {3};
  q = p;
  q.attn.cu_seqlens_q = fa_make_tensor(cu.data(), FA_INT32, FA_DEVICE_CPU, 1, ncu);
  q.attn.cu_seqlens_k = fa_make_tensor(cu.data(), FA_INT32, FA_DEVICE_CPU, 1, ncu);
  q.attn.q.ndim = 3;
  expect(q, FA_ERROR_UNSUPPORTED, "block_table: paged K/V is not supported with cu_seqlens");
  fa_bwd_params b{};
  b.attn = p.attn;
  b.out = p.out;
  b.lse = p.lse;
  b.dout = p.out;
  b.dq = p.attn.q;
  b.dk = p.attn.k;
  b.dv = p.attn.v;
  EXPECT_EQ(fa_backward(&b, &x), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(fa_last_error()).find("block_table: the backward"), std::string::npos) << fa_last_error();
}

}  // namespace
}  // namespace flashattn::paged_testing
