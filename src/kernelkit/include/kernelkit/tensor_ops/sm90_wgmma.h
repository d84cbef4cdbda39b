// kernelkit/tensor_ops/sm90_wgmma.h: Hopper warpgroups compute a BM x BN tile of A * B on the
// tensor cores (wgmma, sm_90a), the operands staged from device memory through shared memory.
//
// The contract (what tensor_ops' matmul2d codes against; refined from the first draft: the
// Stages and Warpgroups arguments, smem_bytes and the shared-memory slices are new):
//
//   namespace kk::tops::sm90 {
//   template <int BM, int BN, class TA, class TB, class TAcc, int Stages = 3, int Warpgroups = 1>
//   struct warpgroup_gemm {
//     static constexpr bool supported;       // false where this path cannot take the types/shape
//     static constexpr int acc_per_thread;   // (BM / Warpgroups) * BN / 128 per thread
//     static constexpr int smem_bytes;       // dynamic shared memory one tile group's run needs
//     __device__ static void coord(int i, int thread_in_group, int& row, int& col);
//     __device__ static void run(TAcc (&acc)[acc_per_thread], const TA* A, long a_rs, long a_cs,
//                                const TB* B, long b_rs, long b_cs, int m_valid, int n_valid,
//                                int K, bool accumulate);
//     __device__ static void run_scaled(..., same as run, const block_scales& scales);  // fp8 only
//   };
//   }
//
// - A group of Warpgroups consecutive warpgroups (128 threads each, warps 4w..4w+3) calls run
//   together, every thread of them; warpgroup g of the group computes rows
//   [g * BM / Warpgroups, (g + 1) * BM / Warpgroups) of the tile, and the group shares each
//   stage of B. Warpgroups = 1 is the talk's threadgroup of 128 threads (execution_simdgroups<4>);
//   2 is a 256-thread threadgroup (execution_simdgroups<8>). Groups of one threadgroup are
//   independent: group j synchronises on its own named barrier (group_barrier: groups of
//   one and two warpgroups never share one); a two-warpgroup run starts at its barrier (its warpgroups' earlier runs are done with the
//   slice before either stages into it).
//   Every thread of a group must reach run: dispatch whole threadgroups (a Metal grid that is
//   not a multiple of the threadgroup ends the last group's extra threads before the body,
//   and its barriers would then wait for ever).
// - acc (+)= A[0:m_valid, 0:K] * B[0:K, 0:n_valid]: element (m, k) of A is A[m * a_rs + k * a_cs],
//   (k, n) of B is B[k * b_rs + n * b_cs], any strides; rows >= m_valid, cols >= n_valid and
//   k >= K read as zero. accumulate = false starts from zero.
// - coord(i, t, row, col): accumulator i of thread t (0 .. 128 * Warpgroups - 1 in the group)
//   holds tile element (row, col). Accumulators 2j and 2j + 1 are (row, col) and (row, col + 1),
//   so an epilogue stores pairs. Index acc only with compile-time constants (unrolled loops).
// - Shared memory: group j uses bytes [j * smem_bytes, (j + 1) * smem_bytes) of the kernel's
//   dynamic shared memory (cuda_kernel's shared_memory=, or the launcher's carve-out for
//   tensor-op kernels); a body's own dynamic shared memory lies past the groups' slices. run
//   traps (the launch fails) when %dynamic_smem_size is smaller. smem_bytes =
//   Stages * (BM + BN) * 128 + 1536; run_scaled's slices are scaled_smem_bytes, 2 scale_slot_bytes
//   more for its scales (two K tiles' worth, as floats).
// - Global memory: 1 MiB of tensor maps per loaded module (__device__ arrays; a slot per group
//   in flight, claimed per SM with an atomic and released at the end of run).
// - A function call anywhere in the kernel (printf, a non-inlined function) makes ptxas
//   serialise the wgmmas (warning C7510): keep calls out of kernels that use run.
// - run_scaled: MXFP8, acc (+)= sum over K of A(m, k) sa(m, k / 32) * B(k, n) sb(n, k / 32), the
//   scales ue8m0 bytes (2^(s - 127); 0 is 2^-127, 255 NaN) of block_scales. Each 32-element block
//   of K is one wgmma (k32) into a second set of accumulators, added to acc times its two scales
//   (exact: the scales are powers of two), which are staged as floats in shared memory a K tile
//   ahead; fp8 types, K-major both.
// - Types (TA, TB -> TAcc): __half / __half, __nv_bfloat16 / __nv_bfloat16 -> float (HGMMA);
//   __nv_fp8_e4m3 / __nv_fp8_e5m2 in any pair -> float (QGMMA); float / float -> float as tf32;
//   signed char / signed char -> int (IGMMA). Specialise wgmma_type<T> to map another type.
// - Shapes: BM / Warpgroups a multiple of 64, BM <= 256, BN in {64, 128, 192, 256}. Registers:
//   acc_per_thread + ~100 must stay under 255: 128 accumulators (128x128 a warpgroup) for 16-bit
//   types, whose run holds four mainloops (either majorness of A and B), up to 192 (128x192)
//   for fp8 / tf32 / int8 (K-major only, one mainloop). Check ptxas's spill report.
//
// Decisions (bench/notes/sm90_wgmma.md has the measurements, H100):
// (a) Staging: TMA (cp.async.bulk.tensor, 128-byte swizzle, zero fill past the edges) with full
//     and empty mbarriers, Stages deep, one thread issuing, one MMA group in flight. The
//     CUtensorMaps are made on the device, as Triton's device-side descriptors are: zeroed in
//     shared memory, every field set by tensormap.replace from run's pointer, sizes and strides,
//     copied to a global slot (tensormap.cp_fenceproxy); no host involvement. Operands TMA
//     cannot take (contiguous side not stride 1, rows or base not 16-byte aligned) go through
//     cp.async (16-byte LDGSTS with zero fill, or element by element) into the same layout.
//     Measured at 8192^3 bf16, 128x128: TMA 527 TFLOP/s, cp.async 361. Runs of fewer than 16
//     K tiles take cp.async: the maps' set-up (~2 us) would cost more than TMA saves them.
// (b) Operand majorness: 16-bit operands whose M (N) stride is 1 are staged MN-major and read
//     with wgmma's transpose bit, so row-major B (K x N) costs nothing; fp8, tf32 and int8 have
//     no transpose in wgmma: a non-K-major operand of those types is transposed by the
//     element-wise path (correct, slow: store fp8 weights K-major, as torch._scaled_mm wants).
// (c) Tiles: the bound is operand bytes from L2 into the SMs (~8.2 TB/s measured): a tile reads
//     (BM + BN) * 2 bytes per 2 * BM * BN FLOP per K element. One warpgroup's 128x128 (64
//     FLOP/byte) caps bf16 at ~530 TFLOP/s, ~68% of cuBLAS; two warpgroups sharing B in
//     256x128 (85 FLOP/byte) reach 644. With one warpgroup, Stages = 3 fits two threadgroups an
//     SM (2 x 97.5 KB), Stages = 4 one; both measure the same. fp8: 128x192, Stages = 4.
// (d) Rasterisation is the caller's: bands of 16 tile rows walked down their columns (the
//     benchmark's body) keep the threadgroups in flight on shared rows of A and columns of B.
#pragma once

#if defined(KK_TARGET_CUDA)
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

// The dynamic shared memory a kernel's warpgroup runs (or persistent_gemm) need, as a symbol the
// CUDA backend finds in the cubin (backends/cuda.py tensor_ops_shared): it launches the kernel
// with that much, past its own.
template <int Bytes> __device__ int kk_tops_dynamic_smem = Bytes;

