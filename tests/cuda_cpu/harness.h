// The shape of the generated CPU source for a CUDA-dialect kernel, by hand, and
// a launcher on kk_rt_launch. Each test kernel is
//
//   namespace kk_cuda { __device__ void custom_kernel_NAME(params) { body } }
//   struct NAME_args { params...; unsigned kk_shared; };
//   KK_TEST_CALL(NAME, NAME_args, (a.x, a.y, ...))
//
// and runs with launch<NAME_args, NAME_call>(args, grid_threads, block, sync).
#pragma once

// The test's own standard headers first: libstdc++ 13 spells __noinline__,
// which cuda_cpu.h defines (NVRTC code includes none of these).
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <string>
#include <vector>

#define KK_CPU_ALLOW_EXIT 1  // a test program: CHECK exits after too many failures
#define KK_TARGET_CPU 1
#include <kernelkit/target_cpu.h>
#include <kernelkit/cuda_cpu.h>
#include <kernelkit/cpu_group.h>

#include <assert.h>  // after: a kernel's assert() stops the launch (cuda_cpu.h)

static int g_failures = 0;

#define CHECK(cond, ...)                                     \
  do {                                                       \
    if (!(cond)) {                                           \
      printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      printf(__VA_ARGS__);                                   \
      printf("\n");                                          \
      fflush(stdout);                                        \
      if (++g_failures > 20) exit(1);                        \
    }                                                        \
  } while (0)

// kk_call of the generated source: bind the thread, call the body.
#define KK_TEST_CALL(NAME, ARGS, CALL_ARGS)                                  \
  static void NAME##_call(const ARGS& a, const kk_thread_ctx& t) {          \
    KK_CUDA_BIND_THREAD(t, a.kk_shared);                                     \
    kk_cuda::custom_kernel_##NAME CALL_ARGS;                                 \
  }

template <class A, void (*Call)(const A&, const kk_thread_ctx&)>
static void thread_fn(const void* a, const kk_thread_ctx* t) {
  Call(*static_cast<const A*>(a), *t);
}
template <class A, void (*Call)(const A&, const kk_thread_ctx&)>
static void group_fn(const void* a, const kk_launch_desc* d, kk_dim3 gid, void* w) {
  if (d->uses_sync) {
    kk_rt_run_fibers(w, thread_fn<A, Call>, a, d, gid);
  } else {
    const A* args = static_cast<const A*>(a);
    kk::cpu_group_loop(d, gid, [args](const kk_thread_ctx& t) { Call(*args, t); });
  }
}

// CUDA launch of MLX's cuda_kernel: `threads` counts threads, the grid is
// ceil(threads / block) whole blocks (full == true: every block has blockDim
// threads, as on the GPU). full == false: Metal-style partial edge groups.
// Returns "" or the launch's error.
template <class A, void (*Call)(const A&, const kk_thread_ctx&)>
static std::string launch(const A& args, dim3 threads, dim3 block, bool sync, bool full = true,
                          const char* name = "k") {
  kk_launch_desc d;
  d.num_groups = kk_dim3{(threads.x + block.x - 1) / block.x, (threads.y + block.y - 1) / block.y,
                         (threads.z + block.z - 1) / block.z};
  d.group = kk_dim3{block.x, block.y, block.z};
  d.grid = full ? kk_dim3{d.num_groups.x * block.x, d.num_groups.y * block.y, d.num_groups.z * block.z}
                : kk_dim3{threads.x, threads.y, threads.z};
  d.uses_sync = sync;
  d.kernel_name = name;
  char err[2048] = {0};
  int rc = kk_rt_launch(group_fn<A, Call>, &args, &d, err, sizeof err);
  return rc ? std::string(err[0] ? err : "failed without a message") : std::string();
}

#define LAUNCH_OK(...)                                   \
  do {                                                   \
    std::string e_ = __VA_ARGS__;                        \
    CHECK(e_.empty(), "launch failed: %s", e_.c_str());  \
  } while (0)

// Deterministic pseudo-random numbers.
struct rng {
  unsigned long long s;
  explicit rng(unsigned long long seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  unsigned long long next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  unsigned u32() { return unsigned(next() >> 32); }
  double uniform() { return double(next() >> 11) * 0x1p-53; }
};
