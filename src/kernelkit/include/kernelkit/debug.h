// kernelkit/debug.h: checked variants of a kernel (a call's check_bounds=True and timeout=).
//
// The generated unit includes this after the prelude and the entry header when a call asks
// for checks, with KK_DBG_NBUF (the number of checked buffers) defined before. The front end
// (debugging.py) rewrites the user's source, keeping its lines:
//   - each use of a buffer parameter `x` in the body becomes KK_CHK(x, b) (b: the buffer's
//     number), a kk::dbg::ptr<T> that checks every access through it (x[i], *x, x + i then
//     an access) against the buffer's address range, and converts to T* where a raw
//     pointer is needed (the argument of a helper function gets the raw pointer);
//   - a buffer passed to a function as `x + i` becomes ::kk::dbg::arg(KK_CHK(x, b) + i) (the
//     pointer must lie in [x, x + size]), or ::kk::dbg::elem(...) for atomic* calls (the
//     element must exist);
//   - every loop of the body and the header gets a poll in its condition,
//     `while (KK_POLL(0), cond)`, `for (init; KK_POLL(0), cond; inc)` (1 in the header).
// The generated kk_args carries the record buffer (`kk_dbg`), the timeout in ns and each
// checked buffer's size in elements (`kk_dbg_size`); the generated kk_dbg_bind(a, t) hands
// them to bind() below.
//
// The record (64-bit words, read by debugging.py after the launch):
//   [0] status, claimed once by compare-and-swap: 0 nothing, 1 out-of-bounds, 2 timed out
//   [1] start of the launch (ns: %globaltimer on the GPU, CLOCK_MONOTONIC on the CPU)
//   [2] buffer number  [3] element index  [4] line | where << 32 (0 body, 1 header)
//   [5..7] thread position in its group  [8..10] group position in the grid
//   [16..31] the dummy element a redirected access reads or writes (GPU)
//
// On the GPU the first violation is recorded and the access goes to the dummy, so that no
// memory outside the buffers is touched and the process's CUDA context stays usable; a
// thread past its timeout records it and exits (PTX `exit`: the other threads go on, a
// barrier no longer waits for it). On the CPU a violation or a timeout is recorded and the
// launch stops at once through kk_rt_fail (the runtime abandons the group's fibers or
// longjmps out of the loop-mode group), which the caller turns into IndexError or
// TimeoutError from the record.
#pragma once

#ifndef KK_DBG_NBUF
#define KK_DBG_NBUF 0
#endif

#if !defined(KK_TARGET_CUDA)
#include <time.h>
#endif

