// Paged K/V on the CUDA backends: a paged call equals the contiguous call over the same keys bit for bit on the
// same backend (tests/paged_case.hpp; the contiguous calls are checked against the float64 reference by the
// forward suite). The cases cover each read path of the plan: sm90 TMA boxes of whole key blocks (page size a
// multiple of the block), of 16-row boxes (a multiple of 16, tiles of more than 64 rows), sm90 cp.async row gathers
// (any other page size or tile), and the gathered copy (every sm80 call, a cache without pages), with GQA packing,
// split-KV, causal chunks of several queries and sequences of 0 keys.
#include "gpu_support.hpp"
#include "paged_case.hpp"

namespace flashattn::gpu_testing {
namespace {

using paged_testing::Buffers;
using paged_testing::PagedCase;
using paged_testing::PagedData;

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes, const void* host = nullptr) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(bytes, 16)), cudaSuccess);
    if (host != nullptr) EXPECT_EQ(cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

struct Result {
  fa_status status = FA_OK;
  std::string message;
  std::vector<uint8_t> out;
  std::vector<float> lse;
};

// A case's tensors copied to the device (paged or contiguous K/V; out and lse poisoned: NaN in every float format)
// and the call's params over them.
struct DeviceCall {
  size_t out_bytes, lse_n;
  DeviceBuffer q, k, v, table, used, out, lse;
  fa_fwd_params params;
  DeviceCall(const PagedCase& c, const PagedData& g, bool paged)
      : out_bytes(size_t(c.batch * c.sq * c.hq * c.dv) * paged_testing::elem_bytes(paged_testing::out_dtype(c.dtype))),
        lse_n(size_t(c.batch * c.hq * c.sq)),
        q(g.q.size(), g.q.data()),
        k((paged ? g.k_pages : g.k_contig).size(), (paged ? g.k_pages : g.k_contig).data()),
        v((paged ? g.v_pages : g.v_contig).size(), (paged ? g.v_pages : g.v_contig).data()),
        table(g.table.size() * 4, g.table.data()),
        used(g.used.size() * 4, g.used.data()),
        out(out_bytes),
        lse(lse_n * 4) {
    cudaMemset(out.ptr, 0xff, out_bytes);
    cudaMemset(lse.ptr, 0xff, lse_n * 4);
    const Buffers m{q.ptr,
                    k.ptr,
                    v.ptr,
                    out.ptr,
                    static_cast<float*>(lse.ptr),
                    static_cast<int32_t*>(table.ptr),
                    static_cast<int32_t*>(used.ptr)};
    params = paged_testing::make_params(c, g, m, paged, FA_DEVICE_CUDA);
  }
};

Result run(const PagedCase& c, const PagedData& g, bool paged) {
  DeviceCall d(c, g, paged);
  const fa_exec x = paged_testing::make_exec(c);
  Result r;
  r.status = fa_forward(&d.params, &x);
  r.message = fa_last_error();
  if (r.status != FA_OK) return r;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  r.out.resize(d.out_bytes);
  r.lse.resize(d.lse_n);
  EXPECT_EQ(cudaMemcpy(r.out.data(), d.out.ptr, d.out_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(r.lse.data(), d.lse.ptr, d.lse_n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return r;
}

PagedCase make(const char* name, fa_backend backend, int64_t d, int64_t page, int64_t pages,
               std::vector<int32_t> used) {
  PagedCase c;
  c.name = name;
  c.backend = backend;
  c.d = c.dv = d;
  c.page_size = page;
  c.max_pages = pages;
  c.used = std::move(used);
  c.batch = int64_t(c.used.size());
  c.hq = 8;
  c.hkv = 2;
  return c;
}
PagedCase with(PagedCase c, int64_t sq, bool causal, int splits = 0, int64_t hkv = 2) {
  c.sq = sq;
  c.causal = causal;
  c.num_splits = splits;
  c.hkv = hkv;
  return c;
}
PagedCase dims(PagedCase c, int64_t d, int64_t dv) {
  c.d = d;
  c.dv = dv;
  return c;
}
PagedCase table_padded(PagedCase c) {
  c.table_pad = 5;
  return c;
}
PagedCase without_seqused(PagedCase c) {
  c.seqused = false;
  return c;
}

void run_cases(const std::vector<PagedCase>& list, uint32_t seed) {
  int ran = 0;
  std::string skipped;
  for (PagedCase c : list) {
    for (fa_dtype t : {FA_BFLOAT16, FA_FLOAT16}) {
      c.dtype = t;
      SCOPED_TRACE(c.name + (t == FA_BFLOAT16 ? " bf16" : " fp16"));
      const PagedData g = paged_testing::make_data(c, seed++);
      const Result contig = run(c, g, false);
      if (contig.status == FA_ERROR_UNSUPPORTED && sm90_unavailable_message(contig.message)) {
        skipped = contig.message;  // this case's family is absent here; the others still run
        continue;
      }
      ASSERT_EQ(contig.status, FA_OK) << contig.message;
      const Result paged = run(c, g, true);
      ASSERT_EQ(paged.status, FA_OK) << paged.message;
      ++ran;
      // Both calls must be right on their own (the NaN in unused slots must not leak into either), and equal.
      EXPECT_EQ(paged_testing::check_written(c, g, contig.out, contig.lse), "") << "contiguous call";
      EXPECT_EQ(paged_testing::check_written(c, g, paged.out, paged.lse), "") << "paged call";
      EXPECT_EQ(std::memcmp(paged.out.data(), contig.out.data(), paged.out.size()), 0) << "out differs";
      EXPECT_EQ(std::memcmp(paged.lse.data(), contig.lse.data(), paged.lse.size() * 4), 0) << "lse differs";
    }
  }
  if (ran == 0) GTEST_SKIP() << skipped;
}

TEST(Paged, EqualsContiguous) {
  SKIP_WITHOUT_GPU();
  constexpr fa_backend k90 = FA_BACKEND_CUDA_SM90, k80 = FA_BACKEND_CUDA_SM80;
  // clang-format off
  const std::vector<PagedCase> cases = {
      make("sm90 d128 page 16 decode (rows)",        k90, 128,  16, 40, {600, 0, 129, 1}),
      with(make("sm90 d128 page 16 splits 5",        k90, 128,  16, 40, {640, 333}), 1, false, 5),
      make("sm90 d128 page 128 (block boxes)",       k90, 128, 128,  5, {640, 127, 300}),
      make("sm90 d128 page 256",                     k90, 128, 256,  3, {700, 256}),
      make("sm90 d128 page 48",                      k90, 128,  48, 12, {500, 47, 49}),
      make("sm90 d128 page 3 (rows)",                k90, 128,   3, 90, {260, 5}),
      make("sm90 d128 page 1 (rows)",                k90, 128,   1, 70, {70, 33}),
      with(make("sm90 d128 page 16 causal q 5",      k90, 128,  16, 20, {300, 5, 17}), 5, true),
      with(make("sm90 d128 page 16 chunk q 70",      k90, 128,  16, 40, {640, 200}), 70, true),
      with(make("sm90 d128 page 16 MHA (unpacked)",  k90, 128,  16, 20, {300, 31}), 1, false, 0, 8),
      with(make("sm90 d128 page 32 MHA q 130",       k90, 128,  32, 10, {320, 150}), 130, false, 0, 8),
      make("sm90 d64 page 16",                       k90,  64,  16, 30, {470, 2}),
      make("sm90 d64 page 128",                      k90,  64, 128,  4, {512, 100}),
      // d64 causal without packing up to 1k keys: the narrow tiles (64-key blocks), each read path.
      with(make("sm90 d64 page 16 MHA causal q 40 (narrow, row boxes)", k90, 64, 16, 30, {470, 40}), 40, true, 0, 8),
      with(make("sm90 d64 page 64 MHA causal q 33 (narrow, block boxes)", k90, 64, 64, 8, {500, 33}), 33, true, 0, 8),
      with(make("sm90 d64 page 3 MHA causal q 20 (narrow, rows)", k90, 64, 3, 120, {350, 20}), 20, true, 0, 8),
      make("sm90 d256 page 16",                      k90, 256,  16, 20, {300, 81}),
      with(make("sm90 d256 page 7 causal q 3",       k90, 256,   7, 50, {330, 20}), 3, true),
      with(make("sm90 d64 page 5 splits 4",          k90,  64,   5, 80, {390, 6}), 1, false, 4),
      make("sm90 d256 page 160 (block boxes)",       k90, 256, 160,  2, {320, 161}),
      with(make("sm90 d128 page 176 MHA (176-key block boxes)", k90, 128, 176, 3, {528, 200}), 1, false, 0, 8),
      with(make("sm90 d128 page 128 MHA causal q 9", k90, 128, 128,  4, {512, 130}), 9, true, 0, 8),
      dims(make("sm90 d96 page 16 (padded d128)",    k90, 128,  16, 20, {300, 45}), 96, 96),
      dims(make("sm90 d128 dv 64 page 32",           k90, 128,  32, 10, {320, 33}), 128, 64),
      dims(make("sm90 d80 page 128 (padded)",        k90, 128, 128,  3, {384, 129}), 80, 80),
      table_padded(make("sm90 d128 page 16 table row stride 45", k90, 128, 16, 40, {640, 17})),
      // Without seqused_k the whole capacity is used: the lengths only give the batch size.
      without_seqused(make("sm90 d128 page 16 no seqused_k", k90, 128, 16, 12, {0, 0})),
      without_seqused(make("sm90 d128 page 3 no seqused_k (rows)", k90, 128, 3, 30, {0, 0})),
      make("sm80 d128 page 16 (gathered)",           k80, 128,  16, 20, {300, 0, 17}),
      with(make("sm80 d64 page 3 causal q 4",        k80,  64,   3, 50, {150, 4}), 4, true),
      table_padded(make("sm80 d64 page 16 table row stride 25", k80, 64, 16, 20, {300, 3})),
  };
  // clang-format on
  run_cases(cases, 11);
}

// A few cases of each read path for compute-sanitizer (memcheck, racecheck): the full list is too slow there.
TEST(PagedSanitizer, ReadPaths) {
  SKIP_WITHOUT_GPU();
  constexpr fa_backend k90 = FA_BACKEND_CUDA_SM90, k80 = FA_BACKEND_CUDA_SM80;
  const std::vector<PagedCase> cases = {
      with(make("sm90 row boxes q 70", k90, 128, 16, 12, {190, 3}), 70, true),
      make("sm90 rows page 16 decode", k90, 128, 16, 12, {190, 3}),
      make("sm90 block boxes", k90, 128, 128, 2, {200, 1}),
      with(make("sm90 rows page 16 splits 3", k90, 64, 16, 16, {256, 40}), 1, false, 3),
      with(make("sm90 rows splits 3", k90, 128, 5, 60, {256, 40}), 1, false, 3),
      make("sm90 rows page 3", k90, 128, 3, 40, {100, 0}),
      make("sm90 rows d256 page 1", k90, 256, 1, 100, {90, 7}),
      with(make("sm90 narrow row boxes", k90, 64, 16, 12, {190, 30}), 30, true, 0, 8),
      make("sm80 gathered", k80, 64, 16, 8, {128, 9}),
  };
  run_cases(cases, 101);
}

// A cache without pages (every sequence empty): no TMA descriptor can describe it, so the plan gathers; every row
// sees no key (out = 0, lse = -inf).
TEST(Paged, CacheWithoutPages) {
  SKIP_WITHOUT_GPU();
  for (fa_backend backend : {FA_BACKEND_CUDA_SM90, FA_BACKEND_CUDA_SM80}) {
    PagedCase c = make("no pages", backend, 128, 16, 2, {0, 0});
    PagedData g = paged_testing::make_data(c, 5);
    g.num_pages = 0;
    g.k_pages.clear();
    g.v_pages.clear();
    const Result r = run(c, g, true);
    if (r.status == FA_ERROR_UNSUPPORTED && sm90_unavailable_message(r.message)) continue;
    ASSERT_EQ(r.status, FA_OK) << r.message;
    EXPECT_EQ(paged_testing::check_written(c, g, r.out, r.lse), "");
  }
}

// The plan says which read path serves a page size (fa_forward_plan reports the kernels; a gathered plan needs the
// copies' workspace): sm90 reads every page size itself, sm80 reads a gathered copy. One split, so that the
// workspace holds no split-KV partials (the decode tiles' CTA slots make the plan split this call).
TEST(Paged, PlanReadsPagesNativelyOnSm90) {
  SKIP_WITHOUT_GPU();
  auto workspace = [](int64_t page, fa_backend backend = FA_BACKEND_CUDA_SM90) {
    PagedCase c = make("plan", backend, 128, page, 48 / page * 16, {16});
    c.num_splits = 1;
    const PagedData g = paged_testing::make_data(c, 1);
    const DeviceCall d(c, g, true);
    const fa_exec x = paged_testing::make_exec(c);
    fa_plan_info info{};
    const fa_status st = fa_forward_plan(&d.params, &x, &info);
    return std::make_pair(st == FA_OK ? info.workspace_bytes : int64_t(-1), std::string(fa_last_error()));
  };
  const auto [native, msg] = workspace(16);
  if (native < 0 && sm90_unavailable_message(msg)) GTEST_SKIP() << msg;
  ASSERT_GE(native, 0) << msg;
  const auto [rows, msg3] = workspace(3);
  ASSERT_GE(rows, 0) << msg3;
  const auto [gathered, msg80] = workspace(16, FA_BACKEND_CUDA_SM80);
  ASSERT_GE(gathered, 0) << msg80;
  EXPECT_LT(native, 1024) << "page 16 should be read by TMA, without a gathered copy";
  EXPECT_LT(rows, 1024) << "page 3 should be gathered row by row by the kernel, without a gathered copy";
  EXPECT_GT(gathered, native) << "sm80 reads the gathered copies";
}

}  // namespace
}  // namespace flashattn::gpu_testing
