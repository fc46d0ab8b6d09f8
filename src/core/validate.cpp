// The one validation every backend goes through. Each rule reports "<argument>: <rule> (got ...)".
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <sstream>

#include "core/problem.hpp"
#include "flashattn/flashattn.hpp"  // dtype_name: the one spelling of a dtype in messages

namespace flashattn::detail {

Error invalid(const std::string& argument, const std::string& rule) {
  return {FA_ERROR_INVALID_ARGUMENT, argument + ": " + rule};
}
Error unsupported(const std::string& what) { return {FA_ERROR_UNSUPPORTED, what}; }
Error backend_error(const std::string& what) { return {FA_ERROR_BACKEND, what}; }

namespace {

constexpr int64_t kMaxHeadDim = 256;
constexpr int64_t kHeadDimMultiple = 8;
// Batch, heads and sequence lengths are int32 in the kernels (and cu_seqlens are int32 anyway).
constexpr int64_t kMaxCount = (int64_t(1) << 31) - 1;

int64_t elem_size(fa_dtype t) { return int64_t(dtype_size(t)); }

std::string shape_str(const fa_tensor& t) {
  std::ostringstream s;
  s << "(";
  for (int i = 0; i < t.ndim && i < FA_MAX_DIMS; ++i) s << (i ? ", " : "") << t.shape[i];
  s << ")";
  return s.str();
}

std::string shape_str(std::initializer_list<int64_t> dims) {
  std::ostringstream s;
  s << "(";
  int i = 0;
  for (int64_t d : dims) s << (i++ ? ", " : "") << d;
  s << ")";
  return s.str();
}

bool known_dtype(fa_dtype t) {
  return t == FA_FLOAT32 || t == FA_FLOAT16 || t == FA_BFLOAT16 || t == FA_INT32 || t == FA_FLOAT8_E4M3 ||
         t == FA_INT64;
}

std::string strides_str(const fa_tensor& t) {
  std::ostringstream s;
  s << "(";
  for (int i = 0; i < t.ndim && i < FA_MAX_DIMS; ++i) s << (i ? ", " : "") << t.stride[i];
  s << ")";
  return s.str();
}

int64_t numel(const fa_tensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim && i < FA_MAX_DIMS; ++i) n *= t.shape[i];  // overflow excluded by check_tensor
  return n;
}

// Structural checks common to every tensor argument: present, rank, dtype known, device, strides, and a
// size that int64 arithmetic can address (every offset a backend computes is then free of overflow).
Error check_tensor(const char* name, const fa_tensor& t, int ndim, const fa_tensor& ref_device, bool unit_last,
                   const Requirements& req) {
  if (t.ndim != ndim)
    return invalid(name, "must have " + std::to_string(ndim) + " dimensions (got " + std::to_string(t.ndim) + ")");
  if (!known_dtype(t.dtype)) return invalid(name, "unknown dtype code " + std::to_string(int(t.dtype)));
  for (int i = 0; i < ndim; ++i)
    if (t.shape[i] < 0) return invalid(name, "negative size in shape " + shape_str(t));
  // Element count and extent (largest element offset + 1, in bytes) must fit in int64: a product that wrapped
  // would let a huge tensor pass as an empty one, and offsets computed by the kernels would wrap too.
  int64_t count = 1;
  bool too_big = false;
  for (int i = 0; i < ndim; ++i) too_big |= __builtin_mul_overflow(count, t.shape[i], &count);
  if (too_big) return invalid(name, "element count of shape " + shape_str(t) + " overflows int64");
  // Empty tensors may come without storage (frameworks hand out null pointers for them), and their strides
  // mean nothing (numpy gives zero-size arrays zero strides): no stride or alignment rule applies.
  if (count == 0) {
    if (t.device != ref_device.device || t.device_index != ref_device.device_index)
      return invalid(name, "must be on the same device as q");
    return ok();
  }
  if (t.data == nullptr) return invalid(name, "null data pointer");
  if (t.device != ref_device.device || t.device_index != ref_device.device_index)
    return invalid(name, "must be on the same device as q");
  for (int i = 0; i < ndim; ++i)
    if (t.stride[i] < 0)
      return invalid(name, "negative stride " + std::to_string(t.stride[i]) + " in dimension " + std::to_string(i));
  int64_t last = 0;  // largest element offset
  for (int i = 0; i < ndim; ++i) {
    int64_t step = 0;
    too_big |= __builtin_mul_overflow(t.shape[i] - 1, t.stride[i], &step);
    too_big |= __builtin_add_overflow(last, step, &last);
  }
  int64_t bytes = 0;
  too_big |= __builtin_add_overflow(last, int64_t(1), &bytes);
  too_big |= __builtin_mul_overflow(bytes, elem_size(t.dtype), &bytes);
  uintptr_t end = 0;
  too_big |= __builtin_add_overflow(reinterpret_cast<uintptr_t>(t.data), uintptr_t(too_big ? 0 : bytes), &end);
  if (too_big)
    return invalid(name, "shape " + shape_str(t) + " with strides " + strides_str(t) +
                             " spans more memory than int64 byte offsets can address");
  if (unit_last && t.shape[ndim - 1] > 1 && t.stride[ndim - 1] != 1)
    return invalid(name,
                   "last dimension must have unit stride (got stride " + std::to_string(t.stride[ndim - 1]) + ")");
  int64_t align = req.pointer_alignment_bytes > 0 ? req.pointer_alignment_bytes : elem_size(t.dtype);
  if (reinterpret_cast<uintptr_t>(t.data) % uintptr_t(align) != 0)
    return invalid(
        name, "data pointer must be aligned to " + std::to_string(align) + " bytes for the " + req.name + " backend");
  const int64_t stride_multiple =
      req.stride_bytes > 1 ? std::max<int64_t>(1, req.stride_bytes / elem_size(t.dtype)) : 1;
  if (unit_last && stride_multiple > 1) {
    for (int i = 0; i < ndim - 1; ++i)
      if (t.shape[i] > 1 && t.stride[i] % stride_multiple != 0)
        return invalid(name, "stride of dimension " + std::to_string(i) + " must be a multiple of " +
                                 std::to_string(stride_multiple) + " elements for the " + req.name + " backend (got " +
                                 std::to_string(t.stride[i]) + ")");
  }
  return ok();
}

// The memory of a (validated, non-empty) tensor as rows: the innermost dimensions that are laid out
// contiguously merge into rows of `width` bytes; every row starts at `lo` plus a multiple of `period` (the
// gcd of the remaining strides, in bytes; 0 when the whole tensor is one contiguous row). This is what
// lets views that interleave in one buffer (dq, dk, dv of a packed dqkv) be told apart from real overlap.
struct Footprint {
  const char* name;
  uint64_t lo = 0, hi = 0;  // [lo, hi) in bytes
  uint64_t width = 0, period = 0;
};

Footprint footprint_of(const char* name, const fa_tensor& t) {
  Footprint f;
  f.name = name;
  const int64_t e = elem_size(t.dtype);
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dimensions that move
  int64_t last = 0;
  for (int i = 0; i < t.ndim; ++i) {
    last += (t.shape[i] - 1) * t.stride[i];
    if (t.shape[i] > 1 && t.stride[i] > 0) dims.push_back({t.stride[i], t.shape[i]});
  }
  std::sort(dims.begin(), dims.end());
  f.lo = reinterpret_cast<uintptr_t>(t.data);
  f.hi = f.lo + uint64_t((last + 1) * e);
  f.width = uint64_t(e);
  size_t i = 0;
  for (; i < dims.size() && uint64_t(dims[i].first * e) == f.width; ++i) f.width *= uint64_t(dims[i].second);
  for (; i < dims.size(); ++i) f.period = std::gcd(f.period, uint64_t(dims[i].first * e));
  return f;
}

// True unless the two footprints provably share no byte: disjoint ranges, or rows that fall into disjoint
// residue classes modulo the common period. Conservative: an exotic interleaving it cannot prove disjoint
// counts as overlap.
bool may_overlap(const Footprint& a, const Footprint& b) {
  if (a.hi <= b.lo || b.hi <= a.lo) return false;
  if (a.period == 0 || b.period == 0) return true;
  const uint64_t g = std::gcd(a.period, b.period);
  if (a.width > g || b.width > g) return true;
  // a's rows cover the residues [0, a.width) modulo g, b's cover [r, r + b.width).
  const uint64_t r = b.lo >= a.lo ? (b.lo - a.lo) % g : (g - (a.lo - b.lo) % g) % g;
  return !(r >= a.width && r + b.width <= g);
}

// An output must give every element its own memory: with the moving dimensions sorted by stride, each
// stride must clear everything the smaller ones reach (a sufficient test; zero strides fail it).
bool self_overlapping(const fa_tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] > 1) dims.push_back({t.stride[i], t.shape[i]});
  std::sort(dims.begin(), dims.end());
  int64_t reach = 1;  // elements spanned by the dimensions so far
  for (const auto& [stride, size] : dims) {
    if (stride < reach) return true;
    reach += (size - 1) * stride;
  }
  return false;
}

