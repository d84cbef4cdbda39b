// tests/prelude/prelude_test.h: the harness of the MSL-layer tests.
//
// A test is a function `void test(kk_test_result& r, uint lane)` in namespace
// metal, written like a kernel body (unqualified MSL names). The same file
// builds three ways:
//  - CPU (g++), default: with the single-lane target shim; main() runs the
//    test once and prints the failed checks;
//  - CPU with -DKK_TARGET_CPU: against the real CPU target; exports
//    kk_test_entry(result, lane) for a runner that provides the fiber runtime
//    (the pytest only checks that it compiles);
//  - CUDA (NVRTC, -DKK_TARGET_CUDA): kk_test_kernel(kk_test_result*), run by
//    the test driver with one warp when a GPU is present (compile-only in CI).
#pragma once

#if !defined(KK_TARGET_CUDA)
#include <stdio.h>
#endif
#if !defined(KK_TARGET_CUDA) && !defined(KK_TARGET_CPU)
#include "single_lane_target.h"
#endif
#include "kernelkit/metal.h"

// For large test functions: compiled once instead of inlined at every call
// (keeps NVRTC's time on the tests down).
#if defined(KK_TARGET_CUDA)
#define KK_TEST_FN __device__ __noinline__
#else
#define KK_TEST_FN inline
#endif

struct kk_test_result {
  int checks;
  int failures;
};

KK_FN void kk_check(kk_test_result& r, bool ok, const char* file, int line, const char* what) {
  r.checks++;
  if (!ok) {
    r.failures++;
    printf("%s:%d: check failed: %s\n", file, line, what);
  }
}
#define CHECK(...) kk_check(r, static_cast<bool>(__VA_ARGS__), __FILE__, __LINE__, #__VA_ARGS__)
// |a - b| <= tol * max(1, |b|), in double.
#define CHECK_NEAR(a, b, tol)                                                                   \
  kk_check(r, kk_near(static_cast<double>(a), static_cast<double>(b), (tol)), __FILE__, __LINE__, \
           #a " ~ " #b)
KK_FN bool kk_near(double a, double b, double tol) {
  const double d = a > b ? a - b : b - a, m = b < 0 ? -b : b;
  return d <= tol * (m > 1 ? m : 1);
}

// The entry point. LANES: how many lanes of one SIMD-group run the test
// (1 for everything the single-lane CPU shim can check).
#if defined(KK_TARGET_CUDA)
#define KK_TEST_MAIN(fn, LANES)                                                        \
  extern "C" __global__ void kk_test_kernel(kk_test_result* out) {                     \
    if (threadIdx.x >= (LANES)) return;                                                \
    kk_test_result r = {0, 0};                                                         \
    metal::fn(r, threadIdx.x);                                                         \
    atomicAdd(&out->checks, r.checks);                                                 \
    atomicAdd(&out->failures, r.failures);                                             \
  }
#elif defined(KK_TARGET_CPU)
#define KK_TEST_MAIN(fn, LANES)                                                        \
  extern "C" void kk_test_entry(kk_test_result* r, unsigned lane) { metal::fn(*r, lane); }
#else
#define KK_TEST_MAIN(fn, LANES)                                                        \
  static_assert((LANES) == 1, "the CPU shim runs one lane");                           \
  int main() {                                                                         \
    kk_test_result r = {0, 0};                                                         \
    metal::fn(r, 0);                                                                   \
    printf("%s: %d checks, %d failed\n", #fn, r.checks, r.failures);                   \
    return r.failures != 0;                                                            \
  }
#endif
