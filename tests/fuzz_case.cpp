#include "fuzz_case.hpp"

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>

namespace flashattn::testing {

// A named error: a known argument, a colon, the rule.
// A hand-aligned case table: one case or rule per line.
// clang-format off
bool named(const std::string& message) {
  static const char* kNames[] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv", "cu_seqlens_q",
                                 "cu_seqlens_k", "seqused_k", "max_seqlen_q", "max_seqlen_k", "softmax_scale",
                                 "softcap", "window_left", "window_right", "causal_alignment", "alibi_slopes",
                                 "dropout_p", "exec.backend", "exec.num_threads", "params", "cpu", "sinks", "dsinks",
                                 "exec.stream", "exec.deterministic", "exec.num_splits", "q_descale", "k_descale",
                                 "v_descale"};
  for (const char* n : kNames) {
    const std::string prefix = std::string(n) + ":";
    if (message.compare(0, prefix.size(), prefix) == 0 && message.size() > prefix.size() + 2) return true;
  }
  return false;
}
// clang-format on

std::vector<std::pair<void*, size_t>> buffers(Problem& pr) {
  std::vector<std::pair<void*, size_t>> b;
  for (std::vector<uint8_t>* v : {&pr.q, &pr.k, &pr.v, &pr.out, &pr.dout, &pr.dq, &pr.dk, &pr.dv})
    b.push_back({v->data(), v->size()});
  for (std::vector<float>* v : {&pr.lse, &pr.alibi, &pr.sinks, &pr.dsinks, &pr.q_descale, &pr.k_descale, &pr.v_descale})
    b.push_back({v->data(), v->size() * sizeof(float)});
  for (std::vector<int32_t>* v : {&pr.cu_q, &pr.cu_k, &pr.used_k})
    b.push_back({v->data(), v->size() * sizeof(int32_t)});
  return b;
}

std::vector<uint8_t> HostMemory::snapshot() {
  std::vector<uint8_t> s;
  for (auto [p, n] : buffers(*pr_)) s.insert(s.end(), static_cast<uint8_t*>(p), static_cast<uint8_t*>(p) + n);
  return s;
}

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kChecked: return "checked against the reference";
    case Outcome::kRefused: return "named refusals";
    case Outcome::kBrokenAccepted: return "broken calls accepted";
    default: return "not run";
  }
}

