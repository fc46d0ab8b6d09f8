// fa_merge_partials on the CPU (flashattn.h): each (batch, row, head) of (out, lse) takes in (out_b, lse_b) by the
// merge rule of core/merge_rule.hpp, the one the CUDA merge and the split-KV combine follow. In float32, rounded to
// out's dtype once. One pass over memory; a ring step's attention costs far more, so it runs on the calling thread.
#include "core/merge_rule.hpp"
#include "core/problem.hpp"
#include "cpu/numeric.hpp"

namespace flashattn::detail {

Error merge_partials_cpu(const MergeProblem& p) {
  using namespace flashattn::cpu;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.seqlen; ++i)
      for (int64_t h = 0; h < p.heads; ++h) {
        float& lse = p.lse[b * p.lse_batch + h * p.lse_head + i * p.lse_row];
        const float lse_b = p.lse_b[b * p.lse_b_batch + h * p.lse_b_head + i * p.lse_b_row];
        float merged, wa, wb;
        LseMerge::two(lse, lse_b, &merged, &wa, &wb);
        const int64_t o = b * p.out_batch + i * p.out_row + h * p.out_head;
        const int64_t ob = b * p.out_b_batch + i * p.out_b_row + h * p.out_b_head;
        for (int64_t c = 0; c < p.dim; ++c) {
          // A part of weight 0 is not read (its out may hold anything); NaN weights are read and propagate.
          float x = wa == 0.f ? 0.f : wa * load_float(p.out_dtype, p.out, o + c);
          if (wb != 0.f) x += wb * load_float(p.out_b_dtype, p.out_b, ob + c);
          store_float(p.out_dtype, p.out, o + c, x);
        }
        lse = merged;
      }
  return ok();
}

}  // namespace flashattn::detail
