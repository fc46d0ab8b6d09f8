// The fuzz tier's C ABI generator (issue 16), shared by the CPU tier (tests/test_fuzz.cpp) and the CUDA backends'
// (tests/gpu/fuzz_test.cpp): a seeded random valid problem (small shapes, empty dimensions, every mask, huge
// windows and thread counts, packed layouts), then at most one breaking mutation, called through the public API.
// A case passes when the call gives a named error (FA_ERROR_INVALID_ARGUMENT or FA_ERROR_UNSUPPORTED whose message
// starts with "<argument>:") and leaves every buffer as it was, or succeeds with outputs that pass the float64
// reference check (NaN never passes). Both tiers run the same stream of seeds; only the memory differs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention_case.hpp"

namespace flashattn::testing {

// A named error: a known argument, a colon, the rule.
bool named(const std::string& message);

// Where a case's tensors live. The params a Problem makes point at its host buffers; a memory copies those buffers
// where the backend reads them and rewrites the params' pointers to its copies. The host memory is the identity.
class FuzzMemory {
 public:
  virtual ~FuzzMemory() = default;
  // Takes a copy of every buffer of `pr` (outputs still poisoned).
  virtual void load(Problem& pr) = 0;
  // Points `t` (made by pr.fwd() / pr.bwd()) at this memory.
  virtual void place(fa_tensor* t) = 0;
  // Copies every buffer back into `pr`, for the reference check.
  virtual void fetch(Problem& pr) = 0;
  // Every byte of every buffer, to tell that a refused call wrote nothing.
  virtual std::vector<uint8_t> snapshot() = 0;
  // What the last call left behind that the caller must see (a CUDA error), or "".
  virtual std::string fault() { return ""; }
  // The host buffer a placed pointer copies (for the device memory's "host memory" mutation), or nullptr.
  virtual void* host_twin(const void*) { return nullptr; }
  // Device memories draw GPU-shaped problems (fp16/bf16 mostly, sinks, longer sequences, now and then a head dim
  // or stride the CUDA backends refuse) and add the mutations only device memory has.
  virtual bool device() const { return false; }
};

// The Problem's own buffers (CPU backend).
class HostMemory : public FuzzMemory {
 public:
  void load(Problem& pr) override { pr_ = &pr; }
  void place(fa_tensor*) override {}
  void fetch(Problem&) override {}
  std::vector<uint8_t> snapshot() override;

 private:
  Problem* pr_ = nullptr;
};

// Every buffer of a problem as (pointer, bytes), in a fixed order.
std::vector<std::pair<void*, size_t>> buffers(Problem& pr);

enum class Outcome {
  kChecked,         // computed, outputs checked against the reference
  kRefused,         // a named error, every buffer unchanged
  kBrokenAccepted,  // a breaking mutation that still describes valid memory was accepted (no crash is the bar)
  kNotRun,          // not a valid forward to start a backward from
};
const char* outcome_name(Outcome o);

// The result codes of run_fuzz_case: pass, fail (the call or its result is wrong), fault (a CUDA error is left:
// this process can run no further case).
constexpr int kCasePassed = 0, kCaseFailed = 1, kCaseFault = 3;

// One case of the stream: the generator's problem and mutation for `seed`, run on `memory` with exec.backend
// `backend`. What it did goes to stderr (the fuzz drivers keep it per case and show it on failure).
int run_fuzz_case(uint64_t seed, FuzzMemory& memory, fa_backend backend, Outcome* outcome);

}  // namespace flashattn::testing
