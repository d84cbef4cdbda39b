// CUDA kernel bodies on the CPU backend (kernelkit/cuda_cpu.h), without the
// Python pipeline: kernels in the shape of the generated source (harness.h),
// launched through libkkrt in loop and fiber mode.
//   g++ -std=c++17 -O1 -pthread -frounding-math -I src/kernelkit/include cuda_tests.cpp -L DIR -lkkrt -ldl
//   ./cuda_tests NAME...   (prints "ok NAME", or "FAIL ..." and exits 1)
//   ./cuda_tests warp_dump (prints the warp intrinsics' results for the Python model)
#include <dlfcn.h>
#include <fenv.h>
#include <stdint.h>

#include <cmath>

#include "harness.h"

// ===========================================================================
// Kernels. Bodies are CUDA C++, in namespace kk_cuda as the generated code puts them.

namespace kk_cuda {
namespace cg = cooperative_groups;

// Every thread records what it sees; slots are the thread's grid position.
__device__ void custom_kernel_indices(unsigned* rec, unsigned* count) {
  const unsigned X = gridDim.x * blockDim.x, Y = gridDim.y * blockDim.y;
  const unsigned gx = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned gy = blockIdx.y * blockDim.y + threadIdx.y;
  const unsigned gz = blockIdx.z * blockDim.z + threadIdx.z;
  unsigned* r = rec + 12 * ((size_t(gz) * Y + gy) * X + gx);
  const uint3 t = threadIdx, b = blockIdx;
  const dim3 bd = blockDim, gd = gridDim;
  unsigned v[12] = {t.x, t.y, t.z, b.x, b.y, b.z, bd.x, bd.y, bd.z, gd.x, gd.y, gd.z};
  for (int k = 0; k < 12; ++k) r[k] = v[k];
  atomicAdd(count, 1u);
}

// threadIdx & co stay the thread's own after each kind of rendezvous (fiber mode:
// other fibers ran meanwhile), also when read in a helper function.
__device__ unsigned flat_id() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
__device__ void custom_kernel_ids_after_sync(unsigned* bad) {
  const uint3 t0 = threadIdx, b0 = blockIdx;
  const unsigned id = flat_id();
  unsigned e = 0;
  auto same = [&]() {
    const uint3 t = threadIdx, b = blockIdx;
    return t.x == t0.x && t.y == t0.y && t.z == t0.z && b.x == b0.x && b.y == b0.y && b.z == b0.z && flat_id() == id;
  };
  __syncthreads();
  e += !same();
  float v = __shfl_xor_sync(0xffffffff, float(id), 1);
  e += !same() || v != float(id ^ 1u);  // (every block here has whole warps)
  e += __ballot_sync(0xffffffff, 1) == 0 || !same();
  __syncwarp();
  e += !same();
  e += __syncthreads_count(1) != int(blockDim.x * blockDim.y * blockDim.z) || !same();
  auto tile = cooperative_groups::tiled_partition<8>(cooperative_groups::this_thread_block());
  v += cooperative_groups::reduce(tile, v, cooperative_groups::plus<float>());
  e += !same();
  e += __reduce_add_sync(0xffffffff, 1u) == 0 || __activemask() == 0 || !same();
  tile.sync();
  e += !same() || tile.thread_rank() != id % 8;
  if (threadIdx.x % 2) return;  // fewer fibers from here on
  __syncthreads();
  e += !same() || v != v;
  if (e) atomicAdd(bad, e);
}

// Tree reduction in shared memory: one sum per block (guarded loads: the last
// block runs past n, as on the GPU).
__device__ void custom_kernel_block_sum(const float* x, float* out, const int n) {
  __shared__ float s[1024];
  const unsigned tid = threadIdx.x;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  s[tid] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (tid < stride) s[tid] += s[tid + stride];
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = s[0];
}

// The classic warp-shuffle block reduction (static __shared__, __shfl_down_sync).
__device__ float warp_sum(float v) {
  for (int offset = warpSize / 2; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffff, v, offset);
  return v;
}
__device__ void custom_kernel_shfl_block_sum(const float* x, float* out, const int n) {
  static __shared__ float shared[32];
  const int lane = threadIdx.x % warpSize, wid = threadIdx.x / warpSize;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = warp_sum(i < n ? x[i] : 0.0f);
  if (lane == 0) shared[wid] = v;
  __syncthreads();
  v = (threadIdx.x < blockDim.x / warpSize) ? shared[lane] : 0.0f;
  if (wid == 0) v = warp_sum(v);
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}

__device__ void custom_kernel_sync_votes(const int* x, int* out, const int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int p = i < n ? x[i] : 0;
  const int c = __syncthreads_count(p);
  const int a = __syncthreads_and(p);
  const int o = __syncthreads_or(p);
  if (threadIdx.x == 0) {
    out[3 * blockIdx.x] = c;
    out[3 * blockIdx.x + 1] = a;
    out[3 * blockIdx.x + 2] = o;
  }
}

// Dynamic shared memory: filled by the block, read back reversed by other threads.
__device__ void custom_kernel_dyn_shared(unsigned* errors, unsigned long long* ptrs, const unsigned words) {
  KK_EXTERN_SHARED(unsigned, dyn);  // extern __shared__ unsigned dyn[];
  __shared__ unsigned long long first;
  const unsigned tid = threadIdx.x;
  if (tid == 0) first = (unsigned long long)(uintptr_t)dyn;
  for (unsigned k = tid; k < words; k += blockDim.x) dyn[k] = blockIdx.x * 1000003u + k * 7u;
  __syncthreads();
  unsigned bad = 0;
  for (unsigned k = tid; k < words; k += blockDim.x) {
    const unsigned j = words - 1 - k;
    bad += dyn[j] != blockIdx.x * 1000003u + j * 7u;
  }
  if ((uintptr_t)dyn % 16 != 0 || (unsigned long long)(uintptr_t)dyn != first) bad++;
  if (bad) atomicAdd(errors, bad);
  if (tid == 0) ptrs[blockIdx.x] = first;
  __syncthreads();  // nobody may leave before all have read (the next group reuses the buffer)
}

// Warp intrinsics: every result of every lane (warp_body.inc).
__device__ void custom_kernel_warp(int* out, const unsigned* live) {
#include "warp_body.inc"
}

// Shuffles of other types: each lane gets lane ^ 1's value.
struct pair3 { short a; char b; double c; };
__device__ void custom_kernel_shfl_types(int* bad) {
  const int lane = threadIdx.x % 32, other = lane ^ 1;
  int e = 0;
  const double d = __shfl_xor_sync(0xffffffff, lane * 0.25 + 1e10, 1);
  e += d != other * 0.25 + 1e10;
  const float f = __shfl_xor_sync(0xffffffff, lane * 1.5f, 1);
  e += f != other * 1.5f;
  const long long l = __shfl_xor_sync(0xffffffff, (long long)lane << 40, 1);
  e += l != (long long)other << 40;
  const __half h = __shfl_xor_sync(0xffffffff, __float2half(lane * 0.5f), 1);
  e += __half2float(h) != other * 0.5f;
  const __nv_bfloat162 b2 = __shfl_xor_sync(0xffffffff, __floats2bfloat162_rn(lane, -lane), 1);
  e += __low2float(b2) != other || __high2float(b2) != -other;
  const pair3 p = __shfl_down_sync(0xffffffff, pair3{short(lane), char(lane + 1), lane * 2.0}, 1);
  const int src = lane == 31 ? 31 : lane + 1;
  e += p.a != src || p.b != src + 1 || p.c != src * 2.0;
  const unsigned long long u = __shfl_sync(0xffffffff, 0xffffffff00000000ull | lane, 31 - lane);
  e += u != (0xffffffff00000000ull | unsigned(31 - lane));
  if (e) atomicAdd(bad, e);
}

// Atomics, contended by every thread of the grid.
__device__ void custom_kernel_atomics(const unsigned* x, const int n, int* hist_i, unsigned* hist_u,
                                      unsigned long long* hist_ull, float* fsum, double* dsum, __half* hsum,
                                      __nv_bfloat16* bsum, __half2* h2sum, int* imin, int* imax,
                                      unsigned* umin_, unsigned* umax_, long long* llmin_, long long* llmax_,
                                      unsigned long long* ullmin_, unsigned long long* ullmax_,
                                      int* isub, unsigned* inc, unsigned* dec, unsigned* bits_and,
                                      unsigned* bits_or, unsigned* bits_xor, int* exch_old, int* exch_slot,
                                      float* fmax_cas, unsigned* ticket, unsigned short* cas16) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const unsigned v = x[i], bin = v % 256;
  atomicAdd(&hist_i[bin], 1);
  atomicAdd(&hist_u[bin], 2u);
  atomicAdd(&hist_ull[bin % 16], 1ull << 33);
  atomicAdd(&fsum[bin % 16], float(v % 100));
  atomicAdd(&dsum[bin % 16], double(v % 1000) * 0.5);
  atomicAdd(&hsum[i % 1024], __float2half(1.0f));    // <= 2048 per slot: exact
  atomicAdd(&bsum[i % 2048], __float2bfloat16(1.0f));  // <= 256 per slot: exact
  atomicAdd(&h2sum[i % 1024], __floats2half2_rn(1.0f, 2.0f));
  const int sv = int(v % 20001) - 10000;
  atomicMin(imin, sv);
  atomicMax(imax, sv);
  atomicMin(umin_, v);
  atomicMax(umax_, v);
  atomicMin(llmin_, (long long)sv << 32);
  atomicMax(llmax_, (long long)sv << 32);
  atomicMin(ullmin_, (unsigned long long)v << 20);
  atomicMax(ullmax_, (unsigned long long)v << 20);
  atomicSub(isub, 3);
  atomicInc(inc, 9u);
  atomicDec(dec, 6u);
  atomicAnd(bits_and, ~(1u << (i % 32)) | (i % 64 >= 32 ? 0u : 0u));
  atomicOr(bits_or, 1u << (v % 32));
  atomicXor(bits_xor, v);
  exch_old[i] = atomicExch(exch_slot, i);
  // float max by CAS, as CUDA code writes it
  const float val = float(sv) * 0.25f;
  int* addr = (int*)fmax_cas;
  int old = *addr, assumed;
  do {
    assumed = old;
    if (__int_as_float(assumed) >= val) break;
    old = atomicCAS(addr, assumed, __float_as_int(val));
  } while (assumed != old);
  // ticket by CAS increment
  unsigned t = *ticket, seen;
  do {
    seen = t;
    t = atomicCAS(ticket, seen, seen + 1);
  } while (t != seen);
  unsigned short s16 = *cas16, seen16;
  do {
    seen16 = s16;
    s16 = atomicCAS(cas16, seen16, (unsigned short)(seen16 + 1));
  } while (s16 != seen16);
}