namespace kk::tops::sm90 {

namespace detail {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr bool arch_ok = true;
#else
constexpr bool arch_ok = false;  // wgmma exists only in the sm_90a target
#endif

template <class A, class B> constexpr bool same = false;
template <class A> constexpr bool same<A, A> = true;

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; bytes past `src_bytes` (0..16) are zero-filled.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// cp_async_wait<N> for an N known once the caller's loop is unrolled (0 .. 7).
__device__ __forceinline__ void cp_async_wait_dynamic(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    default: cp_async_wait<7>(); break;
  }
}
// Shared memory written through the generic proxy (cp.async, st.shared), read next by wgmma
// (the async proxy): each writer fences before the barrier.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// The named barrier of group j of WG warpgroups: 1 + j for one warpgroup (at most 8 groups),
// 9 + j for two (at most 4), so that groups of the two widths never share one (0 is __syncthreads).
constexpr int group_barrier(int wg, int group) { return (wg == 1 ? 1 : 9) + group; }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across the asynchronous MMAs.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(int& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(unsigned& r) { asm volatile("" : "+r"(r)::"memory"); }

// A shared-memory matrix descriptor for the 128-byte swizzle: start, leading and stride byte
// offsets (PTX ISA, "Matrix Descriptor Format"), each in 16-byte units.
__device__ __forceinline__ unsigned long long descriptor(unsigned addr, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
         ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);
}

// mbarriers (shared::cta) and the bulk tensor copy (TMA) that completes on them.
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_inval(unsigned bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// `count` arrivals at once (a warp that frees a stage for others that never touch it)
__device__ __forceinline__ void mbar_arrive_count(unsigned bar, unsigned count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// The same by the threads where `pred` holds, without a branch (a branch between a wgmma's issue
// and its wait makes ptxas wait for it there).
__device__ __forceinline__ void mbar_arrive_if(unsigned bar, bool pred) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n"
               ::"r"(bar), "r"(int(pred)) : "memory");
}
// A ring of n full / empty barrier pairs, each 8 bytes after the last: full completes on
// `fillers` arrivals (one with its transaction bytes), empty on `releasers` (one a consumer warp);
// and their invalidation once the kernel is done with them.
__device__ __forceinline__ void ring_init(unsigned full, unsigned empty, int n, unsigned releasers,
                                          unsigned fillers = 1) {
#pragma unroll
  for (int s = 0; s < n; ++s) {
    mbar_init(full + 8 * s, fillers);
    mbar_init(empty + 8 * s, releasers);
  }
}
__device__ __forceinline__ void ring_inval(unsigned full, unsigned empty, int n) {
#pragma unroll
  for (int s = 0; s < n; ++s) {
    mbar_inval(full + 8 * s);
    mbar_inval(empty + 8 * s);
  }
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nKK_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra KK_WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void tma_load_2d(unsigned dst, const void* map, int c0, int c1, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
__device__ __forceinline__ void tma_load_3d(unsigned dst, const void* map, int c0, int c1, int c2, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}
// A box of a 3-D map into L2 only (no shared memory, no barrier)
__device__ __forceinline__ void tma_prefetch_3d(const void* map, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];\n"
               ::"l"(map), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
__device__ __forceinline__ void tma_load_4d(unsigned dst, const void* map, int c0, int c1, int c2, int c3,
                                            unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
      ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}
// Shared -> global through a map (TMA store), in the issuing thread's bulk group; the group's
// reads of shared memory are waited for by bulk_wait_read, its writes by bulk_wait.
__device__ __forceinline__ void tma_store_3d(const void* map, unsigned src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n"
               ::"l"(map), "r"(src), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
__device__ __forceinline__ void tma_store_4d(const void* map, unsigned src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
               ::"l"(map), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
// 1-D bulk copies (bytes a multiple of 16, addresses 16-byte aligned): global -> shared,
// completing on an mbarrier; shared floats added into global ones, in the bulk group.
__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
// (by the threads where `pred` holds, without a branch: see mbar_arrive_if)
__device__ __forceinline__ void bulk_reduce_add_if(float* dst, unsigned src, unsigned bytes, bool pred) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %3, 0;\n"
               "@p cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n}\n"
               ::"l"(dst), "r"(src), "r"(bytes), "r"(int(pred)) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// (bulk_wait_read<N>: all but the N most recent groups have read their shared memory)
template <int N = 0> __device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Tensor maps made on the device (as Triton's device-side descriptors): zeroed in shared memory,
// every field of a 2-D tiled map set by tensormap.replace, then copied to global memory, where
// TMA reads them. Each group in a run holds one slot of two maps, claimed per SM (an SM id past
// max_sms takes the cp.async path).
constexpr int max_sms = 256, slots_per_sm = 16;
__device__ __align__(128) unsigned char tensor_maps[max_sms * slots_per_sm][2][128];
__device__ unsigned tensor_map_slots[max_sms];

__device__ __forceinline__ int claim_slot(unsigned sm) {
  for (;;) {
    const unsigned free = ~*reinterpret_cast<volatile unsigned*>(&tensor_map_slots[sm]) & ((1u << slots_per_sm) - 1);
    const unsigned bit = free & (0u - free);
    if (bit && !(atomicOr(&tensor_map_slots[sm], bit) & bit)) return __ffs(bit) - 1;
  }
}
__device__ __forceinline__ void release_slot(unsigned sm, int slot) { atomicAnd(&tensor_map_slots[sm], ~(1u << slot)); }

// A 2-D (3-D: dim2 > 0; 4-D: dim3 > 0 too) map, dims innermost first, 128-byte swizzle, zero
// fill: ElemType 0/1/2 = 1/2/4-byte. The outer dims (batches, heads) have boxes of one.
template <int ElemType>
__device__ __forceinline__ void make_map(unsigned map, const void* base, unsigned dim0, unsigned dim1,
                                         unsigned long long stride1_bytes, unsigned box0, unsigned box1,
                                         unsigned dim2 = 0, unsigned long long stride2_bytes = 0,
                                         unsigned dim3 = 0, unsigned long long stride3_bytes = 0) {
  asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;\n" ::"r"(map),
               "l"(base) : "memory");
  if (dim3) {
    asm volatile("tensormap.replace.tile.rank.shared::cta.b1024.b32 [%0], 3;\n" ::"r"(map) : "memory");  // rank - 1
    asm volatile("tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [%0], 3, 1;\n" ::"r"(map) : "memory");
    asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 3, %1;\n" ::"r"(map), "r"(dim3) : "memory");
    asm volatile("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], 2, %1;\n" ::"r"(map),
                 "l"(stride3_bytes) : "memory");
    asm volatile("tensormap.replace.tile.element_stride.shared::cta.b1024.b32 [%0], 3, 1;\n" ::"r"(map) : "memory");
  } else if (dim2) {
    asm volatile("tensormap.replace.tile.rank.shared::cta.b1024.b32 [%0], 2;\n" ::"r"(map) : "memory");
  } else {
    asm volatile("tensormap.replace.tile.rank.shared::cta.b1024.b32 [%0], 1;\n" ::"r"(map) : "memory");
  }
  if (dim2) {
    asm volatile("tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [%0], 2, 1;\n" ::"r"(map) : "memory");
    asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 2, %1;\n" ::"r"(map), "r"(dim2) : "memory");
    asm volatile("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], 1, %1;\n" ::"r"(map),
                 "l"(stride2_bytes) : "memory");
    asm volatile("tensormap.replace.tile.element_stride.shared::cta.b1024.b32 [%0], 2, 1;\n" ::"r"(map) : "memory");
  }
  asm volatile("tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [%0], 0, %1;\n" ::"r"(map), "r"(box0) : "memory");
  asm volatile("tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [%0], 1, %1;\n" ::"r"(map), "r"(box1) : "memory");
  asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 0, %1;\n" ::"r"(map), "r"(dim0) : "memory");
  asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 1, %1;\n" ::"r"(map), "r"(dim1) : "memory");
  asm volatile("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], 0, %1;\n" ::"r"(map),
               "l"(stride1_bytes) : "memory");
  asm volatile("tensormap.replace.tile.element_stride.shared::cta.b1024.b32 [%0], 0, 1;\n" ::"r"(map) : "memory");
  asm volatile("tensormap.replace.tile.element_stride.shared::cta.b1024.b32 [%0], 1, 1;\n" ::"r"(map) : "memory");
  asm volatile("tensormap.replace.tile.elemtype.shared::cta.b1024.b32 [%0], %1;\n" ::"r"(map), "n"(ElemType) : "memory");
  asm volatile("tensormap.replace.tile.interleave_layout.shared::cta.b1024.b32 [%0], 0;\n" ::"r"(map) : "memory");
  asm volatile("tensormap.replace.tile.swizzle_mode.shared::cta.b1024.b32 [%0], 3;\n" ::"r"(map) : "memory");
  asm volatile("tensormap.replace.tile.fill_mode.shared::cta.b1024.b32 [%0], 0;\n" ::"r"(map) : "memory");
}
// Whole warp: the map built in shared memory to global memory, visible to TMA.
__device__ __forceinline__ void publish_map(void* global, unsigned map) {
  asm volatile("tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%0], [%1], 128;\n"
               ::"l"(global), "r"(map) : "memory");
}
__device__ __forceinline__ void acquire_map(const void* global) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(global) : "memory");
}

// Two floats as a pair of T (__half or __nv_bfloat16) in 32 bits, rounded to nearest; and back.
template <class T> __device__ __forceinline__ unsigned pack_pair(float x, float y) {
  if constexpr (same<T, __half>) {
    const __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<const unsigned*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const unsigned*>(&v);
  }
}
template <class T> __device__ __forceinline__ void unpack_pair(unsigned u, float& x, float& y) {
  if constexpr (same<T, __half>) {
    const __half2 v = *reinterpret_cast<const __half2*>(&u);
    x = __low2float(v), y = __high2float(v);
  } else {
    const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&u);
    x = __low2float(v), y = __high2float(v);
  }
}

// What the persistent, warp-specialised kernels (persistent_gemm, attention_forward) set up the
// same way. Their dynamic shared memory, 1024-byte aligned (the 128-byte swizzle's atoms): named
// in the cubin for the launcher (kk_tops_dynamic_smem); a launch with less, or another
// threadgroup size, traps.
template <int SmemBytes, int Threads>
__device__ __forceinline__ unsigned persistent_smem() {
  asm volatile("" ::"l"(&kk_tops_dynamic_smem<SmemBytes>));
  extern __shared__ __align__(16) unsigned char kk_sm90_dynamic_smem[];
  unsigned dynamic;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic));
  if (dynamic < unsigned(SmemBytes) || blockDim.x * blockDim.y * blockDim.z != unsigned(Threads)) __trap();
  return (smem_u32(kk_sm90_dynamic_smem) + 1023) & ~1023u;
}
__device__ __forceinline__ unsigned current_sm() {
  unsigned sm;
  asm("mov.u32 %0, %%smid;" : "=r"(sm));
  if (sm >= unsigned(max_sms)) __trap();
  return sm;
}
// Their maps (up to four) live in two slots of map memory claimed for this SM: map m in slot
// m / 2 (map_in). One whole warp calls publish_maps: it claims the slots (their word at shared `slot_word`,
// where every thread reads it after the next __syncthreads), zeroes the maps at shared `maps`
// (128 bytes each), lets its lane 0 make them and set up the kernel's barriers (make()), and
// publishes them.
__device__ __forceinline__ void* map_in(unsigned sm, int slots, int m) {
  return tensor_maps[sm * slots_per_sm + (m < 2 ? slots & 0xff : slots >> 8)][m & 1];
}
template <int Maps, class Make>
__device__ __forceinline__ void publish_maps(unsigned sm, unsigned maps, unsigned slot_word, Make&& make) {
  const int lane = int(threadIdx.x & 31);
  int slots = 0;
  if (lane == 0) {
    slots = claim_slot(sm) | claim_slot(sm) << 8;
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(slot_word), "r"(slots) : "memory");
  }
