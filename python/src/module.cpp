// flashattn._C: the C ABI (include/flashattn/flashattn.h) for any DLPack array (numpy, torch, cupy, jax).
// It depends on no array library: shapes, strides, dtype and device come from the DLPack header, the
// CUDA stream is an explicit integer, and the caller allocates every output. The one validation of the
// core runs on every call; its message becomes the Python exception's message, so an error names the
// argument and the rule exactly as the C API reports it.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "flashattn/flashattn.h"

namespace nb = nanobind;

namespace {

// Inputs may be read-only arrays (the core never writes them); outputs must be writable.
using In = nb::ndarray<nb::ro>;
using Out = nb::ndarray<>;
using OptIn = std::optional<In>;
using OptOut = std::optional<Out>;

[[noreturn]] void raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

// The status of a failed call, as the Python exception the package documents.
[[noreturn]] void raise_status(fa_status status) {
  const std::string message = fa_last_error();
  switch (status) {
    case FA_ERROR_INVALID_ARGUMENT: raise(PyExc_ValueError, message);
    case FA_ERROR_UNSUPPORTED: raise(PyExc_NotImplementedError, message);
    default: raise(PyExc_RuntimeError, message.empty() ? "flashattn: backend error" : message);
  }
}

// A DLPack dtype the C ABI may have no code for (fa_dtype values are named by flashattn::dtype_name).
std::string dlpack_dtype_name(nb::dlpack::dtype t) {
  const char* kind = "unknown";
  switch (nb::dlpack::dtype_code(t.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: kind = "bool"; break;
  }
  std::string s = std::string(kind) + std::to_string(int(t.bits));
  if (t.lanes != 1) s += "x" + std::to_string(int(t.lanes));
  return s;
}

// The dtype rule of each argument, for a dtype the C ABI has no code for (the core states the same rules for
// the dtypes it knows).
std::string dtype_rule(const std::string& name) {
  if (name == "cu_seqlens_q" || name == "cu_seqlens_k") return "int32 (prefix sums of sequence lengths)";
  if (name == "seqused_k") return "int32 (keys used per sequence)";
  if (name == "block_table") return "int32 (page indices)";
  if (name == "dropout_rng") return "int64 (the dropout seed and offset)";
  if (name == "alibi_slopes") return "float32 (one slope per head)";
  if (name == "lse") return "float32 (log-sum-exp per query row)";
  if (name == "q" || name == "k" || name == "v") return "float32, float16, bfloat16 or float8_e4m3fn";
  return "float32, float16 or bfloat16";
}

// DLPack's code of float8_e4m3fn (DLPack 1.1, kDLFloat8_e4m3fn); arrays from exporters without it come as 8-bit
// integers with fp8=True (flashattn.ops passes torch.float8_e4m3fn tensors viewed as uint8).
constexpr uint8_t kDLFloat8E4m3fn = 10;

fa_dtype to_fa_dtype(const char* name, nb::dlpack::dtype t, bool fp8_storage = false) {
  if (t.lanes == 1 && t.bits == 8 &&
      (t.code == kDLFloat8E4m3fn || (fp8_storage && (t.code == uint8_t(nb::dlpack::dtype_code::UInt) ||
                                                     t.code == uint8_t(nb::dlpack::dtype_code::Int)))))
    return FA_FLOAT8_E4M3;
  if (t == nb::dtype<float>()) return FA_FLOAT32;
  if (t == nb::dtype<int32_t>()) return FA_INT32;
  if (t == nb::dtype<int64_t>()) return FA_INT64;
  if (t.lanes == 1 && t.bits == 16 && t.code == uint8_t(nb::dlpack::dtype_code::Float)) return FA_FLOAT16;
  if (t.lanes == 1 && t.bits == 16 && t.code == uint8_t(nb::dlpack::dtype_code::Bfloat)) return FA_BFLOAT16;
  raise(PyExc_ValueError,
        std::string(name) + ": dtype must be " + dtype_rule(name) + " (got " + dlpack_dtype_name(t) + ")");
}

// A non-owning fa_tensor view of a DLPack array (strides in elements, as DLPack and fa_tensor both use).
template <typename Array>
fa_tensor view(const char* name, const Array& a, bool fp8_storage = false) {
  fa_tensor t{};
  const size_t ndim = a.ndim();
  if (ndim > FA_MAX_DIMS)
    raise(PyExc_ValueError, std::string(name) + ": must have at most " + std::to_string(FA_MAX_DIMS) +
                                " dimensions (got " + std::to_string(ndim) + ")");
  const int device_type = a.device_type();
  if (device_type == nb::device::cpu::value) {
    t.device = FA_DEVICE_CPU;
    t.device_index = 0;
  } else if (device_type == nb::device::cuda::value) {
    t.device = FA_DEVICE_CUDA;
    t.device_index = a.device_id();
  } else {
    raise(PyExc_ValueError, std::string(name) + ": must be in CPU or CUDA device memory (got DLPack device type " +
                                std::to_string(device_type) + ")");
  }
  t.dtype = to_fa_dtype(name, a.dtype(), fp8_storage);
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.ndim = int(ndim);
  for (size_t i = 0; i < ndim; ++i) {
    t.shape[i] = int64_t(a.shape(i));
    t.stride[i] = int64_t(a.stride(i));
  }
  return t;
}

template <typename Array>
fa_tensor view(const char* name, const std::optional<Array>& a, bool fp8_storage = false) {
  return a ? view(name, *a, fp8_storage) : fa_tensor{};
}

fa_causal_alignment to_alignment(int alignment) {
  if (alignment != FA_ALIGN_BOTTOM_RIGHT && alignment != FA_ALIGN_TOP_LEFT)
    raise(PyExc_ValueError,
          "causal_alignment: must be 0 (bottom-right) or 1 (top-left) (got " + std::to_string(alignment) + ")");
  return fa_causal_alignment(alignment);
}

// The arguments shared by forward and backward (what to compute), in the order the Python functions take them.
fa_attention attention(const In& q, const In& k, const In& v, const OptIn& cu_seqlens_q, const OptIn& cu_seqlens_k,
                       const OptIn& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                       std::optional<double> softmax_scale, bool causal, int causal_alignment, int64_t window_left,
                       int64_t window_right, double softcap, const OptIn& alibi_slopes, double dropout_p,
                       const OptIn& sinks, uint64_t dropout_seed, uint64_t dropout_offset, const OptIn& dropout_rng,
                       bool fp8 = false) {
  fa_attention a = fa_attention_default();
  a.q = view("q", q, fp8);
  a.k = view("k", k, fp8);
  a.v = view("v", v, fp8);
  a.cu_seqlens_q = view("cu_seqlens_q", cu_seqlens_q);
  a.cu_seqlens_k = view("cu_seqlens_k", cu_seqlens_k);
  a.seqused_k = view("seqused_k", seqused_k);
  a.max_seqlen_q = max_seqlen_q;
  a.max_seqlen_k = max_seqlen_k;
  a.has_softmax_scale = softmax_scale.has_value();
  a.softmax_scale = softmax_scale ? float(*softmax_scale) : 0.f;
  a.causal = causal;
  a.causal_alignment = to_alignment(causal_alignment);
  a.window_left = window_left;
  a.window_right = window_right;
  a.softcap = float(softcap);
  a.alibi_slopes = view("alibi_slopes", alibi_slopes);
  a.dropout_p = float(dropout_p);
  a.sinks = view("sinks", sinks);
  a.dropout_seed = dropout_seed;
  a.dropout_offset = dropout_offset;
  a.dropout_rng = view("dropout_rng", dropout_rng);
  return a;
}

fa_exec execution(int backend, int num_threads, uintptr_t stream, bool deterministic, int num_splits = 0) {
  fa_exec e = fa_exec_default();
  e.backend = fa_backend(backend);
  e.num_threads = num_threads;
  e.stream = reinterpret_cast<void*>(stream);
  e.deterministic = deterministic;
  e.num_splits = num_splits;
  return e;
}

void forward(const In& q, const In& k, const In& v, const Out& out, const OptOut& lse, const OptIn& cu_seqlens_q,
             const OptIn& cu_seqlens_k, const OptIn& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
             std::optional<double> softmax_scale, bool causal, int causal_alignment, int64_t window_left,
             int64_t window_right, double softcap, const OptIn& alibi_slopes, double dropout_p, const OptIn& sinks,
             uint64_t dropout_seed, uint64_t dropout_offset, const OptIn& dropout_rng, int num_splits,
             const OptIn& block_table, bool fp8, const OptIn& q_descale, const OptIn& k_descale, const OptIn& v_descale,
             const OptOut& probs, int backend, int num_threads, uintptr_t stream) {
  fa_fwd_params p{};
  p.attn = attention(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                     causal_alignment, window_left, window_right, softcap, alibi_slopes, dropout_p, sinks, dropout_seed,
                     dropout_offset, dropout_rng, fp8);
  p.attn.block_table = view("block_table", block_table);  // forward only: paged K/V (flashattn.h)
  // FP8 (forward only): the dequantisation factors.
  p.attn.q_descale = view("q_descale", q_descale);
  p.attn.k_descale = view("k_descale", k_descale);
  p.attn.v_descale = view("v_descale", v_descale);
  p.out = view("out", out);
  p.lse = view("lse", lse);
  const fa_exec e = execution(backend, num_threads, stream, false, num_splits);
  // With probs: the probabilities only (fa_forward_probs), out is not written.
  const fa_tensor probs_view = view("probs", probs);
  fa_status status;
  {
    // The kernels use their own threads (CPU) or the stream (CUDA); other Python threads may run meanwhile.
    nb::gil_scoped_release release;
    status = probs ? fa_forward_probs(&p, &probs_view, &e) : fa_forward(&p, &e);
  }
  if (status != FA_OK) raise_status(status);
}

void backward(const In& dout, const In& q, const In& k, const In& v, const In& out, const In& lse, const Out& dq,
              const Out& dk, const Out& dv, const OptIn& cu_seqlens_q, const OptIn& cu_seqlens_k,
              const OptIn& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k, std::optional<double> softmax_scale,
              bool causal, int causal_alignment, int64_t window_left, int64_t window_right, double softcap,
              const OptIn& alibi_slopes, double dropout_p, const OptIn& sinks, const OptOut& dsinks,
              uint64_t dropout_seed, uint64_t dropout_offset, const OptIn& dropout_rng, bool deterministic, int backend,
              int num_threads, uintptr_t stream) {
  fa_bwd_params p{};
  p.attn = attention(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                     causal_alignment, window_left, window_right, softcap, alibi_slopes, dropout_p, sinks, dropout_seed,
                     dropout_offset, dropout_rng);
  p.dsinks = view("dsinks", dsinks);
  p.out = view("out", out);
  p.lse = view("lse", lse);
  p.dout = view("dout", dout);
  p.dq = view("dq", dq);
  p.dk = view("dk", dk);
  p.dv = view("dv", dv);
  const fa_exec e = execution(backend, num_threads, stream, deterministic);
  fa_status status;
  {
    nb::gil_scoped_release release;
    status = fa_backward(&p, &e);
  }
  if (status != FA_OK) raise_status(status);
}

// fa_quantize_fp8: x (B, S, H, D) -> out (8-bit storage of e4m3), descale (B, H).
void quantize_fp8(const In& x, const Out& out, const Out& descale, bool hadamard, uint64_t seed, uintptr_t stream) {
  fa_quantize_params p{};
  p.x = view("x", x);
  p.out = view("out", out, true);
  p.descale = view("descale", descale);
  p.hadamard = hadamard ? 1 : 0;
  p.seed = seed;
  fa_exec e = fa_exec_default();
  e.stream = reinterpret_cast<void*>(stream);
  fa_status status;
  {
    nb::gil_scoped_release release;
    status = fa_quantize_fp8(&p, &e);
  }
  if (status != FA_OK) raise_status(status);
}

// fa_merge_partials: (out_b, lse_b) merged into (out, lse) in place.
void merge_partials(const Out& out, const Out& lse, const In& out_b, const In& lse_b, uintptr_t stream) {
  fa_merge_params p{};
  p.out = view("out", out);
  p.lse = view("lse", lse);
  p.out_b = view("out_b", out_b);
  p.lse_b = view("lse_b", lse_b);
  fa_exec e = fa_exec_default();
  e.stream = reinterpret_cast<void*>(stream);
  fa_status status;
  {
    nb::gil_scoped_release release;
    status = fa_merge_partials(&p, &e);
  }
  if (status != FA_OK) raise_status(status);
}

// The backend fa_forward would run for an array on q's device ("cpu", "cuda-sm80", "cuda-sm90", "none").
std::string backend_name(const In& q, int backend) {
  fa_fwd_params p{};
  p.attn = fa_attention_default();
  p.attn.q = view("q", q);
  const fa_exec e = execution(backend, 0, 0, false);
  return fa_backend_name(&p, &e);
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "flashattn C ABI for DLPack arrays (no torch dependency). Use flashattn.ops for a friendlier API.";

  m.attr("BACKEND_AUTO") = int(FA_BACKEND_AUTO);
  m.attr("BACKEND_CPU") = int(FA_BACKEND_CPU);
  m.attr("BACKEND_CUDA_SM80") = int(FA_BACKEND_CUDA_SM80);
  m.attr("BACKEND_CUDA_SM90") = int(FA_BACKEND_CUDA_SM90);
  m.attr("ALIGN_BOTTOM_RIGHT") = int(FA_ALIGN_BOTTOM_RIGHT);
  m.attr("ALIGN_TOP_LEFT") = int(FA_ALIGN_TOP_LEFT);
#ifdef FLASHATTN_PY_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif

  m.def(
      "cuda_available", []() { return fa_cuda_available() != 0; },
      "True when this build has CUDA backends and a CUDA device is present.");
  m.def("backend_name", &backend_name, nb::arg("q"), nb::arg("backend") = int(FA_BACKEND_AUTO),
        "Name of the backend a call with q (its device) and this backend code would run.");

  m.def("forward", &forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse").none() = nb::none(), nb::kw_only(), nb::arg("cu_seqlens_q").none() = nb::none(),
        nb::arg("cu_seqlens_k").none() = nb::none(), nb::arg("seqused_k").none() = nb::none(),
        nb::arg("max_seqlen_q") = 0, nb::arg("max_seqlen_k") = 0, nb::arg("softmax_scale").none() = nb::none(),
        nb::arg("causal") = false, nb::arg("causal_alignment") = int(FA_ALIGN_BOTTOM_RIGHT),
        nb::arg("window_left") = -1, nb::arg("window_right") = -1, nb::arg("softcap") = 0.0,
        nb::arg("alibi_slopes").none() = nb::none(), nb::arg("dropout_p") = 0.0, nb::arg("sinks").none() = nb::none(),
        nb::arg("dropout_seed") = 0, nb::arg("dropout_offset") = 0, nb::arg("dropout_rng").none() = nb::none(),
        nb::arg("num_splits") = 0, nb::arg("block_table").none() = nb::none(), nb::arg("fp8") = false,
        nb::arg("q_descale").none() = nb::none(), nb::arg("k_descale").none() = nb::none(),
        nb::arg("v_descale").none() = nb::none(), nb::arg("probs").none() = nb::none(),
        nb::arg("backend") = int(FA_BACKEND_AUTO), nb::arg("num_threads") = 0, nb::arg("stream") = 0,
        "fa_forward: writes out (and lse when given). Layouts, semantics and errors as in flashattn.h.\n"
        "probs: instead, fa_forward_probs writes the probabilities (B, Hq, Sq, Sk) (host arrays only).\n"
        "stream is a cudaStream_t as an integer (0 = default stream), ignored for CPU arrays.\n"
        "fp8: q, k, v are float8_e4m3fn stored as 8-bit integers (exporters without DLPack's float8 code).");

  m.def("quantize_fp8", &quantize_fp8, nb::arg("x"), nb::arg("out"), nb::arg("descale"), nb::kw_only(),
        nb::arg("hadamard") = false, nb::arg("seed") = 0, nb::arg("stream") = 0,
        "fa_quantize_fp8: out (8-bit storage of float8_e4m3fn) and descale (B, H) float32 from x (B, S, H, D).");

  m.def("merge_partials", &merge_partials, nb::arg("out"), nb::arg("lse"), nb::arg("out_b"), nb::arg("lse_b"),
        nb::kw_only(), nb::arg("stream") = 0,
        "fa_merge_partials: (out, lse) becomes the attention over its keys and out_b's (in place).");

  m.def("backward", &backward, nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::kw_only(),
        nb::arg("cu_seqlens_q").none() = nb::none(), nb::arg("cu_seqlens_k").none() = nb::none(),
        nb::arg("seqused_k").none() = nb::none(), nb::arg("max_seqlen_q") = 0, nb::arg("max_seqlen_k") = 0,
        nb::arg("softmax_scale").none() = nb::none(), nb::arg("causal") = false,
        nb::arg("causal_alignment") = int(FA_ALIGN_BOTTOM_RIGHT), nb::arg("window_left") = -1,
        nb::arg("window_right") = -1, nb::arg("softcap") = 0.0, nb::arg("alibi_slopes").none() = nb::none(),
        nb::arg("dropout_p") = 0.0, nb::arg("sinks").none() = nb::none(), nb::arg("dsinks").none() = nb::none(),
        nb::arg("dropout_seed") = 0, nb::arg("dropout_offset") = 0, nb::arg("dropout_rng").none() = nb::none(),
        nb::arg("deterministic") = false, nb::arg("backend") = int(FA_BACKEND_AUTO), nb::arg("num_threads") = 0,
        nb::arg("stream") = 0, "fa_backward: writes dq, dk, dv from the forward's out and lse.");
}
