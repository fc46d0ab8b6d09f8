// FA_HOST_DEVICE: functions shared by the host code (the float64 reference, the CPU backend, the planners) and the
// CUDA kernels, inlined on both sides.
#pragma once

#if defined(__CUDACC__)
#define FA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FA_HOST_DEVICE inline
#endif