// 16-bit float arithmetic in a kernel.
__device__ void custom_kernel_half_math(const __half* a, const __half* b, const __nv_bfloat16* c, __half* out_h,
                                        __nv_bfloat16* out_b, float* out_f, const int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  __half x = a[i], y = b[i];
  out_h[4 * i] = x + y;
  out_h[4 * i + 1] = x * y;
  out_h[4 * i + 2] = __hfma(x, y, x);
  out_h[4 * i + 3] = __hdiv(x, y);
  __nv_bfloat16 z = c[i];
  out_b[2 * i] = z * z - z;
  out_b[2 * i + 1] = __float2bfloat16(__half2float(x));
  out_f[i] = float(x) + __bfloat162float(z);  // half op float is float
}

// The C math names as a body calls them (unqualified, float and double).
__device__ void custom_kernel_math_names(const float* x, float* out, double* dout, const int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = x[i], p = fabsf(v) + 0.5f;
  float* o = out + 40 * i;
  int e = 0;
  float s, c;
  sincosf(v, &s, &c);
  const float r[40] = {expf(v), exp2f(v), logf(p), log2f(p), log1pf(p), expm1f(v), powf(p, v), sqrtf(p),
                       rsqrtf(p), cbrtf(v), sinf(v), cosf(v), tanf(v), s + c, asinf(v / 8), acosf(v / 8),
                       atanf(v), atan2f(v, p), sinhf(v), coshf(v), tanhf(v), erff(v), erfcf(v), fabsf(v),
                       floorf(v), ceilf(v), roundf(v), truncf(v), rintf(v), fmodf(v, 0.75f), fmaxf(v, 0.1f),
                       fminf(v, 0.1f), fmaf(v, p, 1.0f), copysignf(p, v), hypotf(v, p), nextafterf(v, 0.0f),
                       ldexpf(v, 3), frexpf(p, &e) + e, float(isnan(v) + 2 * isinf(v) + 4 * isfinite(v) + 8 * signbit(v)),
                       exp(v) + sqrt(p) + floor(v) + fmax(v, p)};  // the C++ float overloads
  for (int k = 0; k < 40; ++k) o[k] = r[k];
  const double d = v;
  dout[4 * i] = exp(d) + log(d * d + 1.0);
  dout[4 * i + 1] = sin(d) * cos(d) + tanh(d);
  dout[4 * i + 2] = pow(fabs(d), 1.5) + rsqrt(fabs(d) + 1.0);
  dout[4 * i + 3] = fma(d, d, d) + erfinv(d / 8.0) + sinpi(d);
}

// Cooperative groups.
__device__ void custom_kernel_coop(const int* x, int* out, unsigned long long* grid_ranks, int* bad) {
  cg::thread_block block = cg::this_thread_block();
  const unsigned r = block.thread_rank();
  const int nb = int(block.size());
  int e = 0;
  const uint3 ti = threadIdx;
  const dim3 bd = blockDim;
  e += r != ti.x + bd.x * (ti.y + bd.y * ti.z);
  e += block.size() != bd.x * bd.y * bd.z || block.num_threads() != block.size();
  e += block.group_index().x != blockIdx.x || block.thread_index().y != threadIdx.y ||
       block.group_dim().z != blockDim.z || block.dim_threads().x != blockDim.x;
  const int v = x[blockIdx.x * nb + r];
  int* o = out + (blockIdx.x * nb + r) * 24;

  // block-level: shared-memory reduction with block.sync()
  __shared__ int s[1024];
  s[r] = v;
  block.sync();
  for (int stride = 1; stride < nb; stride *= 2) {  // any block size
    if (r % (2 * stride) == 0 && int(r) + stride < nb) s[r] += s[r + stride];
    cg::sync(block);
  }
  o[0] = s[0];

  cg::thread_block_tile<32> t32 = cg::tiled_partition<32>(block);
  o[1] = cg::reduce(t32, v, cg::plus<int>());
  o[2] = cg::reduce(cg::tiled_partition<16>(block), v, cg::plus<int>());
  auto t8 = cg::tiled_partition<8>(block);
  o[3] = cg::reduce(t8, v, cg::less<int>());
  o[4] = cg::reduce(t8, v, cg::greater<int>());
  o[5] = cg::reduce(cg::tiled_partition<4>(block), v, cg::bit_xor<int>());
  o[6] = cg::reduce(cg::tiled_partition<2>(block), v, [](int a, int b) { return a * 3 + b; });
  o[7] = cg::reduce(cg::tiled_partition<1>(block), v, cg::plus<int>());
  // shfl_down tree on the tile of 32
  int t = v;
  for (int off = int(t32.size()) / 2; off > 0; off /= 2) t += t32.shfl_down(t, off);
  o[8] = t;  // lane 0 holds the sum
  o[9] = int(t32.thread_rank() + 100 * t32.meta_group_rank() + 10000 * t32.meta_group_size());
  o[10] = int(t8.thread_rank() + 100 * t8.meta_group_rank() + 10000 * t8.meta_group_size());
  o[11] = int(t8.ballot(v % 2 == 0));
  o[12] = t8.any(v == 5) + 2 * t8.all(v >= 0);
  o[13] = cg::inclusive_scan(t32, v);
  o[14] = cg::exclusive_scan(t8, v, cg::plus<int>());
  o[15] = t8.shfl(v, 3) + 1000 * t8.shfl_xor(v, 5) ;
  o[16] = t32.shfl_up(v, 2);
  auto t4of8 = cg::tiled_partition<4>(t8);
  o[17] = int(t4of8.thread_rank() + 100 * t4of8.meta_group_rank() + 10000 * t4of8.meta_group_size());
  o[18] = cg::reduce(t4of8, v, cg::plus<int>());
  // a generic thread_group
  const cg::thread_group& g = t8;
  o[19] = int(g.size() * 100 + g.thread_rank());
  g.sync();
  // grid
  cg::grid_group grid = cg::this_grid();
  grid_ranks[grid.thread_rank()] = grid.size() * 1000000ull + blockIdx.x * 1000ull + r;
  e += grid.is_valid();
  e += grid.block_rank() != blockIdx.x || grid.num_blocks() != gridDim.x;
  // memcpy_async of 4 ints per thread into shared memory, then wait
  __shared__ int staged[4096];
  cg::memcpy_async(block, staged, x + blockIdx.x * nb, sizeof(int) * nb);
  cg::wait(block);
  o[20] = staged[(r + 1) % nb];
  t32.sync();
  // coalesced group after the odd lanes returned
  block.sync();
  if (r % 2 == 1) {
    if (e) atomicAdd(bad, e);
    return;
  }
  cg::coalesced_group active = cg::coalesced_threads();
  o[21] = int(active.size() * 100 + active.thread_rank());
  o[22] = cg::reduce(active, v, cg::plus<int>());
  o[23] = active.shfl(v, 0) + 1000 * int(active.ballot(v % 3 == 0) != 0);
  if (e) atomicAdd(bad, e);
}

#include "error_kernels.inc"  // (its #line directives stay in that file)
}  // namespace kk_cuda

struct indices_args { unsigned* rec; unsigned* count; unsigned kk_shared; };
KK_TEST_CALL(indices, indices_args, (a.rec, a.count))
struct ids_args { unsigned* bad; unsigned kk_shared; };
KK_TEST_CALL(ids_after_sync, ids_args, (a.bad))
struct sum_args { const float* x; float* out; int n; unsigned kk_shared; };
KK_TEST_CALL(block_sum, sum_args, (a.x, a.out, a.n))
KK_TEST_CALL(shfl_block_sum, sum_args, (a.x, a.out, a.n))
struct votes_args { const int* x; int* out; int n; unsigned kk_shared; };
KK_TEST_CALL(sync_votes, votes_args, (a.x, a.out, a.n))
struct dyn_args { unsigned* errors; unsigned long long* ptrs; unsigned words; unsigned kk_shared; };
KK_TEST_CALL(dyn_shared, dyn_args, (a.errors, a.ptrs, a.words))
struct warp_args { int* out; unsigned live; unsigned kk_shared; };
KK_TEST_CALL(warp, warp_args, (a.out, &a.live))
struct bad_args { int* bad; unsigned kk_shared; };
KK_TEST_CALL(shfl_types, bad_args, (a.bad))
struct atomics_args {
  const unsigned* x; int n; int* hist_i; unsigned* hist_u; unsigned long long* hist_ull; float* fsum;
  double* dsum; __half* hsum; __nv_bfloat16* bsum; __half2* h2sum; int* imin; int* imax; unsigned* umin_;
  unsigned* umax_; long long* llmin_; long long* llmax_; unsigned long long* ullmin_;
  unsigned long long* ullmax_; int* isub; unsigned* inc; unsigned* dec; unsigned* bits_and;
  unsigned* bits_or; unsigned* bits_xor; int* exch_old; int* exch_slot; float* fmax_cas; unsigned* ticket;
  unsigned short* cas16; unsigned kk_shared;
};
KK_TEST_CALL(atomics, atomics_args,
             (a.x, a.n, a.hist_i, a.hist_u, a.hist_ull, a.fsum, a.dsum, a.hsum, a.bsum, a.h2sum, a.imin, a.imax,
              a.umin_, a.umax_, a.llmin_, a.llmax_, a.ullmin_, a.ullmax_, a.isub, a.inc, a.dec, a.bits_and,
              a.bits_or, a.bits_xor, a.exch_old, a.exch_slot, a.fmax_cas, a.ticket, a.cas16))
