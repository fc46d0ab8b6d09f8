/*
 * flashattn C ABI: the one parameter struct every backend (CPU, CUDA sm80, CUDA sm90) and every binding
 * (C++, Python) consumes. Plain C so that bindings need no C++ ABI; the C++ API in flashattn.hpp wraps it.
 *
 * Layouts follow flash_attn:
 *   batched : q (B, Sq, Hq, D)   k (B, Sk, Hkv, D)   v (B, Sk, Hkv, Dv)   out (B, Sq, Hq, Dv)   lse (B, Hq, Sq)
 *   varlen  : q (Tq, Hq, D)      k (Tk, Hkv, D)      v (Tk, Hkv, Dv)      out (Tq, Hq, Dv)      lse (Hq, Tq)
 *             with cu_seqlens_q (B+1), cu_seqlens_k (B+1) int32 prefix sums, Tq = cu_seqlens_q[B].
 * Any strides (in elements) with a unit-stride last dimension. lse is float32 natural-log sum-exp.
 *
 * Semantics (logits of query i against key j in one sequence of Sq queries and Sk keys):
 *   s_ij = scale * <q_i, k_j>;  if softcap > 0: s_ij = softcap * tanh(s_ij / softcap);
 *   if alibi: s_ij -= slope_h * |i + off - j|;   masked (j outside the window) -> -inf;
 *   off = Sk - Sq (bottom-right alignment, flash_attn >= 2.1) or 0 (top-left).
 *   The window keeps i + off - window_left <= j <= i + off + window_right (-1 = unbounded side);
 *   causal is window_right = 0.
 * A query row with no visible key has out = 0 and lse = -inf. NaN inputs propagate to the rows they touch.
 * Learnable sinks (attn.sinks, one logit sink_h per query head) join every row's softmax denominator:
 *   out_i = sum_j e^{s_ij} v_j / (e^{sink_h} + sum_j e^{s_ij}),  lse_i = log(e^{sink_h} + sum_j e^{s_ij});
 * a row with no visible key then has out = 0 and lse = sink_h. The backward writes dsinks (optional):
 *   dsink_h = -sum_{b,i} e^{sink_h - lse_i} * <dout_i, out_i>.
 * Dropout (dropout_p > 0): out_i = sum_j P_ij m_ij / (1 - p) v_j with P the softmax above (lse unchanged) and
 * m_ij in {0, 1} a pure function of (seed, offset, b, h, i, j) (src/core/dropout.hpp): every backend draws the
 * same mask, and the backward regenerates it from the same seed and offset. (seed, offset) are attn.dropout_seed
 * and attn.dropout_offset, or the two entries of attn.dropout_rng (int64, on q's device): CUDA calls read that
 * tensor in the kernels, never on the host, so a captured CUDA graph draws a new mask whenever the caller refills
 * it (as torch's generator does for its own dropout under capture). With dropout_rng, dropout_seed and
 * dropout_offset must be 0.
 * A window side of at least the longest sequence (query or key) means the same as -1, so any int64 is safe.
 *
 * Paged K/V (attn.block_table, forward of batched calls): k (num_pages, page_size, Hkv, D) and v (num_pages,
 * page_size, Hkv, Dv) hold pages of any page_size >= 1; key j of sequence b is slot j % page_size of page
 * block_table[b][j / page_size]. The key length is max_pages * page_size, or seqused_k[b] keys when given (the
 * cache_seqlens of flash_attn_with_kvcache). Page indices of the pages a sequence reads must be in [0,
 * num_pages): checked on the host for CPU calls; CUDA calls do not read the table on the host (no
 * synchronisation, graph-capturable) and read an out-of-range page as zeros, never memory outside k and v.
 * Entries past a sequence's last used page are never read. Not with cu_seqlens (varlen) or in the backward.
 *
 * FP8 (q, k, v all FA_FLOAT8_E4M3; forward only; out bfloat16, lse float32): the stored values times their
 * dequantisation factors are the inputs of the semantics above,
 *   q_ih = q_descale[b, h'] * Q_ih,   k_jh = k_descale[b, hk] * K_jh,   v_jh = v_descale[b, hk] * V_jh,
 * with hk = h / (Hq / Hkv) the KV head of query head h. k_descale and v_descale have shape (B, Hkv); q_descale
 * (B, Hkv) (h' = hk, FlashAttention-3's convention) or (B, Hq) (h' = h, one factor per query head, as
 * fa_quantize_fp8 returns for q); absent = 1. Factors must be >= 0 (CPU calls: checked; CUDA calls are not read on
 * the host, and a negative q_descale * k_descale makes that head's rows NaN). The kernels may round the probabilities
 * to e4m3 before they multiply V (FlashAttention-3 does; the tests' plain implementation does too). fa_quantize_fp8
 * makes such inputs.
 *
 * Bad input is an error, never a crash or a wrong answer:
 *   - Outputs (out, lse; dq, dk, dv, dsinks) may share no memory with an input, another output or themselves (no
 *     in-place attention): FA_ERROR_INVALID_ARGUMENT names both tensors. Views that interleave in one buffer
 *     without sharing an element (dq, dk, dv of one packed dqkv) are accepted.
 *   - Element counts and byte extents must fit in int64, batch, heads and sequence lengths below 2^31.
 *   - Empty tensors (a zero in the shape) may have any strides and a NULL data pointer.
 *   - fa_exec.num_threads above the machine's hardware thread count is clamped to it.
 *   - The CPU backend keeps its scratch blocks of 1 MiB or more for later calls (fresh pages cost it 10 % of a short
 *     backward), at most FLASHATTN_CPU_SCRATCH_CACHE_MB MiB in all (read once; default 128, 0 keeps none).
 *   - No function throws or aborts: a failed host allocation is FA_ERROR_BACKEND with a message.
 */
