// kernelkit/cpu_runtime/stacks.h: the stacks kernel threads run on (part of libkkrt).
//
// Every kernel thread runs on a stack of the runtime's: a fiber on its own, a loop-mode group
// on its participant's loop stack. Each stack reserves KERNELKIT_CPU_STACK_SIZE bytes of
// address space (default 8 MiB, what an OS thread gets) above a guard page, with
// MAP_NORESERVE: pages are committed only as a kernel touches them, so a kernel with large
// local arrays (which a GPU keeps in local memory; CUDA allows 512 KiB per thread) runs, and a
// small kernel costs the pages it touches. Transparent huge pages are off on them: one touch
// would commit 2 MiB. Overflowing a stack hits its guard page: the fault handler names it.
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <vector>

namespace {

constexpr size_t kDefaultStackSize = size_t(8) << 20;
constexpr size_t kMinStackSize = size_t(64) << 10;
constexpr size_t kMaxStackSize = size_t(1) << 30;

size_t page_size() {
  static const size_t p = size_t(sysconf(_SC_PAGESIZE));
  return p;
}

// The stack size of the process, read once: KERNELKIT_CPU_STACK_SIZE (bytes, or with a K, M or
// G suffix), else the default. `error` is set when the variable is not a valid size.
struct StackSetting {
  size_t bytes = kDefaultStackSize;
  bool from_env = false;
  char error[256] = {0};
};

StackSetting read_stack_setting() {
  StackSetting s;
  const char* e = getenv("KERNELKIT_CPU_STACK_SIZE");
  if (!e || !*e) return s;
  char* end = nullptr;
  unsigned long long v = strtoull(e, &end, 10);
  unsigned shift = 0;
  if (end != e && *end) {
    switch (*end | 0x20) {
      case 'k': shift = 10; break;
      case 'm': shift = 20; break;
      case 'g': shift = 30; break;
      default: shift = 64;
    }
    if (shift != 64) {
      ++end;
      if ((*end | 0x20) == 'i') ++end;  // KiB, MiB, GiB
      if ((*end | 0x20) == 'b') ++end;
    }
  }
  const bool ok = end != e && !*end && shift < 64 && e[0] != '-' && v <= (kMaxStackSize >> shift) &&
                  (v << shift) >= kMinStackSize;
  if (!ok) {
    snprintf(s.error, sizeof s.error,
             "KERNELKIT_CPU_STACK_SIZE='%.64s' is not a stack size: expected bytes between 64K "
             "and 1G, as a number with an optional K, M or G suffix (e.g. 16M)", e);
    return s;
  }
  s.bytes = size_t(v << shift);
  s.from_env = true;
  return s;
}

const StackSetting& stack_setting() {
  static const StackSetting s = read_stack_setting();
  return s;
}

// Stacks of one OS thread, `per_map` to a mapping, each above its own guard page.
class Stacks {
 public:
  explicit Stacks(unsigned per_map) : per_map_(per_map) {}
  ~Stacks() { release(); }
  Stacks(const Stacks&) = delete;
  Stacks& operator=(const Stacks&) = delete;

  // Makes at least n stacks of the process's size; false when the address space cannot be
  // reserved even at the smallest size tried (the default size halves down to 256 KiB; a size
  // set in the environment is kept).
  bool ensure(unsigned n) {
    if (!size_) size_ = round_up(stack_setting().bytes);
    while (count_ < n) {
      const size_t len = per_map_ * slot();
      int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_NORESERVE
      flags |= MAP_NORESERVE;
#endif
#ifdef MAP_STACK
      flags |= MAP_STACK;
#endif
      void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, flags, -1, 0);
      if (m == MAP_FAILED) {
        if (stack_setting().from_env || size_ <= (size_t(256) << 10)) return false;
        release();
        size_ = round_up(size_ / 2);
        continue;
      }
#ifdef MADV_NOHUGEPAGE
      madvise(m, len, MADV_NOHUGEPAGE);
#endif
      for (unsigned k = 0; k < per_map_; ++k)
        mprotect(static_cast<char*>(m) + k * slot(), page_size(), PROT_NONE);
      maps_.push_back(static_cast<char*>(m));
      count_ += per_map_;
    }
    return true;
  }

  // Stack i: [lo, hi), with a guard page below lo.
  void get(unsigned i, char** lo, char** hi) const {
    char* base = maps_[i / per_map_] + (i % per_map_) * slot();
    *lo = base + page_size();
    // Stagger the tops so that the hot frames of the fibers do not all fall in the same L1 sets.
    *hi = base + slot() - (i % 63) * 64;
  }

  // Whether addr lies in the guard page of one of these stacks.
  bool in_guard_page(uintptr_t addr) const {
    for (char* m : maps_) {
      const uintptr_t b = reinterpret_cast<uintptr_t>(m);
      if (addr < b || addr >= b + per_map_ * slot()) continue;
      return (addr - b) % slot() < page_size();
    }
    return false;
  }

  size_t size() const { return size_ ? size_ : round_up(stack_setting().bytes); }

 private:
  static size_t round_up(size_t n) { return (n + page_size() - 1) & ~(page_size() - 1); }
  size_t slot() const { return size_ + page_size(); }
  void release() {
    for (char* m : maps_) munmap(m, per_map_ * slot());
    maps_.clear();
    count_ = 0;
  }

  const unsigned per_map_;
  std::vector<char*> maps_;
  unsigned count_ = 0;
  size_t size_ = 0;  // usable bytes per stack, once the first stacks are made
};

}  // namespace