struct half_args {
  const __half* a; const __half* b; const __nv_bfloat16* c; __half* out_h; __nv_bfloat16* out_b; float* out_f;
  int n; unsigned kk_shared;
};
KK_TEST_CALL(half_math, half_args, (a.a, a.b, a.c, a.out_h, a.out_b, a.out_f, a.n))
struct math_args { const float* x; float* out; double* dout; int n; unsigned kk_shared; };
KK_TEST_CALL(math_names, math_args, (a.x, a.out, a.dout, a.n))
struct coop_args { const int* x; int* out; unsigned long long* grid_ranks; int* bad; unsigned kk_shared; };
KK_TEST_CALL(coop, coop_args, (a.x, a.out, a.grid_ranks, a.bad))
struct none_args { unsigned kk_shared; };
KK_TEST_CALL(err_sync, none_args, ())
KK_TEST_CALL(err_trap, none_args, ())
KK_TEST_CALL(err_grid, none_args, ())
KK_TEST_CALL(err_barrier, none_args, ())
struct errf_args { float* out; unsigned kk_shared; };
KK_TEST_CALL(err_shfl, errf_args, (a.out))
struct erri_args { const int* x; unsigned kk_shared; };
KK_TEST_CALL(err_assert, erri_args, (a.x))

// ===========================================================================
// Tests.

static void test_indices() {
  struct cfg { dim3 threads, block; };
  const cfg cfgs[] = {
      {dim3(1000), dim3(128)}, {dim3(1), dim3(1)}, {dim3(33), dim3(32)}, {dim3(37, 19), dim3(8, 4)},
      {dim3(13, 7, 5), dim3(4, 2, 3)}, {dim3(64, 3, 2), dim3(64, 1, 1)}, {dim3(5, 6, 70), dim3(1, 2, 32)}};
  for (const cfg& c : cfgs) {
    for (int sync = 0; sync < 2; ++sync) {
      const dim3 g((c.threads.x + c.block.x - 1) / c.block.x, (c.threads.y + c.block.y - 1) / c.block.y,
                   (c.threads.z + c.block.z - 1) / c.block.z);
      const unsigned X = g.x * c.block.x, Y = g.y * c.block.y, Z = g.z * c.block.z;
      std::vector<unsigned> rec(size_t(X) * Y * Z * 12, 0xdeadbeefu);
      unsigned count = 0;
      LAUNCH_OK(launch<indices_args, indices_call>(indices_args{rec.data(), &count, 0}, c.threads, c.block, sync));
      // Full blocks: every thread of every block ran once (the GPU launches whole blocks).
      CHECK(count == X * Y * Z, "count %u, expected %u", count, X * Y * Z);
      for (unsigned z = 0; z < Z; ++z)
        for (unsigned y = 0; y < Y; ++y)
          for (unsigned x = 0; x < X; ++x) {
            const unsigned* r = &rec[12 * ((size_t(z) * Y + y) * X + x)];
            const unsigned e[12] = {x % c.block.x, y % c.block.y, z % c.block.z, x / c.block.x, y / c.block.y,
                                    z / c.block.z, c.block.x, c.block.y, c.block.z, g.x, g.y, g.z};
            for (int k = 0; k < 12; ++k)
              CHECK(r[k] == e[k], "thread (%u,%u,%u) field %d: %u, expected %u (sync %d)", x, y, z, k, r[k], e[k],
                    sync);
          }
    }
  }
  // after rendezvous, in fiber mode
  for (dim3 block : {dim3(64), dim3(8, 4, 2), dim3(2, 3, 16), dim3(1024)}) {
    unsigned bad = 0;
    LAUNCH_OK(launch<ids_args, ids_after_sync_call>(ids_args{&bad, 0}, dim3(3 * block.x, 2 * block.y, block.z), block,
                                                    true));
    CHECK(bad == 0, "ids after sync, block (%u,%u,%u): %u", block.x, block.y, block.z, bad);
  }
  // Metal-style partial edge groups (if the generated code launches the exact grid):
  // threads outside it do not exist, blockDim stays the launched size.
  std::vector<unsigned> rec(size_t(40) * 12, 0xdeadbeefu);
  unsigned count = 0;
  LAUNCH_OK(launch<indices_args, indices_call>(indices_args{rec.data(), &count, 0}, dim3(37), dim3(8), true, false));
  CHECK(count == 37, "partial: count %u", count);
  CHECK(rec[12 * 36 + 6] == 8 && rec[12 * 37] == 0xdeadbeefu, "partial edge group");
}

static void test_reduce() {
  rng r(1);
  for (int sync = 1; sync >= 1; --sync) {
    for (unsigned block : {32u, 64u, 256u, 1024u}) {
      for (int n : {1, 31, 1000, 100003}) {
        std::vector<float> x(n);
        for (float& v : x) v = float(int(r.u32() % 201) - 100);  // exact sums
        const unsigned groups = (n + block - 1) / block;
        std::vector<float> ref(groups, 0.0f);
        for (int i = 0; i < n; ++i) ref[i / block] += x[i];
        std::vector<float> out(groups, NAN), out2(groups, NAN);
        LAUNCH_OK(launch<sum_args, block_sum_call>(sum_args{x.data(), out.data(), n, 0}, dim3(n), dim3(block), true));
        LAUNCH_OK(launch<sum_args, shfl_block_sum_call>(sum_args{x.data(), out2.data(), n, 0}, dim3(n), dim3(block),
                                                   true));
        for (unsigned g = 0; g < groups; ++g) {
          CHECK(out[g] == ref[g], "block %u of %u (n %d): %g, expected %g", g, block, n, out[g], ref[g]);
          CHECK(out2[g] == ref[g], "shfl: block %u of %u (n %d): %g, expected %g", g, block, n, out2[g], ref[g]);
        }
      }
    }
  }
  // __syncthreads_count / _and / _or
  const int n = 1000;
  std::vector<int> x(n), out(3 * 8);
  for (int i = 0; i < n; ++i) x[i] = (i % 7 == 0) || (i >= 128 && i < 256);
  LAUNCH_OK(launch<votes_args, sync_votes_call>(votes_args{x.data(), out.data(), n, 0}, dim3(n), dim3(128), true));
  for (int g = 0; g < 8; ++g) {
    int c = 0, a = 1, o = 0;
    for (int i = g * 128; i < g * 128 + 128; ++i) {
      const int p = i < n ? x[i] : 0;
      c += p, a &= p, o |= p;
    }
    CHECK(out[3 * g] == c && out[3 * g + 1] == a && out[3 * g + 2] == o, "group %d: %d %d %d, expected %d %d %d", g,
          out[3 * g], out[3 * g + 1], out[3 * g + 2], c, a, o);
  }
}

static void test_dyn_shared() {
  // Growing and shrinking between launches; many groups at once on the pool.
  for (unsigned bytes : {16u, 1000u, 4096u, 48u * 1024, 64u * 1024, 100u * 1024, 64u * 1024, 4u}) {
    for (unsigned block : {32u, 256u}) {
      const unsigned groups = 40, words = bytes / 4;
      std::vector<unsigned long long> ptrs(groups, 0);
      unsigned errors = 0;
      LAUNCH_OK(launch<dyn_args, dyn_shared_call>(dyn_args{&errors, ptrs.data(), words, bytes}, dim3(groups * block),
                                             dim3(block), true));
      CHECK(errors == 0, "%u bytes, block %u: %u errors", bytes, block, errors);
      for (unsigned long long p : ptrs) CHECK(p != 0 && p % 16 == 0, "pointer %llx", p);
    }
  }
}

// The results for the Python model: one line per output row, 64*K values.
static void warp_dump() {
  for (unsigned block : {64u, 48u}) {
    for (unsigned live : {32u, 20u}) {
      const int rows = 6 * 10 * 4 + 4 + 10 + 9 + 6 + 1;
      std::vector<int> out(size_t(rows) * block, -1);
      LAUNCH_OK(launch<warp_args, warp_call>(warp_args{out.data(), live, 0}, dim3(block), dim3(block), true));
      printf("block %u live %u rows %d\n", block, live, rows);
      for (int row = 0; row < rows; ++row) {
        for (unsigned t = 0; t < block; ++t) printf("%d ", out[size_t(row) * block + t]);
        printf("\n");
      }
    }
  }
}

static void test_shfl_types() {
  int bad = 0;
  LAUNCH_OK(launch<bad_args, shfl_types_call>(bad_args{&bad, 0}, dim3(256), dim3(64), true));
  CHECK(bad == 0, "%d wrong shuffles", bad);
}