#pragma unroll
  for (int m = 0; m < Maps; ++m) asm volatile("st.shared.u32 [%0], 0;\n" ::"r"(maps + 128 * m + 4 * lane) : "memory");
  __syncwarp();
  if (lane == 0) {
    make();
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncwarp();
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(slots) : "r"(slot_word) : "memory");
#pragma unroll
  for (int m = 0; m < Maps; ++m) publish_map(map_in(sm, slots, m), maps + 128 * m);
}
__device__ __forceinline__ int read_slots(unsigned slot_word) {
  int slots;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(slots) : "r"(slot_word) : "memory");
  return slots;
}
__device__ __forceinline__ void release_slots(unsigned sm, int slots) {
  release_slot(sm, slots & 0xff);
  release_slot(sm, slots >> 8);
}

// The asm operand lists for wgmma m64nNk*, N/2 accumulators (generated; %i numbering).
#define KK_WG_F(x) "+f"(x)
#define KK_WG_I(x) "+r"(x)
#define KK_WG_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define KK_WG_X64 "%32, %33"
#define KK_WG_S64 "%34"
#define KK_WG_T64 "%35, %36"
#define KK_WG_OPS64(C, d) \
  C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), \
  C(d[8]), C(d[9]), C(d[10]), C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15]), \
  C(d[16]), C(d[17]), C(d[18]), C(d[19]), C(d[20]), C(d[21]), C(d[22]), C(d[23]), \
  C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]), C(d[31])
#define KK_WG_D128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define KK_WG_X128 "%64, %65"
#define KK_WG_S128 "%66"
#define KK_WG_T128 "%67, %68"
#define KK_WG_OPS128(C, d) \
  C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), \
  C(d[8]), C(d[9]), C(d[10]), C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15]), \
  C(d[16]), C(d[17]), C(d[18]), C(d[19]), C(d[20]), C(d[21]), C(d[22]), C(d[23]), \
  C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]), C(d[31]), \
  C(d[32]), C(d[33]), C(d[34]), C(d[35]), C(d[36]), C(d[37]), C(d[38]), C(d[39]), \
  C(d[40]), C(d[41]), C(d[42]), C(d[43]), C(d[44]), C(d[45]), C(d[46]), C(d[47]), \
  C(d[48]), C(d[49]), C(d[50]), C(d[51]), C(d[52]), C(d[53]), C(d[54]), C(d[55]), \
  C(d[56]), C(d[57]), C(d[58]), C(d[59]), C(d[60]), C(d[61]), C(d[62]), C(d[63])
#define KK_WG_D192 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}"
#define KK_WG_X192 "%96, %97"
#define KK_WG_S192 "%98"
#define KK_WG_T192 "%99, %100"
#define KK_WG_OPS192(C, d) \
  C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), \
  C(d[8]), C(d[9]), C(d[10]), C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15]), \
  C(d[16]), C(d[17]), C(d[18]), C(d[19]), C(d[20]), C(d[21]), C(d[22]), C(d[23]), \
  C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]), C(d[31]), \
  C(d[32]), C(d[33]), C(d[34]), C(d[35]), C(d[36]), C(d[37]), C(d[38]), C(d[39]), \
  C(d[40]), C(d[41]), C(d[42]), C(d[43]), C(d[44]), C(d[45]), C(d[46]), C(d[47]), \
  C(d[48]), C(d[49]), C(d[50]), C(d[51]), C(d[52]), C(d[53]), C(d[54]), C(d[55]), \
  C(d[56]), C(d[57]), C(d[58]), C(d[59]), C(d[60]), C(d[61]), C(d[62]), C(d[63]), \
  C(d[64]), C(d[65]), C(d[66]), C(d[67]), C(d[68]), C(d[69]), C(d[70]), C(d[71]), \
  C(d[72]), C(d[73]), C(d[74]), C(d[75]), C(d[76]), C(d[77]), C(d[78]), C(d[79]), \
  C(d[80]), C(d[81]), C(d[82]), C(d[83]), C(d[84]), C(d[85]), C(d[86]), C(d[87]), \
  C(d[88]), C(d[89]), C(d[90]), C(d[91]), C(d[92]), C(d[93]), C(d[94]), C(d[95])
