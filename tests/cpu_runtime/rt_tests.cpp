// Tests of the CPU runtime without the Python pipeline: hand-written kernel
// bodies run through kk_rt_launch, in loop mode or fiber mode.
//   g++ -std=c++17 -O2 -pthread -I src/kernelkit/include rt_tests.cpp -L DIR -lkkrt
//   ./rt_tests NAME     (NAME: see main; prints "ok NAME" or "FAIL ...", exit 1)
#define KK_CPU_ALLOW_EXIT 1  // a test program: CHECK exits after too many failures
#include <kernelkit/cpu_group.h>
#include <kernelkit/target_cpu.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <chrono>
#include <cfenv>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

static int g_failures = 0;

#define CHECK(cond, ...)                                        \
  do {                                                          \
    if (!(cond)) {                                              \
      printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
      printf(__VA_ARGS__);                                      \
      printf("\n");                                             \
      fflush(stdout);                                           \
      if (++g_failures > 20) exit(1);                           \
    }                                                           \
  } while (0)

// ---------------------------------------------------------------------------
// A tiny launcher: Body(const A*, const kk_thread_ctx*) runs as a kernel.

template <class A, void (*Body)(const A*, const kk_thread_ctx*)>
static void thread_fn(const void* a, const kk_thread_ctx* t) {
  Body(static_cast<const A*>(a), t);
}
template <class A, void (*Body)(const A*, const kk_thread_ctx*)>
static void group_fibers(const void* a, const kk_launch_desc* d, kk_dim3 gid, void* w) {
  kk_rt_run_fibers(w, thread_fn<A, Body>, a, d, gid);
}
template <class A, void (*Body)(const A*, const kk_thread_ctx*)>
static void group_loop(const void* a, const kk_launch_desc* d, kk_dim3 gid, void* w) {
  const A* args = static_cast<const A*>(a);
  kk::cpu_group_loop(d, gid, kk_rt_loop_only(w), [args](const kk_thread_ctx& t) { Body(args, &t); });
}

static unsigned cdiv(unsigned a, unsigned b) { return (a + b - 1) / b; }

static kk_launch_desc make_desc(const char* name, kk_dim3 grid, kk_dim3 group, bool sync) {
  kk_launch_desc d;
  d.grid = grid;
  d.group = group;
  d.num_groups = kk_dim3{cdiv(grid.x, group.x), cdiv(grid.y, group.y), cdiv(grid.z, group.z)};
  d.uses_sync = sync;
  d.kernel_name = name;
  return d;
}

// Returns "" on success, else the error text.
template <class A, void (*Body)(const A*, const kk_thread_ctx*)>
static std::string launch(const char* name, const A& args, kk_dim3 grid, kk_dim3 group, bool sync) {
  kk_launch_desc d = make_desc(name, grid, group, sync);
  char err[4096];
  int rc = kk_rt_launch(sync ? group_fibers<A, Body> : group_loop<A, Body>, &args, &d, err,
                        sizeof err);
  if (rc == 0) return "";
  return err[0] ? std::string(err) : std::string("(empty error)");
}

static bool contains(const std::string& s, const char* part) { return s.find(part) != s.npos; }

static double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Plus {
  template <class T>
  T operator()(T a, T b) const { return a + b; }
};
struct Max {
  template <class T>
  T operator()(T a, T b) const { return a > b ? a : b; }
};

static unsigned gx(const kk_thread_ctx* t) { return t->gid.x * t->tg_dispatch.x + t->tid.x; }

// ---------------------------------------------------------------------------
// Tree reduction through threadgroup memory, groups of 256.

struct ReduceArgs {
  const unsigned* in;
  unsigned long long* out;
  unsigned n;
  pthread_t* who;  // OS thread that ran each group
};

static void reduce_body(const ReduceArgs* a, const kk_thread_ctx* t) {
  KK_THREADGROUP unsigned long long buf[256];
  const unsigned i = gx(t), l = t->tindex;
  buf[l] = i < a->n ? a->in[i] : 0;
  kk::threadgroup_barrier();
  for (unsigned s = 128; s > 0; s >>= 1) {
    if (l < s) buf[l] += buf[l + s];
    kk::threadgroup_barrier();
  }
  if (l == 0) {
    a->out[t->gid.x] = buf[0];
    if (a->who) a->who[t->gid.x] = pthread_self();
  }
}

static bool run_reduce(unsigned groups, bool record_threads) {
  const unsigned n = groups * 256;
  std::vector<unsigned> in(n);
  for (unsigned i = 0; i < n; ++i) in[i] = (i * 2654435761u) >> 8;
  std::vector<unsigned long long> out(groups, ~0ull);
  std::vector<pthread_t> who(groups);
  ReduceArgs a{in.data(), out.data(), n, record_threads ? who.data() : nullptr};
  std::string e = launch<ReduceArgs, reduce_body>("reduce", a, {n, 1, 1}, {256, 1, 1}, true);
  CHECK(e.empty(), "%s", e.c_str());
  bool ok = e.empty();
  for (unsigned g = 0; g < groups; ++g) {
    unsigned long long want = 0;
    for (unsigned k = 0; k < 256; ++k) want += in[g * 256 + k];
    if (out[g] != want) {
      CHECK(out[g] == want, "group %u: %llu != %llu", g, out[g], want);
      ok = false;
      break;
    }
  }
  if (record_threads) {
    std::set<unsigned long> ids;
    for (pthread_t p : who) ids.insert((unsigned long)p);
    printf("reduce: %u groups of 256 ran on %zu OS threads (kk_rt_num_threads = %d)\n", groups,
           ids.size(), kk_rt_num_threads());
    if (kk_rt_num_threads() >= 2) CHECK(ids.size() >= 2, "groups did not run in parallel");
  }
  return ok;
}

static void test_reduce() {
  double t0 = now_s();
  run_reduce(2048, true);
  printf("reduce: %.1f ms\n", (now_s() - t0) * 1e3);
  run_reduce(1, false);  // single group: runs on the caller
}

// ---------------------------------------------------------------------------
// SIMD: scans, butterfly shuffles, ballot, reductions, against hand-computed values.

struct SimdArgs {
  int* incl;
  int* excl;
  int* hillis;
  int* butterfly;
  unsigned* ballot;
  int* maxv;
  int* quad;
  int* quad_scan;
  unsigned* mask;
  float* fsum;
};

static int simd_value(unsigned i) { return int((i * 7u + 3u) % 23u) - 5; }