static void test_atomics() {
  const int n = 300007;
  rng r(7);
  std::vector<unsigned> x(n);
  for (unsigned& v : x) v = r.u32() % 1000003;
  std::vector<int> hist_i(256, 0);
  std::vector<unsigned> hist_u(256, 0);
  std::vector<unsigned long long> hist_ull(16, 0);
  std::vector<float> fsum(16, 0);
  std::vector<double> dsum(16, 0);
  std::vector<__half> hsum(1024, __half(0.0f));
  std::vector<__nv_bfloat16> bsum(2048, __nv_bfloat16(0.0f));
  std::vector<__half2> h2sum(1024, __half2(__half(0.0f), __half(0.0f)));
  int imin = INT_MAX, imax = INT_MIN, isub = 0;
  unsigned umin_ = ~0u, umax_ = 0, inc = 0, dec = 0, bits_and = ~0u, bits_or = 0, bits_xor = 0, ticket = 0;
  long long llmin_ = LLONG_MAX, llmax_ = LLONG_MIN;
  unsigned long long ullmin_ = ~0ull, ullmax_ = 0;
  std::vector<int> exch_old(n, -2);
  int exch_slot = -1;
  float fmax_cas = -INFINITY;
  unsigned short cas16 = 0;
  atomics_args a{x.data(), n, hist_i.data(), hist_u.data(), hist_ull.data(), fsum.data(), dsum.data(),
                 hsum.data(), bsum.data(), h2sum.data(), &imin, &imax, &umin_, &umax_, &llmin_, &llmax_,
                 &ullmin_, &ullmax_, &isub, &inc, &dec, &bits_and, &bits_or, &bits_xor, exch_old.data(),
                 &exch_slot, &fmax_cas, &ticket, &cas16, 0};
  LAUNCH_OK(launch<atomics_args, atomics_call>(a, dim3(n), dim3(256), false));

  std::vector<long long> ci(256, 0);
  std::vector<double> cf(16, 0), cd(16, 0);
  int rmin = INT_MAX, rmax = INT_MIN;
  unsigned rumin = ~0u, rumax = 0, ror = 0, rxor = 0;
  for (int i = 0; i < n; ++i) {
    const unsigned v = x[i], bin = v % 256;
    ci[bin]++;
    cf[bin % 16] += v % 100;
    cd[bin % 16] += (v % 1000) * 0.5;
    const int sv = int(v % 20001) - 10000;
    rmin = std::min(rmin, sv), rmax = std::max(rmax, sv);
    rumin = std::min(rumin, v), rumax = std::max(rumax, v);
    ror |= 1u << (v % 32), rxor ^= v;
  }
  for (int b = 0; b < 256; ++b) {
    CHECK(hist_i[b] == ci[b], "hist_i[%d] %d vs %lld", b, hist_i[b], ci[b]);
    CHECK(hist_u[b] == 2 * ci[b], "hist_u[%d]", b);
  }
  for (int b = 0; b < 16; ++b) {
    long long s = 0;
    for (int k = b; k < 256; k += 16) s += ci[k];
    CHECK(hist_ull[b] == (unsigned long long)s << 33, "hist_ull[%d]", b);
    CHECK(fsum[b] == float(cf[b]), "fsum[%d] %g vs %g", b, fsum[b], cf[b]);
    CHECK(dsum[b] == cd[b], "dsum[%d] %g vs %g", b, dsum[b], cd[b]);
  }
  for (int k = 0; k < 1024; ++k) {  // about 293 each: exact in half (up to 2048)
    const int cnt = n / 1024 + (k < n % 1024);
    CHECK(float(hsum[k]) == float(cnt), "hsum[%d] %g vs %d", k, float(hsum[k]), cnt);
    CHECK(float(h2sum[k].x) == float(cnt) && float(h2sum[k].y) == float(2 * cnt), "h2sum[%d]", k);
  }
  for (int k = 0; k < 2048; ++k) {  // about 146 each: exact in bfloat16 (up to 256)
    const int cnt = n / 2048 + (k < n % 2048);
    CHECK(float(bsum[k]) == float(cnt), "bsum[%d] %g vs %d", k, float(bsum[k]), cnt);
  }
  CHECK(imin == rmin && imax == rmax, "int min/max %d %d", imin, imax);
  CHECK(umin_ == rumin && umax_ == rumax, "unsigned min/max");
  CHECK(llmin_ == (long long)rmin << 32 && llmax_ == (long long)rmax << 32, "long long min/max");
  CHECK(ullmin_ == (unsigned long long)rumin << 20 && ullmax_ == (unsigned long long)rumax << 20, "ull min/max");
  CHECK(isub == -3 * n, "atomicSub %d", isub);
  CHECK(inc == unsigned(n % 10), "atomicInc %u, expected %u", inc, unsigned(n % 10));
  // atomicDec(6) from 0: 6,5,...,0,6,... -> after n steps: (6 - (n-1) % 7) ... computed serially
  unsigned rdec = 0;
  for (int i = 0; i < n; ++i) rdec = (rdec == 0 || rdec > 6) ? 6 : rdec - 1;
  CHECK(dec == rdec, "atomicDec %u vs %u", dec, rdec);
  CHECK(bits_and == 0u, "atomicAnd %x", bits_and);
  CHECK(bits_or == ror && bits_xor == rxor, "atomicOr/Xor");
  // atomicExch: the old values and the final one are a permutation of -1..n-1
  std::vector<char> seen(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    CHECK(exch_old[i] >= -1 && exch_old[i] < n && !seen[exch_old[i] + 1], "exch old %d", exch_old[i]);
    seen[exch_old[i] + 1] = 1;
  }
  CHECK(!seen[exch_slot + 1], "exch final %d", exch_slot);
  CHECK(fmax_cas == float(rmax) * 0.25f, "CAS float max %g", fmax_cas);
  CHECK(ticket == unsigned(n), "CAS ticket %u", ticket);
  CHECK(cas16 == (unsigned short)n, "16-bit CAS %u", cas16);
}

// ---------------------------------------------------------------------------
// 16-bit floats against an independent reference: every bit pattern decoded
// with ldexp, rounding by search in the sorted table of values.

struct f16_ref {
  int man_bits, exp_bits, bias;
  std::vector<double> pos;  // value of each positive finite pattern, increasing
  unsigned short inf_bits;
  f16_ref(int m, int e) : man_bits(m), exp_bits(e), bias((1 << (e - 1)) - 1) {
    inf_bits = (unsigned short)(((1u << e) - 1) << m);
    for (unsigned b = 0; b < inf_bits; ++b) pos.push_back(decode(b));
  }
  double decode(unsigned b) const {
    const unsigned e = (b >> man_bits) & ((1u << exp_bits) - 1), m = b & ((1u << man_bits) - 1);
    const double s = (b >> (man_bits + exp_bits)) & 1 ? -1.0 : 1.0;
    if (e == (1u << exp_bits) - 1) return m ? NAN : s * INFINITY;
    if (e == 0) return s * std::ldexp(double(m), 1 - bias - man_bits);
    return s * std::ldexp(double(m + (1u << man_bits)), int(e) - bias - man_bits);
  }
  // Pattern of x + tail (tail breaks exact ties) rounded with mode n/z/u/d.
  unsigned short round(double x, char mode, double tail = 0) const {
    if (x != x) return 0x7fff;
    if (std::isinf(x)) return x > 0 ? inf_bits : (unsigned short)(0x8000 | inf_bits);
    const unsigned short sign = std::signbit(x) ? (unsigned short)(0x8000) : 0;
    double a = std::fabs(x);
    const double t = std::signbit(x) ? -tail : tail;  // tail in the direction of |x|
    // directed modes on the magnitude: z = down, and u/d depend on the sign
    char m = mode;
    if (mode == 'u') m = sign ? 'z' : 'a';
    if (mode == 'd') m = sign ? 'a' : 'z';
    const double max_fin = pos.back();
    const double ulp_top = max_fin - pos[pos.size() - 2];
    if (a > max_fin || (a == max_fin && t > 0 && m == 'a')) {
      if (m == 'z') return sign | (unsigned short)(inf_bits - 1);
      if (m == 'a') return sign | inf_bits;
      // nearest: to infinity from max + ulp/2 (tie: even, infinity)
      if (a > max_fin + ulp_top / 2 || (a == max_fin + ulp_top / 2 && t >= 0)) return sign | inf_bits;
      return sign | (unsigned short)(inf_bits - 1);
    }
    size_t hi = std::lower_bound(pos.begin(), pos.end(), a) - pos.begin();  // pos[hi] >= a
    if (pos[hi] == a && t == 0) return sign | (unsigned short)hi;
    if (pos[hi] == a) {  // exactly on a value, tail decides for directed modes only
      if (m == 'n') return sign | (unsigned short)hi;
      if (m == 'z') return sign | (unsigned short)(t < 0 ? hi - 1 : hi);
      return sign | (unsigned short)(t > 0 ? hi + 1 : hi);
    }
    const size_t lo = hi - 1;
    if (m == 'z') return sign | (unsigned short)lo;
    if (m == 'a') return sign | (unsigned short)hi;
    const double dl = a - pos[lo], dh = pos[hi] - a;
    if (dl < dh || (dl == dh && t < 0)) return sign | (unsigned short)lo;
    if (dh < dl || (dl == dh && t > 0)) return sign | (unsigned short)hi;
    return sign | (unsigned short)((lo & 1) ? hi : lo);  // tie: even
  }
};