namespace kk {
namespace dbg {

enum : unsigned {
  kStatus = 0, kStart = 1, kBuffer = 2, kIndex = 3, kLine = 4, kTid = 5, kGid = 8, kDummy = 16,
  kRecordWords = 32,
};
enum : unsigned long long { kNone = 0, kOutOfBounds = 1, kTimedOut = 2 };
constexpr unsigned kBuffers = KK_DBG_NBUF > 0 ? KK_DBG_NBUF : 1;
constexpr unsigned kPollEvery = 1024;  // CPU: polls between two looks at the clock (a power of 2)

struct state {
  unsigned long long* rec;
  unsigned long long timeout;  // ns; 0: none
  unsigned long long start;
  int stopped;
  unsigned polls;                 // CPU: polls of this OS thread (the clock every kPollEvery)
  const kk_thread_ctx* ctx;       // CPU loop mode: the thread running on this OS thread
  kk_dim3 grid;                   // GPU: the launch's grid, for record_thread
  const char* base[kBuffers];
  long long size[kBuffers];       // elements
};

// --- the state of the running launch ---------------------------------------------------------
#if defined(KK_TARGET_CUDA)
// One per block: thread 0 fills it at the start of the block (bind), before any thread runs.
__shared__ state g_state;
KK_FN state& st() { return g_state; }

KK_FN unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

KK_FN void record_thread(unsigned long long* rec) {
  kk_dim3 tid = {threadIdx.x, threadIdx.y, threadIdx.z};
  unsigned index;
  thread_position(group_size(g_state.grid), tid, index);  // the Metal thread it runs
  rec[kTid] = tid.x;
  rec[kTid + 1] = tid.y;
  rec[kTid + 2] = tid.z;
  rec[kGid] = blockIdx.x;
  rec[kGid + 1] = blockIdx.y;
  rec[kGid + 2] = blockIdx.z;
}

// Every thread of the block calls it, before the grid check (so the barrier sees them all).
KK_FN void bind(unsigned long long* rec, long long timeout, const void* const* base,
                const long long* size, const kk_dim3 grid, const kk_thread_ctx*) {
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    state& s = g_state;
    s.rec = rec;
    s.grid = grid;
    s.timeout = static_cast<unsigned long long>(timeout);
    for (unsigned i = 0; i < unsigned(KK_DBG_NBUF); ++i) {
      s.base[i] = static_cast<const char*>(base[i]);
      s.size[i] = size[i];
    }
    s.start = 0;
    s.stopped = 0;
    if (timeout) {
      unsigned long long start = *reinterpret_cast<volatile unsigned long long*>(&rec[kStart]);
      if (!start) {
        const unsigned long long now = now_ns();
        start = atomicCAS(&rec[kStart], 0ull, now);
        if (!start) start = now;
      }
      s.start = start;
      // A block that starts after the launch timed out does not run the body.
      s.stopped = *reinterpret_cast<volatile unsigned long long*>(&rec[kStatus]) == kTimedOut;
    }
  }
  __syncthreads();
}
KK_FN bool stopped() { return g_state.stopped != 0; }

__device__ __noinline__ void* violation(unsigned b, long long index, unsigned line) {
  unsigned long long* rec = g_state.rec;
  if (atomicCAS(&rec[kStatus], kNone, kOutOfBounds) == kNone) {
    rec[kBuffer] = b;
    rec[kIndex] = static_cast<unsigned long long>(index);
    rec[kLine] = line;
    record_thread(rec);
    __threadfence();
  }
  return rec + kDummy;  // the access reads or writes the dummy instead
}

__device__ __noinline__ void timed_out(unsigned line, unsigned where) {
  unsigned long long* rec = g_state.rec;
  if (atomicCAS(&rec[kStatus], kNone, kTimedOut) == kNone) {
    rec[kLine] = line | (static_cast<unsigned long long>(where) << 32);
    record_thread(rec);
    __threadfence();
  }
  asm volatile("exit;");  // this thread ends; the context and the other threads are unharmed
}

KK_FN void poll_rt(unsigned line, unsigned where) {
  const state& s = g_state;
  if (__builtin_expect(now_ns() - s.start > s.timeout, 0)) timed_out(line, where);
}

#else  // the CPU
// One per OS thread: every thread of a launch binds it before its body (the values are the
// launch's, the same for all the fibers of a group). A kernel library's own TLS block.
static thread_local state g_state;
// Its address, as a function the compiler may call once per group: `const` lets it hoist the
// call out of the group's loop (a group, and all its fibers, stay on one OS thread), where the
// TLS lookup of every access would otherwise cost a __tls_get_addr call.
__attribute__((const, noinline)) inline state* state_ptr() { return &g_state; }
inline state& st() { return *state_ptr(); }

inline unsigned long long now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<unsigned long long>(ts.tv_sec) * 1000000000ull +
         static_cast<unsigned long long>(ts.tv_nsec);
}

inline const kk_thread_ctx* current_thread() {
  return kk_rt_current ? kk_rt_current : st().ctx;  // fiber mode : loop mode
}

inline void bind(unsigned long long* rec, long long timeout, const void* const* base,
                 const long long* size, const kk_dim3, const kk_thread_ctx* t) {
  state& s = st();
  s.rec = rec;
  s.ctx = t;
  s.timeout = static_cast<unsigned long long>(timeout);
  for (unsigned i = 0; i < unsigned(KK_DBG_NBUF); ++i) {
    s.base[i] = static_cast<const char*>(base[i]);
    s.size[i] = size[i];
  }
}

inline void record_thread(unsigned long long* rec) {
  const kk_thread_ctx* t = current_thread();
  if (!t) return;
  rec[kTid] = t->tid.x;
  rec[kTid + 1] = t->tid.y;
  rec[kTid + 2] = t->tid.z;
  rec[kGid] = t->gid.x;
  rec[kGid + 1] = t->gid.y;
  rec[kGid + 2] = t->gid.z;
}

inline bool claim(unsigned long long* rec, unsigned long long status) {
  unsigned long long expected = kNone;
  return __atomic_compare_exchange_n(&rec[kStatus], &expected, status, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE);
}

[[noreturn]] __attribute__((noinline, cold)) inline void* violation(unsigned b, long long index,
                                                                     unsigned line) {
  unsigned long long* rec = g_state.rec;
  if (claim(rec, kOutOfBounds)) {
    rec[kBuffer] = b;
    rec[kIndex] = static_cast<unsigned long long>(index);
    rec[kLine] = line;
    record_thread(rec);
  }
  kk_rt_fail(current_thread(), "out-of-bounds access (check_bounds)");
}