#ifndef FLASHATTN_FLASHATTN_H
#define FLASHATTN_FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FA_MAX_DIMS 4

/* FA_FLOAT8_E4M3: OCP e4m3fn (torch.float8_e4m3fn: 1 sign, 4 exponent, 3 mantissa bits, max 448, NaN 0x7f/0xff,
   no infinities), forward only: q, k, v stored in it, out bfloat16 (see FP8 below). */
typedef enum fa_dtype {
  FA_FLOAT32 = 0,
  FA_FLOAT16 = 1,
  FA_BFLOAT16 = 2,
  FA_INT32 = 3,
  FA_FLOAT8_E4M3 = 4,
  FA_INT64 = 5, /* attn.dropout_rng only */
} fa_dtype;
typedef enum fa_device { FA_DEVICE_CPU = 0, FA_DEVICE_CUDA = 1 } fa_device;

/* A non-owning view. data == NULL marks an optional tensor as absent. */
typedef struct fa_tensor {
  void* data;
  fa_dtype dtype;
  fa_device device;
  int device_index;
  int ndim;
  int64_t shape[FA_MAX_DIMS];
  int64_t stride[FA_MAX_DIMS]; /* elements */
} fa_tensor;

typedef enum fa_status {
  FA_OK = 0,
  FA_ERROR_INVALID_ARGUMENT = 1, /* a rule of the API was broken; the message names the argument and rule */
  FA_ERROR_UNSUPPORTED = 2,      /* valid request that no built backend implements (e.g. dropout, fp32 on CUDA) */
  FA_ERROR_BACKEND = 3,          /* the device runtime failed (launch error, out of memory) */
} fa_status;

typedef enum fa_causal_alignment { FA_ALIGN_BOTTOM_RIGHT = 0, FA_ALIGN_TOP_LEFT = 1 } fa_causal_alignment;

typedef enum fa_backend {
  FA_BACKEND_AUTO = 0, /* the tensors' device decides; on CUDA the fastest kernel for the architecture */
  FA_BACKEND_CPU = 1,
  FA_BACKEND_CUDA_SM80 = 2,
  FA_BACKEND_CUDA_SM90 = 3,
} fa_backend;