template <class H>
static void check_f16(const f16_ref& R, const char* name) {
  // every pattern decodes as the reference; every finite one survives a round trip
  for (unsigned b = 0; b < 65536; ++b) {
    const H h = H::from_bits((unsigned short)b);
    const double ref = R.decode(b);
    const float f = float(h);
    if (ref != ref) {
      CHECK(f != f, "%s %04x: %g not NaN", name, b, f);
      continue;
    }
    CHECK(double(f) == ref, "%s %04x: %g vs %g", name, b, f, ref);
    CHECK(H(f).bits == b, "%s %04x round trip %04x", name, b, H(f).bits);
  }
  // float -> 16 bits, all four modes, on random floats, near ties and edges
  rng r(11);
  std::vector<float> fs;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = r.u32();
    float f;
    memcpy(&f, &u, 4);
    if (f == f) fs.push_back(f);
  }
  for (int i = 0; i < 20000; ++i) {  // midpoints and their neighbours, in range
    const unsigned b = r.u32() % (R.inf_bits - 1);
    const double mid = (R.decode(b) + R.decode(b + 1)) / 2;
    const float m = float(mid);
    fs.push_back(m), fs.push_back(-m), fs.push_back(std::nextafter(m, 0.0f)), fs.push_back(std::nextafter(m, 1e30f));
  }
  for (float f : {0.0f, -0.0f, 1e-30f, -1e-30f, 65504.0f, 65519.99f, 65520.0f, 70000.0f, -65520.0f, 3.4e38f,
                  INFINITY, -INFINITY, 5.96e-8f, 2.98e-8f, 2.99e-8f})
    fs.push_back(f);
  for (float f : fs) {
    const unsigned short n = H(f).bits, z = kk_cuda_cpu::f16_from_float<H>(f, 'z').bits;
    const unsigned short u = kk_cuda_cpu::f16_from_float<H>(f, 'u').bits,
                         d = kk_cuda_cpu::f16_from_float<H>(f, 'd').bits;
    CHECK(n == R.round(f, 'n'), "%s rn(%a) %04x vs %04x", name, f, n, R.round(f, 'n'));
    CHECK(z == R.round(f, 'z'), "%s rz(%a) %04x vs %04x", name, f, z, R.round(f, 'z'));
    CHECK(u == R.round(f, 'u'), "%s ru(%a) %04x vs %04x", name, f, u, R.round(f, 'u'));
    CHECK(d == R.round(f, 'd'), "%s rd(%a) %04x vs %04x", name, f, d, R.round(f, 'd'));
  }
  // arithmetic: correctly rounded results of the exact operation
  for (int i = 0; i < 300000; ++i) {
    unsigned short ba = (unsigned short)r.u32(), bb = (unsigned short)r.u32(), bc = (unsigned short)r.u32();
    if (i % 2) {  // moderate magnitudes, where sums do not cancel to nothing
      ba = (ba & 0x83ff) | ((R.bias - 4 + r.u32() % 8) << R.man_bits);
      bb = (bb & 0x83ff) | ((R.bias - 4 + r.u32() % 8) << R.man_bits);
    }
    const H a = H::from_bits(ba), b = H::from_bits(bb), c = H::from_bits(bc);
    const double x = R.decode(ba), y = R.decode(bb), z = R.decode(bc);
    if (x != x || y != y || z != z) continue;
    auto same = [](H h, unsigned short e) { return h.bits == e || ((h.bits & 0x7fff) > 0x7c00 && (e & 0x7fff) > 0x7c00); };
    const unsigned short qn = R.round(x / y, 'n');
    CHECK(same(__hadd(a, b), R.round(x + y, 'n')), "%s %04x + %04x", name, ba, bb);
    CHECK(same(__hsub(a, b), R.round(x - y, 'n')), "%s %04x - %04x", name, ba, bb);
    CHECK(same(__hmul(a, b), R.round(x * y, 'n')), "%s %04x * %04x", name, ba, bb);
    CHECK(same(a * b, R.round(x * y, 'n')), "%s operator* %04x %04x", name, ba, bb);
    if (y != 0 && std::isfinite(x / y)) {
      // x / y in double is not exact: take the tail from the remainder
      const double q = x / y, tail = std::fma(-q, y, x) / y;
      CHECK(same(__hdiv(a, b), R.round(q, 'n', tail)), "%s %04x / %04x: %04x vs %04x", name, ba, bb,
            __hdiv(a, b).bits, qn);
    }
    // fma: exact value s + e (two-sum of the exact product and z)
    const double p = x * y, s = p + z, bbv = s - p, e = (p - (s - bbv)) + (z - bbv);
    if (std::isfinite(s))
      CHECK(same(__hfma(a, b, c), R.round(s, 'n', e)), "%s fma(%04x, %04x, %04x): %04x vs %04x", name, ba, bb, bc,
            __hfma(a, b, c).bits, R.round(s, 'n', e));
  }
}

static void test_half() {
  f16_ref H16(10, 5), B16(7, 8);
  check_f16<__half>(H16, "half");
  check_f16<__nv_bfloat16>(B16, "bfloat16");
  static_assert(sizeof(__half) == 2 && alignof(__half) == 2 && std::is_trivially_copyable<__half>::value, "");
  static_assert(sizeof(__nv_bfloat16) == 2 && std::is_trivially_copyable<__nv_bfloat16>::value, "");
  static_assert(sizeof(__half2) == 4 && alignof(__half2) == 4 && std::is_trivially_copyable<__half2>::value, "");

  // The double rounding a float fma would make: (1 + 2^-10) * 1.5 is a midpoint
  // of two halves; -2^-24 must round it down.
  const __half a = __float2half(1.0f + 0x1p-10f), b = __float2half(1.5f), c = __float2half(-0x1p-24f);
  CHECK(__half2float(__hfma(a, b, c)) == 1.5f + 0x1p-10f, "hfma double rounding: %a",
        __half2float(__hfma(a, b, c)));
  CHECK(__half2float(__hfma(a, b, __float2half(0.0f))) == 1.5f + 0x1p-9f, "hfma tie to even");

  // Comparisons and NaN
  const __half nan = CUDART_NAN_FP16, one = CUDART_ONE_FP16, two = __float2half(2.0f);
  CHECK(__hisnan(nan) && !__hisnan(one) && __hisinf(CUDART_INF_FP16) == 1 && __hisinf(__hneg(CUDART_INF_FP16)) == -1,
        "hisnan/hisinf");
  CHECK(__hlt(one, two) && !__hlt(nan, two) && __hltu(nan, two) && !__heq(nan, nan) && __hequ(nan, nan), "hlt");
  CHECK(!__hne(nan, one) && __hneu(nan, one) && __hne(one, two), "hne");
  CHECK(__hmax(nan, one) == one && __hmin(one, nan) == one && __hisnan(__hmax_nan(nan, one)), "hmax/hmin NaN");
  CHECK(__hmax(one, two) == two && __hmin(one, two) == one, "hmax/hmin");
  CHECK(__habs(__float2half(-3.0f)) == __float2half(3.0f) && __hneg(one).bits == 0xbc00, "habs/hneg");
  CHECK(__half_as_ushort(one) == 0x3c00 && __ushort_as_half(0x4000) == two, "bit casts");
  CHECK(__bfloat16_as_ushort(__float2bfloat16(1.0f)) == 0x3f80, "bf16 bits");
  CHECK(__half2int_rn(__float2half(2.5f)) == 2 && __half2int_rn(__float2half(3.5f)) == 4 &&
            __half2int_rz(__float2half(-2.75f)) == -2 && __half2int_rd(__float2half(-2.25f)) == -3 &&
            __half2int_ru(__float2half(2.25f)) == 3 && __half2int_rn(nan) == 0,
        "half2int");
  CHECK(__half2uint_rn(__float2half(-5.0f)) == 0u && __half2short_rz(CUDART_INF_FP16) == 32767 &&
            __half2ll_rz(__float2half(-65504.0f)) == -65504,
        "saturating conversions");
  CHECK(__int2half_rn(2049) == __float2half(2048.0f) && __int2half_ru(2049) == __float2half(2050.0f) &&
            __int2half_rn(100000) == CUDART_INF_FP16 && __int2half_rz(100000) == CUDART_MAX_NORMAL_FP16,
        "int2half");
  CHECK(__int2bfloat16_rn(257) == __float2bfloat16(256.0f) && __bfloat162int_rz(__float2bfloat16(-7.9f)) == -7,
        "bf16 ints");
  CHECK(__double2half(1.0 + 0x1p-11 + 0x1p-40) == __float2half(1.0f + 0x1p-10f), "double2half no double rounding");
  CHECK(__double2bfloat16(1.0 + 0x1p-8 + 0x1p-40) == __float2bfloat16(1.0f + 0x1p-7f), "double2bfloat16");
  // Pairs
  __half2 p = __floats2half2_rn(1.5f, -2.0f), q = __halves2half2(two, one);
  __half2 s = p + q, m = __hmul2(p, q), f2 = __hfma2(p, q, p);
  CHECK(__low2float(s) == 3.5f && __high2float(s) == -1.0f && __low2float(m) == 3.0f && __high2float(m) == -2.0f,
        "half2 +, *");
  CHECK(__low2float(f2) == 4.5f && __high2float(f2) == -4.0f && __hbeq2(p, p) && !__hbeq2(p, q), "half2 fma, ==");
  const float2 ff = __half22float2(__lowhigh2highlow(p));
  CHECK(ff.x == -2.0f && ff.y == 1.5f, "half22float2");
  __nv_bfloat162 bp = __floats2bfloat162_rn(1.0f, 3.0f);
  bp += bp;
  CHECK(__low2float(bp) == 2.0f && __high2float(bp) == 6.0f, "bf162 +=");
  // half with the C++ math overloads, float results as CUDA gives
  const __half h3 = __float2half(3.0f);
  static_assert(std::is_same<decltype(sqrt(h3)), float>::value && std::is_same<decltype(pow(h3, 2.0f)), float>::value &&
                    std::is_same<decltype(h3 * 2.0f), float>::value && std::is_same<decltype(h3 + h3), __half>::value,
                "half promotions");
  CHECK(sqrt(h3) == std::sqrt(3.0f) && pow(h3, h3) == 27.0f && !isnan(h3) && fmax(h3, 4) == 4.0f, "half math");
  CHECK(cuda::std::numeric_limits<__half>::max() == CUDART_MAX_NORMAL_FP16 &&
            cuda::std::numeric_limits<__half>::infinity() == CUDART_INF_FP16 &&
            float(cuda::std::numeric_limits<__half>::epsilon()) == 0x1p-10f &&
            float(cuda::std::numeric_limits<__nv_bfloat16>::lowest()) == -0x1.fep127f &&
            cuda::std::numeric_limits<float>::max() == FLT_MAX,
        "numeric_limits");
  CHECK(hexp(__float2half(1.0f)) == __float2half(2.7182818f) && hsqrt(__float2half(2.0f)) == __float2half(1.4142135f) &&
            hfloor(__float2half(-1.5f)) == __float2half(-2.0f) && hrcp(two) == __float2half(0.5f),
        "half math functions");
  const __half_raw raw = one;
  const __half back = raw;
  CHECK(raw.x == 0x3c00 && back == one, "__half_raw");

  // and in a kernel
  const int n = 1000;
  rng r(5);
  std::vector<__half> ha(n), hb(n), oh(4 * n);
  std::vector<__nv_bfloat16> bc(n), ob(2 * n);
  std::vector<float> of(n);
  for (int i = 0; i < n; ++i) {
    ha[i] = __float2half(float(r.uniform() * 8 - 4));
    hb[i] = __float2half(float(r.uniform() * 8 + 0.5));
    bc[i] = __float2bfloat16(float(r.uniform() * 100 - 50));
  }
  LAUNCH_OK(launch<half_args, half_math_call>(half_args{ha.data(), hb.data(), bc.data(), oh.data(), ob.data(), of.data(), n, 0},
                                         dim3(n), dim3(128), false));
  for (int i = 0; i < n; ++i) {
    const double x = H16.decode(ha[i].bits), y = H16.decode(hb[i].bits), z = B16.decode(bc[i].bits);
    CHECK(oh[4 * i].bits == H16.round(x + y, 'n') && oh[4 * i + 1].bits == H16.round(x * y, 'n') &&
              oh[4 * i + 2].bits == H16.round(x * y + x, 'n'),
          "half kernel %d", i);
    const double zz = B16.decode(B16.round(z * z, 'n'));  // z * z is a bfloat16, then - z
    CHECK(ob[2 * i].bits == B16.round(zz - z, 'n') && ob[2 * i + 1].bits == B16.round(x, 'n'), "bf16 kernel %d", i);
    CHECK(of[i] == float(x) + float(z), "mixed kernel %d", i);
  }
}

