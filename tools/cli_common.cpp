#include "cli_common.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <new>
#include <sstream>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#include "core/problem.hpp"
#include "cpu/numeric.hpp"
#include "cpu/reference.hpp"

#ifdef FLASHATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace flashattn::cli {

std::string Shape::describe() const {
  std::ostringstream s;
  s << "B=" << batch << " Sq=" << seqlen_q << " Sk=" << seqlen_k << " H=" << heads;
  if (hkv() != heads) s << " Hkv=" << hkv();
  s << " D=" << head_dim;
  if (dv() != head_dim) s << " Dv=" << dv();
  s << " " << dtype_name(dtype);
  if (causal) s << (top_left ? " causal(top-left)" : " causal");
  if (window_left >= 0 || window_right >= 0) s << " window(" << window_left << "," << window_right << ")";
  if (softcap > 0) s << " softcap=" << softcap;
  if (alibi) s << " alibi";
  return s.str();
}

namespace {
// A window side reaching past both sequences is unbounded (as in the library): clamping it keeps the mask
// arithmetic below free of overflow for any int64 the user gives.
int64_t clamp_window(const Shape& s, int64_t w) { return w < 0 ? w : std::min(w, std::max(s.seqlen_q, s.seqlen_k)); }
}  // namespace

double forward_flops(const Shape& s) {
  // Count the (query, key) pairs the mask keeps, so causal and windows are credited only with real work.
  double pairs = 0;
  const int64_t off = s.top_left ? 0 : s.seqlen_k - s.seqlen_q;
  const int64_t right = s.causal ? 0 : clamp_window(s, s.window_right), left = clamp_window(s, s.window_left);
  if (!s.causal && s.window_left < 0 && s.window_right < 0) {
    pairs = double(s.seqlen_q) * double(s.seqlen_k);
  } else if (s.causal && s.window_left < 0) {
    pairs = double(s.seqlen_q) * double(s.seqlen_k) / 2;  // the convention peers report causal FLOPs by
  } else {
    for (int64_t i = 0; i < s.seqlen_q; ++i) {
      int64_t lo = left >= 0 ? std::max<int64_t>(0, i + off - left) : 0;
      int64_t hi = right >= 0 ? std::min<int64_t>(s.seqlen_k, i + off + right + 1) : s.seqlen_k;
      pairs += double(std::max<int64_t>(0, hi - lo));
    }
  }
  return 2.0 * double(s.batch) * double(s.heads) * pairs * double(s.head_dim + s.dv());
}

IoPicture io_picture(const Shape& s, int block_q, int block_k) {
  const double e = double(dtype_size(s.dtype));
  const double bh = double(s.batch) * double(s.heads), dims = double(s.head_dim) + double(s.dv());
  const double qkvo = bh * (double(s.seqlen_q) * dims) + double(s.batch) * double(s.hkv()) * double(s.seqlen_k) * dims;
  IoPicture io;
  // Standard: S = QK^T written, read by softmax, P written, read by PV: four N^2 passes.
  io.standard_bytes = e * (qkvo + 4.0 * bh * double(s.seqlen_q) * double(s.seqlen_k));
  // Fused: Q read and O written once; each query block streams the K/V blocks its mask reaches; LSE out.
  double kv_blocks = 0;
  if (block_q > 0 && block_k > 0) {
    const int64_t off = s.top_left ? 0 : s.seqlen_k - s.seqlen_q;
    const int64_t right = s.causal ? 0 : clamp_window(s, s.window_right), left = clamp_window(s, s.window_left);
    for (int64_t i0 = 0; i0 < s.seqlen_q; i0 += block_q) {
      int64_t i1 = std::min<int64_t>(s.seqlen_q, i0 + block_q) - 1;
      int64_t lo = left >= 0 ? std::max<int64_t>(0, i0 + off - left) : 0;
      int64_t hi = right >= 0 ? std::min<int64_t>(s.seqlen_k, i1 + off + right + 1) : s.seqlen_k;
      if (hi > lo)
        kv_blocks +=
            double(std::min<int64_t>(s.seqlen_k, (hi + block_k - 1) / block_k * block_k) - lo / block_k * block_k);
    }
  }
  io.fused_bytes = e * (bh * double(s.seqlen_q) * dims + bh * kv_blocks * dims) + 4.0 * bh * double(s.seqlen_q);
  return io;
}

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", b, unit[u]);
  return buf;
}