/* What to compute: shared by forward and backward. */
typedef struct fa_attention {
  fa_tensor q, k, v;
  fa_tensor cu_seqlens_q, cu_seqlens_k; /* int32 (B+1); both present (varlen) or both absent */
  fa_tensor seqused_k;                  /* optional int32 (B): keys actually used per sequence. CPU: each entry
                                           must be in [0, keys of that sequence]; CUDA: not read on the host
                                           (no synchronisation, graph-capturable), entries clamped to that range */
  int64_t max_seqlen_q, max_seqlen_k;   /* varlen only: upper bounds of the per-sequence lengths */
  int has_softmax_scale;                /* 0: scale = 1/sqrt(head_dim) */
  float softmax_scale;
  int causal;
  fa_causal_alignment causal_alignment;
  int64_t window_left, window_right;         /* -1 = unbounded */
  float softcap;                             /* 0 = off */
  fa_tensor alibi_slopes;                    /* optional float32 (Hq) or (B, Hq) */
  float dropout_p;                           /* probability of dropping each attention probability, [0, 1); see below */
  fa_tensor sinks;                           /* optional float32 (Hq): learnable sink logits (see Semantics) */
  uint64_t dropout_seed, dropout_offset;     /* dropout: the mask is a function of (seed, offset, b, h, i, j) */
  fa_tensor block_table;                     /* optional int32 (B, max_pages): paged K/V (see Paged K/V below) */
  fa_tensor q_descale, k_descale, v_descale; /* FP8 only, optional float32: dequantisation factors (see FP8) */
  fa_tensor dropout_rng; /* optional int64 (2): (seed, offset) of the dropout mask, read where it lives (see Dropout) */
} fa_attention;

/* How to run it. */
typedef struct fa_exec {
  fa_backend backend;
  int num_threads;   /* CPU worker threads; 0 = all hardware threads */
  void* stream;      /* cudaStream_t for CUDA tensors; NULL = default stream */
  int deterministic; /* backward: bit-identical results run to run */
  int num_splits;    /* forward, CUDA: key/value splits per (batch, head) for short query sequences (split-KV:
                        partial results merged by a second kernel). 0 = the plan picks (splits only when the grid
                        would not fill the GPU), 1 = none, n > 1 = at most n (capped at 128 and at the key
                        blocks). A hint: backends without split-KV (CPU, cuda-sm80) compute the same answer unsplit */
} fa_exec;

typedef struct fa_fwd_params {
  fa_attention attn;
  fa_tensor out;
  fa_tensor lse; /* optional */
} fa_fwd_params;

typedef struct fa_bwd_params {
  fa_attention attn;
  fa_tensor out, lse, dout; /* out and lse as written by the forward */
  fa_tensor dq, dk, dv;
  fa_tensor dsinks; /* optional float32 (Hq), written: the gradient of attn.sinks (needs attn.sinks) */
} fa_bwd_params;

/* Defaults: no tensors, no mask, default scale, bottom-right alignment, unbounded window. */
fa_attention fa_attention_default(void);
fa_exec fa_exec_default(void);

fa_status fa_forward(const fa_fwd_params* params, const fa_exec* exec);
fa_status fa_backward(const fa_bwd_params* params, const fa_exec* exec);

/* The attention probabilities of a forward call, for inspection and tests (flash_attn's S_dmask): probs
 * (B, Hq, Sq, Sk) float32, contiguous (varlen: (B, Hq, max_seqlen_q, max_seqlen_k)), element [b, h, i, j] the
 * softmax probability of key j for query i of sequence b and head h (the attention's mask, scale, softcap, ALiBi and
 * sinks' denominator; computed in float64, rounded once), negated where dropout drops it (-0.0 for a dropped 0);
 * 0 past a sequence's queries or keys. params is a forward call's (out is validated, not written). Host memory
 * only, and memory grows with Sq * Sk: meant for small shapes (copy device tensors to the host first). */
fa_status fa_forward_probs(const fa_fwd_params* params, const fa_tensor* probs, const fa_exec* exec);

/* The message of the last failed call on this thread ("" after success). */
const char* fa_last_error(void);

/* The backend fa_forward would pick for these params ("cpu", "cuda-sm80", "cuda-sm90"). */
const char* fa_backend_name(const fa_fwd_params* params, const fa_exec* exec);

