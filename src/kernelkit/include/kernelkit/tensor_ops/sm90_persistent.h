// kernelkit/tensor_ops/sm90_persistent.h: a persistent, warp-specialised Hopper GEMM for kernels
// that own a whole launch (library ops such as matmul_add_relu): C[b] = epilogue(A[b] * B[b]) for
// a batch of 16-bit matrices, 128 x 256 tiles, or of MXFP8 ones (run_scaled), 128 x 128 tiles, one
// threadgroup an SM walking the tiles.
//
// Why beside warpgroup_gemm (sm90_wgmma.h): a `run` there is one tile of a threadgroup that the
// talk's kernel launches per tile, so each tile pays the tensor maps' set-up (~2 us), its first
// stage's latency (~1.8 us) and its epilogue with the tensor cores idle, ~8 us against a 21 us
// main loop at K = 2048 (bench/notes/sm90_wgmma.md). Here a producer warpgroup streams every
// tile's stages through one pipeline while the consumers compute: the next tile's loads run
// under this tile's epilogue, the maps are made once a threadgroup, the epilogue's source (a
// bias) arrives under the main loop's last steps, and the output leaves by TMA stores the
// consumers do not wait for.
//
// The contract:
//
//   namespace kk::tops::sm90 {
//   template <class T, bool KA, bool KB, int Band = 16, bool StagedSource = false, class TC = T>
//   struct persistent_gemm {
//     static constexpr int threads = 384;    // the threadgroup: 2 consumer warpgroups, a producer one
//     static constexpr int smem_bytes;       // its dynamic shared memory (the launcher gives it)
//     struct operand { const void* p; long batch_stride, row_stride; int batches; };
//     template <class Epilogue>
//     __device__ static void run(const operand& a, const operand& b, const operand& source, T* c,
//                                int batches, int M, int N, int K, Epilogue&& epilogue);
//     template <int Buffers = 1, class Epilogue>   // T an fp8 type (MXFP8)
//     __device__ static void run_scaled(const operand& a, const operand& a_scales, const operand& b,
//                                       const operand& b_scales, TC* c, int batches, int M, int N,
//                                       int K, Epilogue&& epilogue);
//   };
//   }
//
// - run: T is __half or __nv_bfloat16 (and TC = T), sums in float. A[b] is M x K, B[b] K x N, C[b] M x N
//   contiguous (row stride N, batch stride M * N). KA: A is K-major (element (m, k) at
//   m * row_stride + k), else M-major ((m, k) at k * row_stride + m); KB: B is K-major ((k, n) at
//   n * row_stride + k), else N-major ((k, n) at k * row_stride + n). An operand with batches
//   == 1 serves every batch (a broadcast). TMA's limits: bases 16-byte aligned, strides in
//   bytes multiples of 16 (and nonzero), extents below 2^31, K > 0: the caller checks them.
// - source (p may be null: none): an M x N matrix of T a batch, (row, col) at
//   row * row_stride + col (row_stride may be 0: one row for all), read a pair (4 bytes) at a
//   time: p 4-byte aligned, the strides even. StagedSource: the source arrives by TMA through
//   the pipeline instead (two stages a tile, after its K steps), which its limits allow where
//   p is 16-byte aligned and the strides are multiples of 8 (row_stride nonzero).
// - epilogue(v0, v1, s0, s1, batch, row, col) maps the sums of (row, col) and (row, col + 1) in
//   place, s0 and s1 the source's elements there (0 without a source); it runs once per pair,
//   every pair of the tile (rows >= M or cols >= N included: they are not stored).
// - run_scaled: MXFP8 (OCP MX: a ue8m0 scale, 2^(s - 127), for 32 consecutive values along K), T
//   __nv_fp8_e4m3 or __nv_fp8_e5m2, KA and KB (both K-major), TC __half, __nv_bfloat16 or float;
//   C = epilogue(sum over k of A(m, k) sa(m, k / 32) B(k, n) sb(n, k / 32)). The scales are
//   operands of bytes: A's (m, block) at m * row_stride + block, B's (n, block) at n * row_stride +
//   block, blocks = ceil(K / 32), a batch at batch_stride; no source (the epilogue's s0, s1 are 0).
//   Each 32-element block is one wgmma m64n128k32 into products that the consumers add to the
//   sums times the two scales (sm90_wgmma.h, mma_stage_scaled: exact, the scales are powers of
//   two; Buffers: mma_stage_scaled's product buffers, one by default: two spill and measured
//   15% slower on the H200, 8192^3); a producer warp stages each K tile's scales, as floats,
//   beside its operands. TMA's limits (above) with 1-byte elements: K a multiple of 16.
// - Every thread of the threadgroup calls run; launch as many threadgroups as there are SMs or
//   tiles (the shared memory allows one an SM). The kernel has no dynamic shared memory of its
//   own (no extern __shared__): run names smem_bytes in the cubin (kk_tops_dynamic_smem) and
//   kernelkit's CUDA backend launches the kernel with it. The kernel's header defines
//   KK_MAX_THREADS_PER_THREADGROUP as 384 (entry_bounds.h): the kernel starts at 168 registers a
//   thread, then the producer warpgroup gives its registers to the consumers (setmaxnreg: 40
//   and 232, as CUTLASS's warp-specialised kernels).
//
// Pipeline: 4 stages of A (128 x 128 bytes of K) and B (256 x 128 bytes), full and empty
// mbarriers; the producer's first thread issues each stage's copies once its stage is released.
// (run_scaled: 5 stages of A's and B's 128 x 128 bytes and their scales as floats, 5 KB, which
// warps 9 and 10 load and convert as the stage is released, arriving on its full barrier; the
// consumers' scaling of the products, two FP32 instructions an output element a block, is what
// bounds it: bench/notes/sm90_wgmma.md, Session 31.)
// Each consumer warpgroup computes 64 rows of the tile, one wgmma m64n256k16 a K step, one MMA
// group in flight: each wgmma reads A's 2 KB and B's 8 KB from shared memory, 20 KB a K step for
// the tile where 256 x 128 tiles (two m64n128 a warpgroup) read 24 KB (+2-3% on the H200:
// bench/notes/sm90_wgmma.md, Session 30). Pairs: the source's tile is prefetched into L2 at the
// tile's start, and under the last MMAs each thread loads its 64 pairs of it at once; staged: the
// producer prefetches it into L2 16 K steps before the tile's end and copies it into the two
// stages after its K steps (a warpgroup's 64 rows each, in the output buffers' layout), and each
// warpgroup reads its pairs out, freeing its stage once its first store is queued. Then the
// warpgroup maps its 64 x 256 in four quarters of 64 columns: pairs into one of its two 8 KB
// buffers in turn (128-byte swizzle), a TMA store each. Measured against the alternatives
// (bench/notes/sm90_wgmma.md): the source read from DRAM in the epilogue cost ~17 us a tile;
// staged by TMA into 32 KB buffers of its own it cost a stage (3 instead of 4: -6% at 8 x 2048^3
// and -10% at 8192^3 on the main loop alone); prefetched four K steps before the end it came late
// (-7% at 8 x 2048^3); loaded into registers four K steps before the end, inside the loop, it
// spilled (89 stores: the loop's state beside 128 accumulators and 64 pairs).
#pragma once