#define KK_WG_D256 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define KK_WG_X256 "%128, %129"
#define KK_WG_S256 "%130"
#define KK_WG_T256 "%131, %132"
#define KK_WG_OPS256(C, d) \
  C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), \
  C(d[8]), C(d[9]), C(d[10]), C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15]), \
  C(d[16]), C(d[17]), C(d[18]), C(d[19]), C(d[20]), C(d[21]), C(d[22]), C(d[23]), \
  C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]), C(d[31]), \
  C(d[32]), C(d[33]), C(d[34]), C(d[35]), C(d[36]), C(d[37]), C(d[38]), C(d[39]), \
  C(d[40]), C(d[41]), C(d[42]), C(d[43]), C(d[44]), C(d[45]), C(d[46]), C(d[47]), \
  C(d[48]), C(d[49]), C(d[50]), C(d[51]), C(d[52]), C(d[53]), C(d[54]), C(d[55]), \
  C(d[56]), C(d[57]), C(d[58]), C(d[59]), C(d[60]), C(d[61]), C(d[62]), C(d[63]), \
  C(d[64]), C(d[65]), C(d[66]), C(d[67]), C(d[68]), C(d[69]), C(d[70]), C(d[71]), \
  C(d[72]), C(d[73]), C(d[74]), C(d[75]), C(d[76]), C(d[77]), C(d[78]), C(d[79]), \
  C(d[80]), C(d[81]), C(d[82]), C(d[83]), C(d[84]), C(d[85]), C(d[86]), C(d[87]), \
  C(d[88]), C(d[89]), C(d[90]), C(d[91]), C(d[92]), C(d[93]), C(d[94]), C(d[95]), \
  C(d[96]), C(d[97]), C(d[98]), C(d[99]), C(d[100]), C(d[101]), C(d[102]), C(d[103]), \
  C(d[104]), C(d[105]), C(d[106]), C(d[107]), C(d[108]), C(d[109]), C(d[110]), C(d[111]), \
  C(d[112]), C(d[113]), C(d[114]), C(d[115]), C(d[116]), C(d[117]), C(d[118]), C(d[119]), \
  C(d[120]), C(d[121]), C(d[122]), C(d[123]), C(d[124]), C(d[125]), C(d[126]), C(d[127])

#define KK_WG_PRED(N) "{\n.reg .pred p;\nsetp.ne.b32 p, " KK_WG_S##N ", 0;\n"
#define KK_WG_MMA16(N, TYPES)                                                                      \
  asm volatile(KK_WG_PRED(N) "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPES " " KK_WG_D##N \
               ", " KK_WG_X##N ", p, 1, 1, " KK_WG_T##N ";\n}\n"                                  \
               : KK_WG_OPS##N(KK_WG_F, d)                                                         \
               : "l"(da), "l"(db), "r"(scale_d), "n"(TransA), "n"(TransB))
#define KK_WG_MMA(N, K, TYPES)                                                                      \
  asm volatile(KK_WG_PRED(N) "wgmma.mma_async.sync.aligned.m64n" #N "k" #K "." TYPES " " KK_WG_D##N \
               ", " KK_WG_X##N ", p, 1, 1;\n}\n"                                                    \
               : KK_WG_OPS##N(KK_WG_F, d)                                                           \
               : "l"(da), "l"(db), "r"(scale_d))
#define KK_WG_MMA_S8(N)                                                                            \
  asm volatile(KK_WG_PRED(N) "wgmma.mma_async.sync.aligned.m64n" #N "k32.s32.s8.s8 " KK_WG_D##N    \
               ", " KK_WG_X##N ", p;\n}\n"                                                         \
               : KK_WG_OPS##N(KK_WG_I, d)                                                          \
               : "l"(da), "l"(db), "r"(scale_d))
// A in registers (RS, 16-bit types): after d, a's four registers, b's descriptor, scale-d, trans-b.
#define KK_WG_RA64 "{%32, %33, %34, %35}, %36"
#define KK_WG_RS64 "%37"
#define KK_WG_RT64 "%38"
#define KK_WG_RA128 "{%64, %65, %66, %67}, %68"
#define KK_WG_RS128 "%69"
#define KK_WG_RT128 "%70"
#define KK_WG_RA192 "{%96, %97, %98, %99}, %100"
#define KK_WG_RS192 "%101"
#define KK_WG_RT192 "%102"
#define KK_WG_RA256 "{%128, %129, %130, %131}, %132"
#define KK_WG_RS256 "%133"
#define KK_WG_RT256 "%134"
#define KK_WG_MMA16_RS(N, TYPES)                                                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " KK_WG_RS##N ", 0;\n"                           \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPES " " KK_WG_D##N ", " KK_WG_RA##N \
               ", p, 1, 1, " KK_WG_RT##N ";\n}\n"                                                  \
               : KK_WG_OPS##N(KK_WG_F, d)                                                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TransB))
#define KK_WG_CASE_RS(N)                                                                           \
  if constexpr (BN == N) {                                                                         \
    if constexpr (A == F16) KK_WG_MMA16_RS(N, "f16.f16");                                          \
    else KK_WG_MMA16_RS(N, "bf16.bf16");                                                           \
  }
#define KK_WG_CASE(N)                                                                              \
  if constexpr (BN == N) {                                                                         \
    if constexpr (A == F16) KK_WG_MMA16(N, "f16.f16");                                             \
    else if constexpr (A == BF16) KK_WG_MMA16(N, "bf16.bf16");                                     \
    else if constexpr (A == E4M3 && B == E4M3) KK_WG_MMA(N, 32, "f32.e4m3.e4m3");                  \
    else if constexpr (A == E4M3 && B == E5M2) KK_WG_MMA(N, 32, "f32.e4m3.e5m2");                  \
    else if constexpr (A == E5M2 && B == E4M3) KK_WG_MMA(N, 32, "f32.e5m2.e4m3");                  \
    else if constexpr (A == E5M2 && B == E5M2) KK_WG_MMA(N, 32, "f32.e5m2.e5m2");                  \
    else if constexpr (A == TF32) KK_WG_MMA(N, 8, "f32.tf32.tf32");                                \
    else KK_WG_MMA_S8(N);                                                                          \
  }

}  // namespace detail

// wgmma's operand types; a type maps to one through wgmma_type<T>::id.
enum : int { F16, BF16, E4M3, E5M2, TF32, S8 };
template <class T> struct wgmma_type { static constexpr int id = -1; };
template <> struct wgmma_type<__half> { static constexpr int id = F16; };
template <> struct wgmma_type<__nv_bfloat16> { static constexpr int id = BF16; };
template <> struct wgmma_type<__nv_fp8_e4m3> { static constexpr int id = E4M3; };
template <> struct wgmma_type<__nv_fp8_e5m2> { static constexpr int id = E5M2; };
template <> struct wgmma_type<float> { static constexpr int id = TF32; };
template <> struct wgmma_type<signed char> { static constexpr int id = S8; };