/* Query/key tile sizes the chosen backend uses for this call (they depend on the head dim, the mask and, on
   sm80, the key length; for IO accounting). */
void fa_forward_tile_shape(const fa_fwd_params* params, const fa_exec* exec, int* block_q, int* block_k);

/* What runs a call, as the plan decides it (the same decisions fa_forward / fa_backward then take): the kernel
   family, the tiles, split-KV splits and GQA packing (forward), and the device workspace the launch allocates.
   Nothing runs. Invalid or unsupported params get the call's error (message in fa_last_error); the checks that
   device pointers belong to the device happen only when a call runs. */
typedef struct fa_plan_info {
  const char* kernels; /* "cpu", "cuda-sm80", "cuda-sm90" (static storage) */
  int block_q, block_k;
  int num_splits; /* forward: key-range splits per tile (1: none) */
  int pack_gqa;   /* forward: the query heads of a KV group share a tile */
  int64_t workspace_bytes;
} fa_plan_info;
fa_status fa_forward_plan(const fa_fwd_params* params, const fa_exec* exec, fa_plan_info* info);
fa_status fa_backward_plan(const fa_bwd_params* params, const fa_exec* exec, fa_plan_info* info);

/* FP8 quantisation (the inputs of an FP8 forward): x (B, S, H, D) float32 / float16 / bfloat16 ->
 *   out (B, S, H, D) FA_FLOAT8_E4M3 and descale (B, H) float32 with  out = rne_e4m3(x' / descale),
 *   descale[b, h] = max |x'[b, :, h, :]| / 448 (1 where that is 0), and x' = x, or with hadamard = 1 the
 *   incoherent-processing rotation x' = x . diag(signs) . H_D / sqrt(D): H_D the Sylvester Hadamard matrix
 *   (D a power of two in [16, 256]), signs[c] = +-1 a function of (seed, c) alone (fa_hadamard_sign). Quantise q
 *   and k with the same seed: the rotation is orthogonal, so q'.k'^T = q.k^T and the attention is unchanged in
 *   exact arithmetic while outliers spread over the head dim. v is quantised without it (hadamard = 0). The
 *   dequantised x' (out * descale) stands within e4m3's rounding of x'. CPU and CUDA tensors (same device). */
typedef struct fa_quantize_params {
  fa_tensor x;       /* (B, S, H, D), unit last stride */
  fa_tensor out;     /* (B, S, H, D) FA_FLOAT8_E4M3, written */
  fa_tensor descale; /* (B, H) float32, written */
  int hadamard;      /* 1: rotate along D first */
  uint64_t seed;     /* the rotation's signs */
} fa_quantize_params;
fa_status fa_quantize_fp8(const fa_quantize_params* params, const fa_exec* exec);
/* The sign (+1 or -1) of column c in the rotation of fa_quantize_fp8 with this seed. */
int fa_hadamard_sign(uint64_t seed, int c);

