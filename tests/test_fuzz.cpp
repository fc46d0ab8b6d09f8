// Fuzz tier (issue 16): a seeded generator of malformed and extreme calls, each run in its own child process
// so that a crash, an abort or a hang is caught and reported as a failure of that case, never of the run.
// A case passes when the call gives a named error (FA_ERROR_INVALID_ARGUMENT or FA_ERROR_UNSUPPORTED whose
// message starts with "<argument>:") or succeeds with outputs that pass the float64 reference check.
//
//   C ABI: a random valid problem (small shapes, empty dimensions, every mask, huge windows and thread
//          counts, packed layouts), then at most one breaking mutation (tests/fuzz_case.hpp, shared with the
//          CUDA backends' fuzz in tests/gpu/fuzz_test.cpp); a refused call must also leave memory unchanged.
//   CLI:   random option lists with malformed, negative, huge and valid values; the tool must exit 0, 1 or
//          2 with a message, never with a signal, and `--check` must never print FAIL.
// Cases per tier: FA_FUZZ_CASES (default: 300 C ABI + 150 CLI in the fast tier; the deep tier runs
// 10,000 + 2,000). FA_FUZZ_SEED picks another stream of cases.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>

#include "attention_case.hpp"
#include "fuzz_case.hpp"

namespace flashattn::testing {
namespace {

constexpr int kCaseTimeoutS = 120;

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

// Runs `body` in a forked child with an alarm; returns "" when it exited 0, else what went wrong. The parent
// of the fuzz tests never runs a kernel itself (a forked child of a process that has run OpenMP regions can
// hang in libgomp), so every child starts with a clean OpenMP runtime.
std::string in_child(const std::function<int()>& body, const std::string& log_path) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    if (!log_path.empty() && !std::freopen(log_path.c_str(), "w", stderr)) _exit(97);
    alarm(kCaseTimeoutS);
    int rc = 98;
    try {
      rc = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "exception escaped: %s\n", e.what());
    }
    std::fflush(nullptr);
    _exit(rc);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status))
    return WTERMSIG(status) == SIGALRM ? "hung (no result after " + std::to_string(kCaseTimeoutS) + " s)"
                                       : "killed by signal " + std::to_string(WTERMSIG(status));
  if (WEXITSTATUS(status) != 0) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return "";
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// One C ABI case (fuzz_case.hpp) on the CPU backend; the child's exit status says whether it passed (its stderr
// says why not).
int capi_case(uint64_t seed) {
  HostMemory memory;
  Outcome outcome;
  return run_fuzz_case(seed, memory, FA_BACKEND_AUTO, &outcome);
}

void run_capi(int64_t cases) {
  const uint64_t base = uint64_t(env_int("FA_FUZZ_SEED", 1));
  const std::string log = ::testing::TempDir() + "fa_fuzz_capi.log";
  int failures = 0;
  for (int64_t i = 0; i < cases; ++i) {
    const uint64_t seed = base * 1000003u + uint64_t(i);
    std::string why = in_child([seed] { return capi_case(seed); }, log);
    if (!why.empty()) {
      ADD_FAILURE() << "C ABI case seed " << seed << ": " << why << "\n" << read_file(log);
      if (++failures >= 10) return;
    }
  }
}