namespace {

// A buffer on the device the run uses, with host staging for inputs and checks.
class Buffer {
 public:
  Buffer(size_t bytes, bool cuda) : bytes_(bytes), cuda_(cuda) {
#ifdef FLASHATTN_WITH_CUDA
    if (cuda_) {
      if (cudaMalloc(&ptr_, bytes_ ? bytes_ : 1) != cudaSuccess) ptr_ = nullptr;
      return;
    }
#endif
    host_.resize(bytes_ ? bytes_ : 1);
    ptr_ = host_.data();
  }
  ~Buffer() {
#ifdef FLASHATTN_WITH_CUDA
    if (cuda_ && ptr_) cudaFree(ptr_);
#endif
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return ptr_; }
  void upload(const std::vector<uint8_t>& h) {
#ifdef FLASHATTN_WITH_CUDA
    if (cuda_) {
      cudaMemcpy(ptr_, h.data(), bytes_, cudaMemcpyHostToDevice);
      return;
    }
#endif
    std::memcpy(ptr_, h.data(), bytes_);
  }
  void fill(uint8_t byte) {
#ifdef FLASHATTN_WITH_CUDA
    if (cuda_) {
      cudaMemset(ptr_, byte, bytes_);
      return;
    }
#endif
    std::memset(ptr_, byte, bytes_);
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> h(bytes_);
#ifdef FLASHATTN_WITH_CUDA
    if (cuda_) {
      cudaMemcpy(h.data(), ptr_, bytes_, cudaMemcpyDeviceToHost);
      return h;
    }
#endif
    std::memcpy(h.data(), ptr_, bytes_);
    return h;
  }

 private:
  size_t bytes_;
  bool cuda_;
  void* ptr_ = nullptr;
  std::vector<uint8_t> host_;
};

// splitmix64 + Box-Muller: fast, reproducible N(0, 1) samples.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (double(next() >> 11) + 0.5) * 0x1p-53; }
  double normal() {
    const double two_pi = 2.0 * std::acos(-1.0);
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(two_pi * uniform());
  }
};

