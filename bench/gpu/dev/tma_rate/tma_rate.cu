// Read rate of one streaming CTA per SM (or two) by copy mechanism, on the decode layout: a bf16 cache (rows, 8
// heads, d 128), each CTA reading one head's 256-byte rows (2 KB apart) through a ring of shared-memory stages, with
// nothing consuming them (each stage is reissued as soon as its bytes have landed). It asks what bounds the sm90
// decode reads (bench/results/2026-12-02_h200_session19: contiguous TMA boxes 4.1-4.5 TB/s, 16-row page boxes 3.0-3.9):
// the TMA request rate per SM (boxes of 64- or 128-byte rows against 256-byte rows), the boxes' height, the issuing
// warps, or the stages in flight.
//
//   tma_rate MODE INNER_BYTES BOX_ROWS STAGES WARPS CTAS_PER_SM
//   MODE: tma (tensor boxes: INNER_BYTES 64/128 swizzled 128B, 256 unswizzled), bulk (1-D cp.async.bulk of each
//   256-byte row; INNER_BYTES, BOX_ROWS unused), cpasync (16-byte cp.async by 128 threads, the kernel's paged rows).
//   A stage holds 128 rows of the head (32 KB); WARPS warps issue its copies (each announcing its own bytes).
// Prints one TSV row: mode inner box_rows stages warps ctas_per_sm GB/s per_SM_GB/s.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

namespace {

constexpr int kHeads = 8, kDim = 128, kRowBytes = kDim * 2, kBlockRows = 128;
constexpr int kStageBytes = kBlockRows * kRowBytes;
using Barrier = cutlass::arch::ClusterTransactionBarrier;

enum Mode { kTma, kBulk, kCpAsync };

struct Args {
  int mode, inner_elems, box_rows, stages, warps;
  int64_t rows_per_cta;
};

__global__ void __launch_bounds__(128) read_kernel(const __grid_constant__ CUtensorMap tmap, const char* base, Args a) {
  extern __shared__ __align__(1024) char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + a.stages * kStageBytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head = blockIdx.x % kHeads;
  const int64_t row0 = int64_t(blockIdx.x / kHeads) * a.rows_per_cta;
  if (threadIdx.x == 0)
    for (int s = 0; s < a.stages; ++s) Barrier::init(&full[s], a.mode == kCpAsync ? 128 : a.warps);
  cutlass::arch::fence_barrier_init();
  __syncthreads();
  const bool issuer = a.mode == kCpAsync || warp < a.warps;
  if (!issuer) return;
  const int64_t blocks = a.rows_per_cta / kBlockRows;
  for (int64_t b = 0; b < blocks; ++b) {
    const int s = int(b % a.stages);
    if (b >= a.stages) Barrier::wait(&full[s], uint32_t((b / a.stages - 1) & 1));
    char* stage = smem + s * kStageBytes;
    const int64_t r = row0 + b * kBlockRows;
    if (a.mode == kTma) {
      const int cols = kDim / a.inner_elems, boxes = cols * (kBlockRows / a.box_rows);
      const int box_bytes = a.inner_elems * 2 * a.box_rows;
      const int mine = (boxes - warp + a.warps - 1) / a.warps;
      if (lane == 0) {
        Barrier::arrive_and_expect_tx(&full[s], uint32_t(mine * box_bytes));
        for (int j = warp; j < boxes; j += a.warps) {
          const int c = j % cols, i = j / cols;
          cute::SM90_TMA_LOAD_3D::copy(&tmap, &full[s], 0, stage + j * box_bytes, c * a.inner_elems, head,
                                       int32_t(r + i * a.box_rows));
        }
      }
    } else if (a.mode == kBulk) {
      const int mine = (kBlockRows - warp + a.warps - 1) / a.warps;
      if (lane == 0) Barrier::arrive_and_expect_tx(&full[s], uint32_t(mine * kRowBytes));
      __syncwarp();
      for (int i = warp + lane * a.warps; i < kBlockRows; i += 32 * a.warps)
        cute::SM90_BULK_COPY_G2S::copy(base + ((r + i) * kHeads + head) * kRowBytes, &full[s], stage + i * kRowBytes,
                                       kRowBytes);
    } else {
      for (int i = threadIdx.x; i < kBlockRows * (kRowBytes / 16); i += 128) {
        const int row = i / (kRowBytes / 16), chunk = i % (kRowBytes / 16);
        const char* src = base + ((r + row) * kHeads + head) * kRowBytes + chunk * 16;
        const uint32_t dst = cute::cast_smem_ptr_to_uint(stage + i * 16);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
      }
      const uint32_t bar = cute::cast_smem_ptr_to_uint(&full[s]);
      asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(bar) : "memory");
    }
  }
  for (int64_t b = blocks > a.stages ? blocks - a.stages : 0; b < blocks; ++b)
    Barrier::wait(&full[b % a.stages], uint32_t((b / a.stages) & 1));
}