static void simd_body(const SimdArgs* a, const kk_thread_ctx* t) {
  const unsigned i = gx(t), lane = kk::simd_lane();
  const int v = simd_value(i);
  a->incl[i] = kk::simd_scan<32>(v, Plus(), 0, true);
  a->excl[i] = kk::simd_scan<32>(v, Plus(), 0, false);
  int x = v;  // Hillis-Steele inclusive scan with shuffles ("shuffle_up")
  for (unsigned d = 1; d < 32; d <<= 1) {
    int y = kk::simd_shuffle(x, lane - d);  // lane - d wraps to >= 32: own value
    if (lane >= d) x += y;
  }
  a->hillis[i] = x;
  int b = v;  // butterfly sum with shuffle xor
  for (unsigned o = 16; o; o >>= 1) b += kk::simd_shuffle(b, lane ^ o);
  a->butterfly[i] = b;
  a->ballot[i] = kk::simd_ballot(v % 3 == 0);
  a->maxv[i] = kk::simd_reduce<32>(v, Max());
  a->quad[i] = kk::simd_reduce<4>(v, Plus());
  a->quad_scan[i] = kk::simd_scan<4>(v, Plus(), 0, false);
  a->mask[i] = kk::simd_active_mask();
  a->fsum[i] = kk::simd_reduce<32>(float(v) * 0.5f, Plus());
}

// SIMD-group 1 works through many SIMD rendezvous while the others wait at a
// barrier; SIMD-group 2 returns early, lane by lane.
struct MixedArgs {
  unsigned* out;
};

static void mixed_body(const MixedArgs* a, const kk_thread_ctx* t) {
  const unsigned sg = t->tindex / 32, lane = t->tindex % 32;
  unsigned acc = 0;
  if (sg == 1)
    for (unsigned k = 0; k < 100; ++k) acc += kk::simd_reduce<32>(k + lane, Plus());
  if (sg == 2) {
    unsigned last = 0;
    for (unsigned k = 0; k < 32; ++k) {
      if (lane == k) {
        a->out[gx(t)] = last;  // the mask of the step before: lanes k..31
        return;
      }
      last = kk::simd_active_mask();
    }
  }
  kk::threadgroup_barrier();
  a->out[gx(t)] = acc;
}

static void test_simd() {
  {
    std::vector<unsigned> out(96 * 3);
    MixedArgs m{out.data()};
    std::string e = launch<MixedArgs, mixed_body>("mixed", m, {96 * 3, 1, 1}, {96, 1, 1}, true);
    CHECK(e.empty(), "%s", e.c_str());
    for (unsigned i = 0; i < out.size(); ++i) {
      unsigned sg = i % 96 / 32, lane = i % 32;
      unsigned want = sg == 0   ? 0
                      : sg == 1 ? 100 * 496 + 32 * 4950
                                : (lane ? 0xffffffffu << lane : 0);
      CHECK(out[i] == want, "mixed %u: %u want %u", i, out[i], want);
    }
  }
  const unsigned n = 64 * 8;  // groups of 64: two SIMD-groups each
  std::vector<int> incl(n), excl(n), hillis(n), bfly(n), maxv(n), quad(n), qscan(n);
  std::vector<unsigned> ballot(n), mask(n);
  std::vector<float> fsum(n);
  SimdArgs a{incl.data(), excl.data(), hillis.data(), bfly.data(), ballot.data(),
             maxv.data(), quad.data(), qscan.data(),  mask.data(),  fsum.data()};
  std::string e = launch<SimdArgs, simd_body>("simd", a, {n, 1, 1}, {64, 1, 1}, true);
  CHECK(e.empty(), "%s", e.c_str());
  for (unsigned base = 0; base < n; base += 32) {
    int run = 0, total = 0, mx = -1000;
    unsigned bal = 0;
    for (unsigned l = 0; l < 32; ++l) {
      int v = simd_value(base + l);
      total += v;
      mx = std::max(mx, v);
      if (v % 3 == 0) bal |= 1u << l;
    }
    for (unsigned l = 0; l < 32; ++l) {
      unsigned i = base + l;
      int v = simd_value(i);
      CHECK(excl[i] == run, "excl[%u] = %d, want %d", i, excl[i], run);
      run += v;
      CHECK(incl[i] == run, "incl[%u] = %d, want %d", i, incl[i], run);
      CHECK(hillis[i] == run, "hillis[%u] = %d, want %d", i, hillis[i], run);
      CHECK(bfly[i] == total, "butterfly[%u] = %d, want %d", i, bfly[i], total);
      CHECK(ballot[i] == bal, "ballot[%u] = %08x, want %08x", i, ballot[i], bal);
      CHECK(maxv[i] == mx, "max[%u] = %d, want %d", i, maxv[i], mx);
      unsigned q = i & ~3u;
      int qs = simd_value(q) + simd_value(q + 1) + simd_value(q + 2) + simd_value(q + 3);
      CHECK(quad[i] == qs, "quad[%u] = %d, want %d", i, quad[i], qs);
      int qx = 0;
      for (unsigned k = q; k < i; ++k) qx += simd_value(k);
      CHECK(qscan[i] == qx, "quad_scan[%u] = %d, want %d", i, qscan[i], qx);
      CHECK(mask[i] == 0xffffffffu, "mask[%u] = %08x", i, mask[i]);
      CHECK(fsum[i] == float(total) * 0.5f, "fsum[%u] = %g", i, fsum[i]);
    }
  }
}

// ---------------------------------------------------------------------------
// Partial edge groups, 1-D, 2-D, 3-D; tg_size, tindex, masks, coverage.

struct EdgeArgs {
  unsigned* hits;   // per grid point
  unsigned* info;   // per grid point: 6 values
  kk_dim3 grid;
};

static unsigned lin(const EdgeArgs* a, const kk_thread_ctx* t) {
  unsigned x = t->gid.x * t->tg_dispatch.x + t->tid.x;
  unsigned y = t->gid.y * t->tg_dispatch.y + t->tid.y;
  unsigned z = t->gid.z * t->tg_dispatch.z + t->tid.z;
  return x + a->grid.x * (y + a->grid.y * z);
}

