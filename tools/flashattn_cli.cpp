// `flashattn` — the main job: run attention on the best available backend (`run`) or sweep a grid (`bench`).
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_common.hpp"

using namespace flashattn;
using namespace flashattn::cli;

namespace {

const char* kUsage = R"(usage: flashattn <command> [options]

commands:
  run     compute attention once per timing repeat and report backend, time, TFLOP/s, IO; --check compares
          sampled rows with the float64 reference
  bench   sweep seqlens x head dims x dtypes x masks, write CSV and markdown
  help    this text

shape and mask options (run and bench), defaults in brackets:
  --batch N [1]  --seqlen N (both q and k) [1024]  --seqlen-q N  --seqlen-k N  --heads N [8]
  --heads-kv N [= heads]  --hdim N [64]  --hdim-v N [= hdim]  --dtype bf16|fp16|fp32|fp8 [bf16]
  (fp8: e4m3 q, k, v of N(0, 1) values, no dequantisation factors, bf16 out; forward only)
  --causal [off]  --top-left [bottom-right alignment]  --window L,R [-1,-1; -1 = unbounded side]
  --softcap C [0 = off]  --alibi [off]
run options:
  --bwd [forward only]  --check [off]  --threads N [0 = all hardware threads]
  --iters N [0 = time-budgeted: up to 5 on the CPU, 100 on CUDA]  --backend auto|cpu|cuda-sm80|cuda-sm90 [auto]
  --seed N [0]
bench options:
  --seqlens LIST [1024,2048,4096,8192,16384]  --hdims LIST [64,128]  --dtypes LIST [fp32,bf16]
  --masks none,causal [none,causal]  --tokens N [0: batch as given; else batch = tokens / seqlen]
  --bwd  --csv FILE  --md FILE [none: table on stdout only]  --threads N  --iters N  --machine NAME [unnamed]
Sizes are non-negative integers (heads at least 1), counts fit in int64; a malformed number, an option
without its value or an output file that cannot be written is an error (exit status 2, or 1 when a run fails).
)";

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "flashattn: %s\n", msg.c_str());
  std::exit(2);
}

