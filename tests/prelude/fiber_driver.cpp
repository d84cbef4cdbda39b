// tests/prelude/fiber_driver.cpp: runs a prelude test program built with
// -DKK_TARGET_CPU (its kk_test_entry) as one SIMD-group of 32 threads on the
// CPU runtime's fibers, and reports like the single-lane builds.
#include <stdio.h>

#include "kernelkit/cpu_runtime.h"

struct kk_test_result {
  int checks;
  int failures;
};
extern "C" void kk_test_entry(kk_test_result* r, unsigned lane);

static kk_test_result result = {0, 0};  // one group: its fibers share one OS thread

static void run_thread(const void*, const kk_thread_ctx* t) { kk_test_entry(&result, t->tindex % 32u); }
static void run_group(const void* args, const kk_launch_desc* d, kk_dim3 gid, void* worker) {
  kk_rt_run_fibers(worker, run_thread, args, d, gid);
}

int main() {
  const kk_launch_desc d = {{32, 1, 1}, {32, 1, 1}, {1, 1, 1}, 1, "prelude test"};
  char err[1024] = {0};
  const int rc = kk_rt_launch(run_group, nullptr, &d, err, sizeof err);
  if (rc != 0) printf("launch failed: %s\n", err);
  printf("fibers: %d checks, %d failed\n", result.checks, result.failures);
  return rc != 0 || result.failures != 0;
}
