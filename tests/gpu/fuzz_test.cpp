// The fuzz tier's C ABI generator (tests/fuzz_case.hpp) on the CUDA backends (issue 16): the same seeded stream
// as the CPU tier, with every buffer mirrored into device memory (outputs poisoned with NaN), exec.backend
// cuda-sm80 or cuda-sm90, GPU-shaped draws and a "host memory" mutation. A case passes with a named error that
// left every device buffer as it was, or with outputs that pass the float64 reference check (NaN never passes);
// a crash, a hang (kCaseTimeoutS) or a CUDA error left behind fails it.
//
//   GpuFuzz.Sm80 / GpuFuzz.Sm90: FA_GPU_FUZZ_CASES cases per backend (default 1000), in FA_GPU_FUZZ_JOBS worker
//     processes at once (default: half the cores, at most 8). A worker is a forked child that runs its cases one
//     after another (a CUDA context per case would cost more than the cases); after a crash, a hang or a CUDA
//     error a fresh child takes the worker's next case. The parent never touches CUDA: a process that has
//     initialised CUDA cannot use it in a forked child.
//   GpuFuzzSanitizer.Slice: the first kSliceCases cases of both backends in this process, for compute-sanitizer
//     (ctest label "sanitizer"; a forked child would escape its instrumentation).
// FA_FUZZ_SEED picks another stream; FA_FUZZ_ONLY=<seed> runs that one case in this process (both backends).
// Without a CUDA device every test skips; the sm90 ones also skip where the backend is unavailable, unless
// FLASHATTN_REQUIRE_SM90=1 (gpu_support.hpp).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fuzz_case.hpp"
#include "gpu_support.hpp"

namespace {

using namespace flashattn::testing;
using flashattn::FwdParams;
using flashattn::Status;
namespace gt = flashattn::gpu_testing;

constexpr int kCaseTimeoutS = 60;  // one small case; the first of a child also creates its CUDA context
constexpr int kSliceCases = 16;    // per backend, under compute-sanitizer (memcheck and racecheck)
constexpr int kMaxReported = 10;

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

uint64_t case_seed(int64_t i) { return uint64_t(env_int("FA_FUZZ_SEED", 1)) * 1000003u + uint64_t(i); }

// Every buffer of a Problem copied into its own cudaMalloc allocation (so that memcheck sees each tensor's end),
// the params' pointers moved to the copies.
class DeviceMemory : public FuzzMemory {
 public:
  ~DeviceMemory() override { release(); }
  bool device() const override { return true; }

  void load(Problem& pr) override {
    release();
    for (auto [host, bytes] : buffers(pr)) {
      Buffer b{host, bytes, nullptr};
      // An empty host buffer may still have an address: give it a small allocation of its own, so that the
      // library sees a device pointer where the host tier saw a host one.
      if (host != nullptr) {
        if (cudaMalloc(&b.dev, std::max<size_t>(bytes, 16)) != cudaSuccess)
          std::fprintf(stderr, "cudaMalloc(%zu) failed\n", bytes);  // the call then sees a null pointer
        else if (bytes > 0)
          cudaMemcpy(b.dev, host, bytes, cudaMemcpyHostToDevice);
      }
      bufs_.push_back(b);
    }
  }

  void place(fa_tensor* t) override {
    t->device = FA_DEVICE_CUDA;
    t->device_index = 0;
    if (t->data == nullptr) return;
    for (const Buffer& b : bufs_) {
      const char* h = static_cast<const char*>(b.host);
      const char* p = static_cast<const char*>(t->data);
      if (b.host != nullptr && p >= h && p <= h + b.bytes) {
        t->data = static_cast<char*>(b.dev) + (p - h);
        return;
      }
    }
  }

  void fetch(Problem&) override {
    for (const Buffer& b : bufs_)
      if (b.bytes > 0 && b.dev != nullptr) cudaMemcpy(b.host, b.dev, b.bytes, cudaMemcpyDeviceToHost);
  }