namespace detail {

// One wgmma.mma_async m64nBNk(32 bytes): this thread's BN/2 accumulators d (+)= A * B, A and B
// given by descriptors; TransA/TransB: the operand is MN-major (16-bit types only).
template <int BN, int A, int B, int TransA, int TransB, class TAcc>
__device__ __forceinline__ void mma(TAcc* d, unsigned long long da, unsigned long long db, int scale_d) {
  KK_WG_CASE(64) KK_WG_CASE(128) KK_WG_CASE(192) KK_WG_CASE(256)
}

// The same with A from registers (16-bit types): a, this thread's four A registers for the k16
// step, in the m16n8k16 A fragment's order (rows g, g + 8; columns 2t, 2t + 8).
template <int BN, int A, int TransB>
__device__ __forceinline__ void mma_rs(float* d, const unsigned (&a)[4], unsigned long long db, int scale_d) {
  KK_WG_CASE_RS(64) KK_WG_CASE_RS(128) KK_WG_CASE_RS(192) KK_WG_CASE_RS(256)
}

template <int Bytes> struct bits;
template <> struct bits<1> { using type = unsigned char; };
template <> struct bits<2> { using type = unsigned short; };
template <> struct bits<4> { using type = unsigned; };

__device__ __forceinline__ void st_shared(unsigned addr, unsigned char v) {
  asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(addr), "h"((unsigned short)v) : "memory");
}
__device__ __forceinline__ void st_shared(unsigned addr, unsigned short v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(v) : "memory");
}
__device__ __forceinline__ void st_shared(unsigned addr, unsigned v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// One operand's tile of a stage: R rows of M (or N) by 128 bytes of K, in the layout wgmma
// reads with the 128-byte swizzle. K-major: R rows of 128 bytes (8-row atoms of 1024 bytes).
// MN-major: R / 64 slabs, each 64 K-rows of 128 bytes (64 M or N elements). Within each
// 1024-byte atom, 16-byte chunk c of row r sits at chunk c ^ (r % 8).
template <class T, int R, bool KMajor, int Threads> struct stager {
  static constexpr int size = sizeof(T);
  static constexpr int n_outer = KMajor ? R : 128 / size;   // rows of 128 bytes per slab
  static constexpr int inner = KMajor ? 128 / size : R;     // elements along the contiguous side
  static constexpr int chunks = inner * size / 16;          // 16-byte chunks per row
  static constexpr int slab = n_outer * 128;                // bytes per slab
  static constexpr int bytes = R * 128;                     // bytes per stage
  static_assert(n_outer * chunks % Threads == 0, "each thread copies the same number of chunks");

  const T* p;
  long os, is;  // strides along the outer (row) and inner (contiguous) sides of the tile
  int mn_valid;
  bool vec;     // 16-byte copies: inner stride 1, rows and base 16-byte aligned

  __device__ stager(const T* p_, long mn_stride, long k_stride, int mn_valid_)
      : p(p_), os(KMajor ? mn_stride : k_stride), is(KMajor ? k_stride : mn_stride), mn_valid(mn_valid_) {
    vec = is == 1 && ((os * size) & 15) == 0 && (reinterpret_cast<unsigned long long>(p) & 15) == 0;
  }

  __device__ static unsigned offset(int outer, int inner_byte) {
    return (inner_byte >> 7) * slab + outer * 128 + ((((inner_byte >> 4) & 7) ^ (outer & 7)) << 4) +
           (inner_byte & 15);
  }

  // Stages K elements [k0, k0 + 128 / size) at shared address dst; t: thread 0..Threads-1.
  __device__ void load(unsigned dst, int k0, int K, int t) const {
    const int k_valid = K - k0;
    const int outer_valid = KMajor ? mn_valid : k_valid, inner_valid = KMajor ? k_valid : mn_valid;
    const T* base = p + (long)k0 * (KMajor ? is : os);
    // A whole tile (the common case) where a pass of the threads covers whole swizzle atoms: no
    // bounds a chunk. Pass n copies row o0 + n * step, the same chunk: its source moves by step
    // rows, its destination by step * 128 bytes (step a multiple of 8: the same swizzle).
    constexpr bool passes = Threads % chunks == 0 && (Threads / chunks) % 8 == 0;
    if (passes && vec && outer_valid >= n_outer && inner_valid >= inner) {
      constexpr int E = 16 / size, step = passes ? Threads / chunks : 8;
      const int o0 = int(unsigned(t) / chunks), c = int(unsigned(t) % chunks);
      const T* src = base + (long)o0 * os + c * E;
      const unsigned d0 = dst + offset(o0, c * 16);
#pragma unroll
      for (int n = 0; n < n_outer / step; ++n) cp_async16(d0 + n * step * 128, src + (long)n * step * os, 16);
    } else if (vec) {
      constexpr int E = 16 / size;
#pragma unroll
      for (int n = 0; n < n_outer * chunks / Threads; ++n) {
        const int idx = t + Threads * n, o = idx / chunks, c = idx % chunks;
        const int left = inner_valid - c * E;
        const int nbytes = o >= outer_valid ? 0 : left >= E ? 16 : left > 0 ? left * size : 0;
        cp_async16(dst + offset(o, c * 16), nbytes ? base + (long)o * os + c * E : p, nbytes);
      }
    } else {
      using U = typename bits<size>::type;
      const U* q = reinterpret_cast<const U*>(base);
#pragma unroll 4
      for (int n = 0; n < n_outer * inner / Threads; ++n) {
        const int e = t + Threads * n, o = e / inner, i = e % inner;
        st_shared(dst + offset(o, i * size), o < outer_valid && i < inner_valid ? q[o * os + i * is] : U(0));
      }
    }
  }

  // TMA takes the operand: contiguous side stride 1, rows 16-byte aligned (vec), sizes in range.
  __device__ bool tma_ok(int K) const {
    return vec && mn_valid > 0 && K > 0 && os * size < (1ll << 40);
  }
  // The map of this operand: K-major, boxes of 128 bytes of K by R rows; MN-major, 64 M (N)
  // by 64 K-rows, R / 64 of them a stage.
  __device__ void make(unsigned map, int K) const {
    make_map<size == 1 ? 0 : size == 2 ? 1 : 2>(map, p, KMajor ? K : mn_valid, KMajor ? mn_valid : K, os * size,
                                                 128 / size, KMajor ? R : 128 / size);
  }
  __device__ static void issue(unsigned dst, const void* map, int k0, unsigned bar) {
    if constexpr (KMajor) {
      tma_load_2d(dst, map, k0, 0, bar);
    } else {
#pragma unroll
      for (int j = 0; j < R / 64; ++j) tma_load_2d(dst + j * slab, map, 64 * j, k0, bar);
    }
  }
  // The same from a 3-D map (a batch of matrices, persistent_gemm's): the tile's rows (columns)
  // from mn0, of matrix `batch`.
  __device__ static void issue(unsigned dst, const void* map, int k0, int mn0, int batch, unsigned bar) {
    if constexpr (KMajor) {
      tma_load_3d(dst, map, k0, mn0, batch, bar);
    } else {
#pragma unroll
      for (int j = 0; j < R / 64; ++j) tma_load_3d(dst + j * slab, map, mn0 + 64 * j, k0, batch, bar);
    }
  }

  // The descriptor of the 64-row (A) or whole (B) block `block` at K step kk (32 bytes of K).
  __device__ static unsigned long long desc(unsigned tile, int block, int kk) {
    return descriptor(tile, KMajor ? 16 : slab, 1024) + (offset_of(block, kk) >> 4);
  }
  // Bytes from a stage's start to block `block` at K step kk (32 bytes of K; MN-major: 16 K-rows).
  // A descriptor's start field is the address / 16, so a stage's descriptors are one made at its
  // start plus constants (the stages lie below 256 KB: the field does not overflow).
  static constexpr unsigned offset_of(int block, int kk) {
    return KMajor ? unsigned(block * 64 * 128 + kk * 32) : unsigned(block * slab + kk * 16 * 128);
  }
};

}  // namespace detail

// MXFP8 block scales of a scaled run: the scale of A's (m, k) is a[m * a_rs + k / 32], of B's
// (k, n) b[n * b_rs + k / 32], for k / 32 < blocks (ue8m0 bytes).
struct block_scales {
  const unsigned char* a;
  long a_rs;
  const unsigned char* b;
  long b_rs;
  int blocks;
};

namespace detail {
// Scale bytes kb0 .. kb0 + 3 of a row (or column) as one word, byte j for block kb0 + j; 0x7f
// (a scale of 1) for blocks past `blocks` and for rows past the tile's (their products are zero
// or never stored).
__device__ __forceinline__ unsigned scale_word(const unsigned char* row, bool valid, int kb0, int blocks, bool words) {
  if (!valid) return 0x7f7f7f7fu;
  if (words && kb0 + 4 <= blocks) return __ldg(reinterpret_cast<const unsigned*>(row + kb0));
  unsigned w = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) w |= unsigned(kb0 + j < blocks ? __ldg(row + kb0 + j) : 0x7f) << (8 * j);
  return w;
}
// A ue8m0 byte as the float 2^(s - 127), exactly: its bits are the exponent field, except 0
// (2^-127, subnormal) and 255 (NaN).
__device__ __forceinline__ unsigned scale_bits(unsigned s) {
  return s == 0 ? 0x00400000u : s == 255 ? 0x7fc00000u : s << 23;
}
// A word's 4 scales (scale_word) as floats into shared memory, block b at dst + b * stride.
__device__ __forceinline__ void store_scales(unsigned dst, unsigned stride, unsigned w) {
#pragma unroll
  for (int b = 0; b < 4; ++b) st_shared(dst + b * stride, scale_bits((w >> (8 * b)) & 0xff));
}
__device__ __forceinline__ void ld_shared_v4(unsigned addr, float& x, float& y, float& z, float& w) {
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(x), "=f"(y), "=f"(z), "=f"(w) : "r"(addr));
}
__device__ __forceinline__ unsigned ld_shared_u32(unsigned addr) {
  unsigned v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void ld_shared_v2(unsigned addr, float& x, float& y) {
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(x), "=f"(y) : "r"(addr));
}
__device__ __forceinline__ void st_shared_v2(unsigned addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ void st_shared_v4(unsigned addr, float x, float y, float z, float w) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
}
}  // namespace detail