namespace {

// ---------------------------------------------------------------- the C ABI generator
// The call being broken: its attention description and its tensors (inputs first, then the outputs).
struct Call {
  fa_attention* attn;
  std::vector<fa_tensor*> tensors;
  size_t first_output;
  FuzzMemory* memory;
};

struct Mutation {
  const char* name;
  bool keeps_problem;  // an accepted call still computes the unbroken problem (checked against the reference)
  std::function<void(Call&, std::mt19937_64&)> apply;
};

// Sizes and strides the library can tell are wrong from the description alone (negative, or reaching past
// what int64 byte offsets address) or that only shrink the tensor (0). A stride or size that is merely larger
// than the caller's buffer describes memory the caller claims to own: no C API can detect that lie.
int64_t extreme_size(std::mt19937_64& rng) {
  const int64_t v[] = {-1, -2, INT64_MIN, INT64_MAX, INT64_MAX - 1, int64_t(1) << 62, 0};
  return v[rng() % (sizeof v / sizeof v[0])];
}

int64_t extreme(std::mt19937_64& rng) {
  const int64_t v[] = {
      -1, -2, INT64_MIN, INT64_MAX, INT64_MAX - 1, int64_t(1) << 31, int64_t(1) << 32, int64_t(1) << 62, 3, 0};
  return v[rng() % (sizeof v / sizeof v[0])];
}

// The breaking mutations, one per line.
// clang-format off
const std::vector<Mutation>& mutations(bool device) {
  static const std::vector<Mutation> host = {
      {"shape extreme", false, [](Call& c, std::mt19937_64& r) { c.tensors[r() % c.tensors.size()]->shape[r() % 4] = extreme_size(r); }},
      {"stride extreme", false, [](Call& c, std::mt19937_64& r) { c.tensors[r() % c.tensors.size()]->stride[r() % 4] = extreme_size(r); }},
      {"null data", false, [](Call& c, std::mt19937_64& r) { c.tensors[r() % c.tensors.size()]->data = nullptr; }},
      {"misaligned", false, [](Call& c, std::mt19937_64& r) {
         fa_tensor* t = c.tensors[r() % c.tensors.size()];
         t->data = static_cast<char*>(t->data) + 1;
       }},
      {"dtype", false, [](Call& c, std::mt19937_64& r) { c.tensors[r() % c.tensors.size()]->dtype = fa_dtype(int(r() % 6) - 1); }},
      {"rank", false, [](Call& c, std::mt19937_64& r) { c.tensors[r() % c.tensors.size()]->ndim = int(r() % 7) - 1; }},
      {"device", false, [](Call& c, std::mt19937_64& r) {
         fa_tensor* t = c.tensors[r() % c.tensors.size()];
         if (r() % 2) t->device_index = 3; else t->device = fa_device(7);
       }},
      {"output aliases", false, [](Call& c, std::mt19937_64& r) {
         const size_t n_out = c.tensors.size() - c.first_output;
         fa_tensor* o = c.tensors[c.first_output + r() % n_out];
         fa_tensor* other = c.tensors[r() % c.tensors.size()];
         if (other != o) o->data = other->data;
         else o->stride[r() % 3] = 0;  // overlapping itself
       }},
      {"window", true, [](Call& c, std::mt19937_64& r) { (r() % 2 ? c.attn->window_left : c.attn->window_right) = extreme(r); }},
      {"scalars", false, [](Call& c, std::mt19937_64& r) {
         const float v[] = {NAN, INFINITY, -INFINITY, -1.f, 0.f, 1e-30f, 1e30f, 0.5f};
         switch (r() % 4) {
           case 0: c.attn->has_softmax_scale = 1; c.attn->softmax_scale = v[r() % 8]; break;
           case 1: c.attn->softcap = v[r() % 8]; break;
           case 2: c.attn->dropout_p = v[r() % 8]; break;
           default: c.attn->causal_alignment = fa_causal_alignment(int(r() % 5) - 2);
         }
       }},
      {"max_seqlen", false, [](Call& c, std::mt19937_64& r) {
         c.attn->max_seqlen_q = extreme(r);
         if (r() % 2) c.attn->max_seqlen_k = extreme(r);
       }},
  };
  // Device memory: a tensor that says CUDA but holds a host pointer (its buffer's host twin).
  static const std::vector<Mutation> gpu = [] {
    std::vector<Mutation> m = host;
    m.push_back({"host memory", false, [](Call& c, std::mt19937_64& r) {
                   fa_tensor* t = c.tensors[r() % c.tensors.size()];
                   if (void* h = c.memory->host_twin(t->data)) t->data = h;
                 }});
    return m;
  }();
  return device ? gpu : host;
}
// clang-format on

Case random_case(std::mt19937_64& rng) {
  auto pick = [&](std::initializer_list<int64_t> v) { return *(v.begin() + rng() % v.size()); };
  Case c;
  c.seed = rng();
  c.dtype = pick({FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16}) == FA_FLOAT32 ? FA_FLOAT32
            : rng() % 2                                               ? FA_FLOAT16
                                                                      : FA_BFLOAT16;
  c.hkv = pick({1, 2});
  c.hq = c.hkv * pick({1, 2, 3});
  c.d = pick({8, 16, 24, 64});
  c.dv = rng() % 4 == 0 ? pick({8, 32}) : 0;
  if (rng() % 3 == 0) {
    const int n = int(pick({1, 2, 3}));
    for (int b = 0; b < n; ++b) {
      c.lens_q.push_back(int32_t(pick({0, 1, 5, 17, 70})));
      c.lens_k.push_back(int32_t(pick({0, 1, 9, 33, 65})));
    }
    if (rng() % 4 == 0)
      for (int b = 0; b < n; ++b) c.seqused_k.push_back(int32_t(rng() % (c.lens_k[size_t(b)] + 1)));
  } else {
    c.batch = pick({0, 1, 2, 2});
    c.sq = pick({0, 1, 7, 17, 64, 65, 100});
    c.sk = pick({0, 1, 9, 33, 64, 130});
  }
  c.causal = rng() % 3 == 0;
  c.top_left = rng() % 3 == 0;
  if (rng() % 3 == 0) {
    c.wl = pick({-1, 0, 3, 40, int64_t(1) << 40, INT64_MAX - 1, INT64_MAX});
    c.wr = c.causal ? pick({-1, 0}) : pick({-1, 0, 2, 50, INT64_MAX});
  }
  c.softcap = rng() % 4 == 0 ? float(pick({1, 5, 30})) : 0.f;
  c.alibi = rng() % 4 == 0 ? Alibi::kHeads : Alibi::kNone;
  c.head_pad = rng() % 4 == 0 ? pick({8, 16}) : 0;
  c.threads = int(pick({0, 1, 3, 100000, INT_MAX}));
  // FP8 inputs (forward only): their factor tensors join the mutated inputs. Drawn last, so that the rest of the
  // stream is the one the 16-bit cases had.
  if (rng() % 6 == 0) {
    c.dtype = FA_FLOAT8_E4M3;
    c.descale = rng() % 3 == 0 ? Case::Descale::kNone
                : rng() % 2    ? Case::Descale::kKvHeads
                               : Case::Descale::kQueryHeads;
    if (rng() % 2) c.d = c.dv = pick({64, 128});  // the head dims the sm90 FP8 kernel takes, now and then
  }
  return c;
}

// The GPU-shaped draws of a device memory, after the shared ones (so the host stream stays as it was). `rule_break`:
// the problem breaks a documented rule of the CUDA backends on purpose (strides and head dims in multiples of
// 8 elements), so a named refusal of it is right.
void device_case(std::mt19937_64& rng, Case* c, bool* rule_break) {
  // fp32 is a named FA_ERROR_UNSUPPORTED on CUDA: a third of the host stream's fp32 cases stay to check that. FP8
  // runs on sm90 (a named refusal elsewhere, and for what that kernel does not take: varlen, softcap, ALiBi).
  if (c->dtype == FA_FLOAT32 && rng() % 3 != 0) c->dtype = rng() % 2 ? FA_FLOAT16 : FA_BFLOAT16;
  c->sinks = rng() % 6 == 0;
  // Sequences over more than one tile of either family (64-192 rows, 64-176 keys).
  if (!c->varlen() && rng() % 5 == 0) {
    const int64_t q[] = {128, 129, 200}, k[] = {200, 257};
    c->sq = q[rng() % 3];
    c->sk = k[rng() % 2];
    c->batch = std::min<int64_t>(c->batch, 1);
  }
  // One-byte FP8 elements: the CUDA rule of 16-byte strides is 16 elements, so the unbroken problem keeps its head
  // dims and row padding in multiples of 16 (a stride of 24 FP8 elements is a named refusal, checked below as a
  // rule break). No draw: the stream after this stays the one the 16-bit cases had.
  if (c->dtype == FA_FLOAT8_E4M3) {
    auto up16 = [](int64_t x) { return (x + 15) / 16 * 16; };
    c->d = up16(c->d), c->dv = up16(c->dv), c->head_pad = up16(c->head_pad);
  }
  *rule_break = false;
  if (rng() % 12 == 0) {
    if (rng() % 2)
      c->d = 12;
    else
      c->head_pad = 4;
    *rule_break = true;
  }
}

// Every tensor of the params, so that a memory can place them.
void place_all(FuzzMemory& m, fa_attention* a) {
  for (fa_tensor* t : {&a->q, &a->k, &a->v, &a->cu_seqlens_q, &a->cu_seqlens_k, &a->seqused_k, &a->alibi_slopes,
                       &a->sinks, &a->q_descale, &a->k_descale, &a->v_descale})
    if (t->ndim > 0) m.place(t);
}
FwdParams placed(FuzzMemory& m, FwdParams f) {
  place_all(m, &f.attn);
  for (fa_tensor* t : {&f.out, &f.lse})
    if (t->ndim > 0) m.place(t);
  return f;
}
BwdParams placed(FuzzMemory& m, BwdParams b) {
  place_all(m, &b.attn);
  for (fa_tensor* t : {&b.out, &b.lse, &b.dout, &b.dq, &b.dk, &b.dv, &b.dsinks})
    if (t->ndim > 0) m.place(t);
  return b;
}

}  // namespace