#if defined(KK_TARGET_CUDA)
#include <kernelkit/tensor_ops/sm90_wgmma.h>

namespace kk::tops::sm90 {

template <class T, bool KA, bool KB, int Band = 16, bool StagedSource = false, class TC = T>
struct persistent_gemm {
  static constexpr int E = wgmma_type<T>::id;
  static constexpr bool scaled = E == E4M3 || E == E5M2;     // MXFP8 (run_scaled)
  static constexpr bool supported =
      detail::arch_ok && (scaled ? KA && KB && !StagedSource &&
                                       (detail::same<TC, __half> || detail::same<TC, __nv_bfloat16> || detail::same<TC, float>)
                                 : (E == F16 || E == BF16) && detail::same<TC, T>);
  static constexpr int BM = 128, BN = scaled ? 128 : 256, Stages = scaled ? 5 : 4, threads = 384, consumer_threads = 256;
  static constexpr int BK = 128 / sizeof(T);                   // K elements a stage (128 bytes)
  // the scaled main loop and its scale slots (two warpgroups of 64 rows, 128 columns)
  using ScaledLoop = warpgroup_gemm<BM, BN, T, T, float, 4, 2>;
  // a stage: A's and B's tiles, and (scaled) their scales as floats in ScaledLoop's slot layout,
  // rounded up to 1 KB (the next stage's tiles start on a swizzle atom)
  static constexpr int a_bytes = BM * 128, b_bytes = BN * 128;
  static constexpr int scale_bytes = scaled ? (ScaledLoop::scale_slot_bytes + 1023) / 1024 * 1024 : 0;
  static constexpr int stage_bytes = a_bytes + b_bytes + scale_bytes;
  // A's and B's stage layouts (sm90_wgmma.h): TMA copies into them, descriptors read them
  using A16 = detail::stager<T, BM, KA, consumer_threads>;
  using B16 = detail::stager<T, BN, KB, consumer_threads>;
  static constexpr int WM = BM / 2;                            // a warpgroup's rows of the tile
  static constexpr int QC = 128 / sizeof(TC);                  // output columns of 128 bytes: a TMA box
  static constexpr int quarter_bytes = WM * 128;               // a warpgroup's WM x QC outputs
  static constexpr int half_bytes = 2 * quarter_bytes;         // its output buffer: two of them
  // K steps before a tile's end at which a staged source is prefetched into L2: at the tile's
  // start it was evicted again at K = 2048 (611 against 650 TFLOP/s, bf16 8 x 2048^3)
  static constexpr int source_lead = 16;
  // stages, two output buffers, barriers and four maps (1024); + 1024 to align the stages
  static constexpr int smem_bytes = Stages * stage_bytes + 2 * half_bytes + 1024 + 1024;
  static constexpr int scale_loaders = 64;                     // warps 9 and 10 (run_scaled)
  // registers a thread after setmaxnreg: 2 consumers + producer within the 3 x 168 of the launch
  static constexpr int producer_registers = 40, consumer_registers = 232;