template <int BM, int BN, class TA, class TB, class TAcc, int Stages = 3, int Warpgroups = 1>
struct warpgroup_gemm {
  static constexpr int WG = Warpgroups, threads = 128 * Warpgroups, rows = BM / Warpgroups;
  static constexpr int A = wgmma_type<TA>::id, B = wgmma_type<TB>::id;
  static constexpr bool is16 = (A == F16 || A == BF16) && A == B;
  static constexpr bool is8 = (A == E4M3 || A == E5M2) && (B == E4M3 || B == E5M2);
  static constexpr bool types_ok = ((is16 || is8 || (A == TF32 && B == TF32)) && detail::same<TAcc, float>) ||
                                   (A == S8 && B == S8 && detail::same<TAcc, int>);
  static constexpr bool supported = detail::arch_ok && types_ok && WG >= 1 && rows % 64 == 0 && rows > 0 &&
                                    BM <= 256 && BN % 64 == 0 && BN > 0 && BN <= 256 && Stages >= 2;
  static constexpr int acc_per_thread = rows * BN / 128;
  static constexpr int stage_bytes = (BM + BN) * 128;
  // + 1024 to align the stages to the swizzle atoms, + 512 for the mbarriers and two tensor maps
  static constexpr int smem_bytes = Stages * stage_bytes + 1024 + 512;
  // run_scaled also stages the scales of two K tiles as floats (scale_stager): A's 4 a row, and a
  // block's B columns in 4 groups of col_group floats (BN / 4 and 4 of padding, so that the 4
  // addresses a warp's 128-bit loads read lie in different banks: unpadded they conflicted 4 ways
  // and the loads took ~75% of the SM's shared-memory bandwidth, ncu, H200)
  static constexpr int col_group = BN / 4 + 4;
  static constexpr int scale_slot_bytes = BM * 16 + 4 * 16 * col_group;
  static constexpr int scaled_smem_bytes = smem_bytes + 2 * scale_slot_bytes;
  static constexpr int BK = 128 / sizeof(TA);                     // K elements per stage

  __device__ static void coord(int i, int t, int& row, int& col) {
    const int mi = i / (BN / 2), j = i % (BN / 2), w = (t >> 5) & 3, l = t & 31;
    row = (t >> 7) * rows + mi * 64 + w * 16 + (l >> 2) + 8 * ((j >> 1) & 1);
    col = (j >> 2) * 8 + (l & 3) * 2 + (j & 1);
  }

  __device__ static void run(TAcc (&acc)[acc_per_thread], const TA* A_, long a_rs, long a_cs, const TB* B_,
                             long b_rs, long b_cs, int m_valid, int n_valid, int K, bool accumulate) {
    static_assert(supported, "warpgroup_gemm: types, tile shape or target (sm_90a) not supported");
    // 16-bit operands whose M (N) stride is 1 go MN-major (wgmma transposes them); others K-major.
    const bool mn_a = is16 && a_rs == 1 && a_cs != 1, mn_b = is16 && b_cs == 1 && b_rs != 1;
    if constexpr (is16) {
      if (mn_a && mn_b) return run_as<false, false>(acc, A_, a_rs, a_cs, B_, b_rs, b_cs, m_valid, n_valid, K, accumulate);
      if (mn_a) return run_as<false, true>(acc, A_, a_rs, a_cs, B_, b_rs, b_cs, m_valid, n_valid, K, accumulate);
      if (mn_b) return run_as<true, false>(acc, A_, a_rs, a_cs, B_, b_rs, b_cs, m_valid, n_valid, K, accumulate);
    }
    run_as<true, true>(acc, A_, a_rs, a_cs, B_, b_rs, b_cs, m_valid, n_valid, K, accumulate);
  }

  __device__ static void run_scaled(TAcc (&acc)[acc_per_thread], const TA* A_, long a_rs, long a_cs, const TB* B_,
                                    long b_rs, long b_cs, int m_valid, int n_valid, int K, bool accumulate,
                                    const block_scales& scales) {
    static_assert(supported && is8, "warpgroup_gemm::run_scaled: fp8 operands (MXFP8) only");
    run_as<true, true, true>(acc, A_, a_rs, a_cs, B_, b_rs, b_cs, m_valid, n_valid, K, accumulate, &scales);
  }

  // A in registers (RS; 16-bit types): acc (+)= A * B[0:K, 0:n_valid] with A given as this
  // thread's fragments, a[mi][s] for its warpgroup's 64-row block mi and k16 step s (the
  // m16n8k16 A fragment: rows g, g + 8, columns 2t, 2t + 8 of the warp's 16 rows). K <= KS; B's
  // rows past K read as zero (A's columns past K must be zero or finite). B is staged whole,
  // ceil(KS / 64) stages of BN x 128 bytes, every stage's copies issued at once (cp.async: no
  // tensor map to make, so a run costs no set-up) and each stage's MMAs started as it lands:
  // the loop of a kernel that slides B over a long operand (attention's keys) pays one
  // operand's latency a run, hidden by the other threadgroups of the SM.
  static constexpr int rs_stages(int KS) { return (KS + BK - 1) / BK; }
  static constexpr int rs_smem_bytes(int KS) { return rs_stages(KS) * BN * 128 + 1024; }
  template <int KS>
  __device__ static void run_rs(TAcc (&acc)[acc_per_thread], const unsigned (&a)[rows / 64][KS / 16][4], const TB* B_,
                                long b_rs, long b_cs, int n_valid, int K, bool accumulate) {
    static_assert(supported && is16 && KS % 16 == 0 && KS > 0, "warpgroup_gemm::run_rs: 16-bit types, K a multiple of 16");
    if (b_cs == 1 && b_rs != 1) run_rs_as<KS, false>(acc, a, B_, b_rs, b_cs, n_valid, K, accumulate);
    else run_rs_as<KS, true>(acc, a, B_, b_rs, b_cs, n_valid, K, accumulate);
  }

