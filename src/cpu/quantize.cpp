// fa_quantize_fp8 on the CPU (flashattn.h): per (batch, head) the maximum |x'| over the rows, then each row rotated
// again and rounded to e4m3 (round to nearest even, saturating). The rotation and the rounding are those of the
// CUDA kernel (src/cuda/quantize_fp8.cu), so both write the same bytes.
#include <cmath>
#include <vector>

#include "core/hadamard.hpp"
#include "core/problem.hpp"
#include "cpu/numeric.hpp"

namespace flashattn::detail {

Error quantize_fp8_cpu(const QuantizeProblem& p) {
  using namespace flashattn::cpu;
  const int64_t d = p.dim;
  const float inv_sqrt = p.hadamard ? 1.f / std::sqrt(float(d)) : 1.f;
  std::vector<float> row(static_cast<size_t>(d)), sign(static_cast<size_t>(d), 1.f);
  if (p.hadamard)
    for (int64_t c = 0; c < d; ++c) sign[size_t(c)] = float(detail::hadamard_sign(p.seed, int(c)));
  auto rotated = [&](int64_t b, int64_t s, int64_t h) {
    const int64_t base = b * p.x_batch + s * p.x_row + h * p.x_head;
    for (int64_t c = 0; c < d; ++c) row[size_t(c)] = load_float(p.dtype, p.x, base + c) * sign[size_t(c)];
    if (p.hadamard) detail::walsh_hadamard(row.data(), int(d), inv_sqrt);
  };
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      float amax = 0.f;
      bool nan = false;
      for (int64_t s = 0; s < p.seqlen; ++s) {
        rotated(b, s, h);
        for (float x : row) {
          nan |= std::isnan(x);
          amax = std::fmax(amax, std::fabs(x));
        }
      }
      // NaN inputs: the factor is NaN too (as the CUDA kernel's maximum of the bits is), so the rows say so.
      const float descale = nan ? std::nanf("") : detail::fp8_descale_of(amax);
      p.descale[b * p.descale_batch + h * p.descale_head] = descale;
      for (int64_t s = 0; s < p.seqlen; ++s) {
        rotated(b, s, h);
        uint8_t* out = p.out + b * p.out_batch + s * p.out_row + h * p.out_head;
        for (int64_t c = 0; c < d; ++c) out[c] = float_to_e4m3(row[size_t(c)] / descale);
      }
    }
  return detail::ok();
}

}  // namespace flashattn::detail