int run_fuzz_case(uint64_t seed, FuzzMemory& memory, fa_backend backend, Outcome* outcome) {
  *outcome = Outcome::kNotRun;
  std::mt19937_64 rng(seed);
  Case c = random_case(rng);
  const bool backward = rng() % 3 == 0 && c.dtype != FA_FLOAT8_E4M3;  // FP8 is forward only
  const bool mutate = rng() % 4 != 0;
  const Mutation* m = mutate ? &mutations(memory.device())[rng() % mutations(memory.device()).size()] : nullptr;
  // A window mutation that the library accepts is the unbroken problem with that window: apply it to the
  // case itself, so that the reference sees it too.
  if (m && m->keeps_problem) {
    fa_attention a = fa_attention_default();
    a.window_left = c.wl;
    a.window_right = c.wr;
    Call call{&a, {}, 0, &memory};
    m->apply(call, rng);
    c.wl = a.window_left;
    c.wr = a.window_right;
  }
  bool rule_break = false;
  if (memory.device()) device_case(rng, &c, &rule_break);
  std::fprintf(stderr, "case %s%s, mutation %s\n", c.label().c_str(), backward ? " bwd" : " fwd", m ? m->name : "none");
  Problem pr(c);
  memory.load(pr);
  fa_exec exec = pr.exec();
  exec.backend = backend;
  // A refusal of the unbroken problem: a named FA_ERROR_UNSUPPORTED on CUDA (fp32, a kernel this build lacks),
  // or the named refusal of a GPU rule the case breaks on purpose. On the CPU the unbroken problem must run.
  auto unbroken_refusal_ok = [&](const Status& st) {
    if (!named(st.message)) return false;
    if (st.code == FA_ERROR_UNSUPPORTED) return memory.device();
    return st.code == FA_ERROR_INVALID_ARGUMENT && rule_break;
  };
  auto report = [](const Status& st) { std::fprintf(stderr, "status %d: %s\n", int(st.code), st.message.c_str()); };
  if (backward) {
    if (c.causal && c.wr > 0) return kCasePassed;  // not a valid forward to start from: fwd cases cover it
    Status st = forward(placed(memory, pr.fwd()), exec);
    if (const std::string f = memory.fault(); !f.empty()) {
      std::fprintf(stderr, "the forward left a CUDA error: %s\n", f.c_str());
      return kCaseFault;
    }
    if (!st.ok()) {
      report(st);
      // The forward of the unbroken problem, or of a window mutation the library refuses (named).
      const bool ok = unbroken_refusal_ok(st) ||
                      (m && m->keeps_problem && st.code == FA_ERROR_INVALID_ARGUMENT && named(st.message));
      if (ok) *outcome = Outcome::kRefused;
      return ok ? kCasePassed : kCaseFailed;
    }
  }
  FwdParams f = placed(memory, pr.fwd());
  BwdParams b = placed(memory, pr.bwd());
  Call call =
      backward
          ? Call{&b.attn, {&b.attn.q, &b.attn.k, &b.attn.v, &b.out, &b.lse, &b.dout, &b.dq, &b.dk, &b.dv}, 6, &memory}
          : Call{&f.attn, {&f.attn.q, &f.attn.k, &f.attn.v, &f.out, &f.lse}, 3, &memory};
  if (!backward && f.attn.q_descale.data != nullptr) {  // the factors are inputs: before the outputs
    call.tensors.insert(call.tensors.begin() + 3, {&f.attn.q_descale, &f.attn.k_descale, &f.attn.v_descale});
    call.first_output += 3;
  }
  if (m && !m->keeps_problem) m->apply(call, rng);
  const std::vector<uint8_t> before = memory.snapshot();
  Status st = backward ? flashattn::backward(b, exec) : flashattn::forward(f, exec);
  if (const std::string fault = memory.fault(); !fault.empty()) {
    report(st);
    std::fprintf(stderr, "the call left a CUDA error: %s\n", fault.c_str());
    return kCaseFault;
  }
  if (!st.ok()) {
    report(st);
    const bool right =
        m == nullptr ? unbroken_refusal_ok(st)
                     : (st.code == FA_ERROR_INVALID_ARGUMENT || st.code == FA_ERROR_UNSUPPORTED) && named(st.message);
    if (!right) return kCaseFailed;
    // A refused call must not have started: no input, output or scratch byte the caller owns changed.
    if (memory.snapshot() != before) {
      std::fprintf(stderr, "the call was refused but changed the caller's memory\n");
      return kCaseFailed;
    }
    *outcome = Outcome::kRefused;
    return kCasePassed;
  }
  // Accepted after a breaking mutation: a layout or scalar change that still describes valid memory (e.g.
  // a zero-size dimension, a scale of 0.5); no crash is the bar. Otherwise the outputs must be right.
  if (m && !m->keeps_problem) {
    *outcome = Outcome::kBrokenAccepted;
    return kCasePassed;
  }
  memory.fetch(pr);
  *outcome = Outcome::kChecked;
  if (backward) {
    Accuracy g = pr.check_backward();
    if (g.dq.passed() && g.dk.passed() && g.dv.passed() && (!c.sinks || g.dsinks.passed())) return kCasePassed;
    std::fprintf(stderr, "wrong gradients: dq %s dk %s dv %s dsinks %s\n", g.dq.summary().c_str(),
                 g.dk.summary().c_str(), g.dv.summary().c_str(), c.sinks ? g.dsinks.summary().c_str() : "-");
    return kCaseFailed;
  }
  Accuracy a = pr.check_forward();
  if (a.out.passed() && (!c.lse || a.lse.passed())) return kCasePassed;
  std::fprintf(stderr, "wrong output: out %s lse %s\n", a.out.summary().c_str(), a.lse.summary().c_str());
  return kCaseFailed;
}

}  // namespace flashattn::testing