// ---------------------------------------------------------------------------
// Math: CUDA's additions against <cmath> in long double; directed rounding
// against the FPU in that rounding mode (this file is built with -frounding-math).

static double ulps(double got, long double ref, int digits) {
  if (std::isnan(got) && std::isnan(ref)) return 0;
  if (std::isinf(ref)) return got == ref ? 0 : 1e9;
  const long double scale = std::ldexp(1.0L, std::ilogb(std::fabs(ref) > 0 ? ref : 1e-300L) - digits + 1);
  return double(std::fabs((long double)got - ref) / scale);
}

template <class F>
static float with_mode(int mode, F f) {
  fesetround(mode);
  volatile float r = f();
  fesetround(FE_TONEAREST);
  return r;
}

static void test_math() {
  const long double PI = 3.141592653589793238462643383279502884L;
  rng r(3);
  {  // the names a body calls, against <cmath>
    const int n = 501;
    std::vector<float> x(n), out(40 * n);
    std::vector<double> dout(4 * n);
    for (int i = 0; i < n; ++i) x[i] = float((i - 250) * 0.03125);
    LAUNCH_OK(launch<math_args, math_names_call>(math_args{x.data(), out.data(), dout.data(), n, 0}, dim3(n), dim3(64),
                                                 false));
    for (int i = 0; i < n; ++i) {
      const float v = x[i], p = std::fabs(v) + 0.5f;
      int e = 0;
      const float fr = std::frexp(p, &e);
      const float ref[40] = {std::exp(v), std::exp2(v), std::log(p), std::log2(p), std::log1p(p), std::expm1(v),
                             std::pow(p, v), std::sqrt(p), float(1 / std::sqrt(double(p))), std::cbrt(v),
                             std::sin(v), std::cos(v), std::tan(v), std::sin(v) + std::cos(v), std::asin(v / 8),
                             std::acos(v / 8), std::atan(v), std::atan2(v, p), std::sinh(v), std::cosh(v),
                             std::tanh(v), std::erf(v), std::erfc(v), std::fabs(v), std::floor(v), std::ceil(v),
                             std::round(v), std::trunc(v), std::rint(v), std::fmod(v, 0.75f), std::fmax(v, 0.1f),
                             std::fmin(v, 0.1f), std::fma(v, p, 1.0f), std::copysign(p, v), std::hypot(v, p),
                             std::nextafter(v, 0.0f), std::ldexp(v, 3), fr + e, float(4 + 8 * std::signbit(v)),
                             std::exp(v) + std::sqrt(p) + std::floor(v) + std::fmax(v, p)};
      for (int k = 0; k < 40; ++k)
        CHECK(out[40 * i + k] == ref[k] || std::fabs(out[40 * i + k] - ref[k]) <= 1e-6f * std::fabs(ref[k]),
              "function %d at %g: %a vs %a", k, v, out[40 * i + k], ref[k]);
      const double d = v;
      CHECK(std::fabs(dout[4 * i] - (std::exp(d) + std::log(d * d + 1.0))) <= 1e-15 * (std::exp(d) + 2) &&
                std::fabs(dout[4 * i + 1] - (std::sin(d) * std::cos(d) + std::tanh(d))) <= 1e-15 &&
                std::fabs(dout[4 * i + 2] - (std::pow(std::fabs(d), 1.5) + 1 / std::sqrt(std::fabs(d) + 1))) <= 1e-14,
            "double math at %g", d);
    }
  }
  double worst_sinpi = 0, worst_erfinv = 0, worst_rsqrt = 0;
  for (int i = 0; i < 20000; ++i) {
    const float x = float((r.uniform() - 0.5) * 200);
    float s, c;
    sincospif(x, &s, &c);
    const long double k = std::nearbyint(2.0L * x), f = x - k / 2;
    long double rs = std::sin(PI * f), rc = std::cos(PI * f);
    const int q = int(std::fmod(std::fabs(k), 4.0L)) * (k < 0 ? -1 : 1);
    const int qq = ((q % 4) + 4) % 4;
    long double S = qq == 0 ? rs : qq == 1 ? rc : qq == 2 ? -rs : -rc;
    long double C = qq == 0 ? rc : qq == 1 ? -rs : qq == 2 ? -rc : rs;
    worst_sinpi = std::max({worst_sinpi, ulps(s, S, 24), ulps(c, C, 24), ulps(sinpif(x), S, 24)});
    const float p = float(r.uniform() * 1000 + 1e-3);
    worst_rsqrt = std::max(worst_rsqrt, ulps(rsqrtf(p), 1.0L / std::sqrt((long double)p), 24));
  }
  CHECK(worst_sinpi <= 1.0 && worst_rsqrt <= 1.0, "sinpi %g ulp, rsqrt %g ulp", worst_sinpi, worst_rsqrt);
  CHECK(sinpif(3.0f) == 0.0f && !std::signbit(sinpif(3.0f)) && std::signbit(sinpif(-2.0f)) && cospif(0.5f) == 0.0f &&
            cospif(1.0f) == -1.0f && sinpi(0.5) == 1.0,
        "sinpi exact points");
  // erfinv: against erf of the result, and double erfinv against a long-double erf
  for (int i = 0; i < 20000; ++i) {
    const double y = i < 19000 ? r.uniform() * 2 - 1 : (1 - std::ldexp(1.0, -int(r.u32() % 52) - 1)) * (i % 2 ? 1 : -1);
    const double x = erfinv(y);
    // d erf / dx = 2/sqrt(pi) exp(-x^2): the error in x is (erf(x) - y) / derivative
    const long double ex = std::erf((long double)x), deriv = 2 / std::sqrt(PI) * std::exp(-(long double)x * x);
    const long double ec = std::erfc((long double)std::fabs(x)), yc = 1 - (long double)std::fabs(y);
    const long double err = std::fabs(y) > 0.5 ? (ec - yc) / deriv : (ex - y) / deriv;
    worst_erfinv = std::max(worst_erfinv, double(std::fabs(err) / (std::fabs(x) * 0x1p-52 + 1e-300)));
    const float yf = float(y);
    const float xf = erfinvf(yf);
    CHECK(xf == float(erfinv(double(yf))), "erfinvf(%a)", yf);
  }
  CHECK(worst_erfinv <= 4.0, "erfinv: %g ulp", worst_erfinv);
  CHECK(erfinvf(0.0f) == 0.0f && erfinvf(1.0f) == INFINITY && erfinvf(-1.0f) == -INFINITY && std::isnan(erfinvf(1.5f)),
        "erfinv edges");
  for (double z : {1e-300, 1e-100, 1e-20, 1e-5, 0.01, 0.3, 0.7, 1.0, 1.5, 1.999}) {
    const double x = erfcinv(z);
    const long double back = std::erfc((long double)x);
    CHECK(std::fabs(back - z) <= 1e-13L * z, "erfcinv(%g) = %.17g: erfc gives %Lg", z, x, back);
  }
  for (float x : {-3.0f, -0.5f, 0.0f, 1.0f, 2.5f}) {
    const float p = normcdff(x);
    CHECK(std::fabs(p - float(0.5L * std::erfc(-x / std::sqrt(2.0L)))) <= 2e-7f * p, "normcdff(%g)", x);
    CHECK(std::fabs(normcdfinvf(p) - x) <= 1e-5f, "normcdfinvf(%g)", p);
  }
  for (double x : {-2.0, 0.0, 1.0, 5.0, 20.0, 24.9, 25.99, 26.0, 30.0, 100.0}) {
    const long double ref = std::exp((long double)x * x) * std::erfc((long double)x);
    CHECK(ulps(erfcx(x), ref, 53) <= 16, "erfcx(%g): %.17g vs %.17Lg", x, erfcx(x), ref);
  }
  const double big = 1e4, asym = (1 - 1 / (2 * big * big)) / (big * std::sqrt(3.14159265358979323846));
  CHECK(std::fabs(erfcx(big) - asym) <= 1e-15 * asym && erfcxf(1e4f) == float(asym), "erfcx(1e4)");
  CHECK(std::fabs(rcbrtf(8.0f) - 0.5f) == 0 && rhypotf(3, 4) == 0.2f && norm3df(2, 3, 6) == 7.0f &&
            __saturatef(-1.0f) == 0 && __saturatef(NAN) == 0 && __saturatef(2.0f) == 1 && __saturatef(0.25f) == 0.25f &&
            __fdividef(1, 4) == 0.25f && __expf(1.0f) == expf(1.0f),
        "misc");
  CHECK(exp10(2.0f) == 100.0f && (std::is_same<decltype(exp10(2.0f)), float>::value), "exp10");

  // Directed rounding: __f*_r[nzud] against the FPU's own.
  const int modes[4] = {FE_TONEAREST, FE_TOWARDZERO, FE_UPWARD, FE_DOWNWARD};
  int bad = 0;
  for (int i = 0; i < 100000; ++i) {
    uint32_t ua = r.u32(), ub = r.u32(), uc = r.u32();
    if (i % 2) {  // similar exponents: cancellation, ties
      ub = (ub & 0x807fffff) | (ua & 0x7f800000);
      uc = (uc & 0x807fffff) | (((ua >> 23) & 0xff) + ((ub >> 23) & 0xff) - 127) << 23;
    }
    float a, b, c;
    memcpy(&a, &ua, 4), memcpy(&b, &ub, 4), memcpy(&c, &uc, 4);
    volatile float va = a, vb = b, vc = c;
    const float got[4][7] = {
        {__fadd_rn(a, b), __fsub_rn(a, b), __fmul_rn(a, b), __fdiv_rn(a, b), __fmaf_rn(a, b, c), __fsqrt_rn(a), __frcp_rn(b)},
        {__fadd_rz(a, b), __fsub_rz(a, b), __fmul_rz(a, b), __fdiv_rz(a, b), __fmaf_rz(a, b, c), __fsqrt_rz(a), __frcp_rz(b)},
        {__fadd_ru(a, b), __fsub_ru(a, b), __fmul_ru(a, b), __fdiv_ru(a, b), __fmaf_ru(a, b, c), __fsqrt_ru(a), __frcp_ru(b)},
        {__fadd_rd(a, b), __fsub_rd(a, b), __fmul_rd(a, b), __fdiv_rd(a, b), __fmaf_rd(a, b, c), __fsqrt_rd(a), __frcp_rd(b)}};
    for (int m = 0; m < 4; ++m) {
      const float ref[7] = {with_mode(modes[m], [&] { return va + vb; }), with_mode(modes[m], [&] { return va - vb; }),
                            with_mode(modes[m], [&] { return va * vb; }), with_mode(modes[m], [&] { return va / vb; }),
                            with_mode(modes[m], [&] { return std::fma(float(va), float(vb), float(vc)); }),
                            with_mode(modes[m], [&] { return std::sqrt(float(va)); }),
                            with_mode(modes[m], [&] { return 1.0f / vb; })};
      for (int k = 0; k < 7; ++k) {
        const bool ok = memcmp(&got[m][k], &ref[k], 4) == 0 || (got[m][k] != got[m][k] && ref[k] != ref[k]);
        if (!ok && bad++ < 10)
          printf("FAIL rounding mode %d op %d: a=%a b=%a c=%a: %a vs %a\n", m, k, a, b, c, got[m][k], ref[k]);
      }
    }
    const int ia = int(ua);
    volatile double dd = double(ia) * 1.1;
    CHECK(__int2float_rz(ia) == with_mode(FE_TOWARDZERO, [&] { return float(ia); }) &&
              __int2float_ru(ia) == with_mode(FE_UPWARD, [&] { return float(ia); }) &&
              __uint2float_rd(ua) == with_mode(FE_DOWNWARD, [&] { return float(ua); }) &&
              __double2float_ru(dd) == with_mode(FE_UPWARD, [&] { return float(dd); }),
          "int2float modes %d", ia);
  }
  CHECK(bad == 0, "%d wrong directed roundings", bad);
  // float -> int: round, truncate, floor, ceil; saturating; NaN -> 0
  CHECK(__float2int_rn(2.5f) == 2 && __float2int_rn(-3.5f) == -4 && __float2int_rz(-2.7f) == -2 &&
            __float2int_rd(-2.1f) == -3 && __float2int_ru(2.1f) == 3 && __float2int_rn(3e9f) == INT_MAX &&
            __float2int_rz(-3e9f) == INT_MIN && __float2int_rn(NAN) == 0 && __float2uint_rn(-1.0f) == 0u &&
            __float2uint_rz(5e9f) == UINT_MAX && __float2ll_rd(-1e19f) == LLONG_MIN && __float2ull_ru(0.5f) == 1ull &&
            __double2int_rn(1e10) == INT_MAX && __float2int_rn(INFINITY) == INT_MAX,
        "float2int");
  CHECK(__float_as_int(1.0f) == 0x3f800000 && __int_as_float(0x40000000) == 2.0f && __float_as_uint(-0.0f) == 0x80000000u &&
            __uint_as_float(0x3f000000u) == 0.5f && __double_as_longlong(1.0) == 0x3ff0000000000000ll &&
            __longlong_as_double(0x4000000000000000ll) == 2.0 && __double2hiint(1.0) == 0x3ff00000 &&
            __double2loint(1.0) == 0 && __hiloint2double(0x40080000, 0) == 3.0,
        "bit casts");

  // integer intrinsics against plain loops
  for (int i = 0; i < 20000; ++i) {
    const unsigned x = i < 64 ? (1u << (i % 32)) >> (i / 32) : r.u32() >> (r.u32() % 32);
    const unsigned y = r.u32(), s = r.u32();
    const unsigned long long X = (static_cast<unsigned long long>(r.u32()) << 32 | r.u32()) >> (r.u32() % 64);
    int clz = 0, ffs = 0, pop = 0;
    while (clz < 32 && !((x >> (31 - clz)) & 1)) ++clz;
    for (int b = 0; b < 32; ++b) pop += (x >> b) & 1;
    for (int b = 0; b < 32; ++b)
      if ((x >> b) & 1) { ffs = b + 1; break; }
    unsigned rev = 0;
    for (int b = 0; b < 32; ++b) rev |= ((x >> b) & 1u) << (31 - b);
    int clzll = 0, popll = 0, ffsll = 0;
    while (clzll < 64 && !((X >> (63 - clzll)) & 1)) ++clzll;
    for (int b = 0; b < 64; ++b) popll += (X >> b) & 1;
    for (int b = 0; b < 64; ++b)
      if ((X >> b) & 1) { ffsll = b + 1; break; }
    unsigned long long revll = 0;
    for (int b = 0; b < 64; ++b) revll |= ((X >> b) & 1ull) << (63 - b);
    CHECK(__clz(int(x)) == clz && __ffs(int(x)) == ffs && __popc(x) == pop && __brev(x) == rev, "bits of %x", x);
    CHECK(__clzll((long long)X) == clzll && __ffsll((long long)X) == ffsll && __popcll(X) == popll &&
              __brevll(X) == revll,
          "bits of %llx", X);
    CHECK(__mulhi(int(x), int(y)) == int(((long long)int(x) * int(y)) >> 32) &&
              __umulhi(x, y) == unsigned(((unsigned long long)x * y) >> 32),
          "mulhi");
    CHECK(__umul64hi(X, 0xfedcba9876543210ull) ==
              (unsigned long long)(((unsigned __int128)X * 0xfedcba9876543210ull) >> 64) &&
              __mul64hi(-(long long)X, 12345) == (long long)(((__int128)(-(long long)X) * 12345) >> 64),
          "mul64hi");
    long long xa = (long long)((int)(x << 8) >> 8), ya = (long long)((int)(y << 8) >> 8);
    CHECK(__mul24(int(x), int(y)) == int((unsigned)(xa * ya)) && __umul24(x, y) == (x & 0xffffff) * (y & 0xffffff),
          "mul24");
    CHECK(__sad(int(x), int(y), 5u) == unsigned(std::llabs((long long)int(x) - int(y))) + 5u &&
              __usad(x, y, 1u) == (x > y ? x - y : y - x) + 1u,
          "sad");
    CHECK(__hadd(int(x), int(y)) == int(((long long)int(x) + int(y)) >> 1) &&
              __urhadd(x, y) == unsigned(((unsigned long long)x + y + 1) >> 1),
          "hadd");
    unsigned bp = 0;
    const unsigned char bytes[8] = {(unsigned char)x, (unsigned char)(x >> 8), (unsigned char)(x >> 16),
                                    (unsigned char)(x >> 24), (unsigned char)y, (unsigned char)(y >> 8),
                                    (unsigned char)(y >> 16), (unsigned char)(y >> 24)};
    for (int b = 0; b < 4; ++b) bp |= unsigned(bytes[(s >> (4 * b)) & 7]) << (8 * b);
    CHECK(__byte_perm(x, y, s) == bp, "byte_perm");
    const unsigned sh = s % 40;
    const unsigned long long cat = (static_cast<unsigned long long>(y) << 32) | x;
    CHECK(__funnelshift_l(x, y, sh) == unsigned((cat << (sh & 31)) >> 32) &&
              __funnelshift_lc(x, y, sh) == (sh >= 32 ? x : unsigned((cat << sh) >> 32)) &&
              __funnelshift_r(x, y, sh) == unsigned(cat >> (sh & 31)) &&
              __funnelshift_rc(x, y, sh) == (sh >= 32 ? y : unsigned(cat >> sh)),
          "funnelshift");
    int dp = int(s);
    for (int b = 0; b < 4; ++b) dp += int((signed char)(x >> (8 * b))) * int((signed char)(y >> (8 * b)));
    CHECK(__dp4a(int(x), int(y), int(s)) == dp, "dp4a");
  }
  CHECK(__clz(0) == 32 && __clzll(0) == 64 && __ffs(0) == 0 && __ffsll(0) == 0, "zero");
  // CUDA's global min / max overloads
  static_assert(std::is_same<decltype(min(1, 2u)), unsigned>::value, "");
  static_assert(std::is_same<decltype(max(1.0f, 2.0)), double>::value, "");
  static_assert(std::is_same<decltype(min(1ll, 2ll)), long long>::value, "");
  static_assert(std::is_same<decltype(max(2.0f, 3.0f)), float>::value, "");
  CHECK(min(-1, 2u) == 2u && max(-1, 2) == 2 && min(-1LL, 5LL) == -1 && max(1.5f, NAN) == 1.5f && umin(3u, 2u) == 2u,
        "min/max");
  CHECK(::abs(-3) == 3 && ::abs(-2.5f) == 2.5f && fabsf(-1.0f) == 1.0f && isnan(NAN) && !isinf(1.0f) && signbit(-0.0),
        "abs, classification");
  const float2 f2 = make_float2(1, 2);
  const int4 i4 = make_int4(1, 2, 3, 4);
  static_assert(sizeof(float4) == 16 && alignof(float4) == 16 && alignof(float2) == 8 && sizeof(float3) == 12 &&
                    alignof(double2) == 16 && sizeof(char3) == 3 && alignof(short4) == 8 && sizeof(uint3) == 12,
                "vector types");
  CHECK(f2.y == 2 && i4.w == 4 && dim3(5).y == 1 && dim3(make_uint3(1, 2, 3)).z == 3, "vectors");
}