  std::vector<uint8_t> snapshot() override {
    std::vector<uint8_t> s;
    for (const Buffer& b : bufs_) {
      const size_t at = s.size();
      s.resize(at + b.bytes);
      if (b.bytes > 0 && b.dev != nullptr) cudaMemcpy(s.data() + at, b.dev, b.bytes, cudaMemcpyDeviceToHost);
    }
    return s;
  }

  // The library must return its errors, not leave them in the runtime for the caller's next call; an error from
  // a kernel (an illegal address) also ends this process's context.
  std::string fault() override {
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? "" : std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  }

  void* host_twin(const void* p) override {
    for (const Buffer& b : bufs_) {
      const char* d = static_cast<const char*>(b.dev);
      if (b.dev != nullptr && static_cast<const char*>(p) >= d && static_cast<const char*>(p) <= d + b.bytes)
        return b.host;
    }
    return nullptr;
  }

 private:
  struct Buffer {
    void* host;
    size_t bytes;
    void* dev;
  };
  void release() {
    for (Buffer& b : bufs_) cudaFree(b.dev);
    bufs_.clear();
  }
  std::vector<Buffer> bufs_;
};

int run_device_case(uint64_t seed, fa_backend backend, Outcome* outcome) {
  DeviceMemory memory;
  return run_fuzz_case(seed, memory, backend, outcome);
}

// Whether `backend` can run here: 0 yes, 10 no CUDA device, 11 the backend is unavailable and that may skip (its
// message on stderr), 12 the probe itself failed. A tiny valid forward tells: the sm90 backend needs both a
// compute capability 9.0 device and a build with its kernels.
int probe(fa_backend backend) {
  if (!gt::have_gpu()) return 10;
  Case c;
  c.sq = c.sk = 16;
  DeviceMemory memory;
  Problem pr(c);
  memory.load(pr);
  FwdParams f = pr.fwd();
  for (fa_tensor* t : {&f.attn.q, &f.attn.k, &f.attn.v, &f.out, &f.lse}) memory.place(t);
  fa_exec exec = fa_exec_default();
  exec.backend = backend;
  const Status st = flashattn::forward(f, exec);
  if (st.ok()) return memory.fault().empty() ? 0 : 12;
  std::fprintf(stderr, "%s\n", st.message.c_str());
  return backend == FA_BACKEND_CUDA_SM90 && gt::sm90_unavailable_message(st.message) ? 11 : 12;
}

std::string read_all(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void append(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n <= 0) break;
    done += size_t(n);
  }
  close(fd);
}

// Runs `body` in a forked child; returns its exit status (128 + signal when killed).
template <class Body>
int in_child(Body body) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

// One worker: its cases (every jobs-th of the stream), where the next child starts, and its files. A child writes
// "S <k>" before its k-th case and "D <k> <result> <outcome>" after it, so that the parent can tell which case a
// dead child was running.
struct Worker {
  std::vector<int64_t> cases;
  size_t next = 0;
  pid_t pid = -1;
  std::string progress, log, failures;
};

std::string backend_name(fa_backend b) { return gt::backend_label(b); }

int worker_child(const Worker& w, fa_backend backend) {
  for (size_t k = w.next; k < w.cases.size(); ++k) {
    const uint64_t seed = case_seed(w.cases[k]);
    append(w.progress, "S " + std::to_string(k) + "\n");
    if (!std::freopen(w.log.c_str(), "w", stderr)) return 97;
    std::setvbuf(stderr, nullptr, _IONBF, 0);  // a crash must not lose what the case printed
    alarm(kCaseTimeoutS);
    Outcome outcome = Outcome::kNotRun;
    int rc = kCaseFailed;
    try {
      rc = run_device_case(seed, backend, &outcome);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "exception escaped: %s\n", e.what());
    }
    alarm(0);
    std::fflush(stderr);
    if (rc != kCasePassed)
      append(w.failures, backend_name(backend) + " case seed " + std::to_string(seed) +
                             (rc == kCaseFault ? ": left a CUDA error" : ": wrong") + "\n" + read_all(w.log) + "\n");
    append(w.progress, "D " + std::to_string(k) + " " + std::to_string(rc) + " " + std::to_string(int(outcome)) + "\n");
    if (rc == kCaseFault) return 3;  // the context is gone: a fresh child takes the next case
  }
  return 0;
}