[[noreturn]] __attribute__((noinline, cold)) inline void timed_out(unsigned line, unsigned where) {
  unsigned long long* rec = g_state.rec;
  if (claim(rec, kTimedOut)) {
    rec[kLine] = line | (static_cast<unsigned long long>(where) << 32);
    record_thread(rec);
  }
  kk_rt_fail(current_thread(), "timed out");
}

// Every kPollEvery polls of this OS thread: the clock. The launch's start is the first look
// at the clock of any of its threads (a few microseconds after it began at most). Another
// thread may win that compare-and-swap with a later reading than this thread's `now`, so the
// elapsed time is signed: a negative one is not past the deadline (unsigned, it would wrap).
__attribute__((noinline, cold)) inline void poll_clock(unsigned line, unsigned where) {
  const state& s = st();
  if (!s.timeout || !s.rec) return;
  const unsigned long long now = now_ns();
  unsigned long long start = __atomic_load_n(&s.rec[kStart], __ATOMIC_RELAXED);
  if (!start && __atomic_compare_exchange_n(&s.rec[kStart], &start, now, false, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED))
    start = now;
  const long long elapsed = static_cast<long long>(now - start);
  // Past the deadline, or another thread already stopped the launch.
  if (elapsed > static_cast<long long>(s.timeout) ||
      __atomic_load_n(&s.rec[kStatus], __ATOMIC_RELAXED) != kNone)
    timed_out(line, where);
}

inline void poll_rt(unsigned line, unsigned where) {
  if (__builtin_expect((++st().polls & (kPollEvery - 1)) == 0, 0)) poll_clock(line, where);
}
#endif

// A poll in a loop condition; usable in constexpr functions of the user's header.
#if defined(KK_TARGET_CUDA)
__host__ __device__ __forceinline__
#else
inline
#endif
constexpr void poll(unsigned line, unsigned where) {
  if (!__builtin_is_constant_evaluated()) {
#if !defined(KK_TARGET_CUDA) || defined(__CUDA_ARCH__)
    poll_rt(line, where);
#endif
  }
}

// --- checked pointers ------------------------------------------------------------------------
namespace detail {
template <bool B, class T = int> struct enable_if {};
template <class T> struct enable_if<true, T> { using type = T; };
template <class U> struct remove_ref { using type = U; };
template <class U> struct remove_ref<U&> { using type = U; };
template <class U> struct remove_ref<U&&> { using type = U; };
template <class U> struct is_ptr { static constexpr bool value = false; };
template <class U> struct is_ptr<U*> { static constexpr bool value = true; };
template <class U> struct is_ptr<U* const> { static constexpr bool value = true; };
template <class U> struct is_index { static constexpr bool value = false; };
#define KK_DBG_INDEX(T) template <> struct is_index<T> { static constexpr bool value = true; };
KK_DBG_INDEX(bool) KK_DBG_INDEX(char) KK_DBG_INDEX(signed char) KK_DBG_INDEX(unsigned char)
KK_DBG_INDEX(short) KK_DBG_INDEX(unsigned short) KK_DBG_INDEX(int) KK_DBG_INDEX(unsigned)
KK_DBG_INDEX(long) KK_DBG_INDEX(unsigned long) KK_DBG_INDEX(long long)
KK_DBG_INDEX(unsigned long long)
#undef KK_DBG_INDEX
template <class I> struct is_index<const I> : is_index<I> {};
template <class I>
using if_index = typename enable_if<is_index<typename remove_ref<I>::type>::value>::type;
template <class U>
using if_not_pointer = typename enable_if<!is_ptr<typename remove_ref<U>::type>::value>::type;
}  // namespace detail

constexpr unsigned kNoBuffer = 0xffffffffu;  // a checked pointer given a raw pointer: unchecked

// p itself if element *p lies in buffer b, else the violation's dummy (GPU) or never (CPU).
template <class T>
KK_FN T* check(T* p, unsigned b, unsigned line) {
  if (b == kNoBuffer) return p;
  const state& s = st();
  const long long off = (const char*)(p) - s.base[b];  // bytes from the buffer's start
  const unsigned long long bytes = static_cast<unsigned long long>(s.size[b]) * sizeof(T);
  if (__builtin_expect(off >= 0 && static_cast<unsigned long long>(off) + sizeof(T) <= bytes, 1))
    return p;
  const long long n = static_cast<long long>(sizeof(T));
  const long long index = off >= 0 ? off / n : -((-off + n - 1) / n);
  return (T*)(violation(b, index, line));
}

// A pointer into buffer b (a parameter of the body) whose accesses are checked.
template <class T>
struct ptr {
  T* p;
  unsigned b, line;