  struct operand {
    const void* p;
    long batch_stride, row_stride;  // elements
    int batches;
  };

  template <class Epilogue>
  __device__ static void run(const operand& a, const operand& b, const operand& source, TC* c, int batches, int M,
                             int N, int K, Epilogue&& epilogue) {
    static_assert(supported && !scaled, "persistent_gemm::run: 16-bit types on sm_90a");
    run_as<1>(a, b, source, operand{}, operand{}, c, batches, M, N, K, epilogue);
  }
  template <int Buffers = 1, class Epilogue>
  __device__ static void run_scaled(const operand& a, const operand& a_scales, const operand& b,
                                    const operand& b_scales, TC* c, int batches, int M, int N, int K,
                                    Epilogue&& epilogue) {
    static_assert(supported && scaled, "persistent_gemm::run_scaled: fp8 operands, both K-major, a 16-bit or "
                                       "float output, on sm_90a");
    run_as<Buffers>(a, b, operand{}, a_scales, b_scales, c, batches, M, N, K, epilogue);
  }

 private:
  template <int Buffers, class Epilogue>
  __device__ static void run_as(const operand& a, const operand& b, const operand& source, const operand& a_scales,
                                const operand& b_scales, TC* c, int batches, int M, int N, int K, Epilogue& epilogue) {
#if defined(KK_TOPS_NO_WARPGROUP)
    static_assert(!supported, "persistent_gemm stages through the kernel's dynamic shared memory: a body "
                              "with its own extern __shared__ cannot use it");
#endif
    using namespace detail;
    const unsigned base = persistent_smem<smem_bytes, threads>();
    const unsigned outs = base + Stages * stage_bytes, extra = outs + 2 * half_bytes;
    // full[Stages], empty[Stages], the slots word; maps (A, B, C, the staged source) from + 128
    const unsigned full = extra, empty = extra + 8 * Stages, slot_word = extra + 16 * Stages, maps = extra + 128;
    // (run_scaled) the scale operands, A's and B's, for the scale loaders (stage_scales)
    const unsigned scale_ops = extra + 640;
    const int t = int(threadIdx.x), warp = t >> 5;
    const unsigned sm = current_sm();

    // The producer's first warp makes the maps (A, B; C, source) and sets up the barriers.
    if (warp == 8)
      publish_maps<StagedSource ? 4 : 3>(sm, maps, slot_word, [&] {
        constexpr int et = sizeof(T) == 1 ? 0 : 1, ec = sizeof(TC) == 2 ? 1 : 2, es = sizeof(T), cs = sizeof(TC);
        if (KA) make_map<et>(maps, a.p, K, M, a.row_stride * es, BK, BM, a.batches, batch_bytes(a, M));
        else make_map<et>(maps, a.p, M, K, a.row_stride * es, 64, BK, a.batches, batch_bytes(a, K));
        if (KB) make_map<et>(maps + 128, b.p, K, N, b.row_stride * es, BK, BN, b.batches, batch_bytes(b, N));
        else make_map<et>(maps + 128, b.p, N, K, b.row_stride * es, 64, BK, b.batches, batch_bytes(b, K));
        make_map<ec>(maps + 256, c, N, M, (unsigned long long)N * cs, QC, WM, batches, (unsigned long long)M * N * cs);
        if (StagedSource && source.p != nullptr)
          make_map<et>(maps + 384, source.p, N, M, source.row_stride * es, 64, WM, source.batches,
                       batch_bytes(source, M));
        ring_init(full, empty, Stages, consumer_threads / 32, scaled ? 1 + scale_loaders : 1);
        if (scaled) {
          *reinterpret_cast<operand*>(__cvta_shared_to_generic(scale_ops)) = a_scales;
          *reinterpret_cast<operand*>(__cvta_shared_to_generic(scale_ops + sizeof(operand))) = b_scales;
        }
      });
    __syncthreads();
    const int slots = read_slots(slot_word);
    const void* map_c = map_in(sm, slots, 2);

    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN, k_tiles = (K + BK - 1) / BK;
    const int per_batch = tiles_m * tiles_n, tiles = batches * per_batch;
    // Each role takes its registers first thing (what is live there must fit the new count).
    if (warp >= 8) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(producer_registers) : "memory");
      if (t == 256) {
        const void *map_a = map_in(sm, slots, 0), *map_b = map_in(sm, slots, 1);
        const bool staged = StagedSource && source.p != nullptr;
        const void* map_s = staged ? map_in(sm, slots, 3) : nullptr;
        acquire_map(map_a);
        acquire_map(map_b);
        if (staged) acquire_map(map_s);
        int it = 0;
        // the next free stage, once released, its full barrier and its address
        const auto next = [&](unsigned& bar) {
          const int s = it % Stages, use = it / Stages;
          if (use > 0) mbar_wait(empty + 8 * s, (use & 1) ^ 1);
          bar = full + 8 * s;
          return base + s * stage_bytes;
        };
        for (int tile = int(blockIdx.x); tile < tiles; tile += int(gridDim.x)) {
          int bt, m0, n0;
          where(tile, per_batch, tiles_m, tiles_n, bt, m0, n0);
          const int ba = a.batches == 1 ? 0 : bt, bb = b.batches == 1 ? 0 : bt, bs = source.batches == 1 ? 0 : bt;
          for (int kt = 0; kt < k_tiles; ++kt, ++it) {
            if (staged && kt == max(0, k_tiles - source_lead))  // into L2, so that its stages land at once
              for (int q = 0; q < 2 * BN / 64; ++q)
                if (m0 + WM * (q & 1) < M && n0 + 64 * (q >> 1) < N)
                  tma_prefetch_3d(map_s, n0 + 64 * (q >> 1), m0 + WM * (q & 1), bs);
            unsigned bar;
            const unsigned dst = next(bar);
            mbar_expect_tx(bar, a_bytes + b_bytes);  // (the scales come by the scale loaders)
            A16::issue(dst, map_a, kt * BK, m0, ba, bar);
            B16::issue(dst + a_bytes, map_b, kt * BK, n0, bb, bar);
          }
          for (int wg = 0; staged && wg < 2; ++wg, ++it) {
            // warpgroup wg's rows of the source, four boxes of 64 columns in the output buffers'
            // layout; boxes wholly past the edges are not copied (their pairs are not stored)
            unsigned bar;
            const unsigned dst = next(bar);
            const int row = m0 + WM * wg, boxes = row < M ? min(BN / 64, (N - n0 + 63) / 64) : 0;
            mbar_expect_tx(bar, boxes * quarter_bytes);
            for (int q = 0; q < boxes; ++q) tma_load_3d(dst + q * quarter_bytes, map_s, n0 + 64 * q, row, bs, bar);
          }
        }
      } else if (scaled && warp == 9) {
        stage_scales<true>(t & 31, base, full, scale_ops, M, K, tiles, per_batch, tiles_m, tiles_n, k_tiles);
      } else if (scaled && warp == 10) {
        stage_scales<false>(t & 31, base, full, scale_ops + sizeof(operand), N, K, tiles, per_batch, tiles_m, tiles_n,
                            k_tiles);
      }
    } else {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(consumer_registers) : "memory");
      consume<Buffers>(t, base, outs + (warp >> 2) * half_bytes, full, empty, source, map_c, M, N, tiles, per_batch, tiles_m,
              tiles_n, k_tiles, epilogue);
    }
    __syncthreads();  // every copy landed and was read, every store written: barriers and slots are free
    if (t == 256) {
      ring_inval(full, empty, Stages);
      release_slots(sm, slots);
    }
  }

  // A map's batch stride in bytes: a broadcast operand's (one batch) is never used, but TMA wants
  // a valid one (its matrix's extent).
  __device__ static unsigned long long batch_bytes(const operand& o, int rows) {
    constexpr int es = sizeof(T);
    return o.batches > 1 ? (unsigned long long)o.batch_stride * es : (unsigned long long)o.row_stride * es * rows;
  }

  // The scale loaders: warp 9 stages A's rows (Rows), warp 10 B's columns, 4 a lane (lane + 32 j),
  // each K tile's in the pipeline's order: their words (4 blocks) loaded before the stage is
  // released, stored as floats into its slot after, then an arrival on its full barrier. (The
  // operand is read from shared memory, and little is held: the producer has 40 registers.)
  template <bool Rows>
  __device__ static void stage_scales(int lane, unsigned base, unsigned full, unsigned operand_at, int extent, int K,
                                      int tiles, int per_batch, int tiles_m, int tiles_n, int k_tiles) {
    using namespace detail;
    const operand& o = *reinterpret_cast<const operand*>(__cvta_shared_to_generic(operand_at));
    const int blocks = (K + 31) / 32;
    // this lane's first float in a stage's slot; the next block's 4 (rows) or a block's columns
    // (16 col_group bytes) on; the next row's 512 bytes (32 rows) or col_slot's 32 (32 columns) on
    const unsigned first = base + a_bytes + b_bytes +
                           (Rows ? lane * 16 : BM * 16 + ScaledLoop::scale_stager::col_slot(lane) * 4);
    constexpr int next_block = Rows ? 4 : 16 * ScaledLoop::col_group, next_row = Rows ? 512 : 32;
    int it = 0;
    for (int tile = int(blockIdx.x); tile < tiles; tile += int(gridDim.x)) {
      int bt, m0, n0;
      where(tile, per_batch, tiles_m, tiles_n, bt, m0, n0);
      const int row0 = (Rows ? m0 : n0) + lane;
      const unsigned char* p = static_cast<const unsigned char*>(o.p) +
                               (o.batches == 1 ? 0 : long(bt) * o.batch_stride) + long(row0) * o.row_stride;
#pragma unroll 1
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        unsigned w[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const unsigned char* r = p + long(32 * j) * o.row_stride;
          w[j] = scale_word(r, row0 + 32 * j < extent, kt * 4, blocks, (reinterpret_cast<unsigned long long>(r) & 3) == 0);
        }
        const int s = it % Stages, use = it / Stages;
        if (use > 0) mbar_wait(full + 8 * Stages + 8 * s, (use & 1) ^ 1);  // its empty barrier
#pragma unroll
        for (int j = 0; j < 4; ++j) store_scales(first + s * stage_bytes + j * next_row, next_block, w[j]);
        mbar_arrive(full + 8 * s);
      }
    }
  }

  // Tile `tile`'s batch and corner: bands of Band tile rows, walked down their columns, so that
  // the SMs' tiles in flight share rows of A and columns of B in L2.
  __device__ static void where(int tile, int per_batch, int tiles_m, int tiles_n, int& bt, int& m0, int& n0) {
    bt = tile / per_batch;
    const int id = tile - bt * per_batch, first = id / (Band * tiles_n) * Band;
    const int rows = min(Band, tiles_m - first), in_band = id - first * tiles_n;
    m0 = (first + in_band % rows) * BM;
    n0 = (in_band / rows) * BN;
  }

  template <int Buffers, class Epilogue>
  __device__ static void consume(int t, unsigned base, unsigned out, unsigned full, unsigned empty,
                                 const operand& source, const void* map_c, int M, int N, int tiles, int per_batch,
                                 int tiles_m, int tiles_n, int k_tiles, Epilogue& epilogue) {
    using namespace detail;
    constexpr int n_acc = WM * BN / 128;  // 64 rows x BN columns a warpgroup: one m64nBN wgmma a K step
    const int wg = t >> 7, tw = t & 127, w = tw >> 5, l = tw & 31, barrier = 1 + wg;
    // This thread's pair j / 2 is (row0 + row_of(j), col_of(j)) of the tile
    const auto row_of = [&](int j) { return w * 16 + (l >> 2) + 8 * ((j >> 1) & 1); };
    const auto col_of = [&](int j) { return (j >> 2) * 8 + (l & 3) * 2; };
    if (tw == 0) acquire_map(map_c);
    float acc[n_acc];
    unsigned src[n_acc / 2];
    int it = 0;
    for (int tile = int(blockIdx.x); tile < tiles; tile += int(gridDim.x)) {
      int bt, m0, n0;
      where(tile, per_batch, tiles_m, tiles_n, bt, m0, n0);
      const int row0 = m0 + wg * WM;
      if (!scaled && !StagedSource && source.p != nullptr && row0 + (tw & (WM - 1)) < M) {
        // the source's rows of this warpgroup into L2 (half a row of the tile a thread), read
        // under the last MMAs
        const T* r = source_row(source, bt, row0 + (tw & (WM - 1))) + n0 + (tw / WM) * (BN / 2);
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(r));
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(r + 64));
      }
      if constexpr (scaled) {
#pragma unroll
        for (int i = 0; i < n_acc; ++i) acc[i] = 0.0f;
#pragma unroll 1
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          // the stage's four blocks (their MMAs waited for), then its release
          const int s = it % Stages;
          mbar_wait(full + 8 * s, (it / Stages) & 1);
          const unsigned a_tile = base + s * stage_bytes, b_tile = a_tile + a_bytes;
          ScaledLoop::template mma_stage_scaled<Buffers>(acc, a_tile, b_tile, wg, b_tile + b_bytes, t);
          if ((t & 31) == 0) mbar_arrive(empty + 8 * s);
        }
      } else {
#pragma unroll 1
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int s = it % Stages;
          mbar_wait(full + 8 * s, (it / Stages) & 1);
          const unsigned a_tile = base + s * stage_bytes, b_tile = a_tile + a_bytes;
#pragma unroll
          for (int i = 0; i < n_acc; ++i) fence_operand(acc[i]);
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            mma<BN, E, E, KA ? 0 : 1, KB ? 0 : 1>(acc, A16::desc(a_tile, wg, kk), B16::desc(b_tile, 0, kk),
                                                   kt > 0 || kk > 0);
          wgmma_commit();
#pragma unroll
          for (int i = 0; i < n_acc; ++i) fence_operand(acc[i]);
          wgmma_wait<1>();  // the previous stage's MMAs are done: release it
          if (kt > 0 && (t & 31) == 0) mbar_arrive(empty + 8 * ((it - 1) % Stages));
        }
        if (!StagedSource && source.p != nullptr) {
          // This thread's pairs of the source, all loads in flight together under the last MMAs: its
          // two rows' pointers, then constant offsets (a pair's columns are inside N when its
          // 8-column block is: N % 8 == 0).
          const T* rp[2];
          bool rv[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = row0 + row_of(2 * h);
            rv[h] = row < M;
            rp[h] = source_row(source, bt, rv[h] ? row : 0) + n0 + col_of(0);
          }
#pragma unroll
          for (int j = 0; j < n_acc; j += 2) {
            const int h = (j >> 1) & 1;
            src[j / 2] = rv[h] && n0 + (j >> 2) * 8 < N ? ldg_u32(rp[h] + (j >> 2) * 8) : 0u;
          }
        }

        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < n_acc; ++i) fence_operand(acc[i]);
        if ((t & 31) == 0) mbar_arrive(empty + 8 * ((it - 1) % Stages));
      }
      int staged = -1;  // the stage this warpgroup's source pairs came from, freed below
      if (StagedSource && source.p != nullptr) {
        // The two source stages: both waited (a barrier's phases are told apart by parity only),
        // this warpgroup's read into its pairs.
        mbar_wait(full + 8 * (it % Stages), (it / Stages) & 1);
        mbar_wait(full + 8 * ((it + 1) % Stages), ((it + 1) / Stages) & 1);
        staged = (it + wg) % Stages;
        const unsigned stage = base + staged * stage_bytes;
#pragma unroll
        for (int j = 0; j < n_acc; j += 2) {
          const int row = row_of(j), cb = col_of(j) * 2;  // byte in the 512-byte row of 256 columns
          src[j / 2] = ld_shared_u32(stage + (cb >> 7) * quarter_bytes + row * 128 +
                                     ((((cb >> 4) ^ row) & 7) << 4) + (cb & 15));
        }
        it += 2;
      }
      // Epilogue: quarters of QC columns (128 bytes) through this warpgroup's two buffers in turn,
      // a TMA store each (a buffer is refilled once the store before last has read it).