void run_forked(fa_backend backend) {
  // The probe runs in a child too: the parent must not initialise CUDA.
  const std::string dir =
      ::testing::TempDir() + "fa_gpu_fuzz." + std::to_string(getpid()) + "." + backend_name(backend) + ".";
  const std::string probe_log = dir + "probe.log";
  const int probed = in_child([&] {
    if (!std::freopen(probe_log.c_str(), "w", stderr)) return 97;
    return probe(backend);
  });
  if (probed == 10) GTEST_SKIP() << "no CUDA device";
  if (probed == 11) GTEST_SKIP() << backend_name(backend) << " unavailable: " << read_all(probe_log);
  ASSERT_EQ(probed, 0) << "a valid forward through " << backend_name(backend) << " failed: " << read_all(probe_log);

  const int64_t cases = env_int("FA_GPU_FUZZ_CASES", 1000);
  const int64_t hw = std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()));
  const int64_t jobs = std::clamp<int64_t>(env_int("FA_GPU_FUZZ_JOBS", std::min<int64_t>(8, hw / 2)), 1, 64);
  std::vector<Worker> workers(static_cast<size_t>(jobs));
  for (int64_t i = 0; i < cases; ++i) workers[size_t(i % jobs)].cases.push_back(i);
  for (size_t w = 0; w < workers.size(); ++w) {
    workers[w].progress = dir + std::to_string(w) + ".progress";
    workers[w].log = dir + std::to_string(w) + ".log";
    workers[w].failures = dir + std::to_string(w) + ".failures";
    for (const std::string& f : {workers[w].progress, workers[w].failures}) std::remove(f.c_str());
  }
  std::map<int, int64_t> outcomes;  // Outcome -> cases
  std::vector<std::string> failed;  // one entry per failed case
  auto start = [&](Worker& w) {
    std::remove(w.progress.c_str());
    std::fflush(nullptr);
    w.pid = fork();
    if (w.pid == 0) _exit(worker_child(w, backend));
  };
  for (Worker& w : workers)
    if (!w.cases.empty()) start(w);
  for (;;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) break;  // no child left
    auto it = std::find_if(workers.begin(), workers.end(), [&](const Worker& w) { return w.pid == pid; });
    if (it == workers.end()) continue;
    Worker& w = *it;
    w.pid = -1;
    // What the child got through: the last case it started and whether it finished it.
    std::istringstream lines(read_all(w.progress));
    std::string tag;
    int64_t k = 0, rc = 0, outcome = 0, started = -1, finished = -1;
    while (lines >> tag >> k) {
      if (tag == "S") {
        started = k;
      } else if (lines >> rc >> outcome) {
        finished = k;
        ++outcomes[int(outcome)];
      }
    }
    const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (clean) {
      w.next = w.cases.size();
    } else if (started >= 0 && started != finished) {  // died inside a case: that case failed
      const std::string why =
          WIFSIGNALED(status)
              ? (WTERMSIG(status) == SIGALRM ? "hung (no result after " + std::to_string(kCaseTimeoutS) + " s)"
                                             : "killed by signal " + std::to_string(WTERMSIG(status)))
              : "exited with status " + std::to_string(WEXITSTATUS(status));
      append(w.failures, backend_name(backend) + " case seed " + std::to_string(case_seed(w.cases[size_t(started)])) +
                             ": " + why + "\n" + read_all(w.log) + "\n");
      w.next = size_t(started) + 1;
    } else if (finished >= 0) {  // stopped after a case (a CUDA error it left): go on after it
      w.next = size_t(finished) + 1;
    } else {
      ADD_FAILURE() << "a fuzz worker died before its first case (status " << status << ")";
      w.next = w.cases.size();
    }
    if (w.next < w.cases.size()) start(w);
  }
  for (const Worker& w : workers) {
    const std::string text = read_all(w.failures);
    for (size_t at = 0; at < text.size();) {
      const size_t end = text.find("\n" + backend_name(backend) + " case seed ", at);
      failed.push_back(text.substr(at, end == std::string::npos ? std::string::npos : end + 1 - at));
      at = end == std::string::npos ? text.size() : end + 1;
    }
  }
  std::printf("%s fuzz: %lld cases in %lld workers (FA_GPU_FUZZ_CASES, FA_GPU_FUZZ_JOBS), %zu failed\n",
              backend_name(backend).c_str(), (long long)cases, (long long)jobs, failed.size());
  for (auto [o, n] : outcomes) std::printf("  %6lld %s\n", (long long)n, outcome_name(Outcome(o)));
  for (size_t i = 0; i < failed.size() && i < size_t(kMaxReported); ++i) ADD_FAILURE() << failed[i];
  // A build or device that refuses everything must not pass: most unbroken problems are fp16/bf16 with head dims
  // <= 64, which every build's kernels cover (about 30% of the stream is computed and checked).
  EXPECT_GE(outcomes[int(Outcome::kChecked)] * 10, cases) << "fewer than 10% of the cases ran and were checked";
}