Error check_shape(const char* name, const fa_tensor& t, std::initializer_list<int64_t> want) {
  int i = 0;
  bool same = int(want.size()) == t.ndim;
  for (int64_t d : want) {
    if (!same) break;
    same = t.shape[i++] == d;
  }
  if (!same) return invalid(name, "shape must be " + shape_str(want) + " (got " + shape_str(t) + ")");
  return ok();
}

Error check_dtype(const char* name, const fa_tensor& t, fa_dtype want, const char* rule) {
  if (t.dtype != want)
    return invalid(
        name, std::string("dtype must be ") + dtype_name(want) + " " + rule + " (got " + dtype_name(t.dtype) + ")");
  return ok();
}

RowLayout layout_of(const fa_tensor& t, bool varlen, bool by_key) {
  RowLayout l;
  l.by_key = by_key;
  if (varlen) {
    l.row = t.stride[0];
    l.head = t.stride[1];
  } else {
    l.batch = t.stride[0];
    l.row = t.stride[1];
    l.head = t.stride[2];
  }
  return l;
}

// cu_seqlens: int32 (B+1), starts at 0, non-decreasing, ends at the row count of the tensor it indexes.
Error check_cu_seqlens(const char* name, const fa_tensor& t, const fa_tensor& q, const int32_t* host, int64_t total,
                       const char* total_name, int64_t max_seqlen, const char* max_name, const Requirements& req,
                       std::vector<int32_t>* copy) {
  const Requirements plain{0, 1, true, req.name};
  if (Error e = check_tensor(name, t, 1, q, true, plain); !e.ok()) return e;
  if (Error e = check_dtype(name, t, FA_INT32, "(prefix sums of sequence lengths)"); !e.ok()) return e;
  if (t.shape[0] < 1) return invalid(name, "must have batch + 1 >= 1 entries (got 0)");
  if (host == nullptr) return invalid(name, "values could not be read for validation");
  int64_t n = t.shape[0];
  copy->assign(host, host + n);
  if ((*copy)[0] != 0) return invalid(name, "must start at 0 (got " + std::to_string((*copy)[0]) + ")");
  int64_t longest = 0;
  for (int64_t i = 1; i < n; ++i) {
    if ((*copy)[i] < (*copy)[i - 1])
      return invalid(name, "must be non-decreasing (entry " + std::to_string(i) + " = " + std::to_string((*copy)[i]) +
                               " < entry " + std::to_string(i - 1) + " = " + std::to_string((*copy)[i - 1]) + ")");
    longest = std::max<int64_t>(longest, (*copy)[i] - (*copy)[i - 1]);
  }
  if ((*copy)[n - 1] != total)
    return invalid(name, "last entry must equal the number of rows of " + std::string(total_name) + " (got " +
                             std::to_string((*copy)[n - 1]) + ", expected " + std::to_string(total) + ")");
  if (max_seqlen < longest)
    return invalid(max_name, "must be at least the longest sequence (got " + std::to_string(max_seqlen) +
                                 ", longest is " + std::to_string(longest) + ")");
  return ok();
}

}  // namespace

