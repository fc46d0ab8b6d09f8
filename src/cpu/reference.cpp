#include "cpu/reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "cpu/numeric.hpp"

namespace flashattn::reference {

using detail::Problem;

double load(const Problem& p, const void* base, const detail::RowLayout& l, int64_t b, int64_t r, int64_t h,
            int64_t c) {
  const int64_t off = p.offset(l, b, r, h) + c;
  // FP8: the stored value times its tensor's factor (q, k and v only; the backward's tensors are never FP8).
  if (p.fp8() && (base == p.q || base == p.k || base == p.v)) {
    const detail::Descale& d = base == p.q ? p.q_descale : base == p.k ? p.k_descale : p.v_descale;
    return double(cpu::e4m3_to_float(static_cast<const uint8_t*>(base)[off])) * double(d.at(b, h));
  }
  const fa_dtype dtype = base == p.q || base == p.k || base == p.v ? p.dtype : p.out_dtype;
  switch (dtype) {
    case FA_FLOAT32: return static_cast<const float*>(base)[off];
    case FA_FLOAT16: return cpu::fp16_to_float(static_cast<const uint16_t*>(base)[off]);
    case FA_BFLOAT16: return cpu::bf16_to_float(static_cast<const uint16_t*>(base)[off]);
    default: return std::numeric_limits<double>::quiet_NaN();
  }
}

namespace {

double abs_diff(double a, double b) {
  if (std::isinf(a) && std::isinf(b) && (a > 0) == (b > 0)) return 0;
  return std::fabs(a - b);
}

// Relative spacing of the storage format near 1 (one ulp).
double storage_eps(fa_dtype t) {
  switch (t) {
    case FA_BFLOAT16: return 0x1p-7;
    case FA_FLOAT8_E4M3: return 0x1p-7;  // FP8 inputs write bfloat16
    case FA_FLOAT16: return 0x1p-10;
    // fp32 output: the floor covers fp32 accumulation over long rows, far below any real defect.
    default: return 1e-6;
  }
}

}  // namespace

void Comparison::add(double ours, double exact, double plain, double noise) {
  if (std::isnan(exact)) {  // NaN inputs: the reference says NaN, ours must too
    nan_ |= !std::isnan(ours);
    return;
  }
  if (std::isnan(ours)) {
    nan_ = true;
    return;
  }
  const double e = abs_diff(ours, exact);
  max_err_ = std::max(max_err_, e);
  if (!std::isfinite(noise)) noise = 0;  // an overflowing allowance must not excuse everything
  max_excess_ = std::max(max_excess_, e - noise);
  max_noise_ = std::max(max_noise_, noise);
  sum_err_ += e;
  ++count_;
  plain_max_err_ = std::max(plain_max_err_, abs_diff(plain, exact));
  if (std::isfinite(exact)) ref_max_abs_ = std::max(ref_max_abs_, std::fabs(exact));
}

double Comparison::tolerance() const { return 2 * plain_max_err_ + storage_eps(dtype_) * std::max(1.0, ref_max_abs_); }

std::string Comparison::summary() const {
  char buf[260];
  int n = std::snprintf(buf, sizeof buf, "max_err %.3e mean_err %.3e tol %.3e (plain %.3e)", max_err_, mean_err(),
                        tolerance(), plain_max_err_);
  if (max_noise_ > 0 && n > 0 && size_t(n) < sizeof buf)
    n += std::snprintf(buf + n, sizeof buf - size_t(n), " excess %.3e (fp32 noise allowance <= %.3e)", max_excess_,
                       max_noise_);
  if (nan_ && n > 0 && size_t(n) < sizeof buf) std::snprintf(buf + n, sizeof buf - size_t(n), " NaN!");
  return buf;
}

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double round_storage(fa_dtype t, double x) {
  switch (t) {
    case FA_FLOAT16: return cpu::round_to<FA_FLOAT16>(float(x));
    case FA_BFLOAT16:
    case FA_FLOAT8_E4M3: return cpu::round_to<FA_BFLOAT16>(float(x));  // FP8: scores and out as bfloat16
    default: return double(float(x));
  }
}

// The plain implementation rounds what an unfused framework stores (scores, probabilities, outputs) to the storage
// dtype and accumulates its sums in fp32, as its matmuls and reductions do; the exact reference does neither.
// (With fp32 storage the first alone left the plain error at the output rounding, below what any fp32
// implementation's long reductions reach, and a correct fp32 backward could fail the 2x rule.)
struct Rounder {
  fa_dtype t;
  bool on;
  double operator()(double x) const { return on ? round_storage(t, x) : x; }
  // acc + term, as an fp32 accumulator holds it.
  double add(double acc, double term) const { return on ? double(float(acc + term)) : acc + term; }
};

int64_t global_q(const Problem& p, int64_t b, int64_t r) { return p.varlen ? p.host_cu_q[b] + r : b * p.seqlen_q + r; }
int64_t global_k(const Problem& p, int64_t b, int64_t r) { return p.varlen ? p.host_cu_k[b] + r : b * p.seqlen_k + r; }

// Logits of row i against every key (masked: -inf); `capped` receives softcap's tanh values.
void logits(const Problem& p, const Rounder& rnd, int64_t b, int64_t h, int64_t i, std::vector<double>* s,
            std::vector<double>* tanh_vals) {
  const int64_t lq = p.len_q(b), lk = p.len_k(b), hk = h / p.group();
  const detail::KeyRange kr = detail::visible_keys(p, i, lq, lk);
  const int64_t diag = i + detail::mask_offset(p, lq, lk);
  const double slope = p.alibi_slope(b, h);
  s->assign(size_t(lk), kNegInf);
  tanh_vals->assign(size_t(lk), 0.0);
  for (int64_t j = 0; j < lk; ++j) {
    double dot = 0;
    for (int64_t c = 0; c < p.head_dim; ++c)
      dot = rnd.add(dot, load(p, p.q, p.q_layout, b, i, h, c) * load(p, p.k, p.k_layout, b, j, hk, c));
    double x = rnd(rnd(dot) * p.scale);
    if (p.softcap > 0) {
      (*tanh_vals)[j] = std::tanh(x / p.softcap);
      x = rnd(p.softcap * (*tanh_vals)[j]);
    }
    x -= slope * std::fabs(double(diag - j));
    if (j >= kr.lo && j < kr.hi) (*s)[j] = x;
  }
}

// Softmax of one row in place, with the sink logit (-inf: none) in the denominator; returns the LSE (-inf when
// nothing is visible and there is no sink, the row then all 0).
double softmax(std::vector<double>* s, double sink) {
  double m = std::isnan(sink) ? kNegInf : sink;
  bool nan = std::isnan(sink);
  for (double x : *s) {
    nan |= std::isnan(x);
    m = std::max(m, x);
  }
  if (nan) {
    for (double& x : *s) x = std::numeric_limits<double>::quiet_NaN();
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (m == kNegInf) {
    for (double& x : *s) x = 0;
    return kNegInf;
  }
  double l = sink == kNegInf ? 0.0 : std::exp(sink - m);
  for (double& x : *s) {
    x = std::exp(x - m);
    l += x;
  }
  for (double& x : *s) x /= l;
  return m + std::log(l);
}

}  // namespace

void probs_row(const Problem& p, int64_t b, int64_t h, int64_t i, double* probs) {
  std::vector<double> s, th;
  logits(p, Rounder{p.dtype, false}, b, h, i, &s, &th);
  softmax(&s, p.sink(h));
  std::copy(s.begin(), s.end(), probs);
}

void forward_row(const Problem& p, Rounding rounding, int64_t b, int64_t h, int64_t i, double* out_row, double* lse) {
  const Rounder rnd{p.dtype, rounding == Rounding::kStorage};
  std::vector<double> s, th;
  logits(p, rnd, b, h, i, &s, &th);
  double m = p.sink(h);
  for (double x : s) m = std::max(m, x);
  *lse = softmax(&s, p.sink(h));
  for (size_t j = 0; j < s.size(); ++j) s[j] *= p.dropout.factor(b, p.heads_q, h, i, int64_t(j));
  // FP8's plain implementation (FlashAttention-3's): each probability relative to the row's maximum, e^(s - m) in
  // [0, 1], rounded to e4m3 for the P.V product, then normalised. (Normalised probabilities of a long row would
  // mostly fall below e4m3's subnormals.)
  const bool fp8_probs = rnd.on && p.fp8() && std::isfinite(m) && std::isfinite(*lse);
  for (double& x : s)
    x = fp8_probs ? double(cpu::e4m3_to_float(cpu::float_to_e4m3(float(x * std::exp(*lse - m))))) * std::exp(m - *lse)
                  : rnd(x);
  const int64_t hk = h / p.group();
  for (int64_t c = 0; c < p.head_dim_v; ++c) {
    double acc = 0;
    for (size_t j = 0; j < s.size(); ++j) acc = rnd.add(acc, s[j] * load(p, p.v, p.v_layout, b, int64_t(j), hk, c));
    out_row[c] = rnd(acc);
  }
}

void forward(const Problem& p, Rounding rounding, Forward* r) {
  const int64_t rows = p.total_q, dv = p.head_dim_v;
  r->out.assign(size_t(p.heads_q * rows * dv), 0.0);
  r->lse.assign(size_t(p.heads_q * rows), 0.0);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.len_q(b); ++i) {
        const int64_t g = global_q(p, b, i);
        forward_row(p, rounding, b, h, i, &r->out[size_t((h * rows + g) * dv)], &r->lse[size_t(h * rows + g)]);
      }
}