static void edge_sync_body(const EdgeArgs* a, const kk_thread_ctx* t) {
  KK_THREADGROUP unsigned count;
  if (t->tindex == 0) count = 0;  // thread 0 always exists
  kk::threadgroup_barrier();
  kk::atomic_fetch_add(&count, 1u);
  kk::threadgroup_barrier();
  const unsigned p = lin(a, t);
  unsigned* o = a->info + 6 * p;
  o[0] = count;
  o[1] = t->tg_size.x * t->tg_size.y * t->tg_size.z;
  o[2] = t->tindex;
  o[3] = kk::simd_active_mask();
  o[4] = kk::simd_reduce<32>(1u, Plus());
  o[5] = kk::simd_shuffle(t->tindex, 0);  // lane 0 always exists
  a->hits[p] += 1;
}

static void edge_loop_body(const EdgeArgs* a, const kk_thread_ctx* t) {
  const unsigned p = lin(a, t);
  a->hits[p] += 1;
  a->info[6 * p] = t->tg_size.x * 10000 + t->tg_size.y * 100 + t->tg_size.z;
  a->info[6 * p + 2] = t->tindex;
}

static void check_edge(kk_dim3 grid, kk_dim3 group) {
  const unsigned n = grid.x * grid.y * grid.z;
  for (int sync = 0; sync < 2; ++sync) {
    std::vector<unsigned> hits(n, 0), info(6 * n, 0);
    EdgeArgs a{hits.data(), info.data(), grid};
    std::string e = sync ? launch<EdgeArgs, edge_sync_body>("edge", a, grid, group, true)
                         : launch<EdgeArgs, edge_loop_body>("edge", a, grid, group, false);
    CHECK(e.empty(), "%s", e.c_str());
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) {
          unsigned p = x + grid.x * (y + grid.y * z);
          CHECK(hits[p] == 1, "(%u,%u,%u) ran %u times", x, y, z, hits[p]);
          unsigned gx0 = x / group.x * group.x, gy0 = y / group.y * group.y,
                   gz0 = z / group.z * group.z;
          unsigned sx = std::min(group.x, grid.x - gx0), sy = std::min(group.y, grid.y - gy0),
                   sz = std::min(group.z, grid.z - gz0);
          unsigned tx = x - gx0, ty = y - gy0, tz = z - gz0;
          unsigned tindex = tx + ty * sx + tz * sx * sy;  // over the (edge) group's own size
          const unsigned* o = &info[6 * p];
          CHECK(o[2] == tindex, "tindex %u want %u", o[2], tindex);
          if (!sync) {
            CHECK(o[0] == sx * 10000 + sy * 100 + sz, "tg_size %u", o[0]);
            continue;
          }
          CHECK(o[0] == sx * sy * sz && o[1] == sx * sy * sz, "count %u size %u want %u", o[0],
                o[1], sx * sy * sz);
          // Lanes of this SIMD-group that exist: tindex t' in [sg*32, sg*32+32) inside the group.
          unsigned sg = tindex / 32, mask = 0;
          for (unsigned l = 0; l < 32; ++l)
            if (sg * 32 + l < sx * sy * sz) mask |= 1u << l;
          CHECK(o[3] == mask, "(%u,%u,%u) mask %08x want %08x", x, y, z, o[3], mask);
          CHECK(o[4] == unsigned(__builtin_popcount(mask)), "count lanes %u", o[4]);
          CHECK(o[5] == ((mask & 1) ? sg * 32 : tindex), "shuffle from lane 0: %u", o[5]);
        }
  }
}

static void test_edge() {
  check_edge({100, 1, 1}, {32, 1, 1});
  check_edge({1000, 1, 1}, {256, 1, 1});
  check_edge({10, 7, 1}, {4, 4, 1});
  check_edge({37, 13, 1}, {16, 8, 1});
  check_edge({5, 6, 7}, {4, 4, 4});
  check_edge({9, 3, 5}, {8, 2, 4});
  check_edge({3, 3, 3}, {3, 3, 3});
}

// ---------------------------------------------------------------------------
// Early return before barriers and before SIMD functions.

struct EarlyArgs {
  unsigned* out;
  unsigned* mask;
  unsigned live;  // threads with tindex < live stay
};

static void early_body(const EarlyArgs* a, const kk_thread_ctx* t) {
  KK_THREADGROUP unsigned buf[256];
  const unsigned l = t->tindex;
  if (l >= a->live) return;  // before any barrier
  buf[l] = l + 1;
  kk::threadgroup_barrier();
  if (l == 0) {
    unsigned s = 0;
    for (unsigned k = 0; k < a->live; ++k) s += buf[k];
    a->out[t->gid.x] = s;
  }
  if (l % 2) return;  // odd threads leave between two barriers
  kk::threadgroup_barrier();
  a->mask[t->gid.x * 256 + l] = kk::simd_reduce<32>(1u << (l % 32), [](unsigned x, unsigned y) {
    return x | y;
  });
  kk::threadgroup_barrier();
}