Error validate(const fa_attention& a, const fa_tensor& out, const fa_tensor& lse, const fa_tensor* dout,
               const fa_tensor* dq, const fa_tensor* dk, const fa_tensor* dv, Direction dir, const Requirements& req,
               const int32_t* host_cu_q, const int32_t* host_cu_k, const int32_t* host_used_k, Problem* p,
               const fa_tensor* dsinks) {
  *p = Problem{};
  const bool has_cu_q = a.cu_seqlens_q.data != nullptr, has_cu_k = a.cu_seqlens_k.data != nullptr;
  if (has_cu_q != has_cu_k)
    return invalid(has_cu_q ? "cu_seqlens_k" : "cu_seqlens_q", "varlen needs both cu_seqlens_q and cu_seqlens_k");
  const bool varlen = has_cu_q;
  const int nd = varlen ? 3 : 4;
  const int hd = nd - 2;  // index of the heads dimension
  const bool paged = a.block_table.data != nullptr;
  if (paged && varlen)
    return unsupported(
        "block_table: paged K/V is not supported with cu_seqlens (varlen calls: flash_attn_varlen_func gathers "
        "the pages)");
  if (paged && dir == Direction::kBackward)
    return unsupported("block_table: the backward reads contiguous K/V (paged K/V is forward only, as in flash_attn)");

  if (Error e = check_tensor("q", a.q, nd, a.q, true, req); !e.ok()) return e;
  if (a.q.dtype != FA_FLOAT32 && a.q.dtype != FA_FLOAT16 && a.q.dtype != FA_BFLOAT16 && a.q.dtype != FA_FLOAT8_E4M3)
    return invalid("q", std::string("dtype must be float32, float16, bfloat16 or float8_e4m3fn (got ") +
                            dtype_name(a.q.dtype) + ")");
  if (a.q.dtype == FA_FLOAT8_E4M3 && dir == Direction::kBackward)
    return unsupported("q: float8_e4m3fn is forward only (as in FlashAttention-3): no backward");
  if (a.q.dtype == FA_FLOAT32 && !req.allows_float32)
    return unsupported(std::string("q: dtype float32 is not supported by the ") + req.name +
                       " backend (use float16 or bfloat16)");
  if (Error e = check_tensor("k", a.k, nd, a.q, true, req); !e.ok()) return e;
  if (Error e = check_tensor("v", a.v, nd, a.q, true, req); !e.ok()) return e;
  if (Error e = check_dtype("k", a.k, a.q.dtype, "(same as q)"); !e.ok()) return e;
  if (Error e = check_dtype("v", a.v, a.q.dtype, "(same as q)"); !e.ok()) return e;

  p->dtype = a.q.dtype;
  p->out_dtype = p->fp8() ? FA_BFLOAT16 : p->dtype;
  p->device = a.q.device;
  p->device_index = a.q.device_index;
  p->varlen = varlen;
  p->heads_q = a.q.shape[hd];
  p->heads_kv = a.k.shape[hd];
  p->head_dim = a.q.shape[hd + 1];
  p->head_dim_v = a.v.shape[hd + 1];

  if (p->head_dim % kHeadDimMultiple != 0 || p->head_dim < kHeadDimMultiple || p->head_dim > kMaxHeadDim)
    return invalid("q", "head_dim must be a multiple of 8 in [8, 256] (got " + std::to_string(p->head_dim) + ")");
  if (a.k.shape[hd + 1] != p->head_dim)
    return invalid("k", "head_dim must equal q's (" + std::to_string(p->head_dim) + ", got " +
                            std::to_string(a.k.shape[hd + 1]) + ")");
  if (p->head_dim_v % kHeadDimMultiple != 0 || p->head_dim_v < kHeadDimMultiple || p->head_dim_v > kMaxHeadDim)
    return invalid("v", "head_dim must be a multiple of 8 in [8, 256] (got " + std::to_string(p->head_dim_v) + ")");
  if (p->heads_q < 1) return invalid("q", "must have at least one head");
  if (p->heads_kv < 1) return invalid("k", "must have at least one head");
  if (p->heads_q % p->heads_kv != 0)
    return invalid("k", "heads of q (" + std::to_string(p->heads_q) + ") must be a multiple of heads of k/v (" +
                            std::to_string(p->heads_kv) + ") for GQA/MQA");
  if (a.v.shape[hd] != p->heads_kv)
    return invalid("v", "must have as many heads as k (" + std::to_string(p->heads_kv) + ", got " +
                            std::to_string(a.v.shape[hd]) + ")");
  if (a.v.shape[0] != a.k.shape[0] || (!varlen && a.v.shape[1] != a.k.shape[1]))
    return invalid("v", "shape " + shape_str(a.v) + " must match k's " + shape_str(a.k) + " except head_dim");

  if (varlen) {
    p->total_q = a.q.shape[0];
    p->total_k = a.k.shape[0];
    if (a.max_seqlen_q < 0 || a.max_seqlen_q > kMaxCount)
      return invalid("max_seqlen_q", "must be in [0, 2^31 - 1] (got " + std::to_string(a.max_seqlen_q) + ")");
    if (a.max_seqlen_k < 0 || a.max_seqlen_k > kMaxCount)
      return invalid("max_seqlen_k", "must be in [0, 2^31 - 1] (got " + std::to_string(a.max_seqlen_k) + ")");
    if (Error e = check_cu_seqlens("cu_seqlens_q", a.cu_seqlens_q, a.q, host_cu_q, p->total_q, "q", a.max_seqlen_q,
                                   "max_seqlen_q", req, &p->host_cu_q);
        !e.ok())
      return e;
    if (Error e = check_cu_seqlens("cu_seqlens_k", a.cu_seqlens_k, a.q, host_cu_k, p->total_k, "k", a.max_seqlen_k,
                                   "max_seqlen_k", req, &p->host_cu_k);
        !e.ok())
      return e;
    if (a.cu_seqlens_k.shape[0] != a.cu_seqlens_q.shape[0])
      return invalid("cu_seqlens_k", "must have as many entries as cu_seqlens_q (got " +
                                         std::to_string(a.cu_seqlens_k.shape[0]) + " vs " +
                                         std::to_string(a.cu_seqlens_q.shape[0]) + ")");
    p->batch = a.cu_seqlens_q.shape[0] - 1;
    p->seqlen_q = a.max_seqlen_q;
    p->seqlen_k = a.max_seqlen_k;
    p->cu_seqlens_q = static_cast<const int32_t*>(a.cu_seqlens_q.data);
    p->cu_seqlens_k = static_cast<const int32_t*>(a.cu_seqlens_k.data);
  } else if (paged) {
    // k, v: (num_pages, page_size, Hkv, D); the table maps each sequence's key blocks to pages.
    p->batch = a.q.shape[0];
    p->seqlen_q = a.q.shape[1];
    const fa_tensor& t = a.block_table;
    const Requirements plain{0, 1, true, req.name};
    if (Error e = check_tensor("block_table", t, 2, a.q, true, plain); !e.ok()) return e;
    if (Error e = check_dtype("block_table", t, FA_INT32, "(page indices)"); !e.ok()) return e;
    if (t.shape[0] != p->batch)
      return invalid("block_table", "must have one row per batch entry of q (" + std::to_string(p->batch) +
                                        ", got shape " + shape_str(t) + ")");
    if (t.shape[1] < 1 && p->batch > 0)
      return invalid("block_table", "must have at least one page per sequence (got shape " + shape_str(t) + ")");
    if (a.k.shape[1] < 1) return invalid("k", "page_size (dimension 1 of a paged k) must be >= 1 (got 0)");
    if (a.k.shape[0] > kMaxCount)  // page indices are int32
      return invalid("k", "a paged k has at most 2^31 - 1 pages (got " + std::to_string(a.k.shape[0]) + ")");
    p->page_size = a.k.shape[1];
    p->num_pages = a.k.shape[0];
    p->max_pages = t.shape[1];
    p->block_table_stride = t.stride[0];
    p->block_table = static_cast<const int32_t*>(t.data);
    int64_t capacity = 0;
    if (__builtin_mul_overflow(p->max_pages, p->page_size, &capacity) || capacity > kMaxCount)
      return invalid("block_table", "max_pages * page_size (the key capacity) must be at most 2^31 - 1 (got " +
                                        std::to_string(p->max_pages) + " pages of " + std::to_string(p->page_size) +
                                        ")");
    p->seqlen_k = p->max_pages > 0 ? capacity : 0;
    p->total_q = p->batch * p->seqlen_q;
    p->total_k = p->batch * p->seqlen_k;
  } else {
    p->batch = a.q.shape[0];
    p->seqlen_q = a.q.shape[1];
    p->seqlen_k = a.k.shape[1];
    if (a.k.shape[0] != p->batch)
      return invalid(
          "k", "batch must equal q's (" + std::to_string(p->batch) + ", got " + std::to_string(a.k.shape[0]) + ")");
    p->total_q = p->batch * p->seqlen_q;  // no overflow: bounded by q's element count
    p->total_k = p->batch * p->seqlen_k;
  }
  auto count_rule = [](const char* name, const char* what, int64_t n) {
    return invalid(name, std::string(what) + " must be at most 2^31 - 1 (got " + std::to_string(n) + ")");
  };
  if (p->batch > kMaxCount) return count_rule(varlen ? "cu_seqlens_q" : "q", "batch", p->batch);
  if (p->heads_q > kMaxCount) return count_rule("q", "heads", p->heads_q);
  if (p->seqlen_q > kMaxCount) return count_rule("q", "seqlen_q", p->seqlen_q);
  if (p->seqlen_k > kMaxCount) return count_rule("k", "seqlen_k", p->seqlen_k);

  if (a.seqused_k.data != nullptr) {
    const Requirements plain{0, 1, true, req.name};
    if (Error e = check_tensor("seqused_k", a.seqused_k, 1, a.q, true, plain); !e.ok()) return e;
    if (Error e = check_dtype("seqused_k", a.seqused_k, FA_INT32, "(keys used per sequence)"); !e.ok()) return e;
    if (Error e = check_shape("seqused_k", a.seqused_k, {p->batch}); !e.ok()) return e;
    // CUDA calls do not read the entries on the host (that would synchronise every decode step and forbid
    // CUDA-graph capture): the kernels clamp each to [0, keys of its sequence]. CPU calls check them here.
    if (host_used_k == nullptr && a.q.device == FA_DEVICE_CPU)
      return invalid("seqused_k", "values could not be read for validation");
    if (host_used_k != nullptr) {
      p->host_used_k.assign(host_used_k, host_used_k + p->batch);
      for (int64_t b = 0; b < p->batch; ++b) {
        int64_t avail = varlen ? p->host_cu_k[b + 1] - p->host_cu_k[b] : p->seqlen_k;
        if (p->host_used_k[b] < 0 || p->host_used_k[b] > avail)
          return invalid("seqused_k", "entry " + std::to_string(b) + " must be in [0, " + std::to_string(avail) +
                                          "] keys of that sequence (got " + std::to_string(p->host_used_k[b]) + ")");
      }
    }
    p->seqused_k = static_cast<const int32_t*>(a.seqused_k.data);
  }
  // The pages each sequence reads, on the host where the table is host memory (CUDA calls: the kernels read an
  // out-of-range page as zeros).
  if (paged && a.q.device == FA_DEVICE_CPU) {
    for (int64_t b = 0; b < p->batch; ++b) {
      const int64_t used = p->host_used_k.empty() ? p->seqlen_k : p->host_used_k[b];
      for (int64_t i = 0; i * p->page_size < used; ++i) {
        const int32_t page = p->block_table[b * p->block_table_stride + i];
        if (page < 0 || page >= p->num_pages)
          return invalid("block_table", "entry (" + std::to_string(b) + ", " + std::to_string(i) +
                                            ") = " + std::to_string(page) + " must be a page index in [0, " +
                                            std::to_string(p->num_pages) + ") (the page holds keys sequence " +
                                            std::to_string(b) + " reads)");
      }
    }
  }

  // Scalars and the mask.
  if (a.has_softmax_scale) {
    if (!std::isfinite(a.softmax_scale) || a.softmax_scale <= 0.f)
      return invalid("softmax_scale", "must be finite and positive (got " + std::to_string(a.softmax_scale) + ")");
    p->scale = a.softmax_scale;
  } else {
    p->scale = float(1.0 / std::sqrt(double(p->head_dim)));
  }
  if (!std::isfinite(a.softcap) || a.softcap < 0.f)
    return invalid("softcap", "must be finite and >= 0, 0 = off (got " + std::to_string(a.softcap) + ")");
  p->softcap = a.softcap;
  if (!(a.dropout_p >= 0.f && a.dropout_p < 1.f))
    return invalid("dropout_p", "must be in [0, 1) (got " + std::to_string(a.dropout_p) + ")");
  p->dropout = DropoutRule(a.dropout_p, a.dropout_seed, a.dropout_offset);
  if (a.dropout_rng.data != nullptr) {
    // (seed, offset) in a tensor: CUDA kernels read it in place (graph capture), CPU calls read it here.
    const fa_tensor& t = a.dropout_rng;
    const Requirements plain{0, 1, true, req.name};
    if (Error e = check_tensor("dropout_rng", t, 1, a.q, true, plain); !e.ok()) return e;
    if (Error e = check_dtype("dropout_rng", t, FA_INT64, "(the dropout seed and offset)"); !e.ok()) return e;
    if (Error e = check_shape("dropout_rng", t, {2}); !e.ok()) return e;
    if (a.dropout_seed != 0 || a.dropout_offset != 0)
      return invalid("dropout_rng", "takes the place of dropout_seed and dropout_offset, which must then be 0 (got " +
                                        std::to_string(a.dropout_seed) + ", " + std::to_string(a.dropout_offset) + ")");
    const auto* words = static_cast<const uint64_t*>(t.data);
    if (t.device == FA_DEVICE_CPU)
      p->dropout = DropoutRule(a.dropout_p, words[0], words[1]);
    else
      p->dropout.rng = words;
  }
  if (a.causal_alignment != FA_ALIGN_BOTTOM_RIGHT && a.causal_alignment != FA_ALIGN_TOP_LEFT)
    return invalid("causal_alignment", "must be FA_ALIGN_BOTTOM_RIGHT or FA_ALIGN_TOP_LEFT");
  if (a.window_left < -1)
    return invalid("window_left", "must be >= -1, -1 = unbounded (got " + std::to_string(a.window_left) + ")");
  if (a.window_right < -1)
    return invalid("window_right", "must be >= -1, -1 = unbounded (got " + std::to_string(a.window_right) + ")");
  if (a.causal && a.window_right > 0)
    return invalid("window_right", "must be 0 or -1 when causal (causal means window_right = 0; got " +
                                       std::to_string(a.window_right) + ")");
  p->causal = a.causal != 0;
  p->alignment = a.causal_alignment;
  p->window_left = a.window_left;
  p->window_right = a.causal ? 0 : a.window_right;
  // A window side of at least the longest sequence reaches past every key (the diagonal of any row lies in
  // [-len_q, len_k)), so it is the unbounded side: normalised to -1, any int64 is safe in the mask arithmetic
  // (and every window left is below 2^31, as the kernels' int32 fields need).
  int64_t longest = std::max(p->seqlen_q, p->seqlen_k);
  if (varlen) {
    longest = 0;
    for (size_t b = 0; b + 1 < p->host_cu_q.size(); ++b)
      longest = std::max<int64_t>(
          {longest, int64_t(p->host_cu_q[b + 1]) - p->host_cu_q[b], int64_t(p->host_cu_k[b + 1]) - p->host_cu_k[b]});
  }
  if (p->window_left >= longest) p->window_left = -1;
  if (p->window_right >= longest) p->window_right = -1;

  if (a.alibi_slopes.data != nullptr) {
    const fa_tensor& s = a.alibi_slopes;
    const Requirements plain{0, 1, true, req.name};
    if (s.ndim != 1 && s.ndim != 2)
      return invalid("alibi_slopes", "must have shape (heads_q) or (batch, heads_q) (got " + shape_str(s) + ")");
    if (Error e = check_tensor("alibi_slopes", s, s.ndim, a.q, true, plain); !e.ok()) return e;
    if (Error e = check_dtype("alibi_slopes", s, FA_FLOAT32, "(one slope per head)"); !e.ok()) return e;
    if (s.ndim == 1) {
      if (Error e = check_shape("alibi_slopes", s, {p->heads_q}); !e.ok()) return e;
    } else {
      if (Error e = check_shape("alibi_slopes", s, {p->batch, p->heads_q}); !e.ok()) return e;
      p->alibi_batch_stride = s.stride[0];
    }
    p->alibi = static_cast<const float*>(s.data);
  }
  if (a.sinks.data != nullptr) {
    const Requirements plain{0, 1, true, req.name};
    if (Error e = check_tensor("sinks", a.sinks, 1, a.q, true, plain); !e.ok()) return e;
    if (Error e = check_dtype("sinks", a.sinks, FA_FLOAT32, "(one sink logit per query head)"); !e.ok()) return e;
    if (Error e = check_shape("sinks", a.sinks, {p->heads_q}); !e.ok()) return e;
    p->sinks = static_cast<const float*>(a.sinks.data);
  }

  // FP8 dequantisation factors.
  auto check_descale = [&](const char* name, const fa_tensor& t, Descale* d) -> Error {
    if (t.data == nullptr) return ok();
    if (!p->fp8())
      return invalid(name, "is for float8_e4m3fn q/k/v only (got " + std::string(dtype_name(p->dtype)) + ")");
    const Requirements plain{0, 0, true, req.name};
    if (Error e = check_tensor(name, t, 2, a.q, false, plain); !e.ok()) return e;
    if (Error e = check_dtype(name, t, FA_FLOAT32, "(dequantisation factors)"); !e.ok()) return e;
    const bool per_q = d == &p->q_descale && t.shape[0] == p->batch && t.shape[1] == p->heads_q;
    if (!per_q)
      if (Error e = check_shape(name, t, {p->batch, p->heads_kv}); !e.ok())
        return d == &p->q_descale
                   ? invalid(name, "shape must be (batch, heads_kv) = " + shape_str({p->batch, p->heads_kv}) +
                                       " or (batch, heads_q) = " + shape_str({p->batch, p->heads_q}) + " (got " +
                                       shape_str(t) + ")")
                   : e;
    *d = Descale{static_cast<const float*>(t.data), t.stride[0], t.stride[1],
                 d == &p->q_descale && !per_q ? p->group() : 1};
    if (t.device == FA_DEVICE_CPU)  // CUDA factors are not read on the host (no synchronisation)
      for (int64_t b = 0; b < t.shape[0]; ++b)
        for (int64_t h = 0; h < t.shape[1]; ++h) {
          const float f = d->data[b * d->batch + h * d->head];
          if (!(f >= 0.f) || !std::isfinite(f))
            return invalid(name, "entries must be finite and >= 0 (entry (" + std::to_string(b) + ", " +
                                     std::to_string(h) + ") is " + std::to_string(f) + ")");
        }
    return ok();
  };
  if (Error e = check_descale("q_descale", a.q_descale, &p->q_descale); !e.ok()) return e;
  if (Error e = check_descale("k_descale", a.k_descale, &p->k_descale); !e.ok()) return e;
  if (Error e = check_descale("v_descale", a.v_descale, &p->v_descale); !e.ok()) return e;

  // Outputs.
  const int64_t rows_q = varlen ? p->total_q : p->seqlen_q;
  auto check_q_shaped = [&](const char* name, const fa_tensor& t, int64_t dim) -> Error {
    if (Error e = check_tensor(name, t, nd, a.q, true, req); !e.ok()) return e;
    if (Error e = check_dtype(name, t, p->out_dtype, p->fp8() ? "(float8_e4m3fn inputs)" : "(same as q)"); !e.ok())
      return e;
    return varlen ? check_shape(name, t, {rows_q, p->heads_q, dim})
                  : check_shape(name, t, {p->batch, rows_q, p->heads_q, dim});
  };
  auto check_k_shaped = [&](const char* name, const fa_tensor& t, const fa_tensor& like) -> Error {
    if (Error e = check_tensor(name, t, nd, a.q, true, req); !e.ok()) return e;
    if (Error e = check_dtype(name, t, p->dtype, "(same as q)"); !e.ok()) return e;
    for (int i = 0; i < nd; ++i)
      if (t.shape[i] != like.shape[i])
        return invalid(name, "shape must equal " + shape_str(like) + " (got " + shape_str(t) + ")");
    return ok();
  };
  if (Error e = check_q_shaped("out", out, p->head_dim_v); !e.ok()) return e;

  const bool need_lse = dir == Direction::kBackward;
  if (lse.data != nullptr || need_lse) {
    const Requirements plain{0, 1, true, req.name};
    int lse_nd = varlen ? 2 : 3;
    if (Error e = check_tensor("lse", lse, lse_nd, a.q, true, plain); !e.ok()) return e;
    if (Error e = check_dtype("lse", lse, FA_FLOAT32, "(log-sum-exp per query row)"); !e.ok()) return e;
    if (varlen) {
      if (Error e = check_shape("lse", lse, {p->heads_q, p->total_q}); !e.ok()) return e;
      p->lse_layout = RowLayout{0, lse.stride[1], lse.stride[0], false};
    } else {
      if (Error e = check_shape("lse", lse, {p->batch, p->heads_q, p->seqlen_q}); !e.ok()) return e;
      p->lse_layout = RowLayout{lse.stride[0], lse.stride[2], lse.stride[1], false};
    }
    p->lse = static_cast<float*>(lse.data);
  }

  p->q = a.q.data;
  p->k = a.k.data;
  p->v = a.v.data;
  p->out = out.data;
  p->q_layout = layout_of(a.q, varlen, false);
  p->k_layout = layout_of(a.k, varlen, true);
  p->v_layout = layout_of(a.v, varlen, true);
  p->k_layout.paged = p->v_layout.paged = paged;
  p->out_layout = layout_of(out, varlen, false);

  if (dir == Direction::kBackward) {
    if (Error e = check_q_shaped("dout", *dout, p->head_dim_v); !e.ok()) return e;
    if (Error e = check_q_shaped("dq", *dq, p->head_dim); !e.ok()) return e;
    if (Error e = check_k_shaped("dk", *dk, a.k); !e.ok()) return e;
    if (Error e = check_k_shaped("dv", *dv, a.v); !e.ok()) return e;
    p->dout = dout->data;
    p->dq = dq->data;
    p->dk = dk->data;
    p->dv = dv->data;
    p->dout_layout = layout_of(*dout, varlen, false);
    p->dq_layout = layout_of(*dq, varlen, false);
    p->dk_layout = layout_of(*dk, varlen, true);
    p->dv_layout = layout_of(*dv, varlen, true);
  }
  if (dsinks != nullptr && dsinks->data != nullptr) {
    if (dir != Direction::kBackward) return invalid("dsinks", "is a backward output");
    if (p->sinks == nullptr) return invalid("dsinks", "needs attn.sinks (the gradient of the sink logits)");
    const Requirements plain{0, 1, true, req.name};
    if (Error e = check_tensor("dsinks", *dsinks, 1, a.q, true, plain); !e.ok()) return e;
    if (Error e = check_dtype("dsinks", *dsinks, FA_FLOAT32, "(like sinks)"); !e.ok()) return e;
    if (Error e = check_shape("dsinks", *dsinks, {p->heads_q}); !e.ok()) return e;
    p->dsinks = static_cast<float*>(dsinks->data);
  }

  // Outputs are written while inputs are still read (and by many threads at once): an output sharing memory
  // with an input, with another output or with itself would give wrong results, so it is refused.
  std::vector<std::pair<const char*, const fa_tensor*>> outputs, inputs = {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}};
  for (auto [name, t] : {std::pair<const char*, const fa_tensor*>{"cu_seqlens_q", &a.cu_seqlens_q},
                         {"cu_seqlens_k", &a.cu_seqlens_k},
                         {"seqused_k", &a.seqused_k},
                         {"alibi_slopes", &a.alibi_slopes},
                         {"sinks", &a.sinks},
                         {"block_table", &a.block_table},
                         {"q_descale", &a.q_descale},
                         {"k_descale", &a.k_descale},
                         {"v_descale", &a.v_descale}})
    if (t->data != nullptr) inputs.push_back({name, t});
  if (dir == Direction::kForward) {
    outputs.push_back({"out", &out});
    if (lse.data != nullptr) outputs.push_back({"lse", &lse});
  } else {
    inputs.insert(inputs.end(), {{"out", &out}, {"lse", &lse}, {"dout", dout}});
    outputs = {{"dq", dq}, {"dk", dk}, {"dv", dv}};
    if (p->dsinks != nullptr) outputs.push_back({"dsinks", dsinks});
  }
  std::vector<Footprint> written, read;
  for (const auto& [name, t] : outputs) {
    if (numel(*t) == 0) continue;
    if (self_overlapping(*t))
      return invalid(name, "elements overlap in memory (strides " + strides_str(*t) + " for shape " + shape_str(*t) +
                               "); an output needs its own memory for every element");
    written.push_back(footprint_of(name, *t));
  }
  for (const auto& [name, t] : inputs)
    if (numel(*t) != 0) read.push_back(footprint_of(name, *t));
  for (size_t i = 0; i < written.size(); ++i) {
    for (size_t j = 0; j < i; ++j)
      if (may_overlap(written[j], written[i]))
        return invalid(written[i].name, std::string("must not overlap ") + written[j].name +
                                            " in memory (outputs may share no memory with each other or with inputs)");
    for (const Footprint& r : read)
      if (may_overlap(r, written[i]))
        return invalid(written[i].name, std::string("must not overlap ") + r.name +
                                            " in memory (outputs may share no memory with each other or with inputs)");
  }
  return ok();
}

