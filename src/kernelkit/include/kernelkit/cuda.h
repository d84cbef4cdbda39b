// kernelkit/cuda.h: the CUDA dialect's prelude. A cuda_kernel body sees what an MLX
// CUDA custom kernel sees: CUDA's own headers (on the GPU) or kernelkit's CPU
// rendering of them (cuda_cpu.h), fixed-width integers, __half / __nv_bfloat16,
// elem_to_loc, ceildiv, WARP_SIZE; cooperative_groups when the generated code
// defines KK_CUDA_COOPERATIVE_GROUPS (the body or header names it: it costs NVRTC
// about a second to parse, so kernels that do not use it do not pay for it).
#pragma once

#if defined(KK_TARGET_CUDA)
#include "target_cuda.h"
#include <cuda/std/cstdint>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#if defined(KK_CUDA_COOPERATIVE_GROUPS)
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#endif
// A body's `extern __shared__ T name[];` (the front end rewrites it so that the CPU can
// give the group its buffer).
#define KK_EXTERN_SHARED(T, name) extern __shared__ T name[]
#define KK_CUDA_BIND_THREAD(t, shared_bytes) ((void)0)
// glibc's <sys/types.h> names, which CUDA compiled by nvcc sees (and the CPU backend, through the
// C library): a body written with them compiles for both targets.
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned long ulong;
#else
#include "target_cpu.h"
#if !defined(__USE_FAST_MATH__)  // NVRTC defines it 0 or 1 (--use_fast_math); bodies may test it
#if defined(KK_MATH_FAST)
#define __USE_FAST_MATH__ 1
#else
#define __USE_FAST_MATH__ 0
#endif
#endif
#include "cuda_cpu.h"
#endif

#include "indexing.h"

#ifndef WARP_SIZE
#define WARP_SIZE 32
#endif

// The kernel's namespace (dialects/cuda.py puts the body in it) sees MLX's helpers unqualified.
namespace kk_cuda {
using kk::ceildiv;
using kk::elem_to_loc;
}  // namespace kk_cuda
