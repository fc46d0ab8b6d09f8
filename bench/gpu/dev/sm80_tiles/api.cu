#include <cmath>

#include "variants.cuh"

void add_fwd64(std::vector<Variant>&);
void add_fwd128(std::vector<Variant>&);
void add_fwd256(std::vector<Variant>&);
void add_bwd64(std::vector<Variant>&);
void add_bwd256(std::vector<Variant>&);
void add_bwd128(std::vector<Variant>&);

static const std::vector<Variant>& table() {
  static const std::vector<Variant> t = [] {
    std::vector<Variant> v;
    add_fwd64(v);
    add_fwd128(v);
    add_fwd256(v);
    add_bwd64(v);
    add_bwd128(v);
    add_bwd256(v);
    return v;
  }();
  return t;
}

// Contiguous (batch, seqlen, heads, head_dim) tensors, LSE (batch, heads, seqlen), no GQA.
static void fill_fwd(fa::FwdParams& p, const void* q, const void* k, const void* v, void* o, float* lse, int b, int s,
                     int h, int d, int causal) {
  p.q = q, p.k = k, p.v = v, p.out = o, p.lse = lse;
  const int64_t row = int64_t(h) * d, batch = int64_t(s) * row;
  p.q_batch = p.k_batch = p.v_batch = p.o_batch = batch;
  p.q_row = p.k_row = p.v_row = p.o_row = row;
  p.q_head = p.k_head = p.v_head = p.o_head = d;
  p.lse_batch = int64_t(h) * s, p.lse_head = s, p.lse_row = 1;
  p.batch = b, p.heads_q = h, p.group = 1, p.seqlen_q = p.seqlen_k = s, p.head_dim = p.head_dim_v = d;
  p.tensor_rows_q = p.tensor_rows_k = s;
  p.logit_scale = 1.f / std::sqrt(float(d));
  p.scale_log2 = p.logit_scale * float(1.0 / std::log(2.0));
  p.bottom_right = true;
  p.has_window = causal != 0;
  p.window_left = -1;
  p.window_right = causal ? 0 : -1;
}

extern "C" {
int v_count() { return int(table().size()); }
const char* v_name(int i) { return table()[i].name; }
int v_backward(int i) { return table()[i].backward; }
int v_head_dim(int i) { return table()[i].head_dim; }
int v_causal(int i) { return table()[i].causal; }
// Floats of the dQ workspace variant i needs (dsum excluded).
long long v_dq_floats(int i, int b, int s, int h, int d) {
  const int bq = table()[i].block_q;
  return (long long)h * (int64_t(b) * s / bq + b + 1) * bq * d;
}

int v_fwd(int i, const void* q, const void* k, const void* v, void* o, float* lse, int b, int s, int h, int d,
          void* stream) {
  fa::FwdParams p;
  fill_fwd(p, q, k, v, o, lse, b, s, h, d, table()[i].causal);
  return int(table()[i].fwd(p, static_cast<cudaStream_t>(stream)));
}

int v_bwd(int i, const void* q, const void* k, const void* v, const void* o, float* lse, const void* dout, void* dq,
          void* dk, void* dv, float* dsum, float* dq_acc, int b, int s, int h, int d, void* stream) {
  sm80::BwdParams p;
  fill_fwd(p, q, k, v, const_cast<void*>(o), lse, b, s, h, d, table()[i].causal);
  p.dout = dout, p.dq = dq, p.dk = dk, p.dv = dv;
  p.do_batch = p.dq_batch = p.dk_batch = p.dv_batch = p.q_batch;
  p.do_row = p.dq_row = p.dk_row = p.dv_row = p.q_row;
  p.do_head = p.dq_head = p.dk_head = p.dv_head = p.q_head;
  p.scale = p.logit_scale;
  p.heads_kv = h;
  p.rows_q = p.rows_k = int64_t(b) * s;
  p.dsum = dsum, p.dq_acc = dq_acc;
  const int bq = table()[i].block_q;
  p.dq_splits = 1;
  p.dq_blocks = p.rows_q / bq + b + 1;
  p.dq_tile = int64_t(bq) * d;
  return int(table()[i].bwd(p, static_cast<cudaStream_t>(stream)));
}
}