// n values of N(0, 1) in dtype t, written to h.
void fill_random(uint8_t* h, size_t n, fa_dtype t, Rng& rng) {
  for (size_t i = 0; i < n; ++i) {
    float x = float(rng.normal());
    if (t == FA_FLOAT8_E4M3) {
      h[i] = cpu::float_to_e4m3(x);
    } else if (t == FA_FLOAT32) {
      std::memcpy(&h[i * 4], &x, 4);
    } else {
      uint16_t v = t == FA_BFLOAT16 ? cpu::float_to_bf16(x) : cpu::float_to_fp16(x);
      std::memcpy(&h[i * 2], &v, 2);
    }
  }
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median time of fn over warmup + timed repetitions; CUDA work is synchronised before each clock read.
template <class F>
double time_median(F&& fn, bool cuda, const Options& o, bool* ok) {
  auto sync = [&] {
#ifdef FLASHATTN_WITH_CUDA
    if (cuda) cudaDeviceSynchronize();
#endif
  };
  for (int i = 0; i < o.warmup; ++i) *ok = *ok && fn();
  sync();
  std::vector<double> times;
  const double budget_ms = cuda ? 300 : 1500;
  const int max_iters = o.iters > 0 ? o.iters : (cuda ? 100 : 5);
  double total = 0;
  while (*ok && int(times.size()) < max_iters && (o.iters > 0 || total < budget_ms || times.empty())) {
    double t0 = now_ms();
    *ok = fn();
    sync();
    times.push_back(now_ms() - t0);
    total += times.back();
  }
  if (times.empty()) return 0;
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

namespace {

// n = product of the factors, false when it does not fit in size_t.
bool checked_product(std::initializer_list<int64_t> factors, size_t* n) {
  size_t p = 1;
  for (int64_t f : factors)
    if (f < 0 || __builtin_mul_overflow(p, size_t(f), &p)) return false;
  *n = p;
  return true;
}

RunResult run_attention_impl(const Shape& s, const Options& o) {
  RunResult r;
  const bool cuda = o.backend == FA_BACKEND_CUDA_SM80 || o.backend == FA_BACKEND_CUDA_SM90 ||
                    (o.backend == FA_BACKEND_AUTO && fa_cuda_available());
  const fa_device dev = cuda ? FA_DEVICE_CUDA : FA_DEVICE_CPU;
  // An explicit CUDA backend without a device would otherwise fail at the first device allocation, as if memory
  // were short.
  if (cuda && !fa_cuda_available()) {
    r.error = std::string("--backend ") + (o.backend == FA_BACKEND_CUDA_SM80 ? "cuda-sm80" : "cuda-sm90") +
              ": no CUDA device is available (not built with CUDA, or no GPU on this machine)";
    return r;
  }
  const int64_t B = s.batch, Sq = s.seqlen_q, Sk = s.seqlen_k, H = s.heads, Hk = s.hkv(), D = s.head_dim, Dv = s.dv();
  const size_t e = dtype_size(s.dtype);
  // out (and the backward's tensors): bfloat16 for FP8 inputs (flashattn.h).
  const fa_dtype out_dtype = s.dtype == FA_FLOAT8_E4M3 ? FA_BFLOAT16 : s.dtype;
  const size_t eo = dtype_size(out_dtype);
  size_t nq = 0, nk = 0, nv = 0, no = 0, nl = 0, bytes = 0;
  // Element counts and byte sizes must not wrap (a wrapped size would allocate a small buffer for a big problem).
  if (!checked_product({B, Sq, H, D, int64_t(e)}, &bytes) || !checked_product({B, Sk, Hk, D, int64_t(e)}, &bytes) ||
      !checked_product({B, Sk, Hk, Dv, int64_t(e)}, &bytes) || !checked_product({B, Sq, H, Dv, int64_t(eo)}, &bytes) ||
      !checked_product({B, Sq, H, D, int64_t(eo)}, &bytes) || !checked_product({B, Sk, Hk, Dv, int64_t(eo)}, &bytes) ||
      !checked_product({B, H, Sq, 4}, &bytes)) {
    r.error = "problem too large: its tensor sizes overflow 64-bit byte counts (" + s.describe() + ")";
    return r;
  }
  checked_product({B, Sq, H, D}, &nq);
  checked_product({B, Sk, Hk, D}, &nk);
  checked_product({B, Sk, Hk, Dv}, &nv);
  checked_product({B, Sq, H, Dv}, &no);
  checked_product({B, H, Sq}, &nl);
  // The problem's tensors, in the order their buffers are laid out.
  enum : int { kQ, kK, kV, kOut, kLse, kDout, kDq, kDk, kDv, kAlibi, kTensors };
  const size_t bytes_of[kTensors] = {nq * e,  nk * e,  nv * e,  no * eo, nl * 4,
                                     no * eo, nq * eo, nk * eo, nv * eo, size_t(H) * 4};
  FwdParams fp = make_fwd_params();
  BwdParams bp = make_bwd_params();
  // Both calls' parameters on the tensors at ptr[], on device d.
  auto describe = [&](void* const* ptr, fa_device d) {
    fa_attention a = fa_attention_default();
    a.q = make_tensor(ptr[kQ], s.dtype, {B, Sq, H, D}, d);
    a.k = make_tensor(ptr[kK], s.dtype, {B, Sk, Hk, D}, d);
    a.v = make_tensor(ptr[kV], s.dtype, {B, Sk, Hk, Dv}, d);
    a.causal = s.causal;
    a.causal_alignment = s.top_left ? FA_ALIGN_TOP_LEFT : FA_ALIGN_BOTTOM_RIGHT;
    a.window_left = s.window_left;
    a.window_right = s.window_right;
    a.softcap = s.softcap;
    if (s.alibi) a.alibi_slopes = make_tensor(ptr[kAlibi], FA_FLOAT32, {H}, d);
    fp.attn = bp.attn = a;
    fp.out = bp.out = make_tensor(ptr[kOut], out_dtype, {B, Sq, H, Dv}, d);
    fp.lse = bp.lse = make_tensor(ptr[kLse], FA_FLOAT32, {B, H, Sq}, d);
    bp.dout = make_tensor(ptr[kDout], out_dtype, {B, Sq, H, Dv}, d);
    bp.dq = make_tensor(ptr[kDq], out_dtype, {B, Sq, H, D}, d);
    bp.dk = make_tensor(ptr[kDk], out_dtype, {B, Sk, Hk, D}, d);
    bp.dv = make_tensor(ptr[kDv], out_dtype, {B, Sk, Hk, Dv}, d);
  };

  // The shape rules before any tensor exists: the library's validation of the described tensors at addresses that
  // are never read (disjoint 256-byte aligned ranges), so that a shape it rejects gets its error at once instead of
  // after minutes of drawing tensors of a size it cannot take (--hdim 100000 drew 3 GB first). The call validates
  // again for its backend.
  size_t total = 0;
  {
    void* at[kTensors];
    uintptr_t next = uintptr_t(1) << 20;
    bool fits = true;
    for (int t = 0; t < kTensors; ++t) {
      at[t] = reinterpret_cast<void*>(next);
      fits = fits && !__builtin_add_overflow(next, (bytes_of[t] | 255u) + 1, &next) &&
             !__builtin_add_overflow(total, bytes_of[t], &total);
    }
    if (fits) {
      describe(at, FA_DEVICE_CPU);
      detail::Problem shape;
      const detail::Requirements any{0, 0, true, "cli"};
      detail::Error ve = detail::validate(fp.attn, fp.out, fp.lse, nullptr, nullptr, nullptr, nullptr,
                                          detail::Direction::kForward, any, nullptr, nullptr, nullptr, &shape);
      if (ve.ok() && o.backward)
        ve = detail::validate(bp.attn, bp.out, bp.lse, &bp.dout, &bp.dq, &bp.dk, &bp.dv, detail::Direction::kBackward,
                              any, nullptr, nullptr, nullptr, &shape);
      if (!ve.ok()) {
        r.error = ve.message;
        return r;
      }
    }
  }
  // Host memory: the tensors themselves on the CPU, else host copies of the inputs (and, with --check, of the
  // outputs read back). Past the machine's memory the allocations could succeed (overcommit) and the process be
  // killed while the values are drawn; say so instead.
  {
    size_t host = cuda ? bytes_of[kQ] + bytes_of[kK] + bytes_of[kV] + bytes_of[kDout] : total;
    if (o.check) host += bytes_of[kOut] + bytes_of[kLse] + (o.backward ? bytes_of[kDq] : 0);
#if defined(_SC_PHYS_PAGES)
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
#else
    const long pages = 0, page = 0;  // unknown: no check
#endif
    if (pages > 0 && page > 0 && double(host) > double(pages) * double(page)) {
      std::ostringstream m;
      m << "problem too large for this machine: its tensors need " << double(host) / double(1ull << 30)
        << " GiB of host memory, the machine has " << double(pages) * double(page) / double(1ull << 30) << " GiB ("
        << s.describe() << ")";
      r.error = m.str();
      return r;
    }
  }

  std::vector<float> slopes(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) slopes[size_t(h)] = float(std::pow(2.0, -8.0 * double(h + 1) / double(H)));
  Buffer q(bytes_of[kQ], cuda), k(bytes_of[kK], cuda), v(bytes_of[kV], cuda), out(bytes_of[kOut], cuda),
      lse(bytes_of[kLse], cuda), dout(bytes_of[kDout], cuda), dq(bytes_of[kDq], cuda), dk(bytes_of[kDk], cuda),
      dv(bytes_of[kDv], cuda), alibi(bytes_of[kAlibi], cuda);
  Buffer* buffers[kTensors] = {&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv, &alibi};
  for (Buffer* b : buffers)
    if (!b->data()) {
      r.error = std::string("out of ") + (cuda ? "device" : "host") + " memory allocating the problem's tensors";
      return r;
    }
  // The inputs' values, drawn in place on the CPU and through host copies (kept for the check) for CUDA.
  Rng rng{o.seed};
  std::vector<uint8_t> staged[kTensors];
  const uint8_t* host_of[kTensors] = {};
  auto draw = [&](int t, size_t n, fa_dtype dtype, const void* values = nullptr) {
    uint8_t* h = static_cast<uint8_t*>(buffers[t]->data());
    if (cuda) {
      staged[t].resize(bytes_of[t]);
      h = staged[t].data();
    }
    if (values != nullptr)
      std::memcpy(h, values, bytes_of[t]);
    else
      fill_random(h, n, dtype, rng);
    if (cuda) buffers[t]->upload(staged[t]);
    host_of[t] = h;
  };
  draw(kQ, nq, s.dtype);
  draw(kK, nk, s.dtype);
  draw(kV, nv, s.dtype);
  draw(kDout, no, out_dtype);
  draw(kAlibi, 0, FA_FLOAT32, slopes.data());
  // Poison the outputs: a row the kernel forgets to write stays NaN and fails the check.
  out.fill(0xff);
  lse.fill(0xff);

  void* at[kTensors];
  for (int t = 0; t < kTensors; ++t) at[t] = buffers[t]->data();
  describe(at, dev);
  fa_exec ex = fa_exec_default();
  ex.backend = o.backend;
  ex.num_threads = o.threads;

  r.backend = fa_backend_name(&fp, &ex);
  r.fwd_plan_ok = fa_forward_plan(&fp, &ex, &r.fwd_plan) == FA_OK;
  if (o.backward) r.bwd_plan_ok = fa_backward_plan(&bp, &ex, &r.bwd_plan) == FA_OK;
  if (r.fwd_plan_ok) {
    r.block_q = r.fwd_plan.block_q;
    r.block_k = r.fwd_plan.block_k;
  }
  bool ok = true;
  std::string err;
  auto fwd = [&] {
    Status st = forward(fp, ex);
    if (!st.ok()) err = st.message;
    return st.ok();
  };
  auto bwd = [&] {
    Status st = backward(bp, ex);
    if (!st.ok()) err = st.message;
    return st.ok();
  };
  const double flops = forward_flops(s);
  r.fwd_ms = time_median(fwd, cuda, o, &ok);
  if (ok) r.fwd_tflops = flops / (r.fwd_ms * 1e9);
  if (ok && o.backward) {
    r.bwd_ms = time_median(bwd, cuda, o, &ok);
    if (ok) r.bwd_tflops = 2.5 * flops / (r.bwd_ms * 1e9);
  }
  if (!ok) {
    r.error = err;
    return r;
  }
  r.ok = true;
  if (!o.check) return r;

  // Check sampled rows against the float64 reference, on host copies.
  std::vector<uint8_t> ho = out.download(), hl = lse.download(),
                       hdq = o.backward ? dq.download() : std::vector<uint8_t>();
  FwdParams hp = make_fwd_params();
  hp.attn = fp.attn;
  hp.attn.q.data = const_cast<uint8_t*>(host_of[kQ]);
  hp.attn.k.data = const_cast<uint8_t*>(host_of[kK]);
  hp.attn.v.data = const_cast<uint8_t*>(host_of[kV]);
  hp.attn.alibi_slopes.data = s.alibi ? const_cast<uint8_t*>(host_of[kAlibi]) : nullptr;
  hp.out = fp.out;
  hp.out.data = ho.data();
  hp.lse = fp.lse;
  hp.lse.data = hl.data();
  for (fa_tensor* t : {&hp.attn.q, &hp.attn.k, &hp.attn.v, &hp.attn.alibi_slopes, &hp.out, &hp.lse})
    t->device = FA_DEVICE_CPU;
  // The forward's validation describes the problem; the reference's dQ rows also read dout and the
  // computed dq, whose (contiguous, batched) layouts are set here.
  detail::Problem p;
  const detail::Requirements host_req{0, 1, true, "reference"};
  detail::Error ve = detail::validate(hp.attn, hp.out, hp.lse, nullptr, nullptr, nullptr, nullptr,
                                      detail::Direction::kForward, host_req, nullptr, nullptr, nullptr, &p);
  if (!ve.ok()) {
    r.error = "check: " + ve.message;
    r.ok = false;
    return r;
  }
  p.dout = host_of[kDout];
  p.dout_layout = detail::RowLayout{bp.dout.stride[0], bp.dout.stride[1], bp.dout.stride[2], false};
  p.dq = o.backward ? hdq.data() : nullptr;
  p.dq_layout = detail::RowLayout{bp.dq.stride[0], bp.dq.stride[1], bp.dq.stride[2], false};
  reference::Comparison cmp(s.dtype), cmp_dq(s.dtype);
  Rng pick{o.seed + 1};
  // An empty problem has no row to sample (and B, H or Sq of 0 must not be taken modulo).
  const int kSamples = B > 0 && H > 0 && Sq > 0 ? 48 : 0;
  r.checked_rows = kSamples;
  std::vector<double> exact(size_t(std::max(Dv, D))), plain(exact.size()), noise(exact.size());
  for (int n = 0; n < kSamples; ++n) {
    // Always the first and last query rows (mask edges), the rest at random.
    int64_t b = int64_t(pick.next() % uint64_t(B)), h = int64_t(pick.next() % uint64_t(H));
    int64_t i = n == 0 ? 0 : n == 1 ? Sq - 1 : int64_t(pick.next() % uint64_t(Sq));
    double lse_exact, lse_plain;
    reference::forward_row(p, reference::Rounding::kExact, b, h, i, exact.data(), &lse_exact);
    reference::forward_row(p, reference::Rounding::kStorage, b, h, i, plain.data(), &lse_plain);
    for (int64_t c = 0; c < Dv; ++c)
      cmp.add(reference::load(p, p.out, p.out_layout, b, i, h, c), exact[size_t(c)], plain[size_t(c)]);
    if (o.backward) {
      reference::backward_dq_row(p, reference::Rounding::kExact, b, h, i, exact.data(), noise.data());
      reference::backward_dq_row(p, reference::Rounding::kStorage, b, h, i, plain.data());
      for (int64_t c = 0; c < D; ++c)
        cmp_dq.add(reference::load(p, p.dq, p.dq_layout, b, i, h, c), exact[size_t(c)], plain[size_t(c)],
                   noise[size_t(c)]);
    }
  }
  r.max_err = cmp.max_err();
  r.mean_err = cmp.mean_err();
  r.tol = cmp.tolerance();
  r.check_passed = cmp.passed();
  if (o.backward) {
    r.dq_max_err = cmp_dq.max_err();
    r.dq_tol = cmp_dq.tolerance();
    r.check_passed = r.check_passed && cmp_dq.passed();
  }
  return r;
}

}  // namespace

RunResult run_attention(const Shape& s, const Options& o) {
  try {
    return run_attention_impl(s, o);
  } catch (const std::bad_alloc&) {
    RunResult r;
    r.error = "out of memory allocating the problem's tensors (" + s.describe() + ")";
    return r;
  }
}

}  // namespace flashattn::cli
