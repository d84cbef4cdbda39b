// A kernel library shaped like the generated CPU source of a CUDA-dialect kernel,
// built with the CPU backend's flags and loaded by cuda_tests (test_generated):
//   -DGEN_SYNC=0            loop mode, KK_CPU_SYNC defined after the prelude (as now)
//   -DGEN_SYNC=0 -DEARLY    loop mode, KK_CPU_SYNC defined before it (no mode test per read)
//   -DGEN_SYNC=1            fiber mode
//   -DGEN_SYNC=2            KK_CPU_SYNC undefined: KK_CPU_ENTRY picks per launch
// y = 2x + 1 for every element; with fibers also one sum per block through
// dynamic shared memory and __shfl_down_sync.
#define KK_TARGET_CPU 1
#define KK_MATH_RELAXED 1
#if defined(EARLY)
#define KK_CPU_SYNC GEN_SYNC
#endif
#include <kernelkit/target_cpu.h>
#include <kernelkit/cuda_cpu.h>  // (kernelkit/cuda.h: target_cpu.h, cuda_cpu.h, indexing.h)
#if !defined(EARLY) && GEN_SYNC != 2
#define KK_CPU_SYNC GEN_SYNC
#endif
#include <kernelkit/cpu_group.h>
#line 1 "header"
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cooperative_groups/scan.h>
#include <cuda/std/array>
#include <cuda/std/limits>
#include <cuda/std/type_traits>
#include <math_constants.h>
#include <cassert>
__constant__ float kTwo[2] = {2.0f, 1.0f};
__device__ int g_unused_counter;
template <typename T>
__host__ __device__ __forceinline__ T twice(T v) { return v * T(kTwo[0]); }
struct __align__(16) Pair { float a, b; };
static_assert(alignof(Pair) == 16, "__align__");
__device__ __noinline__ float one() { return kTwo[1]; }
__global__ void __launch_bounds__(256, 2) unused_kernel(const __grid_constant__ int x) { (void)x; }
namespace kk_cuda {
namespace cg = cooperative_groups;
__device__ void custom_kernel_gen(const float* x, float* y, float* sums, const int n) {
  using T = float;
  constexpr bool with_sums = GEN_SYNC != 0;
#line 1 "body"
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  cuda::std::array<T, 2> pair = {T(0), cuda::std::numeric_limits<T>::max()};
  static_assert(cuda::std::is_same_v<decltype(pair[0]), float&>, "cuda::std");
  if (i < n) y[i] = twice<T>(__ldg(&x[i])) + one() + pair[0];
  if constexpr (with_sums) {
    KK_EXTERN_SHARED(float, partial);  // extern __shared__ float partial[]; (front end)
    float v = i < n ? x[i] : 0.0f;
#pragma unroll
    for (int off = WARP_SIZE / 2; off > 0; off /= 2) v += __shfl_down_sync(0xffffffff, v, off);
    if (threadIdx.x % warpSize == 0) partial[threadIdx.x / warpSize] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
      float s = 0.0f;
      for (unsigned w = 0; w < blockDim.x / warpSize; ++w) s += partial[w];
      sums[blockIdx.x] = s < CUDART_INF_F ? s : 0.0f;
    }
  }
}
struct kk_args { const float* x; float* y; float* sums; int n; kk_dim3 kk_grid; unsigned kk_shared; };
KK_FN void kk_call(const kk_args& a, const kk_thread_ctx& t) {
  KK_CUDA_BIND_THREAD(t, a.kk_shared);
  custom_kernel_gen(a.x, a.y, a.sums, a.n);
}
}  // namespace kk_cuda
static inline void kk_thread_body(const kk_cuda::kk_args& a, const kk_thread_ctx& t) { kk_cuda::kk_call(a, t); }
KK_CPU_ENTRY(kk_cuda::kk_args, kk_thread_body)