Error validate_quantize(const fa_quantize_params& a, QuantizeProblem* p) {
  *p = QuantizeProblem{};
  const Requirements plain{0, 0, true, "quantize"};
  if (Error e = check_tensor("x", a.x, 4, a.x, true, plain); !e.ok()) return e;
  if (a.x.dtype != FA_FLOAT32 && a.x.dtype != FA_FLOAT16 && a.x.dtype != FA_BFLOAT16)
    return invalid("x", std::string("dtype must be float32, float16 or bfloat16 (got ") + dtype_name(a.x.dtype) + ")");
  for (const auto& [name, t] : {std::pair<const char*, const fa_tensor*>{"out", &a.out}, {"descale", &a.descale}})
    if (t->device != a.x.device || t->device_index != a.x.device_index)
      return invalid(name, "must be on the same device as x");
  if (Error e = check_tensor("out", a.out, 4, a.x, true, plain); !e.ok()) return e;
  if (Error e = check_dtype("out", a.out, FA_FLOAT8_E4M3, "(the quantised x)"); !e.ok()) return e;
  if (Error e = check_shape("out", a.out, {a.x.shape[0], a.x.shape[1], a.x.shape[2], a.x.shape[3]}); !e.ok()) return e;
  if (Error e = check_tensor("descale", a.descale, 2, a.x, false, plain); !e.ok()) return e;
  if (Error e = check_dtype("descale", a.descale, FA_FLOAT32, "(one factor per (batch, head))"); !e.ok()) return e;
  if (Error e = check_shape("descale", a.descale, {a.x.shape[0], a.x.shape[2]}); !e.ok()) return e;
  const int64_t d = a.x.shape[3];
  if (a.hadamard != 0 && a.hadamard != 1) return invalid("hadamard", "must be 0 or 1");
  if (a.hadamard && (d < 1 || d > kMaxHeadDim || (d & (d - 1)) != 0))
    return invalid("hadamard", "needs a head dim (x's last dimension) that is a power of two in [1, 256] (got " +
                                   std::to_string(d) + ")");
  if (a.x.shape[0] > kMaxCount || a.x.shape[1] > kMaxCount || a.x.shape[2] > kMaxCount)
    return invalid("x", "batch, sequence length and heads must each be at most 2^31 - 1");
  std::vector<Footprint> written;
  for (const auto& [name, t] : {std::pair<const char*, const fa_tensor*>{"out", &a.out}, {"descale", &a.descale}}) {
    if (numel(*t) == 0) continue;
    if (self_overlapping(*t))
      return invalid(name, "elements overlap in memory (strides " + strides_str(*t) + " for shape " + shape_str(*t) +
                               "); an output needs its own memory for every element");
    const Footprint f = footprint_of(name, *t);
    if (numel(a.x) != 0 && may_overlap(footprint_of("x", a.x), f)) return invalid(name, "must not overlap x in memory");
    for (const Footprint& w : written)
      if (may_overlap(w, f)) return invalid(name, std::string("must not overlap ") + w.name + " in memory");
    written.push_back(f);
  }
  p->dtype = a.x.dtype;
  p->device = a.x.device;
  p->device_index = a.x.device_index;
  p->batch = a.x.shape[0];
  p->seqlen = a.x.shape[1];
  p->heads = a.x.shape[2];
  p->dim = d;
  p->x = a.x.data;
  p->out = static_cast<uint8_t*>(a.out.data);
  p->descale = static_cast<float*>(a.descale.data);
  p->x_batch = a.x.stride[0], p->x_row = a.x.stride[1], p->x_head = a.x.stride[2];
  p->out_batch = a.out.stride[0], p->out_row = a.out.stride[1], p->out_head = a.out.stride[2];
  p->descale_batch = a.descale.stride[0], p->descale_head = a.descale.stride[1];
  p->hadamard = a.hadamard != 0;
  p->seed = a.seed;
  return ok();
}

