// kernelkit/metal.h: the Metal Shading Language layer. A generated kernel
// includes this, then puts the user's header and body inside `namespace metal`
// so that MSL's names (float4, exp, max, atomic_int...) hide the target's own.
//
// Written once for every target, on the contract of DESIGN.md: the target
// header (target_cuda.h or target_cpu.h) defines KK_FN, KK_THREADGROUP,
// KK_PROGRAM_CONSTANT and namespace kk; nothing below uses a target directly.
// Choose the target with KK_TARGET_CUDA or KK_TARGET_CPU, and the math mode with
// KK_MATH_FAST (else precise), before including this file. (A test may include
// its own target header first; it defines KK_TARGET_DEFINED.)
#pragma once

#ifndef KK_TARGET_DEFINED
#if defined(KK_TARGET_CUDA)
#include "target_cuda.h"
#else
#include "target_cpu.h"
#endif
#endif

// Hosted targets declare the C math functions (expf, floorf...) in <math.h>;
// NVRTC has them built in and no such header.
#if defined(__has_include)
#if __has_include(<math.h>)
#include <math.h>
#endif
#endif

#include "metal/traits.h"    // uint, int64_t, size_t...; is_same, enable_if_t...
#include "metal/half.h"      // half, bfloat
#include "metal/vector.h"    // vec<T, N>, float4..., packed_float3...
#include "metal/matrix.h"    // matrix<T, Cols, Rows>, float4x4...; transpose, determinant
#include "metal/array.h"     // array<T, N>, array_ref<T>
#include "metal/limits.h"    // numeric_limits, as_type, M_PI_F, INFINITY...
#include "metal/integer.h"   // clz, popcount, addsat...
#include "metal/math.h"      // exp, floor, min, clamp, isnan, dot... (+ precise::, fast::)
#include "metal/pack.h"      // pack_float_to_unorm4x8, unpack_snorm2x16_to_float...
#include "metal/atomic.h"    // atomic<T>, atomic_fetch_add_explicit...
#include "metal/simd.h"      // barriers, simd_*, quad_*
#include "complex.h"         // MLX's complex_t, complex64_t
#include "utils.h"           // MLX's kernel utilities: Limits<T>, elem_to_loc, ceildiv, log1p...
#include "metal_attributes.h"  // Metal's thread attributes from a kk_thread_ctx (for the entry)

// Metal's compiler defines __FAST_MATH__ when fast math is on (its default); bodies may test it.
#if defined(KK_MATH_FAST) && !defined(__FAST_MATH__)
#define __FAST_MATH__ 1
#endif

// MLX's helper headers mark functions METAL_FUNC.
#ifndef METAL_FUNC
#define METAL_FUNC KK_FN
#endif