namespace {

// The unit roundoff of an fp32 accumulator.
constexpr double kFp32Unit = 0x1p-24;

// Gradients of one query row: accumulates into dq_row (always) and dk/dv (when given). With dq_noise (exact pass
// only) also the rounding noise allowances of dq_row and, with g, of g->dk_noise (Grads).
void backward_row(const Problem& p, const Rounder& rnd, int64_t b, int64_t h, int64_t i, double* dq_row, Grads* g,
                  double* dq_noise) {
  const int64_t hk = h / p.group(), d = p.head_dim, dv = p.head_dim_v;
  std::vector<double> s, th;
  logits(p, rnd, b, h, i, &s, &th);
  const double sink = p.sink(h);
  const double lse = softmax(&s, sink);
  for (double& x : s) x = rnd(x);
  const size_t n = s.size();
  const bool noise = dq_noise != nullptr && !rnd.on;
  // Dropout: Z = P * m / (1 - p) reaches V; dZ = dO.V^T; dP = dZ * m / (1 - p); D = sum Z dZ = dO.O.
  // abs_dp / abs_d: dP and D with every product's magnitude (|dO|.|V|; sum P |dO|.|V| bounds |dO|.|O| too).
  std::vector<double> dP(n), keep(n), abs_dp(noise ? n : 0);
  double D = 0, abs_d = 0;
  for (size_t j = 0; j < n; ++j) {
    keep[j] = p.dropout.factor(b, p.heads_q, h, i, int64_t(j));
    double acc = 0, abs_acc = 0;
    for (int64_t c = 0; c < dv; ++c) {
      const double x = load(p, p.dout, p.dout_layout, b, i, h, c) * load(p, p.v, p.v_layout, b, int64_t(j), hk, c);
      acc = rnd.add(acc, x);
      abs_acc += std::fabs(x);
    }
    dP[j] = rnd(acc);
    D = rnd.add(D, s[j] * keep[j] * dP[j]);
    if (noise) {
      abs_dp[j] = abs_acc * keep[j];
      abs_d += s[j] * keep[j] * abs_dp[j];
    }
  }
  // The sink's probability e^{sink - lse} carries dP = 0 (it adds nothing to out): dsink = -P_sink * D.
  if (g && sink != kNegInf && lse != kNegInf) g->dsinks[size_t(h)] -= std::exp(sink - lse) * D;
  for (int64_t c = 0; c < d; ++c) dq_row[c] = 0;
  if (noise)
    for (int64_t c = 0; c < d; ++c) dq_noise[c] = 0;
  // A dot product of dv terms rounds to about sqrt(dv) unit roundoffs of its terms' magnitude; the noise of
  // the dS terms of one gradient element is independent, so their allowances add as squares (root at the end).
  auto sq = [](double x) { return x * x; };
  const double unit = kFp32Unit * std::sqrt(double(std::max<int64_t>(dv, 1)));
  // D = rowsum(dO * O) from a 16-bit O: the stored output's rounding (and that of P before P.V) is up to an ulp of
  // sum_j P_j |V_jc| per element c, independent over c, so D is off by about storage_eps * sqrt(sum_c (|dO_c| *
  // sum_j P_j |V_jc|)^2): one error shared by the row's dS terms (added linearly over j; one term in the squares
  // of dq). It is what remains where the exact gradient cancels to 0 and O is not representable: one visible key
  // with dropout, O = v / (1 - p).
  double d_noise = 0;
  if (noise && p.dtype != FA_FLOAT32) {
    double d_sq = 0;
    for (int64_t c = 0; c < dv; ++c) {
      double o_abs = 0;
      for (size_t j = 0; j < n; ++j)
        if (s[j] != 0) o_abs += s[j] * keep[j] * std::fabs(load(p, p.v, p.v_layout, b, int64_t(j), hk, c));
      d_sq += sq(std::fabs(load(p, p.dout, p.dout_layout, b, i, h, c)) * o_abs);
    }
    d_noise = storage_eps(p.dtype) * std::sqrt(d_sq);
  }
  std::vector<double> dq_shared(d_noise > 0 ? size_t(d) : 0, 0.0);
  for (size_t j = 0; j < n; ++j) {
    if (s[j] == 0) continue;  // masked or underflowed: no gradient (keeps -inf logits out of the sums)
    double dcap = p.softcap > 0 ? 1 - th[j] * th[j] : 1;
    double ds = rnd(s[j] * (dP[j] * keep[j] - D) * dcap * p.scale);
    const double ds_noise = noise ? unit * s[j] * (abs_dp[j] + abs_d) * std::fabs(dcap * p.scale) : 0;
    const double ds_d_noise = s[j] * d_noise * std::fabs(dcap * p.scale);
    for (int64_t c = 0; c < d; ++c) {
      const double kc = load(p, p.k, p.k_layout, b, int64_t(j), hk, c);
      dq_row[c] = rnd.add(dq_row[c], ds * kc);
      if (noise) dq_noise[c] += sq(ds_noise * kc);
      if (d_noise > 0) dq_shared[size_t(c)] += ds_d_noise * std::fabs(kc);
    }
    if (g) {
      const int64_t gk = global_k(p, b, int64_t(j));
      double* dk = &g->dk[size_t((hk * p.total_k + gk) * d)];
      double* dvr = &g->dv[size_t((hk * p.total_k + gk) * dv)];
      for (int64_t c = 0; c < d; ++c) {
        const double qc = load(p, p.q, p.q_layout, b, i, h, c);
        dk[c] = rnd.add(dk[c], ds * qc);
        if (noise) g->dk_noise[size_t((hk * p.total_k + gk) * d + c)] += sq(ds_noise * qc) + sq(ds_d_noise * qc);
      }
      for (int64_t c = 0; c < dv; ++c)
        dvr[c] = rnd.add(dvr[c], s[j] * keep[j] * load(p, p.dout, p.dout_layout, b, i, h, c));
    }
  }
  for (size_t c = 0; c < dq_shared.size(); ++c) dq_noise[c] += sq(dq_shared[c]);
}

}  // namespace