Error validate_merge(const fa_merge_params& a, MergeProblem* p) {
  *p = MergeProblem{};
  const Requirements plain{0, 0, true, "merge"};
  using Named = std::pair<const char*, const fa_tensor*>;
  for (const auto& [name, t] : {Named{"lse", &a.lse}, Named{"out_b", &a.out_b}, Named{"lse_b", &a.lse_b}})
    if (t->device != a.out.device || t->device_index != a.out.device_index)
      return invalid(name, "must be on the same device as out");
  const bool varlen = a.out.ndim == 3;
  if (a.out.ndim != 3 && a.out.ndim != 4)
    return invalid("out", "must have 4 dimensions (B, S, H, Dv), or 3 (T, H, Dv) for varlen outputs (got " +
                              std::to_string(a.out.ndim) + ")");
  const int nd = a.out.ndim;
  for (const auto& [name, t] : {Named{"out", &a.out}, Named{"out_b", &a.out_b}}) {
    if (Error e = check_tensor(name, *t, nd, a.out, true, plain); !e.ok()) return e;
    if (t->dtype != FA_FLOAT32 && t->dtype != FA_FLOAT16 && t->dtype != FA_BFLOAT16)
      return invalid(name,
                     std::string("dtype must be float32, float16 or bfloat16 (got ") + dtype_name(t->dtype) + ")");
  }
  const int64_t batch = varlen ? 1 : a.out.shape[0], rows = a.out.shape[nd - 3], heads = a.out.shape[nd - 2];
  const int64_t dim = a.out.shape[nd - 1];
  const bool same = [&] {
    for (int i = 0; i < nd; ++i)
      if (a.out_b.shape[i] != a.out.shape[i]) return false;
    return true;
  }();
  if (!same) return invalid("out_b", "shape must be out's " + shape_str(a.out) + " (got " + shape_str(a.out_b) + ")");
  for (const auto& [name, t] : {Named{"lse", &a.lse}, Named{"lse_b", &a.lse_b}}) {
    if (Error e = check_tensor(name, *t, nd - 1, a.out, false, plain); !e.ok()) return e;
    if (Error e = check_dtype(name, *t, FA_FLOAT32, "(log-sum-exps)"); !e.ok()) return e;
    if (Error e = varlen ? check_shape(name, *t, {heads, rows}) : check_shape(name, *t, {batch, heads, rows}); !e.ok())
      return e;
  }
  // Outputs in place: out and lse must give each element its own memory and share none with each other or with
  // the part merged into them (which they would overwrite while it is still read).
  std::vector<Footprint> read;
  for (const auto& [name, t] : {Named{"out_b", &a.out_b}, Named{"lse_b", &a.lse_b}})
    if (numel(*t) != 0) read.push_back(footprint_of(name, *t));
  std::vector<Footprint> written;
  for (const auto& [name, t] : {Named{"out", &a.out}, Named{"lse", &a.lse}}) {
    if (numel(*t) == 0) continue;
    if (self_overlapping(*t))
      return invalid(name, "elements overlap in memory (strides " + strides_str(*t) + " for shape " + shape_str(*t) +
                               "); a merged output needs its own memory for every element");
    const Footprint f = footprint_of(name, *t);
    for (const Footprint& o : written)
      if (may_overlap(o, f)) return invalid(name, std::string("must not overlap ") + o.name + " in memory");
    for (const Footprint& r : read)
      if (may_overlap(r, f))
        return invalid(
            name, std::string("must not overlap ") + r.name + " in memory (it is read while " + name + " is written)");
    written.push_back(f);
  }
  p->device = a.out.device;
  p->device_index = a.out.device_index;
  p->out_dtype = a.out.dtype;
  p->out_b_dtype = a.out_b.dtype;
  p->batch = batch, p->seqlen = rows, p->heads = heads, p->dim = dim;
  p->out = a.out.data;
  p->out_b = a.out_b.data;
  p->lse = static_cast<float*>(a.lse.data);
  p->lse_b = static_cast<const float*>(a.lse_b.data);
  // Varlen tensors have no batch dimension: batch 1, stride 0.
  p->out_batch = varlen ? 0 : a.out.stride[0], p->out_row = a.out.stride[nd - 3], p->out_head = a.out.stride[nd - 2];
  p->out_b_batch = varlen ? 0 : a.out_b.stride[0], p->out_b_row = a.out_b.stride[nd - 3];
  p->out_b_head = a.out_b.stride[nd - 2];
  p->lse_batch = varlen ? 0 : a.lse.stride[0], p->lse_head = a.lse.stride[nd - 3], p->lse_row = a.lse.stride[nd - 2];
  p->lse_b_batch = varlen ? 0 : a.lse_b.stride[0], p->lse_b_head = a.lse_b.stride[nd - 3];
  p->lse_b_row = a.lse_b.stride[nd - 2];
  return ok();
}