/* KV-cache append (the first steps of flash_attn_with_kvcache, for callers without a tensor framework): for each
 * sequence b, the new tokens k[b, t], v[b, t] (t < S_new) are written into the cache at position
 * cache_seqlens[b] + t, after rotating the first rotary_dim columns of k (and of q, in place) when rotary_cos/sin
 * are given. Then attend with fa_forward over the cache, seqused_k = cache_seqlens + S_new (and attn.block_table
 * for a paged cache). Caches:
 *   contiguous  k_cache (B_cache, capacity, Hkv, D), v_cache (B_cache, capacity, Hkv, Dv); sequence b writes cache
 *               row cache_batch_idx[b] (default b)
 *   paged       k_cache (num_pages, page_size, Hkv, D), v_cache (num_pages, page_size, Hkv, Dv), block_table
 *               (B, max_pages) int32: position pos of sequence b is slot pos % page_size of page
 *               block_table[b][pos / page_size]; capacity = max_pages * page_size
 * k (B, S_new, Hkv, D) and v (B, S_new, Hkv, Dv) in the caches' dtype (float32, float16, bfloat16, or float8_e4m3
 * without rotary: appended as bytes). Rotary (flash_attn's): rotary_cos, rotary_sin float32 (S_ro, rotary_dim / 2),
 * rotary_dim even in (0, D]; the pair (x_i, x_j) of column pair c becomes (x_i cos - x_j sin, x_i sin + x_j cos)
 * at the token's position, computed in float32 and rounded to the dtype once; pairs are (2c, 2c + 1) with
 * rotary_interleaved = 1 and (c, c + rotary_dim / 2) with 0 (GPT-NeoX). Key t sits at cache_seqlens[b] + t; query
 * row t of q (B, Sq, Hq, D) at cache_seqlens[b] + t when rotary_q_per_token = 1 (causal or local attention) and
 * at cache_seqlens[b] otherwise. Rules (named errors): cache_seqlens[b] >= 0 and cache_seqlens[b] + S_new <=
 * capacity; cache_batch_idx in [0, B_cache); the pages the new tokens go to in [0, num_pages); the rotated positions
 * below S_ro. Nothing outside the new tokens' slots (and q) is written. CPU tensors; CUDA tensors return
 * FA_ERROR_UNSUPPORTED in this version (flashattn.flash_attn_with_kvcache appends on the GPU from Python). */
typedef struct fa_kvcache_params {
  fa_tensor k_cache, v_cache;       /* written at the new tokens' slots */
  fa_tensor k, v;                   /* the new tokens, read */
  fa_tensor cache_seqlens;          /* int32 (B): tokens already in each sequence's cache */
  fa_tensor cache_batch_idx;        /* optional int32 (B), contiguous caches only */
  fa_tensor block_table;            /* optional int32 (B, max_pages): a paged cache */
  fa_tensor q;                      /* optional (B, Sq, Hq, D): rotated in place (needs rotary_cos/sin) */
  fa_tensor rotary_cos, rotary_sin; /* optional float32 (S_ro, rotary_dim / 2), both or neither */
  int rotary_interleaved;           /* 1: pairs (2c, 2c + 1); 0: pairs (c, c + rotary_dim / 2) */
  int rotary_q_per_token;           /* 1: q row t at cache_seqlens + t; 0: every q row at cache_seqlens */
} fa_kvcache_params;
fa_status fa_kvcache_append(const fa_kvcache_params* params, const fa_exec* exec);

/* Merge of attention partials (ring attention, attention over several caches or key ranges): (out, lse) and
 * (out_b, lse_b) are attentions of the same queries over disjoint key sets, and (out, lse) becomes the attention
 * over their union, exactly as if computed at once:
 *   lse' = log(e^lse + e^lse_b),   out' = e^(lse - lse') out + e^(lse_b - lse') out_b,
 * in float32, the rule the split-KV combine uses too. A part whose lse is -inf saw no key: weight 0, and its out is
 * not read; a row neither part saw gets out 0 and lse -inf; a NaN in either lse makes the row NaN. Layouts are
 * fa_forward's outputs':
 *   batched  out, out_b (B, S, H, Dv), lse, lse_b (B, H, S)
 *   varlen   out, out_b (T, H, Dv),    lse, lse_b (H, T)
 * out float32, float16 or bfloat16 (float32 keeps a ring's running sum unrounded), out_b any of the three, lse and
 * lse_b float32; any strides with a unit last one for out and out_b. (out, lse) is read and written in place and
 * must not overlap (out_b, lse_b) or each other. CPU and CUDA tensors (all on one device; CUDA: in stream order). */
typedef struct fa_merge_params {
  fa_tensor out, lse;     /* the running partial: read, then written with the merge */
  fa_tensor out_b, lse_b; /* the partial merged into it: read */
} fa_merge_params;
fa_status fa_merge_partials(const fa_merge_params* params, const fa_exec* exec);

/* Contiguous view helper: strides filled row-major. */
fa_tensor fa_make_tensor(void* data, fa_dtype dtype, fa_device device, int ndim, const int64_t* shape);

int fa_cuda_available(void);

#ifdef __cplusplus
}
#endif
#endif