// The allowance is twice the typical noise, as the rule allows twice the plain implementation's error (the fp32
// backward's worst one-key element reached 0.35 of it over 450 shapes).
constexpr double kNoiseMargin = 2.0;

void backward_dq_row(const Problem& p, Rounding rounding, int64_t b, int64_t h, int64_t i, double* dq_row,
                     double* dq_noise) {
  const Rounder rnd{p.dtype, rounding == Rounding::kStorage};
  backward_row(p, rnd, b, h, i, dq_row, nullptr, rnd.on ? nullptr : dq_noise);
  for (int64_t c = 0; c < p.head_dim; ++c) dq_row[c] = rnd(dq_row[c]);
  for (int64_t c = 0; dq_noise && !rnd.on && c < p.head_dim; ++c) dq_noise[c] = kNoiseMargin * std::sqrt(dq_noise[c]);
}

void backward(const Problem& p, Rounding rounding, Grads* g) {
  const Rounder rnd{p.dtype, rounding == Rounding::kStorage};
  const int64_t d = p.head_dim, dv = p.head_dim_v;
  g->dq.assign(size_t(p.heads_q * p.total_q * d), 0.0);
  g->dk.assign(size_t(p.heads_kv * p.total_k * d), 0.0);
  g->dv.assign(size_t(p.heads_kv * p.total_k * dv), 0.0);
  g->dsinks.assign(size_t(p.heads_q), 0.0);
  g->dq_noise.assign(rnd.on ? 0 : g->dq.size(), 0.0);
  g->dk_noise.assign(rnd.on ? 0 : g->dk.size(), 0.0);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.len_q(b); ++i) {
        const size_t row = size_t((h * p.total_q + global_q(p, b, i)) * d);
        backward_row(p, rnd, b, h, i, g->dq.data() + row, g, rnd.on ? nullptr : g->dq_noise.data() + row);
      }
  for (double& x : g->dq) x = rnd(x);
  for (double& x : g->dk) x = rnd(x);
  for (double& x : g->dv) x = rnd(x);
  for (double& x : g->dq_noise) x = kNoiseMargin * std::sqrt(x);
  for (double& x : g->dk_noise) x = kNoiseMargin * std::sqrt(x);
}

}  // namespace flashattn::reference