// In this process, for compute-sanitizer: both backends' first kSliceCases cases.
void run_in_process(fa_backend backend, int64_t first, int64_t count) {
  for (int64_t i = first; i < first + count; ++i) {
    const uint64_t seed = case_seed(i);
    Outcome outcome;
    ::testing::internal::CaptureStderr();
    const int rc = run_device_case(seed, backend, &outcome);
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(rc, kCasePassed) << backend_name(backend) << " case seed " << seed << "\n" << log;
    ASSERT_NE(rc, kCaseFault) << "a CUDA error ends the slice";
  }
}

bool sm90_runs_here(std::string* why) {
  ::testing::internal::CaptureStderr();
  const int p = probe(FA_BACKEND_CUDA_SM90);
  *why = ::testing::internal::GetCapturedStderr();
  if (p != 0 && p != 11) ADD_FAILURE() << "a valid forward through cuda-sm90 failed: " << *why;
  return p == 0;
}

TEST(GpuFuzz, Sm80) { run_forked(FA_BACKEND_CUDA_SM80); }
TEST(GpuFuzz, Sm90) { run_forked(FA_BACKEND_CUDA_SM90); }

// Registered after GpuFuzz: these initialise CUDA in this process, after which the forked tests could not run.
TEST(GpuFuzzSanitizer, Slice) {
  if (!gt::have_gpu()) GTEST_SKIP() << "no CUDA device";
  if (const int64_t only = env_int("FA_FUZZ_ONLY", -1); only >= 0) {
    for (fa_backend b : {FA_BACKEND_CUDA_SM80, FA_BACKEND_CUDA_SM90}) {
      Outcome outcome;
      const int rc = run_device_case(uint64_t(only), b, &outcome);
      EXPECT_EQ(rc, kCasePassed) << backend_name(b);
      std::printf("%s: %s\n", backend_name(b).c_str(), outcome_name(outcome));
    }
    return;
  }
  run_in_process(FA_BACKEND_CUDA_SM80, 0, kSliceCases);
  std::string why;
  if (sm90_runs_here(&why))
    run_in_process(FA_BACKEND_CUDA_SM90, 0, kSliceCases);
  else
    std::printf("cuda-sm90 slice skipped: %s\n", why.c_str());
}

}  // namespace