// ---------------------------------------------------------------- the CLI generator
// `malformed` is set when some value is not a number of the option's kind: the tool must then refuse.
// A hand-aligned case table: one case or rule per line.
// clang-format off
std::vector<std::string> cli_args(std::mt19937_64& rng, bool* malformed) {
  auto any = [&](std::initializer_list<const char*> v) { return std::string(*(v.begin() + rng() % v.size())); };
  const char* bad_numbers[] = {"-1", "abc", "5x", "", "1e3", "0x10", "9223372036854775808", "-9223372036854775809",
                               "4611686018427387904", "2147483648", " 7", "nan", "inf", "--"};
  auto number = [&](std::initializer_list<const char*> good, bool integer = true, bool u64 = false) {
    if (rng() % 3 != 0) return any(good);
    const std::string v = bad_numbers[rng() % (sizeof bad_numbers / sizeof bad_numbers[0])];
    const bool not_a_float = v == "abc" || v == "5x" || v.empty() || v == " 7" || v == "--" || v == "nan" || v == "inf";
    const bool not_an_int = not_a_float || v == "1e3" || v == "0x10" || (v == "9223372036854775808" && !u64) ||
                            v == "-9223372036854775809" || (u64 && v[0] == '-');
    if (integer ? not_an_int : not_a_float) *malformed = true;
    return v;
  };
  std::vector<std::string> a;
  const bool bench = rng() % 4 == 0;
  a.push_back(bench ? "bench" : "run");
  // A small problem first, so that valid runs are quick; the random options may override it.
  for (const char* x : {"--seqlen", "24", "--heads", "2", "--hdim", "8", "--iters", "1"}) a.push_back(x);
  if (bench) for (const char* x : {"--seqlens", "16", "--hdims", "8", "--dtypes", "fp32", "--masks", "none"}) a.push_back(x);
  const int n = int(rng() % 4);
  for (int i = 0; i < n; ++i) {
    switch (rng() % 17) {
      case 0: a.push_back("--batch"); a.push_back(number({"0", "1", "2"})); break;
      case 1: a.push_back("--seqlen"); a.push_back(number({"0", "1", "17", "65"})); break;
      case 2: a.push_back("--seqlen-k"); a.push_back(number({"0", "3", "40"})); break;
      case 3: a.push_back("--heads"); a.push_back(number({"0", "1", "3"})); break;
      case 4: a.push_back("--heads-kv"); a.push_back(number({"0", "1", "2"})); break;
      case 5: a.push_back("--hdim"); a.push_back(number({"8", "12", "16", "0", "264"})); break;
      case 6: a.push_back("--window"); a.push_back(any({"3,0", "-1,-1", "-2,0", "9223372036854775807,9223372036854775807",
                                                        "1", "a,b", "5,", "0,9223372036854775808"})); break;
      case 7: a.push_back("--softcap"); a.push_back(number({"0", "2.5", "30"}, false)); break;
      case 8: a.push_back("--threads"); a.push_back(number({"0", "1", "100000"})); break;
      case 9: a.push_back("--seed"); a.push_back(number({"0", "18446744073709551615", "7"}, true, true)); break;
      case 10: a.push_back("--dtype"); a.push_back(any({"bf16", "fp16", "fp32", "fp64", ""})); break;
      case 11: a.push_back(any({"--causal", "--top-left", "--alibi", "--bwd", "--check", "--bogus"})); break;
      case 12: a.push_back("--check"); break;
      case 13: a.push_back("--bwd"); break;
      case 14: a.push_back("--backend"); a.push_back(any({"auto", "cpu", "cuda-sm80", "gpu"})); break;
      case 15: a.push_back("--tokens"); a.push_back(number({"0", "48"})); break;
      default: a.push_back(any({"--csv", "--md"})); a.push_back(any({"/nonexistent/x.csv", "/dev/null"})); break;
    }
  }
  if (rng() % 10 == 0) a.pop_back();  // an option without its value
  return a;
}
// clang-format on

void run_cli(int64_t cases) {
  const uint64_t base = uint64_t(env_int("FA_FUZZ_SEED", 1));
  // One file per process: the fast and deep CLI fuzz tests run at the same time under ctest -j, and a shared name
  // let one truncate the other's output (bench/results/2026-12-01_h200_session7/check.log).
  const std::string out = ::testing::TempDir() + "fa_fuzz_cli." + std::to_string(getpid()) + ".out";
  int failures = 0;
  for (int64_t i = 0; i < cases; ++i) {
    std::mt19937_64 rng(base * 7919u + uint64_t(i));
    bool malformed = false;
    const std::vector<std::string> args = cli_args(rng, &malformed);
    std::string line = FA_CLI_PATH;
    for (const std::string& s : args) line += " '" + s + "'";
    const std::string why = in_child(
        [&] {
          if (!std::freopen(out.c_str(), "w", stdout)) return 97;
          dup2(fileno(stdout), fileno(stderr));
          std::vector<char*> argv;
          argv.push_back(const_cast<char*>(FA_CLI_PATH));
          for (const std::string& s : args) argv.push_back(const_cast<char*>(s.c_str()));
          argv.push_back(nullptr);
          execv(FA_CLI_PATH, argv.data());
          return 96;
        },
        "");
    const std::string text = read_file(out);
    std::string problem = why;
    if (why.empty() || why.rfind("exited with status", 0) == 0) {
      const bool failed = !why.empty();
      const int code = failed ? std::atoi(why.c_str() + std::strlen("exited with status ")) : 0;
      if (code > 2)
        problem = why + " (only 0, 1 and 2 are expected)";
      else if (malformed && !failed)
        problem = "a malformed number was accepted";
      else if (failed && text.find("flashattn:") == std::string::npos && text.find("error") == std::string::npos)
        problem = "failed without a message";
      else if (text.find("check        : FAIL") != std::string::npos)
        problem = "--check failed: a wrong value";
      else
        problem.clear();
    }
    if (!problem.empty()) {
      ADD_FAILURE() << "CLI case: " << line << "\n" << problem << "\n" << text;
      if (++failures >= 10) return;
    }
  }
}

TEST(Fuzz, CApi) {
  // FA_FUZZ_ONLY=<seed>: that one case, in this process (for a debugger).
  if (const int64_t only = env_int("FA_FUZZ_ONLY", -1); only >= 0) {
    EXPECT_EQ(capi_case(uint64_t(only)), 0);
    return;
  }
  run_capi(env_int("FA_FUZZ_CASES", FA_FUZZ_CAPI_CASES));
}
TEST(Fuzz, Cli) { run_cli(env_int("FA_FUZZ_CASES", FA_FUZZ_CLI_CASES)); }

}  // namespace
}  // namespace flashattn::testing