  KK_FN ptr(T* p_, unsigned b_, unsigned line_) : p(p_), b(b_), line(line_) {}
  // A null pointer constant (`c ? x : 0`, `c ? x : nullptr`): the conditional's other operand
  // becomes a checked pointer that checks nothing, as the plain build's null pointer.
  KK_FN ptr(decltype(nullptr)) : p(nullptr), b(kNoBuffer), line(0) {}
  KK_FN operator T*() const { return p; }
  // Casts to other pointer types (`(const uchar*)q`, `static_cast<...>(q)`) take the raw pointer:
  // accesses through the result are unchecked, as after any cast.
  template <class U>
  KK_FN explicit operator U*() const { return (U*)(p); }
  KK_FN ptr& operator=(T* q) { p = q; b = kNoBuffer; return *this; }  // no longer known
  template <class I, class = detail::if_index<I>>
  KK_FN T& operator[](I i) const { return *check(p + i, b, line); }
  KK_FN T& operator*() const { return *check(p, b, line); }
  KK_FN T* operator->() const { return check(p, b, line); }
  template <class I, class = detail::if_index<I>>
  KK_FN ptr operator+(I i) const { return ptr{p + i, b, line}; }
  template <class I, class = detail::if_index<I>>
  KK_FN ptr operator-(I i) const { return ptr{p - i, b, line}; }
  KK_FN long long operator-(const T* q) const { return p - q; }
  KK_FN long long operator-(const ptr& q) const { return p - q.p; }
  template <class I, class = detail::if_index<I>>
  KK_FN ptr& operator+=(I i) { p += i; return *this; }
  template <class I, class = detail::if_index<I>>
  KK_FN ptr& operator-=(I i) { p -= i; return *this; }
  KK_FN ptr& operator++() { ++p; return *this; }
  KK_FN ptr& operator--() { --p; return *this; }
  KK_FN ptr operator++(int) { ptr o = *this; ++p; return o; }
  KK_FN ptr operator--(int) { ptr o = *this; --p; return o; }
};
template <class I, class T, class = detail::if_index<I>>
KK_FN ptr<T> operator+(I i, const ptr<T>& q) { return ptr<T>{q.p + i, q.b, q.line}; }
template <class U, class T>
KK_FN long long operator-(U* a, const ptr<T>& q) { return a - q.p; }

template <class T>
KK_FN ptr<T> make(T* p, unsigned b, unsigned line) { return ptr<T>{p, b, line}; }
// A name that is not the buffer here (a local of the same name): itself, unchecked.
template <class U, class = detail::if_not_pointer<U>>
KK_FN U&& make(U&& v, unsigned, unsigned) { return static_cast<U&&>(v); }

// A checked pointer handed to a function: the raw pointer, which must lie in [base, base + size].
template <class T>
KK_FN T* arg(const ptr<T>& q) {
  if (q.b == kNoBuffer) return q.p;
  const state& s = st();
  const long long off = (const char*)(q.p) - s.base[q.b];
  if (__builtin_expect(off >= 0 && static_cast<unsigned long long>(off) <=
                                       static_cast<unsigned long long>(s.size[q.b]) * sizeof(T), 1))
    return q.p;
  const long long n = static_cast<long long>(sizeof(T));
  return (T*)(violation(q.b, off >= 0 ? off / n : -((-off + n - 1) / n), q.line));
}
// ... to a function that accesses the element (atomic*): the element must exist.
template <class T>
KK_FN T* elem(const ptr<T>& q) { return check(q.p, q.b, q.line); }
namespace detail {
template <class U> struct is_checked { static constexpr bool value = false; };
template <class T> struct is_checked<ptr<T>> { static constexpr bool value = true; };
template <class U> struct is_checked<const U> : is_checked<U> {};
template <class U> using if_unchecked =
    typename enable_if<!is_checked<typename remove_ref<U>::type>::value>::type;
}  // namespace detail
// Anything else (`x - y`, a pointer difference): itself.
template <class U, class = detail::if_unchecked<U>>
KK_FN U&& arg(U&& v) { return static_cast<U&&>(v); }
template <class U, class = detail::if_unchecked<U>>
KK_FN U&& elem(U&& v) { return static_cast<U&&>(v); }
// A derived checked pointer (`auto row = x + i;`) handed to a function or a cast.
template <class T>
KK_FN T* raw(const ptr<T>& q) { return q.p; }
template <class U, class = detail::if_unchecked<U>>
KK_FN U&& raw(U&& v) { return static_cast<U&&>(v); }

}  // namespace dbg
}  // namespace kk

#define KK_CHK(p, b) ::kk::dbg::make((p), (b), __LINE__)
#define KK_POLL(where) ::kk::dbg::poll(__LINE__, (where))