 private:
  // This thread's group of WG warpgroups (t: its thread there) and the group's slice of the
  // dynamic shared memory, `bytes` long, 1024-aligned at base; barrier: the group's named barrier.
  struct group_slice {
    int t, barrier;
    unsigned base;
    __device__ explicit group_slice(int bytes) {
      const unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
      const int group = int(linear / threads);
      t = int(linear % threads);
      barrier = detail::group_barrier(WG, group);
      unsigned dynamic;
      asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic));
      // Too little shared memory would corrupt the caller's: trap (no printf: any call in the
      // kernel makes ptxas serialise every wgmma, warning C7510).
      if (dynamic < unsigned((group + 1) * bytes)) __trap();
      extern __shared__ __align__(16) unsigned char kk_sm90_dynamic_smem[];
      base = (detail::smem_u32(kk_sm90_dynamic_smem) + group * bytes + 1023) & ~1023u;
      if (WG > 1) detail::named_barrier(barrier, threads);
    }
  };

  template <int KS, bool KB>
  __device__ static void run_rs_as(TAcc (&acc)[acc_per_thread], const unsigned (&a)[rows / 64][KS / 16][4],
                                   const TB* B_, long b_rs, long b_cs, int n_valid, int K, bool accumulate) {
    using namespace detail;
    constexpr int stages = rs_stages(KS), steps = KS / 16;
    const group_slice g(rs_smem_bytes(KS));
    const int t = g.t, barrier = g.barrier;
    const unsigned base = g.base;
    const stager<TB, BN, KB, threads> sb(B_, b_cs, b_rs, n_valid);
    const unsigned long long d0 = sb.desc(base, 0, 0);  // the first stage's; the others plus constants
#pragma unroll
    for (int s = 0; s < stages; ++s) {
      sb.load(base + s * sb.bytes, s * BK, K, t);
      cp_async_commit();
    }
    if (!accumulate) {
#pragma unroll
      for (int i = 0; i < acc_per_thread; ++i) acc[i] = TAcc(0);
    }
#pragma unroll
    for (int s = 0; s < stages; ++s) {
      cp_async_wait_dynamic(stages - 1 - s);  // (a constant in the unrolled loop)
      fence_proxy_async();
      named_barrier(barrier, threads);  // every thread's copies of stage s have landed
#pragma unroll
      for (int i = 0; i < acc_per_thread; ++i) fence_operand(acc[i]);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if (s * 4 + kk < steps) {
          const unsigned long long db = d0 + ((s * sb.bytes + sb.offset_of(0, kk)) >> 4);
#pragma unroll
          for (int mi = 0; mi < rows / 64; ++mi) mma_rs<BN, A, KB ? 0 : 1>(acc + mi * (BN / 2), a[mi][s * 4 + kk], db, 1);
        }
      }
      wgmma_commit();
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < acc_per_thread; ++i) fence_operand(acc[i]);
    named_barrier(barrier, threads);  // every warp's MMAs read their stages: the next run may refill them
  }

  // One K step of MMAs from the stage at a_tile / b_tile (4 wgmmas of 32 bytes of K per 64 rows).
  template <bool KA, bool KB>
  __device__ static void mma_stage(TAcc (&acc)[acc_per_thread], unsigned a_tile, unsigned b_tile, int block0) {
    using namespace detail;
#pragma unroll
    for (int i = 0; i < acc_per_thread; ++i) fence_operand(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const unsigned long long db = stager<TB, BN, KB, threads>::desc(b_tile, 0, kk);
#pragma unroll
      for (int mi = 0; mi < rows / 64; ++mi)
        mma<BN, A, B, KA ? 0 : 1, KB ? 0 : 1>(acc + mi * (BN / 2),
                                              stager<TA, BM, KA, threads>::desc(a_tile, block0 + mi, kk), db, 1);
    }
    wgmma_commit();
#pragma unroll
    for (int i = 0; i < acc_per_thread; ++i) fence_operand(acc[i]);
  }

 public:
  // (scale_stager's slots and mma_stage_scaled are persistent_gemm's scaled main loop's too)
  // The scales of a scaled run, as floats in shared memory a K tile (4 blocks) ahead: a float
  // per row of A and column of B and block, so that the threads holding a column's accumulators
  // read its 4 scales with 128-bit loads, not each a global load and a conversion. Slot kt % 2
  // holds tile kt: A's row r at float 4 r + block, B's column n at 4 BM + 4 col_group block +
  // col_slot(n), which puts a thread's BN / 4 columns (coord) side by side. Thread e < BM + BN (and e +
  // threads ...) stages A's row e or B's column e - BM: load reads its word for a tile
  // (scale_word), store writes it a tile later, after the MMAs whose latency it hides.
  struct scale_stager {
    static constexpr int items = (BM + BN + threads - 1) / threads;
    const unsigned char* p[items];
    unsigned dst[items], stride[items], w[items];
    bool valid[items], words[items];
    int blocks;
    static constexpr int col_slot(int n) { return ((n >> 1) & 3) * col_group + (n >> 3) * 2 + (n & 1); }
    __device__ void init(const block_scales& sc, int t, int m_valid, int n_valid, unsigned slots) {
      blocks = sc.blocks;
#pragma unroll
      for (int j = 0; j < items; ++j) {
        const int e = t + j * threads, n = e - BM;
        p[j] = e < BM ? sc.a + e * sc.a_rs : sc.b + n * sc.b_rs;
        valid[j] = e < BM ? e < m_valid : e < BM + BN && n < n_valid;
        words[j] = (reinterpret_cast<unsigned long long>(p[j]) & 3) == 0;
        dst[j] = e < BM ? slots + e * 16 : slots + BM * 16 + col_slot(n) * 4;
        stride[j] = e < BM ? 4 : 16 * col_group;
      }
    }
    __device__ void load(int kt) {
#pragma unroll
      for (int j = 0; j < items; ++j) w[j] = detail::scale_word(p[j], valid[j], kt * 4, blocks, words[j]);
    }
    __device__ void store(int kt, int t) const {
#pragma unroll
      for (int j = 0; j < items; ++j) {
        if (t + j * threads < BM + BN) detail::store_scales(dst[j] + (kt & 1) * scale_slot_bytes, stride[j], w[j]);
      }
    }
  };

  // A scaled stage (run_scaled): its four 32-element blocks of K one at a time, each a wgmma into
  // tmp (scale-d 0: tmp = A * B), then acc += tmp * sa(row) * sb(column), the scales from the
  // stage's slot (scale_stager). Buffers = 2: block kk + 1's wgmma runs while block kk's products
  // are scaled; 1 (wide tiles, whose second buffer would spill): the group's other warpgroups'
  // wgmmas run under a warpgroup's scaling.
  template <int Buffers = 2>
  __device__ static void mma_stage_scaled(TAcc (&acc)[acc_per_thread], unsigned a_tile, unsigned b_tile, int block0,
                                          unsigned slot, int t) {
    using namespace detail;
    const int w = (t >> 5) & 3, l = t & 31;
    float fa[rows / 64][2][4];  // this thread's rows' scales (coord), 4 blocks each
#pragma unroll
    for (int mi = 0; mi < rows / 64; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = (t >> 7) * rows + mi * 64 + w * 16 + (l >> 2) + 8 * h;
        ld_shared_v4(slot + row * 16, fa[mi][h][0], fa[mi][h][1], fa[mi][h][2], fa[mi][h][3]);
      }
    // this thread's columns' scales of block kk: its group's, 4 at a time as used (a block's
    // BN / 4 held at once spill beside 128-column products)
    const unsigned cols = slot + BM * 16 + (l & 3) * col_group * 4;
    TAcc tmp[Buffers][acc_per_thread];
    if (Buffers == 2) issue_block(tmp[0], a_tile, b_tile, block0, 0);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      TAcc(&p)[acc_per_thread] = tmp[kk % Buffers];
      if (Buffers == 1) {
        issue_block(p, a_tile, b_tile, block0, kk);
        wgmma_wait<0>();
      } else if (kk + 1 < 4) {
        issue_block(tmp[(kk + 1) % Buffers], a_tile, b_tile, block0, kk + 1);
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
      }
#pragma unroll
      for (int i = 0; i < acc_per_thread; ++i) fence_operand(p[i]);
#pragma unroll
      for (int v = 0; v < BN / 16; ++v) {
        float fb[4];
        ld_shared_v4(cols + kk * 16 * col_group + v * 16, fb[0], fb[1], fb[2], fb[3]);
#pragma unroll
        for (int c = 4 * v; c < 4 * v + 4; ++c)
#pragma unroll
          for (int mi = 0; mi < rows / 64; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              // accumulator (mi, j) with j = (c >> 1) * 4 + h * 2 + (c & 1): row half h, column c
              const int i = mi * (BN / 2) + (c >> 1) * 4 + h * 2 + (c & 1);
              acc[i] = fmaf(p[i] * fa[mi][h][kk], fb[c & 3], acc[i]);
            }
      }
    }
  }
  // tmp = the products of 32-element block kk of the stage (scale-d 0), committed as one group.
  __device__ static void issue_block(TAcc (&tmp)[acc_per_thread], unsigned a_tile, unsigned b_tile, int block0, int kk) {
    using namespace detail;
#pragma unroll
    for (int i = 0; i < acc_per_thread; ++i) fence_operand(tmp[i]);
    wgmma_fence();
    const unsigned long long db = stager<TB, BN, true, threads>::desc(b_tile, 0, kk);
#pragma unroll
    for (int mi = 0; mi < rows / 64; ++mi)
      mma<BN, A, B, 0, 0>(tmp + mi * (BN / 2), stager<TA, BM, true, threads>::desc(a_tile, block0 + mi, kk), db, 0);
    wgmma_commit();
  }

 private:
  template <bool KA, bool KB, bool Scaled = false>
  __device__ static void run_as(TAcc (&acc)[acc_per_thread], const TA* A_, long a_rs, long a_cs, const TB* B_,
                                long b_rs, long b_cs, int m_valid, int n_valid, int K, bool accumulate,
                                const block_scales* scales = nullptr) {
    using namespace detail;
    const group_slice g(Scaled ? scaled_smem_bytes : smem_bytes);
    // block0: this warpgroup's first 64-row block of A
    const int t = g.t, block0 = WG == 1 ? 0 : (t >> 7) * (rows / 64), barrier = g.barrier;
    const unsigned base = g.base;
    const unsigned extra = base + Stages * stage_bytes;  // full[S], empty[S], slot word, 2 maps; scale slots
    const unsigned scale_slots = extra + 512;
    scale_stager ss;
    if constexpr (Scaled) ss.init(*scales, t, m_valid, n_valid, scale_slots);

    const stager<TA, BM, KA, threads> sa(A_, a_rs, a_cs, m_valid);
    const stager<TB, BN, KB, threads> sb(B_, b_cs, b_rs, n_valid);
    if (!accumulate) {
#pragma unroll
      for (int i = 0; i < acc_per_thread; ++i) acc[i] = TAcc(0);
    }
    const int tiles = (K + BK - 1) / BK;
    unsigned sm;
    asm("mov.u32 %0, %%smid;" : "=r"(sm));
#if defined(KK_SM90_STAGING_CP_ASYNC)  // measures cp.async staging where TMA would be taken
    constexpr bool tma_allowed = false;
#else
    constexpr bool tma_allowed = true;
#endif
    // A run of few tiles (a loop's step, as attention's) stays with cp.async: making and
    // publishing the two maps costs ~2 us a run, the time of ~16 tiles' cp.async handicap.
    if (tma_allowed && tiles >= 16 && sa.tma_ok(K) && sb.tma_ok(K) && sm < max_sms) {
      // TMA: thread 0 issues each stage's copies, completing on full[s]; the warps release a
      // stage on empty[s] once their MMAs have read it. One MMA group stays in flight. The first
      // Stages - 1 stages come by cp.async, every thread's, issued before warp 0 makes and
      // publishes the maps (~2 us): the tensor cores start on them without waiting for the maps
      // (their full barriers' first phases complete at once, as if TMA had filled them).
      constexpr int early = Stages - 1;
#pragma unroll
      for (int s = 0; s < early; ++s) {
        sa.load(base + s * stage_bytes, s * BK, K, t);
        sb.load(base + s * stage_bytes + sa.bytes, s * BK, K, t);
        cp_async_commit();
      }
      const unsigned full = extra, empty = extra + 8 * Stages, slot_word = extra + 128;
      const unsigned map_a = extra + 256, map_b = extra + 384;
      int slot = 0;
      if (t < 32) {
        if (t == 0) {
          slot = claim_slot(sm);
          asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(slot_word), "r"(slot) : "memory");
        }
        st_shared(map_a + 4 * t, 0u);
        st_shared(map_b + 4 * t, 0u);
        __syncwarp();
        asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(slot) : "r"(slot_word) : "memory");
        if (t == 0) {
          sa.make(map_a, K);
          sb.make(map_b, K);
        }
        __syncwarp();
        publish_map(tensor_maps[sm * slots_per_sm + slot][0], map_a);
        publish_map(tensor_maps[sm * slots_per_sm + slot][1], map_b);
      }
      const void* ga = tensor_maps[sm * slots_per_sm + slot][0];
      const void* gb = tensor_maps[sm * slots_per_sm + slot][1];
      if (t == 0) {
        acquire_map(ga);
        acquire_map(gb);
        ring_init(full, empty, Stages, 4 * WG);  // one arrival per warp
        for (int s = 0; s < early; ++s) mbar_arrive(full + 8 * s);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
      }
      if constexpr (Scaled) {
        ss.load(0);
        ss.store(0, t);
      }
      named_barrier(barrier, threads);
      if (t == 0) {
        for (int s = early; s < Stages && s < tiles; ++s) {
          mbar_expect_tx(full + 8 * s, stage_bytes);
          sa.issue(base + s * stage_bytes, ga, s * BK, full + 8 * s);
          sb.issue(base + s * stage_bytes + sa.bytes, gb, s * BK, full + 8 * s);
        }
      }