// Strict: the whole text is one decimal integer in [lo, hi] (no trailing characters, no overflow).
int64_t to_int(const std::string& flag, const char* v, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  if (std::isspace(static_cast<unsigned char>(*v))) die(flag + ": expected an integer, got '" + v + "'");
  long long x = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0') die(flag + ": expected an integer, got '" + v + "'");
  if (errno == ERANGE || x < lo || x > hi)
    die(flag + ": " + v + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

int64_t to_size(const std::string& flag, const char* v, int64_t lo = 0) { return to_int(flag, v, lo, INT64_MAX); }

uint64_t to_u64(const std::string& flag, const char* v) {
  char* end = nullptr;
  errno = 0;
  if (*v == '-' || *v == '+' || *v == ' ')
    die(flag + ": expected a non-negative integer, got '" + std::string(v) + "'");
  unsigned long long x = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0') die(flag + ": expected a non-negative integer, got '" + std::string(v) + "'");
  if (errno == ERANGE) die(flag + ": " + v + " is out of range [0, 2^64 - 1]");
  return x;
}

float to_float(const std::string& flag, const char* v) {
  char* end = nullptr;
  errno = 0;
  if (std::isspace(static_cast<unsigned char>(*v))) die(flag + ": expected a number, got '" + std::string(v) + "'");
  float x = std::strtof(v, &end);
  if (end == v || *end != '\0') die(flag + ": expected a number, got '" + std::string(v) + "'");
  if (errno == ERANGE || !std::isfinite(x)) die(flag + ": " + v + " is not a finite float32");
  return x;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

fa_dtype parse_dtype(const std::string& s) {
  if (s == "bf16" || s == "bfloat16") return FA_BFLOAT16;
  if (s == "fp16" || s == "float16" || s == "half") return FA_FLOAT16;
  if (s == "fp32" || s == "float32" || s == "float") return FA_FLOAT32;
  if (s == "fp8" || s == "float8_e4m3fn" || s == "e4m3") return FA_FLOAT8_E4M3;
  die("--dtype: expected bf16, fp16, fp32 or fp8, got '" + s + "'");
}

struct Args {
  Shape shape;
  Options opt;
  bool seqlen_q_set = false, seqlen_k_set = false;
  std::vector<int64_t> seqlens{1024, 2048, 4096, 8192, 16384}, hdims{64, 128};
  std::vector<fa_dtype> dtypes{FA_FLOAT32, FA_BFLOAT16};
  std::vector<std::string> masks{"none", "causal"};
  int64_t tokens = 0;
  std::string csv, md, machine;
};

Args parse(int argc, char** argv, int first) {
  Args a;
  for (int i = first; i < argc; ++i) {
    std::string f = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) die(f + ": missing value");
      return argv[++i];
    };
    if (f == "--batch")
      a.shape.batch = to_size(f, val());
    else if (f == "--seqlen")
      a.shape.seqlen_q = a.shape.seqlen_k = to_size(f, val());
    else if (f == "--seqlen-q")
      a.shape.seqlen_q = to_size(f, val()), a.seqlen_q_set = true;
    else if (f == "--seqlen-k")
      a.shape.seqlen_k = to_size(f, val()), a.seqlen_k_set = true;
    else if (f == "--heads")
      a.shape.heads = to_size(f, val(), 1);
    else if (f == "--heads-kv")
      a.shape.heads_kv = to_size(f, val());
    else if (f == "--hdim")
      a.shape.head_dim = to_size(f, val());
    else if (f == "--hdim-v")
      a.shape.head_dim_v = to_size(f, val());
    else if (f == "--dtype")
      a.shape.dtype = parse_dtype(val());
    else if (f == "--causal")
      a.shape.causal = true;
    else if (f == "--top-left")
      a.shape.top_left = true;
    else if (f == "--window") {
      auto parts = split(val());
      if (parts.size() != 2) die("--window: expected L,R (e.g. 256,0; -1 = unbounded)");
      a.shape.window_left = to_int(f, parts[0].c_str(), -1, INT64_MAX);
      a.shape.window_right = to_int(f, parts[1].c_str(), -1, INT64_MAX);
    } else if (f == "--softcap")
      a.shape.softcap = to_float(f, val());
    else if (f == "--alibi")
      a.shape.alibi = true;
    else if (f == "--bwd")
      a.opt.backward = true;
    else if (f == "--check")
      a.opt.check = true;
    else if (f == "--threads")
      a.opt.threads = int(to_int(f, val(), 0, INT_MAX));
    else if (f == "--iters")
      a.opt.iters = int(to_int(f, val(), 0, INT_MAX));
    else if (f == "--seed")
      a.opt.seed = to_u64(f, val());
    else if (f == "--backend") {
      std::string b = val();
      if (b == "auto")
        a.opt.backend = FA_BACKEND_AUTO;
      else if (b == "cpu")
        a.opt.backend = FA_BACKEND_CPU;
      else if (b == "cuda-sm80" || b == "cuda")
        a.opt.backend = FA_BACKEND_CUDA_SM80;
      else if (b == "cuda-sm90")
        a.opt.backend = FA_BACKEND_CUDA_SM90;
      else
        die("--backend: expected auto, cpu, cuda-sm80 or cuda-sm90");
    } else if (f == "--seqlens") {
      a.seqlens.clear();
      for (auto& x : split(val())) a.seqlens.push_back(to_size(f, x.c_str()));
    } else if (f == "--hdims") {
      a.hdims.clear();
      for (auto& x : split(val())) a.hdims.push_back(to_size(f, x.c_str()));
    } else if (f == "--dtypes") {
      a.dtypes.clear();
      for (auto& x : split(val())) a.dtypes.push_back(parse_dtype(x));
    } else if (f == "--masks") {
      a.masks = split(val());
      if (a.masks.empty()) die("--masks: expected none and/or causal");
      for (auto& m : a.masks)
        if (m != "none" && m != "causal") die("--masks: expected none and/or causal");
    } else if (f == "--tokens")
      a.tokens = to_size(f, val());
    else if (f == "--csv")
      a.csv = val();
    else if (f == "--md")
      a.md = val();
    else if (f == "--machine")
      a.machine = val();
    else
      die("unknown option '" + f + "' (see flashattn help)");
  }
  return a;
}

// A file the user asked for that cannot be written is an error, not a silent success.
void write_file(const char* flag, const std::string& path, const std::string& text) {
  errno = 0;
  std::ofstream f(path);
  if (f) f << text;
  if (f) f.close();
  if (!f)
    die(std::string(flag) + ": cannot write '" + path + "'" + (errno ? std::string(": ") + std::strerror(errno) : ""));
}

// One line of the library's plan for the call (fa_plan_info): the kernels, their tiles and what else they decided.
void print_plan(const char* label, const fa_plan_info& p, bool forward) {
  std::printf("%s%s, %dx%d tiles", label, p.kernels ? p.kernels : "?", p.block_q, p.block_k);
  if (forward)
    std::printf(", %d key split%s, GQA packing %s", p.num_splits, p.num_splits == 1 ? "" : "s",
                p.pack_gqa ? "on" : "off");
  std::printf(", workspace %s\n", p.workspace_bytes > 0 ? human_bytes(double(p.workspace_bytes)).c_str() : "none");
}

int cmd_run(Args a) {
  const Shape& s = a.shape;
  std::printf("flashattn run: %s%s\n", s.describe().c_str(), a.opt.backward ? " (fwd+bwd)" : " (fwd)");
  RunResult r = run_attention(s, a.opt);
  std::printf("backend      : %s\n", r.backend.c_str());
  if (!r.ok) {
    std::printf("error        : %s\n", r.error.c_str());
    return 1;
  }
  std::printf("forward      : %9.3f ms  %8.3f TFLOP/s\n", r.fwd_ms, r.fwd_tflops);
  if (a.opt.backward) std::printf("backward     : %9.3f ms  %8.3f TFLOP/s\n", r.bwd_ms, r.bwd_tflops);
  if (r.fwd_plan_ok) print_plan("plan (fwd)   : ", r.fwd_plan, true);
  if (r.bwd_plan_ok) print_plan("plan (bwd)   : ", r.bwd_plan, false);
  IoPicture io = io_picture(s, r.block_q, r.block_k);
  std::printf("IO (forward) : standard QK^T/softmax/PV kernels move %s (S and P through memory);\n",
              human_bytes(io.standard_bytes).c_str());
  if (io.fused_bytes <= 0 || io.standard_bytes <= 0)
    std::printf("               this kernel (%dx%d tiles) moves %s (empty problem)\n", r.block_q, r.block_k,
                human_bytes(io.fused_bytes).c_str());
  else if (io.standard_bytes >= io.fused_bytes)
    std::printf("               this kernel (%dx%d tiles) moves %s: %.1fx less\n", r.block_q, r.block_k,
                human_bytes(io.fused_bytes).c_str(), io.standard_bytes / io.fused_bytes);
  else
    std::printf("               this kernel (%dx%d tiles) moves %s: %.1fx more\n", r.block_q, r.block_k,
                human_bytes(io.fused_bytes).c_str(), io.fused_bytes / io.standard_bytes);
  if (a.opt.check && r.checked_rows == 0) {
    std::printf("check        : PASS (empty problem: no rows to compare)\n");
  } else if (a.opt.check) {
    std::printf("check (out)  : max_err %.3e mean_err %.3e tolerance %.3e (2x plain %s + floor)\n", r.max_err,
                r.mean_err, r.tol, dtype_name(s.dtype));
    if (a.opt.backward) std::printf("check (dq)   : max_err %.3e tolerance %.3e\n", r.dq_max_err, r.dq_tol);
    std::printf("check        : %s\n", r.check_passed ? "PASS" : "FAIL");
    return r.check_passed ? 0 : 1;
  }
  return 0;
}

int cmd_bench(Args a) {
  struct Row {
    std::string dtype, mask;
    int64_t hdim, seqlen, batch, heads;
    RunResult r;
  };
  std::vector<Row> rows;
  const size_t total = a.seqlens.size() * a.hdims.size() * a.dtypes.size() * a.masks.size();
  size_t n = 0;
  const auto t_start = std::chrono::steady_clock::now();
  for (fa_dtype dt : a.dtypes)
    for (const std::string& mask : a.masks)
      for (int64_t d : a.hdims)
        for (int64_t sl : a.seqlens) {
          Shape s = a.shape;
          s.dtype = dt;
          s.head_dim = d;
          s.seqlen_q = s.seqlen_k = sl;
          s.causal = mask == "causal";
          if (a.tokens > 0 && sl > 0) s.batch = std::max<int64_t>(1, a.tokens / sl);
          ++n;
          std::fprintf(stderr, "[%zu/%zu] %-46s ", n, total, s.describe().c_str());
          RunResult r = run_attention(s, a.opt);
          double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
          if (r.ok)
            std::fprintf(stderr, "fwd %8.3f TFLOP/s%s  (%.0f s elapsed)\n", r.fwd_tflops,
                         a.opt.backward ? (" bwd " + std::to_string(r.bwd_tflops).substr(0, 7)).c_str() : "", el);
          else
            std::fprintf(stderr, "error: %s\n", r.error.c_str());
          rows.push_back({dtype_short_name(dt), mask, d, sl, s.batch, s.heads, r});
        }
  const std::string backend = rows.empty() ? "none" : rows[0].r.backend;
  std::ostringstream csv, md;
  csv << "backend,dtype,mask,hdim,seqlen,batch,heads,fwd_ms,fwd_tflops,bwd_ms,bwd_tflops,fwd_bwd_tflops\n";
  md << "| dtype | mask | hdim | seqlen | batch x heads | fwd ms | fwd TFLOP/s |"
     << (a.opt.backward ? " bwd ms | bwd TFLOP/s | fwd+bwd TFLOP/s |" : "") << "\n";
  md << "|---|---|---|---|---|---|---|" << (a.opt.backward ? "---|---|---|" : "") << "\n";
  for (const Row& w : rows) {
    char buf[512];
    double fb = a.opt.backward && w.r.ok ? 3.5 * w.r.fwd_tflops * w.r.fwd_ms / (w.r.fwd_ms + w.r.bwd_ms) : 0;
    std::snprintf(buf, sizeof buf, "%s,%s,%s,%lld,%lld,%lld,%lld,%.4f,%.4f,%.4f,%.4f,%.4f\n", w.r.backend.c_str(),
                  w.dtype.c_str(), w.mask.c_str(), (long long)w.hdim, (long long)w.seqlen, (long long)w.batch,
                  (long long)w.heads, w.r.fwd_ms, w.r.fwd_tflops, w.r.bwd_ms, w.r.bwd_tflops, fb);
    csv << buf;
    if (a.opt.backward)
      std::snprintf(buf, sizeof buf, "| %s | %s | %lld | %lld | %lldx%lld | %.2f | %.3f | %.2f | %.3f | %.3f |\n",
                    w.dtype.c_str(), w.mask.c_str(), (long long)w.hdim, (long long)w.seqlen, (long long)w.batch,
                    (long long)w.heads, w.r.fwd_ms, w.r.fwd_tflops, w.r.bwd_ms, w.r.bwd_tflops, fb);
    else
      std::snprintf(buf, sizeof buf, "| %s | %s | %lld | %lld | %lldx%lld | %.2f | %.3f |\n", w.dtype.c_str(),
                    w.mask.c_str(), (long long)w.hdim, (long long)w.seqlen, (long long)w.batch, (long long)w.heads,
                    w.r.fwd_ms, w.r.fwd_tflops);
    md << (w.r.ok ? buf : ("| " + w.dtype + " | " + w.mask + " | error: " + w.r.error + " |\n"));
  }
  std::ostringstream head;
  head << "# flashattn benchmark (" << backend << ")\n\n"
       << "Machine: " << (a.machine.empty() ? "unnamed" : a.machine)
       << "; threads: " << (a.opt.threads > 0 ? a.opt.threads : int(std::thread::hardware_concurrency()))
       << ". FLOPs: fwd 4*B*H*S*S*D (/2 causal), bwd 2.5x; fwd+bwd = 3.5x fwd FLOPs over fwd+bwd time; "
       << "median of timed repeats.\n\n";
  const std::string table = head.str() + md.str();
  std::printf("%s", table.c_str());
  if (!a.csv.empty()) write_file("--csv", a.csv, csv.str());
  if (!a.md.empty()) write_file("--md", a.md, table);
  for (const Row& w : rows)
    if (!w.r.ok) return 1;
  return 0;
}

}  // namespace

int run_main(int argc, char** argv) {
  if (argc < 2) {
    // No arguments: a small causal fwd+bwd with a check, seconds on any machine.
    std::printf(
        "(no command given: running `flashattn run --seqlen 1024 --heads 8 --hdim 64 --causal --bwd "
        "--check`; see `flashattn help`)\n");
    Args a;
    a.shape.causal = true;
    a.opt.backward = true;
    a.opt.check = true;
    return cmd_run(a);
  }
  std::string cmd = argv[1];
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    std::printf("%s", kUsage);
    return 0;
  }
  Args a = parse(argc, argv, 2);
  if (cmd == "run") return cmd_run(a);
  if (cmd == "bench") return cmd_bench(a);
  die("unknown command '" + cmd + "' (see flashattn help)");
}

// Every exit goes through here: a failed write of stdout (a full disk, a closed pipe) is reported too.
int main(int argc, char** argv) {
  int rc;
  try {
    rc = run_main(argc, argv);
  } catch (const std::bad_alloc&) {
    die("out of memory");
  } catch (const std::exception& e) {
    die(std::string("error: ") + e.what());
  }
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "flashattn: cannot write standard output: %s\n", std::strerror(errno));
    return 2;
  }
  return rc;
}