#pragma unroll
      for (int q = 0; q < BN / QC; ++q) {
        const unsigned buffer = out + (q & 1) * quarter_bytes;
        if (tw == 0) bulk_wait_read<1>();
        named_barrier(barrier, 128);
#pragma unroll
        for (int j = QC / 2 * q; j < QC / 2 * (q + 1); j += 2) {
          const int row = row_of(j), col = col_of(j);
          float s0 = 0.0f, s1 = 0.0f;
          if (!scaled && source.p != nullptr) unpack_pair<T>(src[j / 2], s0, s1);
          float v0 = acc[j], v1 = acc[j + 1];
          epilogue(v0, v1, s0, s1, bt, row0 + row, n0 + col);
          const int cb = (col - QC * q) * int(sizeof(TC));  // byte in the buffer's 128-byte row (the staged source's too)
          const unsigned at = buffer + row * 128 + ((((cb >> 4) ^ row) & 7) << 4) + (cb & 15);
          if constexpr (same<TC, float>) st_shared_v2(at, v0, v1);
          else st_shared(at, pack_pair<TC>(v0, v1));
        }
        fence_proxy_async();
        named_barrier(barrier, 128);
        if (tw == 0) {
          tma_store_3d(map_c, buffer, n0 + QC * q, row0, bt);
          bulk_commit();
        }
        // The source's stage freed by this warpgroup's warps (two arrivals each: the other
        // warpgroup never touches it) once the first store is queued: the copies it lets the
        // producer issue (the next tile's) would otherwise queue ahead of this tile's stores in
        // the SM's TMA unit (measured: 596 against 704 TFLOP/s at bf16 8 x 2048^3 with the
        // stores or the source alone).
        if (q == 0 && staged >= 0 && (t & 31) == 0) mbar_arrive_count(empty + 8 * staged, 2);
      }
    }
    if (tw == 0) bulk_wait();
  }

  __device__ static const T* source_row(const operand& o, int batch, int row) {
    return static_cast<const T*>(o.p) + (o.batches == 1 ? 0 : long(batch) * o.batch_stride) + long(row) * o.row_stride;
  }
  __device__ static unsigned ldg_u32(const T* p) {
    unsigned v;
    asm volatile("ld.global.nc.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
    return v;
  }
};

}  // namespace kk::tops::sm90
#endif  // KK_TARGET_CUDA