#pragma unroll 1
      for (int kt = 0; kt < tiles; ++kt) {
        const int s = kt % Stages;
        if constexpr (Scaled) ss.load(kt + 1);
        if (kt < early) {  // every thread's copies of the stage have landed
          cp_async_wait_dynamic(early - 1 - kt);
          fence_proxy_async();
          named_barrier(barrier, threads);
        } else {
          mbar_wait(full + 8 * s, (kt / Stages) & 1);
        }
        if constexpr (Scaled) {
          mma_stage_scaled(acc, base + s * stage_bytes, base + s * stage_bytes + sa.bytes, block0,
                           scale_slots + (kt & 1) * scale_slot_bytes, t);
        } else {
          mma_stage<KA, KB>(acc, base + s * stage_bytes, base + s * stage_bytes + sa.bytes, block0);
        }
        wgmma_wait<1>();  // tile kt - 1's MMAs are done: its stage can be refilled
        if (kt > 0) {
          const int ps = (kt - 1) % Stages, next = kt - 1 + Stages;
          if ((t & 31) == 0) mbar_arrive(empty + 8 * ps);
          if (t == 0 && next < tiles) {
            mbar_wait(empty + 8 * ps, ((kt - 1) / Stages) & 1);
            mbar_expect_tx(full + 8 * ps, stage_bytes);
            sa.issue(base + ps * stage_bytes, ga, next * BK, full + 8 * ps);
            sb.issue(base + ps * stage_bytes + sa.bytes, gb, next * BK, full + 8 * ps);
          }
        }
        if constexpr (Scaled) {
          // tile kt + 1's scales into the slot tile kt - 1 used (read before the last barrier)
          ss.store(kt + 1, t);
          named_barrier(barrier, threads);
        }
      }
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < acc_per_thread; ++i) fence_operand(acc[i]);
      named_barrier(barrier, threads);  // every copy landed and was read: barriers and slot are free
      if (t == 0) {
        ring_inval(full, empty, Stages);
        release_slot(sm, slot);
      }
      return;
    }
    // cp.async: every thread copies its chunks of a stage, Stages - 1 tiles ahead.
#pragma unroll
    for (int s = 0; s < Stages - 1; ++s) {
      if (s < tiles) {
        sa.load(base + s * stage_bytes, s * BK, K, t);
        sb.load(base + s * stage_bytes + sa.bytes, s * BK, K, t);
      }
      cp_async_commit();  // empty groups too: the wait below counts groups
    }
    if constexpr (Scaled) {
      ss.load(0);
      ss.store(0, t);
    }
#pragma unroll 1
    for (int kt = 0; kt < tiles; ++kt) {
      if constexpr (Scaled) ss.load(kt + 1);
      cp_async_wait<Stages - 2>();  // this thread's copies of tile kt have landed
      fence_proxy_async();
      named_barrier(barrier, threads);   // everyone's have; and every warp finished tile kt - 1's MMAs
      const unsigned a_tile = base + (kt % Stages) * stage_bytes;
      if constexpr (Scaled) {
        mma_stage_scaled(acc, a_tile, a_tile + sa.bytes, block0, scale_slots + (kt & 1) * scale_slot_bytes, t);
      } else {
        mma_stage<KA, KB>(acc, a_tile, a_tile + sa.bytes, block0);
      }
      // While the tensor cores run tile kt, copy tile kt + Stages - 1 into the stage tile kt - 1
      // left (its MMAs finished before the barrier above).
      const int next = kt + Stages - 1;
      if (next < tiles) {
        sa.load(base + (next % Stages) * stage_bytes, next * BK, K, t);
        sb.load(base + (next % Stages) * stage_bytes + sa.bytes, next * BK, K, t);
      }
      cp_async_commit();
      if constexpr (Scaled) ss.store(kt + 1, t);  // the slot tile kt - 1 used: read before the barrier above
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < acc_per_thread; ++i) fence_operand(acc[i]);
    }
    cp_async_wait<0>();
    named_barrier(barrier, threads);  // the stages may be refilled by the next run
  }
};

}  // namespace kk::tops::sm90
#endif  // KK_TARGET_CUDA
