// fa_forward_probs on the host (flashattn.h): the attention probabilities of a forward call, from the float64
// reference's logits and softmax (the rule every backend's forward is checked against), rounded once, with the
// dropout mask of core/dropout.hpp as their sign. Materialises Sq x Sk per head: a tool for small shapes.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/problem.hpp"
#include "cpu/reference.hpp"

namespace flashattn::detail {

Error forward_probs_cpu(const Problem& p, float* probs) {
  const int64_t sq = p.seqlen_q, sk = p.seqlen_k;
  if (p.batch * p.heads_q * sq * sk == 0) return ok();  // nothing to write (probs may be null)
  std::vector<double> row(size_t(sk > 0 ? sk : 1));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      float* head = probs + (b * p.heads_q + h) * sq * sk;
      std::fill(head, head + sq * sk, 0.f);
      const int64_t lq = p.len_q(b), lk = p.len_k(b);
      for (int64_t i = 0; i < lq; ++i) {
        reference::probs_row(p, b, h, i, row.data());
        for (int64_t j = 0; j < lk; ++j) {
          const float x = float(row[size_t(j)]);
          head[i * sk + j] = p.dropout.factor(b, p.heads_q, h, i, j) == 0.f ? -x : x;
        }
      }
    }
  return ok();
}

}  // namespace flashattn::detail