static void test_early_return() {
  for (unsigned live : {1u, 37u, 100u, 256u}) {
    std::vector<unsigned> out(4, 0), mask(4 * 256, 0);
    EarlyArgs a{out.data(), mask.data(), live};
    std::string e = launch<EarlyArgs, early_body>("early", a, {1024, 1, 1}, {256, 1, 1}, true);
    CHECK(e.empty(), "live %u: %s", live, e.c_str());
    for (unsigned g = 0; g < 4; ++g) {
      CHECK(out[g] == live * (live + 1) / 2, "live %u: sum %u", live, out[g]);
      for (unsigned l = 0; l < live; l += 2) {
        unsigned want = 0;
        for (unsigned k = l / 32 * 32; k < l / 32 * 32 + 32; k += 2)
          if (k < live) want |= 1u << (k % 32);
        CHECK(mask[g * 256 + l] == want, "live %u lane %u: %08x want %08x", live, l,
              mask[g * 256 + l], want);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Many values live across switches: every callee-saved register (integer and,
// on aarch64, d8-d15) must survive; the FP control state is per fiber.

struct RegArgs {
  double* out;
};

// Scalars live across the barrier call: the compiler keeps them in callee-saved
// registers (x86-64: rbx, rbp, r12-r15; aarch64: x19-x28, d8-d15).
template <bool Sync>
static double registers_work(unsigned l, double sg_sum) {
  double v0 = l * 0.5, v1 = v0 + 1, v2 = v0 + 2, v3 = v0 + 3, v4 = v0 + 4, v5 = v0 + 5,
         v6 = v0 + 6, v7 = v0 + 7;
  unsigned long long k0 = l * 1000003ull, k1 = k0 + 1, k2 = k0 + 2, k3 = k0 + 3, k4 = k0 + 4,
                     k5 = k0 + 5;
  for (int r = 0; r < 20; ++r) {
    if (Sync) kk::threadgroup_barrier();
    double t0 = v0;
    v0 = v0 * 1.25 - v1 * 0.25, v1 = v1 * 1.25 - v2 * 0.25, v2 = v2 * 1.25 - v3 * 0.25;
    v3 = v3 * 1.25 - v4 * 0.25, v4 = v4 * 1.25 - v5 * 0.25, v5 = v5 * 1.25 - v6 * 0.25;
    v6 = v6 * 1.25 - v7 * 0.25, v7 = v7 * 1.25 - t0 * 0.25;
    unsigned long long u0 = k0;
    k0 = k0 * 6364136223846793005ull + k5, k1 = k1 * 6364136223846793005ull + u0;
    k2 = k2 * 6364136223846793005ull + k1, k3 = k3 * 6364136223846793005ull + k2;
    k4 = k4 * 6364136223846793005ull + k3, k5 = k5 * 6364136223846793005ull + k4;
    if (r % 5 == 0) v3 += Sync ? kk::simd_reduce<32>(double(l), Plus()) : sg_sum;
  }
  return v0 + 2 * v1 + 3 * v2 + 4 * v3 + 5 * v4 + 6 * v5 + 7 * v6 + 8 * v7 +
         double((k0 ^ k1 ^ k2 ^ k3 ^ k4 ^ k5) >> 40);
}

static void registers_body(const RegArgs* a, const kk_thread_ctx* t) {
  a->out[t->gid.x * t->tg_dispatch.x + t->tindex] = registers_work<true>(t->tindex, 0);
}

static void test_registers() {
  // The same arithmetic in fiber mode (switching at every barrier) and without
  // any switch: identical bits.
  const unsigned n = 4 * 128;
  std::vector<double> fib(n);
  RegArgs a{fib.data()};
  std::string e = launch<RegArgs, registers_body>("regs", a, {n, 1, 1}, {128, 1, 1}, true);
  CHECK(e.empty(), "%s", e.c_str());
  for (unsigned i = 0; i < n; ++i) {
    unsigned l = i % 128;
    double sg = 0;
    for (unsigned q = l / 32 * 32; q < l / 32 * 32 + 32; ++q) sg += double(q);
    double ref = registers_work<false>(l, sg);
    CHECK(fib[i] == ref, "%u: %.17g != %.17g", i, fib[i], ref);
  }
}

// A fiber's floating-point control state (rounding mode) is its own.
struct FenvArgs {
  double* out;
};

static void fenv_body(const FenvArgs* a, const kk_thread_ctx* t) {
  volatile double one = 1.0, three = 3.0;
  if (t->tindex % 2 == 0) fesetround(FE_UPWARD);
  kk::threadgroup_barrier();
  a->out[t->tindex] = one / three;
  kk::threadgroup_barrier();
  fesetround(FE_TONEAREST);
}

static void test_fenv() {
  std::vector<double> out(64);
  FenvArgs a{out.data()};
  std::string e = launch<FenvArgs, fenv_body>("fenv", a, {64, 1, 1}, {64, 1, 1}, true);
  CHECK(e.empty(), "%s", e.c_str());
  volatile double one = 1.0, three = 3.0;
  double nearest = one / three, up = std::nextafter(nearest, 1.0);
  CHECK(nearest < up, "rounding");
  for (unsigned i = 0; i < 64; ++i)
    CHECK(out[i] == (i % 2 ? nearest : up), "thread %u: %.17g", i, out[i]);
  CHECK(fegetround() == FE_TONEAREST, "rounding mode leaked");
}

// ---------------------------------------------------------------------------
// Divergent SIMD-group functions (active-lane semantics); errors: impossible
// barrier, kk_rt_fail; then the runtime keeps working.

struct DivArgs {
  unsigned bad_group;  // only this group diverges
  unsigned* out;
};

static void divergent_body(const DivArgs* a, const kk_thread_ctx* t) {
  const unsigned lane = t->tindex % 32;
  if (t->gid.x == a->bad_group && t->tindex < 32 && lane < 16) {
    a->out[gx(t)] = kk::simd_reduce<32>(1u, Plus(), KK_SITE("simd_sum"));
  } else {
    kk::threadgroup_barrier();
  }
}

static void divergent_two_sites_body(const DivArgs* a, const kk_thread_ctx* t) {
  const unsigned lane = t->tindex % 32;
  if (lane < 8) a->out[gx(t)] = kk::simd_shuffle(lane, 3, KK_SITE("simd_shuffle"));
  else a->out[gx(t)] = kk::simd_reduce<32>(lane, Max(), KK_SITE("simd_max"));
}

// The lanes inside the `if` complete their call first; the others wait for them after it.
static void reconverge_body(const DivArgs* a, const kk_thread_ctx* t) {
  const unsigned lane = t->tindex % 32;
  unsigned v = lane;
  if (lane < 8) v = kk::simd_reduce<32>(v, Plus(), KK_SITE("simd_sum"));
  a->out[gx(t)] = kk::simd_reduce<32>(v, Plus(), KK_SITE("simd_sum"));
}

static void deadlock_body(const DivArgs* a, const kk_thread_ctx* t) {
  (void)a;
  if (t->tindex < 128 || t->gid.x != a->bad_group) {
    kk::threadgroup_barrier();
  } else {
    kk::threadgroup_barrier();
  }
}

// Without a site the runtime tells call sites apart by their return address.
// (The branches differ after the call, or g++ would merge the two calls into one.)
static void siteless_body(const DivArgs* a, const kk_thread_ctx* t) {
  if (t->tindex < 3 && t->gid.x == a->bad_group) {
    kk_rt_threadgroup_barrier(kk_rt_current, nullptr);
    a->out[gx(t)] = 7;
  } else {
    kk_rt_threadgroup_barrier(kk_rt_current, nullptr);
    a->out[gx(t)] = 8;
  }
}

static void siteless_ok_body(const DivArgs* a, const kk_thread_ctx* t) {
  for (int k = 0; k < 3; ++k) kk_rt_threadgroup_barrier(kk_rt_current, nullptr);
  a->out[gx(t)] = 7;
}

static void fail_body(const DivArgs* a, const kk_thread_ctx* t) {
  if (t->gid.x == a->bad_group && t->tindex == 5) kk_rt_fail(t, "index 99 out of bounds for 'x'");
  a->out[gx(t)] = 1;
}

static void loop_barrier_body(const DivArgs*, const kk_thread_ctx*) { kk::threadgroup_barrier(); }

static void expect_ok_after() {
  CHECK(run_reduce(64, false), "launch after an error failed");
}

static void test_divergent() {
  std::vector<unsigned> out(256 * 64);
  for (unsigned groups : {1u, 64u}) {
    // Lanes 0-15 of one SIMD-group sum while lanes 16-31 wait at the barrier.
    const unsigned bad = groups == 1 ? 0u : 3u;
    std::fill(out.begin(), out.end(), 0u);
    DivArgs a{bad, out.data()};
    std::string e =
        launch<DivArgs, divergent_body>("divergent", a, {256 * groups, 1, 1}, {256, 1, 1}, true);
    CHECK(e.empty(), "%s", e.c_str());
    for (unsigned i = 0; i < 256 * groups; ++i)
      CHECK(out[i] == (i / 256 == bad && i % 256 < 16 ? 16u : 0u), "thread %u: %u", i, out[i]);
  }
  // Lanes 0-7 shuffle among themselves while lanes 8-31 take their maximum.
  DivArgs a{0, out.data()};
  std::string e =
      launch<DivArgs, divergent_two_sites_body>("div2", a, {40, 1, 1}, {40, 1, 1}, true);
  CHECK(e.empty(), "%s", e.c_str());
  for (unsigned i = 0; i < 40; ++i)
    CHECK(out[i] == (i % 32 < 8 ? 3u : 31u), "thread %u: %u", i, out[i]);
  e = launch<DivArgs, reconverge_body>("reconverge", a, {64, 1, 1}, {64, 1, 1}, true);
  CHECK(e.empty(), "%s", e.c_str());
  for (unsigned i = 0; i < 64; ++i)  // 8 * (0 + ... + 7) + (8 + ... + 31)
    CHECK(out[i] == 8 * 28 + 468, "thread %u: %u", i, out[i]);
}

static void test_deadlock() {
  std::vector<unsigned> out(256 * 64);
  for (unsigned groups : {1u, 64u}) {
    DivArgs a{groups - 1, out.data()};
    double t0 = now_s();
    std::string e =
        launch<DivArgs, deadlock_body>("deadlock", a, {256 * groups, 1, 1}, {256, 1, 1}, true);
    double dt = now_s() - t0;
    printf("error: %s\n", e.c_str());
    CHECK(dt < 1.0, "error took %.2f s", dt);
    char where[64];
    snprintf(where, sizeof where, "in threadgroup (%u,0,0) cannot complete: ", groups - 1);
    CHECK(contains(e, "kernel 'deadlock': threadgroup_barrier at "), "%s", e.c_str());
    CHECK(contains(e, where), "%s", e.c_str());
    CHECK(contains(e, "threads 0-127 wait there while threads 128-255 wait at "
                      "threadgroup_barrier at "),
          "%s", e.c_str());
    expect_ok_after();
  }
  DivArgs a{1, out.data()};
  std::string e = launch<DivArgs, siteless_body>("siteless", a, {64, 1, 1}, {32, 1, 1}, true);
  printf("error: %s\n", e.c_str());
  CHECK(contains(e, "kernel 'siteless': threadgroup_barrier (called from 0x") &&
            contains(e, ") in threadgroup (1,0,0) cannot complete: threads 0-2 wait there while "
                        "threads 3-31 wait at threadgroup_barrier (called from 0x"),
        "%s", e.c_str());
  e = launch<DivArgs, siteless_ok_body>("siteless", a, {64, 1, 1}, {32, 1, 1}, true);
  CHECK(e.empty() && out[63] == 7, "%s", e.c_str());
}

static void test_fail() {
  std::vector<unsigned> out(256 * 64);
  for (int sync = 0; sync < 2; ++sync)
    for (unsigned groups : {1u, 64u}) {
      DivArgs a{groups == 1 ? 0u : 7u, out.data()};
      std::string e =
          sync ? launch<DivArgs, fail_body>("checked", a, {64 * groups, 1, 1}, {64, 1, 1}, true)
               : launch<DivArgs, fail_body>("checked", a, {64 * groups, 1, 1}, {64, 1, 1}, false);
      printf("error: %s\n", e.c_str());
      char want[200];
      snprintf(want, sizeof want,
               "kernel 'checked': index 99 out of bounds for 'x' (thread (5,0,0) of threadgroup "
               "(%u,0,0), grid position (%u,0,0))",
               a.bad_group, a.bad_group * 64 + 5);
      CHECK(e == want, "%s", e.c_str());
      expect_ok_after();
    }
  // A synchronising call in a loop-mode kernel fails cleanly.
  DivArgs a{0, out.data()};
  std::string e = launch<DivArgs, loop_barrier_body>("loopbar", a, {64, 1, 1}, {64, 1, 1}, false);
  printf("error: %s\n", e.c_str());
  CHECK(contains(e, "kernel 'loopbar': threadgroup_barrier at ") &&
            contains(e, "needs the fiber runtime"),
        "%s", e.c_str());
  // Invalid descriptors.
  kk_launch_desc d = make_desc("bad", {64, 1, 1}, {64, 1, 1}, false);
  d.num_groups.x = 2;
  char err[512];
  CHECK(kk_rt_launch(group_loop<DivArgs, fail_body>, &a, &d, err, sizeof err) != 0 &&
            contains(err, "num_groups"),
        "%s", err);
  d = make_desc("big", {2048, 1, 1}, {2048, 1, 1}, true);
  CHECK(kk_rt_launch(group_fibers<DivArgs, fail_body>, &a, &d, err, sizeof err) != 0 &&
            contains(err, "exceeds the maximum of 1024"),
        "%s", err);
  d = make_desc("empty", {0, 1, 1}, {1, 1, 1}, true);
  CHECK(kk_rt_launch(group_fibers<DivArgs, fail_body>, &a, &d, err, sizeof err) == 0, "empty");
  expect_ok_after();
}

// ---------------------------------------------------------------------------
// Atomics, contended across groups running in parallel.

struct Half {  // a half type as metal.h may define it: bits, with + and <
  unsigned short bits;
  friend Half operator+(Half a, Half b) {
    return Half{kk::float_to_half(kk::half_to_float(a.bits) + kk::half_to_float(b.bits))};
  }
  friend bool operator<(Half a, Half b) { return kk::half_to_float(a.bits) < kk::half_to_float(b.bits); }
};

struct AtomArgs {
  const unsigned* in;
  unsigned n;
  unsigned* hist;          // 16 bins
  float* fsum;
  double* dsum;
  Half* hsum;
  int* imin;
  int* imax;
  float* fmax;
  unsigned long long* ticket;
  unsigned* xorv;
};

static void atomics_body(const AtomArgs* a, const kk_thread_ctx* t) {
  const unsigned i = gx(t);
  if (i >= a->n) return;
  const unsigned v = a->in[i];
  kk::atomic_fetch_add(&a->hist[v & 15u], 1u);
  kk::atomic_fetch_add(a->fsum, 1.0f);
  kk::atomic_fetch_add(a->dsum, 0.5);
  if (i < 2048) kk::atomic_fetch_add(a->hsum, Half{0x3c00});  // +1.0 in half: exact to 2048
  kk::atomic_fetch_min(a->imin, int(v % 100000) - 50000);
  kk::atomic_fetch_max(a->imax, int(v % 100000) - 50000);
  kk::atomic_fetch_max(a->fmax, float(v % 1000) * 0.25f);
  unsigned long long old = kk::atomic_load(a->ticket), next;
  do {
    next = old + 3;
  } while (!kk::atomic_compare_exchange(a->ticket, &old, next));
  kk::atomic_fetch_xor(a->xorv, v);
}

static void test_atomics() {
  const unsigned n = 1u << 22;
  std::vector<unsigned> in(n);
  unsigned x = 12345;
  for (unsigned i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    in[i] = x;
  }
  unsigned hist[16] = {0};
  float fsum = 0, fmax = -1;
  double dsum = 0;
  Half hsum{0};
  int imin = 1 << 30, imax = -(1 << 30);
  unsigned long long ticket = 0;
  unsigned xorv = 0;
  AtomArgs a{in.data(), n, hist, &fsum, &dsum, &hsum, &imin, &imax, &fmax, &ticket, &xorv};
  double t0 = now_s();
  std::string e = launch<AtomArgs, atomics_body>("atomics", a, {n, 1, 1}, {256, 1, 1}, false);
  printf("atomics: %u elements in %.1f ms\n", n, (now_s() - t0) * 1e3);
  CHECK(e.empty(), "%s", e.c_str());
  unsigned want[16] = {0}, wx = 0;
  int wmin = 1 << 30, wmax = -(1 << 30);
  float wfmax = -1;
  for (unsigned v : in) {
    want[v & 15]++;
    wmin = std::min(wmin, int(v % 100000) - 50000);
    wmax = std::max(wmax, int(v % 100000) - 50000);
    wfmax = std::max(wfmax, float(v % 1000) * 0.25f);
    wx ^= v;
  }
  for (int b = 0; b < 16; ++b) CHECK(hist[b] == want[b], "bin %d: %u != %u", b, hist[b], want[b]);
  CHECK(fsum == float(n), "float sum %.1f", fsum);  // exact: n <= 2^24
  CHECK(dsum == 0.5 * n, "double sum %.1f", dsum);
  CHECK(hsum.bits == kk::float_to_half(2048.0f), "half sum %g", kk::half_to_float(hsum.bits));
  CHECK(imin == wmin && imax == wmax, "min %d max %d", imin, imax);
  CHECK(fmax == wfmax, "fmax %g", fmax);
  CHECK(ticket == 3ull * n, "ticket %llu", ticket);
  CHECK(xorv == wx, "xor");
  // exchange / store
  int y = 5;
  CHECK(kk::atomic_exchange(&y, 9) == 5 && kk::atomic_load(&y) == 9, "exchange");
  kk::atomic_store(&y, 11);
  int exp = 3;
  CHECK(!kk::atomic_compare_exchange(&y, &exp, 4) && exp == 11, "cas failure");
}

// ---------------------------------------------------------------------------
// 16-bit float conversions.

static void test_half() {
  // half -> float: every bit pattern, against the definition.
  for (unsigned h = 0; h < 65536; ++h) {
    float f = kk::half_to_float((unsigned short)h);
    unsigned e = (h >> 10) & 31, m = h & 1023;
    double want = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, int(e) - 15);
    if (e == 31) {
      if (m) {
        CHECK(std::isnan(f), "h=%04x", h);
        continue;
      }
      want = INFINITY;
    }
    if (h & 0x8000) want = -want;
    CHECK(double(f) == want && std::signbit(f) == bool(h & 0x8000), "h=%04x -> %g", h, f);
    // round trip
    CHECK(e == 31 && m ? true : kk::float_to_half(f) == h, "roundtrip %04x", h);
  }
  // float -> half against the correctly rounded reference (_Float16), on every
  // rounding boundary of every half and a sweep of all floats.
  auto check = [](float f) {
    unsigned short got = kk::float_to_half(f);
#if defined(__aarch64__) || defined(__FLT16_MAX__)
#if defined(__aarch64__)
    __fp16 r = (__fp16)f;
#else
    _Float16 r = (_Float16)f;
#endif
    unsigned short want;
    memcpy(&want, &r, 2);
    if (std::isnan(f)) {
      CHECK((got & 0x7c00) == 0x7c00 && (got & 0x3ff), "nan %08x -> %04x", 0u, got);
      return;
    }
    CHECK(got == want, "float %a -> %04x, want %04x", double(f), got, want);
#else
    (void)got;
#endif
  };
  for (unsigned h = 0; h < 0x7c00; ++h) {
    float lo = kk::half_to_float((unsigned short)h), hi = kk::half_to_float((unsigned short)(h + 1));
    float mid = float((double(lo) + double(hi)) / 2);
    for (float f : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      check(f);
      check(-f);
    }
  }
  for (uint64_t b = 0; b < (1ull << 32); b += 4099) {
    float f;
    uint32_t u = uint32_t(b);
    memcpy(&f, &u, 4);
    check(f);
  }
  // bfloat
  for (unsigned b = 0; b < 65536; ++b) {
    float f = kk::bfloat_to_float((unsigned short)b);
    uint32_t u;
    memcpy(&u, &f, 4);
    CHECK(u == b << 16, "bf %04x", b);
    if (!std::isnan(f)) CHECK(kk::float_to_bfloat(f) == b, "bf roundtrip %04x", b);
  }
  auto bf_ref = [](float f) -> unsigned short {  // nearest, ties to even, by comparison
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;  // hi may be inf: rounding overflows
    float flo;
    memcpy(&flo, &lo, 4);
    int e = int((lo >> 23) & 0xffu);
    double ulp = std::ldexp(1.0, (e ? e : 1) - 127 - 7);  // as if the exponent were unbounded
    double dl = std::fabs(double(f) - double(flo)), dh = std::fabs(double(flo) + (f < 0 ? -ulp : ulp) - double(f));
    if (dl < dh) return (unsigned short)(lo >> 16);
    if (dh < dl) return (unsigned short)(hi >> 16);
    return (unsigned short)(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
  };
  for (uint64_t b = 0; b < (1ull << 32); b += 65521) {
    uint32_t u = uint32_t(b);
    if ((u & 0x7fffffffu) >= 0x7f800000u) continue;
    float f;
    memcpy(&f, &u, 4);
    CHECK(kk::float_to_bfloat(f) == bf_ref(f), "bf %08x -> %04x want %04x", u,
          kk::float_to_bfloat(f), bf_ref(f));
  }
  for (uint32_t u : {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0xff7fffffu, 0x00008000u}) {
    float f;
    memcpy(&f, &u, 4);
    CHECK(kk::float_to_bfloat(f) == bf_ref(f), "bf tie %08x -> %04x want %04x", u,
          kk::float_to_bfloat(f), bf_ref(f));
  }
  float qnan = std::nanf("");
  CHECK(std::isnan(kk::bfloat_to_float(kk::float_to_bfloat(qnan))), "bf nan");
  CHECK(std::isnan(kk::half_to_float(kk::float_to_half(qnan))), "half nan");
#if defined(KK_CPU_HALF_F16C)
  printf("half: F16C\n");
#elif defined(KK_CPU_HALF_FP16)
  printf("half: __fp16\n");
#else
  printf("half: portable\n");
#endif
}

// ---------------------------------------------------------------------------
// Concurrent launches from several OS threads, failing ones among them.

static void test_concurrent() {
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int k = 0; k < 4; ++k)
    ts.emplace_back([k, &bad] {
      std::vector<unsigned> out(256 * 16);
      for (int r = 0; r < 30; ++r) {
        if ((r + k) % 5 == 0) {
          DivArgs a{3, out.data()};
          std::string e =
              launch<DivArgs, deadlock_body>("deadlock", a, {256 * 16, 1, 1}, {256, 1, 1}, true);
          if (!contains(e, "threadgroup (3,0,0) cannot complete")) bad++;
        } else if (!run_reduce(r % 2 ? 64 : 3, false)) {
          bad++;
        }
      }
    });
  for (auto& t : ts) t.join();
  CHECK(bad == 0, "%d concurrent launches went wrong", bad.load());
}

// ---------------------------------------------------------------------------
// Invalid memory accesses: the launch fails with the address, the process lives.

struct SegvArgs {
  float* wild;  // an invalid address, passed at run time (no compile-time null)
  unsigned bad_group, bad_thread;
  float* out;
};

static void segv_loop_body(const SegvArgs* a, const kk_thread_ctx* t) {
  const unsigned i = gx(t);
  if (t->gid.x == a->bad_group && t->tindex == a->bad_thread) a->wild[i] = 1.f;
  a->out[i] = float(i);
}

static void segv_fiber_body(const SegvArgs* a, const kk_thread_ctx* t) {
  const unsigned i = gx(t);
  a->out[i] = float(i);
  kk::threadgroup_barrier();
  if (t->gid.x == a->bad_group && t->tindex == a->bad_thread) a->out[i] = a->wild[1000];
  kk::threadgroup_barrier();
}

static unsigned recurse(volatile unsigned* p, unsigned n) {
  volatile unsigned local[64];
  local[n % 64] = n;
  if (n == 0xffffffffu) return local[0];
  return recurse(local, n + 1) + p[0];  // not a tail call
}

static void overflow_body(const SegvArgs* a, const kk_thread_ctx* t) {
  kk::threadgroup_barrier();
  volatile unsigned seed = 1;
  if (t->tindex == a->bad_thread) a->out[0] = float(recurse(&seed, 0));
}

static void test_segv() {
  std::vector<float> out(256 * 64);
  float* wild = reinterpret_cast<float*>(uintptr_t(0x10));
  for (unsigned groups : {4u, 64u}) {  // on the calling thread alone, then on the pool
    // Loop mode: the runtime runs the group again a thread at a time to find the thread.
    SegvArgs a{wild, 3, 5, out.data()};
    std::string e = launch<SegvArgs, segv_loop_body>("wild_loop", a, {256 * groups, 1, 1},
                                                     {256, 1, 1}, false);
    char want[320];
    snprintf(want, sizeof want, "kernel 'wild_loop': invalid memory access at address 0x%x "
             "(SIGSEGV) in thread (5,0,0) of threadgroup (3,0,0), grid position (773,0,0) (the "
             "CPU backend stopped the launch; an out-of-bounds index is the usual cause)",
             0x10 + (3 * 256 + 5) * 4);
    CHECK(e == want, "loop mode (%u groups): %s", groups, e.c_str());
    CHECK(run_reduce(64, false), "launch after a fault (loop mode) failed");
    // Fiber mode, after a barrier: the thread is known.
    SegvArgs b{nullptr, 2, 70, out.data()};
    e = launch<SegvArgs, segv_fiber_body>("null_fiber", b, {256 * groups, 1, 1}, {256, 1, 1}, true);
    CHECK(e == "kernel 'null_fiber': invalid memory access at address 0xfa0 (SIGSEGV) in thread "
               "(70,0,0) of threadgroup (2,0,0), grid position (582,0,0) (the CPU backend stopped "
               "the launch; an out-of-bounds index is the usual cause)",
          "fiber mode (%u groups): %s", groups, e.c_str());
    CHECK(run_reduce(64, false), "launch after a fault (fiber mode) failed");
    // The group's fibers were abandoned mid-flight: their stacks work again.
    e = launch<SegvArgs, segv_fiber_body>("ok", SegvArgs{wild, ~0u, 0, out.data()},
                                          {256 * groups, 1, 1}, {256, 1, 1}, true);
    CHECK(e.empty() && out[256 * groups - 1] == float(256 * groups - 1), "%s", e.c_str());
  }
  // A fiber that overflows its stack hits the guard page.
  for (int k = 0; k < 2; ++k) {
    SegvArgs a{nullptr, 0, 7, out.data()};
    std::string e = launch<SegvArgs, overflow_body>("deep", a, {64, 1, 1}, {64, 1, 1}, true);
    CHECK(contains(e, "kernel 'deep': stack overflow (invalid memory access at address 0x") &&
              contains(e, "in thread (7,0,0) of threadgroup (0,0,0)") &&
              contains(e, "deep recursion"),
          "overflow: %s", e.c_str());
    CHECK(run_reduce(64, false), "launch after a stack overflow failed");
  }
  // Many faulting launches from several OS threads at once, good ones between.
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int k = 0; k < 4; ++k)
    ts.emplace_back([k, wild, &bad] {
      std::vector<float> o(256 * 64);
      for (int r = 0; r < 20; ++r) {
        SegvArgs a{wild, unsigned(r % 64), unsigned(k), o.data()};
        std::string e = (r + k) % 2
            ? launch<SegvArgs, segv_loop_body>("w", a, {256 * 64, 1, 1}, {256, 1, 1}, false)
            : launch<SegvArgs, segv_fiber_body>("w", a, {256 * 64, 1, 1}, {256, 1, 1}, true);
        if (!contains(e, "invalid memory access at address")) bad++;
        if (!run_reduce(r % 2 ? 64 : 3, false)) bad++;
      }
    });
  for (auto& t : ts) t.join();
  CHECK(bad == 0, "%d concurrent faulting launches went wrong", bad.load());
}

// After a launch (the handlers are installed), a fault outside any kernel still
// kills the process with SIGSEGV (run by test_cpu_runtime.py, which expects it).
static void test_segv_outside() {
  CHECK(run_reduce(64, false), "reduce");
  printf("faulting outside a kernel\n");
  fflush(stdout);
  volatile int* volatile p = reinterpret_cast<int*>(uintptr_t(0x10));
  *p = 1;
  printf("FAIL: survived\n");
  exit(1);
}

// ---------------------------------------------------------------------------
// Benchmarks (printed, not asserted beyond sanity).

struct BenchArgs {
  unsigned iters;
  float* out;
};

static void barrier_bench_body(const BenchArgs* a, const kk_thread_ctx* t) {
  for (unsigned k = 0; k < a->iters; ++k) kk::threadgroup_barrier();
  (void)t;
}

static void simd_bench_body(const BenchArgs* a, const kk_thread_ctx* t) {
  float s = 0;
  for (unsigned k = 0; k < a->iters; ++k) s += kk::simd_reduce<32>(float(t->tindex), Plus());
  a->out[t->tindex] = s;
}

static void tiny_body(const BenchArgs* a, const kk_thread_ctx* t) {
  a->out[t->tindex] = a->out[t->tindex] * 2.0f + 1.0f;
}

static void test_bench() {
  std::vector<float> out(1024, 0.f);
  for (unsigned threads : {32u, 256u, 1024u}) {
    BenchArgs a{threads == 1024 ? 200u : 2000u, out.data()};
    launch<BenchArgs, barrier_bench_body>("warm", a, {threads, 1, 1}, {threads, 1, 1}, true);
    double t0 = now_s();
    std::string e =
        launch<BenchArgs, barrier_bench_body>("bench", a, {threads, 1, 1}, {threads, 1, 1}, true);
    double dt = now_s() - t0;
    CHECK(e.empty(), "%s", e.c_str());
    printf("fiber switch (threadgroup_barrier, %u threads): %.1f ns per thread per barrier\n",
           threads, dt * 1e9 / (double(threads) * a.iters));
  }
  {
    BenchArgs a{5000, out.data()};
    double t0 = now_s();
    std::string e = launch<BenchArgs, simd_bench_body>("bench", a, {32, 1, 1}, {32, 1, 1}, true);
    double dt = now_s() - t0;
    CHECK(e.empty() && out[0] == 5000.f * 496.f, "%s %g", e.c_str(), out[0]);
    printf("simd_sum (32 lanes): %.1f ns per lane per call\n", dt * 1e9 / (32.0 * a.iters));
  }
  for (int sync = 0; sync < 2; ++sync) {
    BenchArgs a{0, out.data()};
    const int reps = sync ? 20000 : 200000;
    for (int r = 0; r < 1000; ++r)
      launch<BenchArgs, tiny_body>("tiny", a, {32, 1, 1}, {32, 1, 1}, sync);
    double t0 = now_s();
    for (int r = 0; r < reps; ++r)
      sync ? launch<BenchArgs, tiny_body>("tiny", a, {32, 1, 1}, {32, 1, 1}, true)
           : launch<BenchArgs, tiny_body>("tiny", a, {32, 1, 1}, {32, 1, 1}, false);
    double dt = now_s() - t0;
    printf("launch overhead, 32-thread %s kernel: %.2f us per launch\n",
           sync ? "fiber-mode" : "loop-mode", dt * 1e6 / reps);
  }
}

// ---------------------------------------------------------------------------

int main(int argc, char** argv) {
  struct Test {
    const char* name;
    void (*fn)();
  } tests[] = {
      {"reduce", test_reduce},       {"simd", test_simd},     {"edge", test_edge},
      {"early_return", test_early_return}, {"registers", test_registers}, {"fenv", test_fenv},
      {"divergent", test_divergent},
      {"deadlock", test_deadlock},   {"fail", test_fail},     {"atomics", test_atomics},
      {"half", test_half},           {"concurrent", test_concurrent}, {"bench", test_bench},
      {"segv", test_segv},           {"segv_outside", test_segv_outside},
  };
  if (argc < 2) {
    fprintf(stderr, "usage: %s NAME...|all\n", argv[0]);
    return 2;
  }
  CHECK(kk_rt_abi_version() == KK_RT_ABI_VERSION, "ABI version");
  for (int k = 1; k < argc; ++k) {
    bool found = false;
    for (const Test& t : tests)
      if (!strcmp(argv[k], "all") ? strcmp(t.name, "bench") != 0 && strcmp(t.name, "segv_outside") != 0 : !strcmp(argv[k], t.name)) {
        found = true;
        int before = g_failures;
        t.fn();
        printf("%s %s\n", g_failures == before ? "ok" : "FAILED", t.name);
        fflush(stdout);
      }
    if (!found) {
      fprintf(stderr, "unknown test %s\n", argv[k]);
      return 2;
    }
  }
  return g_failures ? 1 : 0;
}
