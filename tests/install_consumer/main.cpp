// Calls the installed library's C ABI on CPU tensors and checks the result against a float64 attention written
// here, so that a broken install (wrong headers, a library without the CPU kernels, a missing runtime) fails.
#include <flashattn/flashattn.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

// Causal (bottom-right), default scale; (1, S, H, D) layout, one head group per head.
void reference(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, int sq, int sk,
               int h, int d, std::vector<double>& out) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  out.assign(static_cast<size_t>(sq) * h * d, 0.0);
  for (int head = 0; head < h; ++head) {
    for (int i = 0; i < sq; ++i) {
      const int last = i + (sk - sq);
      std::vector<double> s(static_cast<size_t>(last) + 1);
      double m = -INFINITY, sum = 0.0;
      for (int j = 0; j <= last; ++j) {
        double dot = 0.0;
        for (int x = 0; x < d; ++x) dot += double(q[(i * h + head) * d + x]) * k[(j * h + head) * d + x];
        s[j] = dot * scale;
        m = std::fmax(m, s[j]);
      }
      for (int j = 0; j <= last; ++j) sum += (s[j] = std::exp(s[j] - m));
      for (int j = 0; j <= last; ++j)
        for (int x = 0; x < d; ++x) out[(i * h + head) * d + x] += s[j] / sum * v[(j * h + head) * d + x];
    }
  }
}

}  // namespace

int main() {
  const int sq = 37, sk = 53, h = 2, d = 64;
  std::vector<float> q(sq * h * d), k(sk * h * d), v(sk * h * d), out(sq * h * d, NAN), lse(h * sq, NAN);
  unsigned state = 12345;
  auto next = [&state] { return (state = state * 1664525u + 1013904223u) / 4294967296.0f - 0.5f; };
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = 2.0f * next();

  const int64_t q_shape[4] = {1, sq, h, d}, kv_shape[4] = {1, sk, h, d}, lse_shape[3] = {1, h, sq};
  fa_fwd_params p;
  std::memset(&p, 0, sizeof p);
  p.attn = fa_attention_default();
  p.attn.q = fa_make_tensor(q.data(), FA_FLOAT32, FA_DEVICE_CPU, 4, q_shape);
  p.attn.k = fa_make_tensor(k.data(), FA_FLOAT32, FA_DEVICE_CPU, 4, kv_shape);
  p.attn.v = fa_make_tensor(v.data(), FA_FLOAT32, FA_DEVICE_CPU, 4, kv_shape);
  p.attn.causal = 1;
  p.out = fa_make_tensor(out.data(), FA_FLOAT32, FA_DEVICE_CPU, 4, q_shape);
  p.lse = fa_make_tensor(lse.data(), FA_FLOAT32, FA_DEVICE_CPU, 3, lse_shape);
  fa_exec exec = fa_exec_default();
  if (fa_forward(&p, &exec) != FA_OK) {
    std::fprintf(stderr, "fa_forward failed: %s\n", fa_last_error());
    return 1;
  }

  std::vector<double> want;
  reference(q, k, v, sq, sk, h, d, want);
  double err = 0.0;
  for (size_t i = 0; i < out.size(); ++i)
    err = std::isnan(out[i]) ? INFINITY : std::fmax(err, std::fabs(out[i] - want[i]));
  bool lse_ok = true;
  for (float x : lse) lse_ok = lse_ok && std::isfinite(x);
  // float32 storage and accumulation against float64: a few float32 ulps of |out| <= 1.
  const double tol = 1e-5;
  std::printf("flashattn consumer: backend %s, max error %.3g (tolerance %.1g), lse %s\n", fa_backend_name(&p, &exec),
              err, tol, lse_ok ? "finite" : "NOT finite");

  // A broken rule comes back as a status and a message naming the argument, not an abort.
  p.attn.k.shape[2] = 3;  // heads of q (2) not a multiple of heads of k (3)
  const fa_status bad = fa_forward(&p, &exec);
  const bool rejected = bad == FA_ERROR_INVALID_ARGUMENT && std::strstr(fa_last_error(), "k") != nullptr;
  std::printf("flashattn consumer: invalid call -> status %d, \"%s\"\n", static_cast<int>(bad), fa_last_error());

  const bool ok = err <= tol && lse_ok && rejected;
  std::printf("flashattn consumer: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