#define CHECK(x)                                                                          \
  do {                                                                                    \
    if (auto e_ = (x); e_ != 0) {                                                         \
      std::fprintf(stderr, "%s failed (%d) at %s:%d\n", #x, int(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s tma|bulk|cpasync INNER_BYTES BOX_ROWS STAGES WARPS CTAS_PER_SM\n", argv[0]);
    return 2;
  }
  const std::string mode_name = argv[1];
  Args a{};
  a.mode = mode_name == "tma" ? kTma : mode_name == "bulk" ? kBulk : kCpAsync;
  a.inner_elems = std::atoi(argv[2]) / 2;
  a.box_rows = std::atoi(argv[3]);
  a.stages = std::atoi(argv[4]);
  a.warps = std::atoi(argv[5]);
  const int ctas_per_sm = std::atoi(argv[6]);
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int chunks = sms * ctas_per_sm / kHeads, grid = chunks * kHeads;
  const int64_t total_rows = int64_t(2) << 20;  // 2M rows x 8 heads x 256 B = 4 GiB, far past L2
  a.rows_per_cta = total_rows / chunks / kBlockRows * kBlockRows;
  const size_t bytes = size_t(total_rows) * kHeads * kRowBytes;
  char* buf = nullptr;
  CHECK(cudaMalloc(&buf, bytes));
  CHECK(cudaMemset(buf, 1, bytes));

  CUtensorMap tmap{};
  if (a.mode == kTma) {
    const cuuint64_t dims[3] = {kDim, kHeads, cuuint64_t(total_rows)};
    const cuuint64_t strides[2] = {kRowBytes, cuuint64_t(kHeads) * kRowBytes};
    const cuuint32_t box[3] = {cuuint32_t(a.inner_elems), 1, cuuint32_t(a.box_rows)};
    const cuuint32_t elem_strides[3] = {1, 1, 1};
    const CUtensorMapSwizzle swizzle = a.inner_elems * 2 == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                       : a.inner_elems * 2 == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                                 : CU_TENSOR_MAP_SWIZZLE_NONE;
    CHECK(cuTensorMapEncodeTiled(&tmap, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, buf, dims, strides, box, elem_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  }
  const int smem = a.stages * kStageBytes + 64 * 8;
  CHECK(cudaFuncSetAttribute(read_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  read_kernel<<<grid, 128, smem>>>(tmap, buf, a);  // warm-up
  CHECK(cudaDeviceSynchronize());
  constexpr int kReps = 5;
  CHECK(cudaEventRecord(t0));
  for (int i = 0; i < kReps; ++i) read_kernel<<<grid, 128, smem>>>(tmap, buf, a);
  CHECK(cudaEventRecord(t1));
  CHECK(cudaEventSynchronize(t1));
  CHECK(cudaGetLastError());
  float ms = 0.f;
  CHECK(cudaEventElapsedTime(&ms, t0, t1));
  const double read = double(a.rows_per_cta) * grid * kRowBytes * kReps;
  const double gbs = read / (ms * 1e-3) / 1e9;
  std::printf("%s\t%d\t%d\t%d\t%d\t%d\t%.1f\t%.2f\n", mode_name.c_str(), a.inner_elems * 2, a.box_rows, a.stages,
              a.warps, ctas_per_sm, gbs, gbs / (double(grid) / ctas_per_sm));
  return 0;
}