Error validate_kvcache(const fa_kvcache_params& a, KvcacheProblem* p) {
  *p = KvcacheProblem{};
  const Requirements plain{0, 0, true, "kvcache"};
  using Named = std::pair<const char*, const fa_tensor*>;
  // Every given tensor on k_cache's device (check_tensor's own message names q, which this call has no rule for).
  for (const auto& [name, t] :
       {Named{"v_cache", &a.v_cache}, Named{"k", &a.k}, Named{"v", &a.v}, Named{"cache_seqlens", &a.cache_seqlens},
        Named{"cache_batch_idx", &a.cache_batch_idx}, Named{"block_table", &a.block_table}, Named{"q", &a.q},
        Named{"rotary_cos", &a.rotary_cos}, Named{"rotary_sin", &a.rotary_sin}})
    if (t->data != nullptr && (t->device != a.k_cache.device || t->device_index != a.k_cache.device_index))
      return invalid(name, "must be on the same device as k_cache");
  if (Error e = check_tensor("k_cache", a.k_cache, 4, a.k_cache, true, plain); !e.ok()) return e;
  const fa_dtype dt = a.k_cache.dtype;
  if (dt != FA_FLOAT32 && dt != FA_FLOAT16 && dt != FA_BFLOAT16 && dt != FA_FLOAT8_E4M3)
    return invalid("k_cache",
                   std::string("dtype must be float32, float16, bfloat16 or float8_e4m3 (got ") + dtype_name(dt) + ")");
  const int64_t rows = a.k_cache.shape[0], slots = a.k_cache.shape[1], hkv = a.k_cache.shape[2];
  const int64_t d = a.k_cache.shape[3];
  if (Error e = check_tensor("v_cache", a.v_cache, 4, a.k_cache, true, plain); !e.ok()) return e;
  if (Error e = check_dtype("v_cache", a.v_cache, dt, "(k_cache's)"); !e.ok()) return e;
  const int64_t dv = a.v_cache.shape[3];
  if (Error e = check_shape("v_cache", a.v_cache, {rows, slots, hkv, dv}); !e.ok()) return e;
  if (Error e = check_tensor("k", a.k, 4, a.k_cache, true, plain); !e.ok()) return e;
  if (Error e = check_dtype("k", a.k, dt, "(k_cache's)"); !e.ok()) return e;
  const int64_t batch = a.k.shape[0], fresh = a.k.shape[1];
  if (Error e = check_shape("k", a.k, {batch, fresh, hkv, d}); !e.ok()) return e;
  if (Error e = check_tensor("v", a.v, 4, a.k_cache, true, plain); !e.ok()) return e;
  if (Error e = check_dtype("v", a.v, dt, "(k_cache's)"); !e.ok()) return e;
  if (Error e = check_shape("v", a.v, {batch, fresh, hkv, dv}); !e.ok()) return e;
  if (Error e = check_tensor("cache_seqlens", a.cache_seqlens, 1, a.k_cache, true, plain); !e.ok()) return e;
  if (Error e = check_dtype("cache_seqlens", a.cache_seqlens, FA_INT32, "(tokens already cached)"); !e.ok()) return e;
  if (Error e = check_shape("cache_seqlens", a.cache_seqlens, {batch}); !e.ok()) return e;
  if (batch > kMaxCount || fresh > kMaxCount || rows > kMaxCount || slots > kMaxCount || hkv > kMaxCount)
    return invalid("k_cache", "batch, tokens, cache rows / pages, slots and heads must each be at most 2^31 - 1");
  // An optional tensor is absent when its data pointer is null (flashattn.h).
  const bool paged = a.block_table.data != nullptr;
  int64_t capacity = slots;
  if (paged) {
    if (a.cache_batch_idx.data != nullptr)
      return invalid("cache_batch_idx", "is for contiguous caches (a paged cache maps sequences by block_table)");
    if (Error e = check_tensor("block_table", a.block_table, 2, a.k_cache, false, plain); !e.ok()) return e;
    if (Error e = check_dtype("block_table", a.block_table, FA_INT32, "(page indices)"); !e.ok()) return e;
    if (a.block_table.shape[0] != batch)
      return invalid("block_table", "must have one row per sequence (" + std::to_string(batch) + ", got " +
                                        std::to_string(a.block_table.shape[0]) + ")");
    if (slots < 1) return invalid("k_cache", "a paged cache needs page_size (dimension 1) >= 1");
    if (__builtin_mul_overflow(a.block_table.shape[1], slots, &capacity))
      return invalid("block_table", "max_pages * page_size overflows int64");
  } else if (a.cache_batch_idx.data != nullptr) {
    if (Error e = check_tensor("cache_batch_idx", a.cache_batch_idx, 1, a.k_cache, true, plain); !e.ok()) return e;
    if (Error e = check_dtype("cache_batch_idx", a.cache_batch_idx, FA_INT32, "(cache rows)"); !e.ok()) return e;
    if (Error e = check_shape("cache_batch_idx", a.cache_batch_idx, {batch}); !e.ok()) return e;
  } else if (rows < batch) {
    return invalid("k_cache", "has " + std::to_string(rows) + " rows for " + std::to_string(batch) +
                                  " sequences (give cache_batch_idx to map them)");
  }

  // Rotary.
  const bool rotary = a.rotary_cos.data != nullptr || a.rotary_sin.data != nullptr;
  const bool has_q = a.q.data != nullptr;
  if (has_q && !rotary) return invalid("q", "is only read to be rotated: give rotary_cos and rotary_sin with it");
  int64_t half = 0, ro_rows = 0, seqlen_q = 0;
  if (rotary) {
    if (a.rotary_cos.data == nullptr || a.rotary_sin.data == nullptr)
      return invalid(a.rotary_cos.data == nullptr ? "rotary_cos" : "rotary_sin",
                     "rotary_cos and rotary_sin come together");
    if (dt == FA_FLOAT8_E4M3)
      return invalid("rotary_cos", "is not applied to float8_e4m3 caches (it would rotate quantised values)");
    if (fresh == 0) return invalid("rotary_cos", "needs new keys k/v (the rotary embedding is applied to them)");
    if (Error e = check_tensor("rotary_cos", a.rotary_cos, 2, a.k_cache, true, plain); !e.ok()) return e;
    if (Error e = check_dtype("rotary_cos", a.rotary_cos, FA_FLOAT32, "(cos of each position)"); !e.ok()) return e;
    ro_rows = a.rotary_cos.shape[0];
    half = a.rotary_cos.shape[1];
    if (Error e = check_tensor("rotary_sin", a.rotary_sin, 2, a.k_cache, true, plain); !e.ok()) return e;
    if (Error e = check_dtype("rotary_sin", a.rotary_sin, FA_FLOAT32, "(sin of each position)"); !e.ok()) return e;
    if (Error e = check_shape("rotary_sin", a.rotary_sin, {ro_rows, half}); !e.ok()) return e;
    if (half < 1 || 2 * half > d)
      return invalid("rotary_cos", "rotary_dim (2 * " + std::to_string(half) +
                                       ") must be in (0, head_dim = " + std::to_string(d) + "]");
    if (a.rotary_interleaved != 0 && a.rotary_interleaved != 1) return invalid("rotary_interleaved", "must be 0 or 1");
    if (a.rotary_q_per_token != 0 && a.rotary_q_per_token != 1) return invalid("rotary_q_per_token", "must be 0 or 1");
    if (has_q) {
      if (Error e = check_tensor("q", a.q, 4, a.k_cache, true, plain); !e.ok()) return e;
      if (Error e = check_dtype("q", a.q, dt, "(k_cache's)"); !e.ok()) return e;
      seqlen_q = a.q.shape[1];
      if (Error e = check_shape("q", a.q, {batch, seqlen_q, a.q.shape[2], d}); !e.ok()) return e;
      if (a.q.shape[1] > kMaxCount || a.q.shape[2] > kMaxCount)
        return invalid("q", "tokens and heads must each be at most 2^31 - 1");
    }
  }

  // The values (CPU tensors: read here).
  const int32_t* lens = static_cast<const int32_t*>(a.cache_seqlens.data);
  const int32_t* idx = static_cast<const int32_t*>(a.cache_batch_idx.data);
  const int32_t* table = static_cast<const int32_t*>(a.block_table.data);
  if (a.k_cache.device == FA_DEVICE_CPU) {
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t len = lens[b * a.cache_seqlens.stride[0]];
      if (len < 0)
        return invalid("cache_seqlens",
                       "entries must be >= 0 (entry " + std::to_string(b) + " is " + std::to_string(len) + ")");
      if (len + fresh > capacity)
        return invalid("cache_seqlens", "entries + the " + std::to_string(fresh) + " new tokens must fit the cache's " +
                                            std::to_string(capacity) + " slots (entry " + std::to_string(b) + " is " +
                                            std::to_string(len) + ")");
      if (idx != nullptr) {
        const int64_t r = idx[b * a.cache_batch_idx.stride[0]];
        if (r < 0 || r >= rows)
          return invalid("cache_batch_idx", "entries must be in [0, " + std::to_string(rows) + ") (entry " +
                                                std::to_string(b) + " is " + std::to_string(r) + ")");
      }
      if (paged && fresh > 0)
        for (int64_t page = len / slots; page <= (len + fresh - 1) / slots; ++page) {
          const int64_t at = table[b * a.block_table.stride[0] + page * a.block_table.stride[1]];
          if (at < 0 || at >= rows)
            return invalid("block_table", "page indices the new tokens go to must be in [0, " + std::to_string(rows) +
                                              ") (sequence " + std::to_string(b) + ", entry " + std::to_string(page) +
                                              " is " + std::to_string(at) + ")");
        }
      if (rotary) {
        const int64_t reach = len + std::max<int64_t>(fresh, has_q ? (a.rotary_q_per_token ? seqlen_q : 1) : 0);
        if (reach > ro_rows)
          return invalid("rotary_cos", "has " + std::to_string(ro_rows) +
                                           " positions, fewer than the rotated tokens "
                                           "reach (" +
                                           std::to_string(reach) + ", sequence " + std::to_string(b) + ")");
      }
    }
  }

  // Outputs (the caches, q) share no memory with each other or with the inputs they are computed from.
  std::vector<Footprint> written;
  for (const auto& [name, t] : {Named{"k_cache", &a.k_cache}, Named{"v_cache", &a.v_cache}, Named{"q", &a.q}}) {
    if (t->data == nullptr || numel(*t) == 0) continue;
    if (self_overlapping(*t))
      return invalid(name, "elements overlap in memory (strides " + strides_str(*t) + " for shape " + shape_str(*t) +
                               "); an output needs its own memory for every element");
    const Footprint f = footprint_of(name, *t);
    for (const Footprint& w : written)
      if (may_overlap(w, f)) return invalid(name, std::string("must not overlap ") + w.name + " in memory");
    written.push_back(f);
  }
  for (const auto& [name, t] : {Named{"k", &a.k}, Named{"v", &a.v}, Named{"cache_seqlens", &a.cache_seqlens},
                                Named{"cache_batch_idx", &a.cache_batch_idx}, Named{"block_table", &a.block_table},
                                Named{"rotary_cos", &a.rotary_cos}, Named{"rotary_sin", &a.rotary_sin}}) {
    if (t->data == nullptr || numel(*t) == 0) continue;
    const Footprint r = footprint_of(name, *t);
    for (const Footprint& w : written)
      if (may_overlap(w, r)) return invalid(name, std::string("must not overlap ") + w.name + " in memory");
  }

  p->dtype = dt;
  p->device = a.k_cache.device;
  p->device_index = a.k_cache.device_index;
  p->batch = batch, p->new_tokens = fresh, p->heads_kv = hkv, p->dim = d, p->dim_v = dv;
  p->capacity = capacity;
  p->paged = paged;
  p->page_size = paged ? slots : 0;
  p->max_pages = paged ? a.block_table.shape[1] : 0;
  p->k_cache = a.k_cache.data, p->v_cache = a.v_cache.data, p->k = a.k.data, p->v = a.v.data;
  for (int i = 0; i < 3; ++i) {
    p->kc_stride[i] = a.k_cache.stride[i], p->vc_stride[i] = a.v_cache.stride[i];
    p->k_stride[i] = a.k.stride[i], p->v_stride[i] = a.v.stride[i];
    p->q_stride[i] = has_q ? a.q.stride[i] : 0;
  }
  p->seqlens = lens, p->seqlens_stride = a.cache_seqlens.stride[0];
  p->batch_idx = idx, p->batch_idx_stride = idx ? a.cache_batch_idx.stride[0] : 0;
  p->block_table = table;
  p->table_row = paged ? a.block_table.stride[0] : 0, p->table_col = paged ? a.block_table.stride[1] : 0;
  p->rot_half = half, p->rot_rows = ro_rows;
  p->cos = static_cast<const float*>(a.rotary_cos.data), p->sin = static_cast<const float*>(a.rotary_sin.data);
  p->cos_row = rotary ? a.rotary_cos.stride[0] : 0, p->sin_row = rotary ? a.rotary_sin.stride[0] : 0;
  p->interleaved = a.rotary_interleaved != 0, p->q_per_token = a.rotary_q_per_token != 0;
  p->q = has_q ? a.q.data : nullptr;
  p->seqlen_q = seqlen_q, p->heads_q = has_q ? a.q.shape[2] : 0;
  return ok();
}

}  // namespace flashattn::detail