static void test_coop() {
  for (dim3 block : {dim3(64), dim3(256), dim3(8, 4, 2), dim3(96)}) {
    const int nb = int(block.x * block.y * block.z), groups = 5, n = nb * groups;
    rng r(9);
    std::vector<int> x(n), out(size_t(n) * 24, -12345);
    for (int& v : x) v = int(r.u32() % 1000);
    std::vector<unsigned long long> ranks(n, 0);
    int bad = 0;
    LAUNCH_OK(launch<coop_args, coop_call>(coop_args{x.data(), out.data(), ranks.data(), &bad, 0}, dim3(groups * block.x, block.y, block.z), block, true));
    CHECK(bad == 0, "block (%u,%u,%u): %d errors", block.x, block.y, block.z, bad);
    for (int g = 0; g < groups; ++g) {
      const int* xv = &x[g * nb];
      int total = 0;
      for (int i = 0; i < nb; ++i) total += xv[i];
      for (int rk = 0; rk < nb; ++rk) {
        const int* o = &out[(size_t(g) * nb + rk) * 24];
        auto fold = [&](int w, auto op) {
          const int b = rk / w * w;
          int acc = xv[b];
          for (int k = b + 1; k < b + w; ++k) acc = op(acc, xv[k]);
          return acc;
        };
        auto add = [](int a, int b) { return a + b; };
        CHECK(o[0] == total, "block sum");
        CHECK(o[1] == fold(32, add) && o[2] == fold(16, add), "tile reduce 32/16 rank %d", rk);
        CHECK(o[3] == fold(8, [](int a, int b) { return std::min(a, b); }) &&
                  o[4] == fold(8, [](int a, int b) { return std::max(a, b); }),
              "tile 8 less/greater");
        CHECK(o[5] == fold(4, [](int a, int b) { return a ^ b; }) &&
                  o[6] == fold(2, [](int a, int b) { return a * 3 + b; }) && o[7] == xv[rk],
              "tile 4/2/1");
        if (rk % 32 == 0) CHECK(o[8] == fold(32, add), "shfl_down tree: %d vs %d", o[8], fold(32, add));
        CHECK(o[9] == rk % 32 + 100 * (rk / 32) + 10000 * ((nb + 31) / 32), "tile32 ranks %d", o[9]);
        CHECK(o[10] == rk % 8 + 100 * (rk / 8) + 10000 * (nb / 8), "tile8 ranks");
        int bal = 0, any5 = 0;
        for (int k = 0; k < 8; ++k) bal |= (xv[rk / 8 * 8 + k] % 2 == 0) << k, any5 |= xv[rk / 8 * 8 + k] == 5;
        CHECK(o[11] == bal && o[12] == any5 + 2, "tile ballot/any/all");
        int inc = 0, exc = 0;
        for (int k = rk / 32 * 32; k <= rk; ++k) inc += xv[k];
        for (int k = rk / 8 * 8; k < rk; ++k) exc += xv[k];
        CHECK(o[13] == inc && o[14] == exc, "scans rank %d: %d %d vs %d %d", rk, o[13], o[14], inc, exc);
        CHECK(o[15] == xv[rk / 8 * 8 + 3] + 1000 * xv[rk ^ 5], "tile shfl");
        CHECK(o[16] == (rk % 32 >= 2 ? xv[rk - 2] : xv[rk]), "tile shfl_up");
        CHECK(o[17] == rk % 4 + 100 * (rk % 8 / 4) + 10000 * 2, "tile of tile ranks %d", o[17]);
        CHECK(o[18] == fold(4, add), "tile of tile reduce");
        CHECK(o[19] == 800 + rk % 8, "thread_group");
        CHECK(o[20] == xv[(rk + 1) % nb], "memcpy_async");
        CHECK(ranks[size_t(g) * nb + rk] == (unsigned long long)n * 1000000ull + g * 1000ull + rk, "grid rank");
        if (rk % 2 == 0) {
          const int b = rk / 32 * 32, lanes = std::min(32, nb - b);
          int s = 0, any3 = 0;
          for (int k = b; k < b + lanes; k += 2) s += xv[k], any3 |= xv[k] % 3 == 0;
          CHECK(o[21] == (lanes + 1) / 2 * 100 + (rk - b) / 2, "coalesced ranks %d", o[21]);
          CHECK(o[22] == s && o[23] == xv[b] + 1000 * any3, "coalesced reduce/shfl");
        }
      }
    }
  }
}

static void expect_error(const std::string& e, std::initializer_list<const char*> parts) {
  CHECK(!e.empty(), "the launch should have failed");
  for (const char* p : parts) CHECK(e.find(p) != std::string::npos, "'%s' not in: %s", p, e.c_str());
}

static void test_errors() {
  // a synchronising call in a loop-mode launch
  expect_error(launch<none_args, err_sync_call>(none_args{0}, dim3(64), dim3(32), false, true, "ksync"),
               {"kernel 'ksync'", "__syncthreads at body:2", "loop mode"});
  // partial-mask warp call: lanes 0..15 reach it (its active lanes), 16..31 do not; then all
  // 32 meet at a full-mask one
  std::vector<float> out(64);
  std::string e = launch<errf_args, err_shfl_call>(errf_args{out.data(), 0}, dim3(64), dim3(64), true, true, "kshfl");
  CHECK(e.empty(), "%s", e.c_str());
  for (unsigned t = 0; t < 64; ++t)
    CHECK(out[t] == (t < 16 ? 0.0f : float(t + (t ^ 1u))), "kshfl thread %u: %g", t, out[t]);
  expect_error(launch<none_args, err_trap_call>(none_args{0}, dim3(64), dim3(32), false, true, "ktrap"),
               {"kernel 'ktrap'", "__trap() at body:2", "thread (3,0,0)"});
  std::vector<int> x(64, 1);
  x[37] = 9;
  expect_error(launch<erri_args, err_assert_call>(erri_args{x.data(), 0}, dim3(64), dim3(32), false, true, "kassert"),
               {"kernel 'kassert'", "assertion `x[i] < 5' failed at body:2", "thread (5,0,0) of threadgroup (1,0,0)"});
  expect_error(launch<none_args, err_grid_call>(none_args{0}, dim3(64), dim3(32), true, true, "kgrid"),
               {"grid_group::sync() needs a cooperative launch", "body:1"});
  expect_error(launch<none_args, err_barrier_call>(none_args{0}, dim3(32), dim3(32), true, true, "kbar"),
               {"kernel 'kbar'", "__syncthreads at body:", "cannot complete"});
  // and the runtime carries on
  std::vector<float> xs(100, 1.0f), sums(1);
  LAUNCH_OK(launch<sum_args, block_sum_call>(sum_args{xs.data(), sums.data(), 100, 0}, dim3(100), dim3(128), true));
  CHECK(sums[0] == 100.0f, "after errors: %g", sums[0]);
}

// ---------------------------------------------------------------------------
// Kernel libraries built like the generated source (generated_kernel.cpp):
// loaded with dlopen, run through their exported kk_launch.

typedef int (*launch_fn)(const void*, const kk_launch_desc*, char*, size_t);
struct gen_args { const float* x; float* y; float* sums; int n; kk_dim3 kk_grid; unsigned kk_shared; };

static void test_generated(const char* dir) {
  for (const char* lib : {"gen_loop.so", "gen_fiber.so", "gen_loop_early.so", "gen_both.so"}) {
    const std::string path = std::string(dir) + "/" + lib;
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    CHECK(h, "dlopen %s: %s", path.c_str(), dlerror());
    if (!h) continue;
    launch_fn fn = (launch_fn)dlsym(h, "kk_launch");
    const bool fibers = strstr(lib, "fiber") || strstr(lib, "both");
    for (int n : {1, 1000, 65537}) {
      for (unsigned block : {32u, 256u}) {
        std::vector<float> x(n), y(n, NAN);
        for (int i = 0; i < n; ++i) x[i] = float(i % 97) - 40;
        const unsigned groups = (n + block - 1) / block;
        std::vector<float> sums(groups, NAN);
        gen_args a{x.data(), y.data(), sums.data(), n, kk_dim3{unsigned(n), 1, 1}, fibers ? 4096u : 0u};
        kk_launch_desc d{kk_dim3{groups * block, 1, 1}, kk_dim3{block, 1, 1}, kk_dim3{groups, 1, 1}, fibers, lib};
        char err[1024] = {0};
        const int rc = fn(&a, &d, err, sizeof err);
        CHECK(rc == 0, "%s: %s", lib, err);
        for (int i = 0; i < n; ++i) CHECK(y[i] == 2 * x[i] + 1, "%s y[%d] = %g", lib, i, y[i]);
        if (fibers)
          for (unsigned g = 0; g < groups; ++g) {
            float s = 0;
            for (unsigned i = g * block; i < std::min<unsigned>(n, (g + 1) * block); ++i) s += x[i];
            CHECK(sums[g] == s, "%s sum %u: %g vs %g", lib, g, sums[g], s);
          }
      }
    }
  }
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (name == "indices") test_indices();
    else if (name == "reduce") test_reduce();
    else if (name == "dyn_shared") test_dyn_shared();
    else if (name == "warp_dump") warp_dump();
    else if (name == "shfl_types") test_shfl_types();
    else if (name == "atomics") test_atomics();
    else if (name == "half") test_half();
    else if (name == "math") test_math();
    else if (name == "coop") test_coop();
    else if (name == "errors") test_errors();
    else if (name.rfind("generated=", 0) == 0) test_generated(name.c_str() + 10);
    else {
      printf("unknown test %s\n", name.c_str());
      return 2;
    }
    if (g_failures) return 1;
    printf("ok %s\n", name.c_str());
  }
  return 0;
}
