// kernelkit/tensor_ops/sm90_attention_backward.h: a warp-specialised flash-attention backward for
// Hopper (FlashAttention-3's structure) in the layer, for kernels that own a whole launch
// (kk.ops.flash_attention's backward on sm_90).
//
// Why beside the talk-style kernels (ops/flash_attention_dq.metal, _dkdv.metal): those recompute
// the probabilities twice, once for dQ and once for dK / dV, and each matmul2d run there stages
// its operands and waits for them (~190 TFLOP/s at B=4 H=16 S=4096 D=128 bf16, H100). Here a
// tile is a block of 128 keys: a threadgroup holds its K and V in shared memory, a producer
// warpgroup streams the query blocks (Q, dO, the log-sum-exps and D = rowsum(dO * O)) through a
// ring of TMA stages, and two consumer warpgroups (64 keys each) compute the probabilities once
// for all three gradients. dK and dV stay in registers; dQ's partial sums leave by bulk
// reduce-adds into a float accumulator. The threadgroups are persistent, one an SM (the next
// tile's K, V and first query block load under a tile's epilogue, the tensor maps are made once
// an SM; a threadgroup a tile: forward + backward 4% slower at B=4 H=16 S=4096 D=128, 7% causal,
// H100), and with causal masking take the tiles in order from a counter (detail::take_tile).
//
// The contract:
//
//   namespace kk::tops::sm90 {
//   template <class T, int D>
//   struct attention_backward {
//     static constexpr int threads = 384;    // 2 consumer warpgroups, a producer one
//     static constexpr int block_k = 128;    // keys a tile (64 a consumer warpgroup)
//     static constexpr int block_q;          // queries a step: 128 at D = 64, 64 at D = 128
//     static constexpr int smem_bytes;       // its dynamic shared memory (the launcher gives it)
//     struct operand { const T* p; long batch, head, row; };   // strides, elements
//     struct output { T* p; long batch, head, row; };
//     __device__ static void run(const operand& q, const operand& k, const operand& v, const operand& dout,
//                                const float* lse2, const float* delta, float* dq_acc, const output& dk,
//                                const output& dv, int* next_tile, int B, int H, int Hkv, int Sq, int Sk,
//                                float scale, bool causal);
//   };
//   }
//
// - T is __half or __nv_bfloat16, D 64 or 128; q, k, v as attention_forward's operands, dout as
//   q. lse2 and delta: (B, H, Sqp) floats, Sqp = Sq rounded up to block_q, rows past Sq zero:
//   lse2 the forward's log-sum-exp times log2(e), delta = rowsum(dout * o) minus the log-sum-exp's
//   cotangent. The operands' limits are TMA's (the caller checks them), scale > 0.
// - dk, dv (Sk rows, Hkv heads; d packed) are written: dk = scale * sum over the queries of dS^T Q,
//   dv = sum of P^T dout, over every query head that reads the key head (grouped-query attention
//   needs no reduction after). dq_acc, (B, H, Sqp / block_q, block_q * D) floats zeroed by the
//   caller, gets dS K (unscaled) added in wgmma's accumulator order: dq_coord(i) names the
//   elements of floats 4i .. 4i + 3 of a query block's block_q * D.
// - Launch a 1-D grid of one threadgroup an SM (or a tile, if fewer) over the ceil(Sk / 128) * Hkv
//   * B tiles; next_tile points to an int the caller zeroed. Tile i is key block i % blocks of
//   key head i / blocks % Hkv, batch i / blocks / Hkv. As persistent_gemm: no extern __shared__
//   of the kernel's own, and the kernel's header defines KK_MAX_THREADS_PER_THREADGROUP 384
//   (setmaxnreg 40 / 232).
//
// A step, for this warpgroup's 64 keys and a block of queries (scores transposed, keys as rows,
// so that P^T and dS^T are wgmma's A fragments where they lie in registers):
//   S^T = K Q^T and dP^T = V dO^T, both issued before either is waited for;
//   P^T = exp2(S^T * scale * log2(e) - lse2), dS^T = P^T * (dP^T - delta);
//   dV += P^T dO and dK += dS^T Q (A from registers, B MN-major by wgmma's transpose bit);
//   dS^T to shared memory, then dQ = dS K over all 128 keys (warpgroup g takes at D = 128 columns
//   [64 g, 64 g + 64), at D = 64 queries [64 g, 64 g + 64) of the 128), through shared memory in
//   accumulator order to one bulk reduce-add, issued under the next step's S^T and dP^T.
#pragma once

#if defined(KK_TARGET_CUDA)
#include <kernelkit/tensor_ops/sm90_attention.h>

namespace kk::tops::sm90 {

template <class T, int D>
struct attention_backward {
  static constexpr int E = wgmma_type<T>::id;
  static constexpr bool supported = detail::arch_ok && (E == F16 || E == BF16) && (D == 64 || D == 128);
  // Queries a step: 128 at D = 64 (the registers hold its scores; the MMAs' n doubles and dQ is
  // summed over all 128 keys before its reduce-add, half the traffic), 64 at D = 128.
  static constexpr int threads = 384, consumer_threads = 256, block_k = 128, block_q = D == 64 ? 128 : 64;
  static constexpr int Stages = 2;
  static constexpr int DC = D / 64;                         // 128-byte chunks of a row
  static constexpr int box = 64 * 128;                      // a TMA box: 64 rows x 128 bytes
  static constexpr int kv_bytes = block_k * D * 2;          // K or V
  static constexpr int q_bytes = block_q * D * 2;           // a stage's Q or dO
  static constexpr int vec_bytes = block_q * 4;             // a stage's lse2 or delta
  static constexpr int stage_bytes = 2 * q_bytes + 2 * vec_bytes;
  static constexpr int ds_bytes = block_k * block_q * 2;    // dS^T of both warpgroups
  // dS^T double-buffered where shared memory has room (at D = 64 one buffer, a barrier before it
  // is rewritten: two would be 233,216 bytes, above the 232,448 a threadgroup may have)
  static constexpr int ds_buffers = D == 64 ? 1 : 2;
  static constexpr int dq_bytes = 64 * 64 * 4;              // a warpgroup's dQ product (two buffers each)
  // K, V; the stages; the dS^T buffers; four dQ buffers; barriers (256), 4 maps (512), + 1024 to align
  static constexpr int smem_bytes =
      2 * kv_bytes + Stages * stage_bytes + ds_buffers * ds_bytes + 4 * dq_bytes + 256 + 512 + 1024;
  static_assert(block_q == 64 || DC == 1, "a stage's Q and dO are [64-row chunk][128-byte column chunk]");

  struct operand {
    const T* p;
    long batch, head, row;  // strides, elements
  };
  struct output {
    T* p;
    long batch, head, row;
  };

  // Floats 4i .. 4i + 3 of a query block's dQ sums: elements (row, col), (row, col + 1),
  // (row + 8, col), (row + 8, col + 1) of the block (a thread's accumulators 4v .. 4v + 3 of
  // warpgroup g's 64 x 64 product: at D = 128 its 64 columns, at D = 64 its 64 queries).
  __host__ __device__ static void dq_coord(int i, int& row, int& col) {
    const int g = i >> 10, v = (i >> 7) & 7, tw = i & 127, lane = tw & 31;
    row = (D == 64 ? g * 64 : 0) + (tw >> 5) * 16 + (lane >> 2);
    col = (D == 64 ? 0 : g * 64) + v * 8 + (lane & 3) * 2;
  }

  __device__ static void run(const operand& q, const operand& k, const operand& v, const operand& dout,
                             const float* lse2, const float* delta, float* dq_acc, const output& dk,
                             const output& dv, int* next_tile, int B, int H, int Hkv, int Sq, int Sk, float scale,
                             bool causal) {
    static_assert(supported, "attention_backward: 16-bit types, D = 64 or 128, on sm_90a");
#if defined(KK_TOPS_NO_WARPGROUP)
    static_assert(!supported, "attention_backward stages through the kernel's dynamic shared memory: a body "
                              "with its own extern __shared__ cannot use it");
#endif
    using namespace detail;
    const unsigned base = persistent_smem<smem_bytes, threads>();
    const unsigned ks = base, vs = ks + kv_bytes, stages = vs + kv_bytes, dss = stages + Stages * stage_bytes;
    const unsigned dqs = dss + ds_buffers * ds_bytes, bars = dqs + 4 * dq_bytes, maps = bars + 256;
    const unsigned kv_full = bars, kv_empty = bars + 8, full = bars + 16, empty = full + 8 * Stages;
    // the tile in K and V (index, key block, key head, batch: 16 bytes), the slots word
    const unsigned tile_slot = empty + 8 * Stages, slot_word = tile_slot + 16;
    const int t = int(threadIdx.x), warp = t >> 5;
    const unsigned sm = current_sm();
    const int nkb = (Sk + block_k - 1) / block_k, tiles = nkb * Hkv * B, group = H / Hkv;
    const int nqb = (Sq + block_q - 1) / block_q;

    if (warp == 8)
      publish_maps<4>(sm, maps, slot_word, [&] {
        make(maps, q, Sq, H, B);
        make(maps + 128, dout, Sq, H, B);
        make(maps + 256, k, Sk, Hkv, B);
        make(maps + 384, v, Sk, Hkv, B);
        ring_init(kv_full, kv_empty, 1, consumer_threads / 32);
        ring_init(full, empty, Stages, consumer_threads / 32);
      });
    __syncthreads();
    const int slots = read_slots(slot_word);

    if (warp >= 8) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
      if (t == 256) {
        const void *map_q = map_in(sm, slots, 0), *map_do = map_in(sm, slots, 1);
        const void *map_k = map_in(sm, slots, 2), *map_v = map_in(sm, slots, 3);
        acquire_map(map_q);
        acquire_map(map_do);
        acquire_map(map_k);
        acquire_map(map_v);
        int it = 0;
        for (int n = 0, tile = int(blockIdx.x);; ++n, tile = take_tile(tile, next_tile, causal)) {
          const tile_at at = where(tile, nkb, Hkv, nqb, causal);
          // Stream the tile's query blocks; once the first is issued (the stage it takes frees
          // under the last tile's last step), K and V, when the last tile's consumers are done
          // with them (its dK / dV epilogue then runs under these copies).
          const bool done = tile >= tiles;
          bool first = true;
#pragma unroll 1
          for (int h = at.hk * group; h < (done ? 0 : at.hk * group + group); ++h)
#pragma unroll 1
            for (int qb = at.qb0; qb < nqb; ++qb, ++it) {
              const int s = it % Stages, use = it / Stages;
              const unsigned st = stages + s * stage_bytes;
              if (use > 0) mbar_wait(empty + 8 * s, (use & 1) ^ 1);
              mbar_expect_tx(full + 8 * s, stage_bytes);
#pragma unroll
              for (int r = 0; r < block_q / 64; ++r)
#pragma unroll
                for (int c = 0; c < DC; ++c) {
                  const unsigned at_rc = st + (r * DC + c) * box;
                  tma_load_4d(at_rc, map_q, 64 * c, qb * block_q + 64 * r, h, at.b, full + 8 * s);
                  tma_load_4d(at_rc + q_bytes, map_do, 64 * c, qb * block_q + 64 * r, h, at.b, full + 8 * s);
                }
              const long row = (long(at.b) * H + h) * nqb * block_q + qb * block_q;
              bulk_load(st + 2 * q_bytes, lse2 + row, vec_bytes, full + 8 * s);
              bulk_load(st + 2 * q_bytes + vec_bytes, delta + row, vec_bytes, full + 8 * s);
              if (first) load_kv(n, tile, false, at, ks, vs, tile_slot, kv_full, kv_empty, map_k, map_v);
              first = false;
            }
          // a tile of no steps (causal, keys past every query) and the end (told as a tile)
          if (first) load_kv(n, tile, done, at, ks, vs, tile_slot, kv_full, kv_empty, map_k, map_v);
          if (done) break;
        }
      }
    } else {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
      consume(t, ks, vs, stages, dss, dqs + (warp >> 2) * 2 * dq_bytes, kv_full, kv_empty, full, empty, tile_slot,
              dq_acc, dk, dv, tiles, nqb, H, group, Sk, scale, causal);
    }
    __syncthreads();  // every copy landed and was read, every reduction read: barriers and slots are free
    if (t == 256) {
      ring_inval(kv_full, kv_empty, 1);
      ring_inval(full, empty, Stages);
      release_slots(sm, slots);
    }
  }

 private:
  static constexpr int n_s = block_q / 2, n_p = block_q / 4, n_g = D / 2, n_q = 32;  // per thread

  // A (D, rows, heads, batches) map of 64 x 64 boxes.
  __device__ static void make(unsigned map, const operand& x, int rows, int heads, int batches) {
    detail::attention_map<D>(map, x.p, x.row, x.head, x.batch, rows, heads, batches);
  }
  // Accumulators a zero-initialising MMA overwrites: their old values are dead here (wgmma's asm
  // reads every accumulator, which would keep them live, in registers, until the issue).
  template <int N> __device__ static void overwritten(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "=f"(r[i]));
  }

  // A tile: a block of keys of a key head and batch (key blocks fastest: the threadgroups in
  // flight stream the same query blocks through L2; causal, ordered by key block instead, longest
  // first: the streams of ~64 heads at once miss L2, -20% at B=4 H=16 S=4096, H100). Its steps
  // take every query head of the key head in turn, a head's query blocks in order from qb0 (with
  // causal the first that sees a key of the block).
  struct tile_at {
    int j, hk, b, qb0;
  };
  __device__ static tile_at where(int tile, int nkb, int Hkv, int nqb, bool causal) {
    tile_at a;
    const int r = tile / nkb;
    a.j = tile - r * nkb;
    a.hk = r % Hkv;
    a.b = r / Hkv;
    a.qb0 = first_block(a.j, nqb, causal);
    return a;
  }
  __device__ static int first_block(int j, int nqb, bool causal) {
    return causal ? min(nqb, j * block_k / block_q) : 0;
  }
  // The producer's n-th tile (past the last: none) to the consumers, with its K and V once the
  // consumers are done with the last tile's.
  __device__ static void load_kv(int n, int tile, bool done, const tile_at& at, unsigned ks, unsigned vs,
                                 unsigned tile_slot, unsigned kv_full, unsigned kv_empty, const void* map_k,
                                 const void* map_v) {
    using namespace detail;
    if (n > 0) mbar_wait(kv_empty, (n - 1) & 1);
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(tile_slot), "r"(tile), "r"(at.j), "r"(at.hk),
                 "r"(at.b) : "memory");
    if (done) {
      mbar_arrive(kv_full);
      return;
    }
    mbar_expect_tx(kv_full, 2 * kv_bytes);  // (its arrival releases the slot to the consumers)
#pragma unroll
    for (int c = 0; c < DC; ++c)
#pragma unroll
      for (int r = 0; r < block_k / 64; ++r) {
        tma_load_4d(ks + c * block_k * 128 + r * box, map_k, 64 * c, at.j * block_k + 64 * r, at.hk, at.b, kv_full);
        tma_load_4d(vs + c * block_k * 128 + r * box, map_v, 64 * c, at.j * block_k + 64 * r, at.hk, at.b, kv_full);
      }
  }

  // P^T of a step in place of S^T. Mask: zero where 8 (i / 4) + i % 2 < lim[r] for element i of
  // row r, lim the row's first query seen (every one past Sk, the key's own with causal) less this
  // thread's first column (a compile-time choice: a branch between an MMA's issue and its wait
  // makes ptxas wait for it there; the selects cost registers that the other steps keep).
  template <bool Mask>
  __device__ static void probabilities(float (&s)[n_s], unsigned lse, float scale2, const int (&lim)[2]) {
    const int first = (threadIdx.x & 3) * 2;
#pragma unroll
    for (int c = 0; c < n_s / 4; ++c) {  // columns (queries) 8c + first, + 1
      float l0, l1;
      detail::ld_shared_v2(lse + (8 * c + first) * 4, l0, l1);
#pragma unroll
      for (int i = 4 * c; i < 4 * c + 4; ++i) {
        const float x = fmaf(s[i], scale2, -(i & 1 ? l1 : l0));
        s[i] = detail::ex2(Mask && 8 * c + (i & 1) < lim[(i >> 1) & 1] ? -detail::inf() : x);
      }
    }
  }
  // dS^T = P^T * (dP^T - delta) in place of dP^T.
  __device__ static void dscores(const float (&p)[n_s], float (&dp)[n_s], unsigned delta) {
    const int first = (threadIdx.x & 3) * 2;
#pragma unroll
    for (int c = 0; c < n_s / 4; ++c) {
      float d0, d1;
      detail::ld_shared_v2(delta + (8 * c + first) * 4, d0, d1);
#pragma unroll
      for (int i = 4 * c; i < 4 * c + 4; ++i) dp[i] = p[i] * (dp[i] - (i & 1 ? d1 : d0));
    }
  }

  // A warpgroup's 64 rows (keys from key0) of dK or dV from its buffer (st_accumulator_pair's
  // layout) to the output, 16 bytes a store, a warp two whole rows at a time.
  __device__ static void copy_out(unsigned buf, const output& out, int key0, int Sk, int hk, int b) {
    const int tw = int(threadIdx.x & 127);
#pragma unroll
    for (int m = 0; m < 4 * DC; ++m) {
      const int e = tw + 128 * m, row = e / (8 * DC), c = (e >> 3) % DC, u = e & 7, key = key0 + row;
      float x, y, z, w;
      detail::ld_shared_v4(buf + c * box + row * 128 + (((u ^ row) & 7) << 4), x, y, z, w);
      if (key < Sk)
        *reinterpret_cast<float4*>(out.p + b * out.batch + hk * out.head + key * out.row + c * 64 + u * 8) =
            make_float4(x, y, z, w);
    }
  }

  __device__ static void consume(int t, unsigned ks, unsigned vs, unsigned stages, unsigned dss, unsigned dqs,
                                 unsigned kv_full, unsigned kv_empty, unsigned full, unsigned empty,
                                 unsigned tile_slot, float* dq_acc, const output& dk_out, const output& dv_out,
                                 int tiles, int nqb, int H, int group, int Sk, float scale, bool causal) {
    using namespace detail;
    // (the warpgroup broadcast from lane 0: ptxas then knows it uniform, and keeps the operands'
    // addresses in uniform registers)
    const int wg = __shfl_sync(0xffffffffu, t >> 7, 0), tw = t & 127, w = tw >> 5, lane = tw & 31;
    const bool leader = lane == 0;
    const float scale2 = scale * 1.4426950408889634f;  // log2(e): exp2 does the softmax
    // dQ's operands, over all 128 keys (both warpgroups' dS^T): at D = 128 this warpgroup's 64
    // columns (a chunk of K) of the step's queries, at D = 64 every column of its 64 queries (a
    // chunk of dS^T)
    const unsigned k_cols = D == 128 ? ks + wg * block_k * 128 : ks;
    const unsigned ds_chunk = D == 128 ? 0 : wg * block_k * 128;
    // this thread's first row in the tile (its rows: row0, row0 + 8), and its first dS^T element in
    // a buffer (that row, swizzled), less the buffer
    const int row0 = wg * 64 + w * 16 + (lane >> 2);
    const unsigned ds_row = row0 * 128 + ((lane >> 2) << 4) + (lane & 3) * 4;

    float dk[n_g], dv[n_g], s[n_s], dp[n_s], dq[n_q];
    unsigned p[n_p], ds[n_p];
    int seen[2] = {0, 0}, b = 0;
    float* dq_dst = dq_acc;  // where the last step's dQ goes
    bool pending = false;    // whether it has yet to go
    const auto step = [&](int it, int h, int qb, auto mask) {
      const unsigned qt = stages + (it % Stages) * stage_bytes, dot = qt + q_bytes;
      const unsigned dsb = dss + (it % ds_buffers) * ds_bytes;
      mbar_wait(full + 8 * (it % Stages), (it / Stages) & 1);
      overwritten(s);
      overwritten(dp);
      wgmma_fence();
      detail::scores<block_q, E, DC>(s, ks + wg * box, block_k * 128, qt, box);  // S^T = K Q^T
      wgmma_commit();
      detail::scores<block_q, E, DC>(dp, vs + wg * box, block_k * 128, dot, box);  // dP^T = V dO^T
      wgmma_commit();
      // Under these MMAs, the previous step's dQ (written at its end to buffer (it - 1) % 2) to its
      // bulk reduce-add; the reduction before that one has read buffer it % 2, written at this
      // step's end. (Predicates, not branches: see probabilities.)
      bulk_wait_read();  // (only the issuing thread has reductions)
      named_barrier(1 + wg, 128);
      bulk_reduce_add_if(dq_dst, dqs + ((it - 1) & 1) * dq_bytes, dq_bytes, tw == 0 && pending);
      bulk_commit();
      wgmma_wait<1>();  // S^T landed: its exponentials run under dP^T's MMAs
      detail::fence_all(s);
      const int lim[2] = {seen[0] - qb * block_q, seen[1] - qb * block_q};
      probabilities<decltype(mask)::value>(s, qt + 2 * q_bytes, scale2, lim);
      detail::fence_all(s);
      wgmma_wait<0>();
      detail::fence_all(dp);
      dscores(s, dp, qt + 2 * q_bytes + vec_bytes);
#pragma unroll
      for (int i = 0; i < n_p; ++i) {
        p[i] = pack_pair<T>(s[2 * i], s[2 * i + 1]);
        ds[i] = pack_pair<T>(dp[2 * i], dp[2 * i + 1]);
      }
      detail::fence_all(dv);
      detail::fence_all(dk);
      wgmma_fence();
      detail::register_product<D, E, block_q>(dv, p, dot, true);  // dV += P^T dO
      detail::register_product<D, E, block_q>(dk, ds, qt, true);  // dK += dS^T Q
      wgmma_commit();
      // dS^T into the buffer: rows are keys (128 bytes of 64 queries each, swizzled; 128 queries
      // in two chunks of 128 rows), as dQ's MN-major A. Pair i is row ds_row + 8 (i % 2), 16-byte
      // unit i / 2 of the queries (unit u % 8 of chunk u / 8), at unit (u % 8) ^ (row % 8).
      if (ds_buffers == 1) named_barrier(6, consumer_threads);  // the last step's dQ MMAs read it
#pragma unroll
      for (int i = 0; i < n_p; ++i)
        st_shared((((ds_row + dsb) ^ (((i >> 1) & 7) << 4)) + (i & 1) * 1024) + (i >> 4) * (block_k * 128), ds[i]);
      fence_proxy_async();
      named_barrier(5, consumer_threads);  // the dS^T rows dQ reads are written
      overwritten(dq);
      wgmma_fence();
      {
        const unsigned long long da = descriptor(dsb + ds_chunk, box, 1024), db = descriptor(k_cols, box, 1024);
#pragma unroll
        for (int kk = 0; kk < block_k / 16; ++kk)
          mma<64, E, E, 1, 1>(dq, da + ((kk * 2048) >> 4), db + ((kk * 2048) >> 4), kk > 0);
      }
      wgmma_commit();
      wgmma_wait<1>();  // dV and dK's MMAs are done with P^T, dS^T and the stage
      detail::fence_all(dv);
      detail::fence_all(dk);
      detail::fence_all(p);
      detail::fence_all(ds);
      mbar_arrive_if(empty + 8 * (it % Stages), leader);
      wgmma_wait<0>();
      detail::fence_all(dq);
      // dQ into buffer it % 2 in accumulator order (16-byte stores, no conflicts), reduced next step
      const unsigned dqb = dqs + (it & 1) * dq_bytes;
#pragma unroll
      for (int v4 = 0; v4 < n_q / 4; ++v4)
        st_shared_v4(dqb + (v4 * 128 + tw) * 16, dq[4 * v4], dq[4 * v4 + 1], dq[4 * v4 + 2], dq[4 * v4 + 3]);
      fence_proxy_async();
      dq_dst = dq_acc + ((long(b) * H + h) * nqb + qb) * (block_q * D) + wg * 4096;
      pending = true;
    };
    int it = 0;  // steps done, over the tiles
#pragma unroll 1
    for (int n = 0;; ++n) {
      mbar_wait(kv_full, n & 1);
      int tile;
      tile_at at;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(tile), "=r"(at.j), "=r"(at.hk), "=r"(at.b) : "r"(tile_slot) : "memory");
      tile = __shfl_sync(0xffffffffu, tile, 0);  // (uniform: ptxas keeps what follows in uniform registers)
      if (tile >= tiles) break;
      at.j = __shfl_sync(0xffffffffu, at.j, 0);
      at.hk = __shfl_sync(0xffffffffu, at.hk, 0);
      at.b = __shfl_sync(0xffffffffu, at.b, 0);
      at.qb0 = first_block(at.j, nqb, causal);
      b = at.b;
      // this warpgroup's first key, this thread's first; a row's first query seen (none past Sk;
      // with causal its key: both far enough from any query that the differences stay in range),
      // less this thread's first column
      const int wkey = at.j * block_k + wg * 64, key0 = at.j * block_k + row0;
#pragma unroll
      for (int r = 0; r < 2; ++r)
        seen[r] = (key0 + 8 * r >= Sk ? 1 << 30 : causal ? key0 + 8 * r : -(1 << 30)) - (lane & 3) * 2;
#pragma unroll
      for (int i = 0; i < n_g; ++i) dk[i] = dv[i] = 0.0f;
      // Steps that need masking: all where this warpgroup's keys pass Sk; causal, those before the
      // first query block whose first query sees every key of this warpgroup.
      const bool edge = wkey + 64 > Sk;
      const int unmasked_from = causal ? (wkey + 63) / block_q + 1 : 0;
#pragma unroll 1
      for (int h = at.hk * group; h < at.hk * group + group; ++h)
#pragma unroll 1
        for (int qb = at.qb0; qb < nqb; ++qb, ++it) {
          if (edge || qb < unmasked_from) step(it, h, qb, detail::flag<true>{});
          else step(it, h, qb, detail::flag<false>{});
        }
      mbar_arrive_if(kv_empty, leader);  // the last step's MMAs were K and V's last reads

      // Epilogue: the last step's dQ to its reduction now, dK (scaled) into the other dQ buffer
      // under it, then dV into its buffer; both out by 16-byte stores, rows past Sk not written
      // (the next tile's K and V load meanwhile). From the registers, a pair a 4-byte store, it
      // took ~8 store wavefronts an instruction.
      const unsigned last = dqs + ((it - 1) & 1) * dq_bytes, other = dqs + (it & 1) * dq_bytes;
      bulk_wait_read();
      named_barrier(1 + wg, 128);
      bulk_reduce_add_if(dq_dst, last, dq_bytes, tw == 0 && pending);
      bulk_commit();
      pending = false;
#pragma unroll
      for (int i = 0; i < n_g; i += 2) st_accumulator_pair<T>(other, i, dk[i] * scale, dk[i + 1] * scale);
      bulk_wait_read();
      named_barrier(1 + wg, 128);  // (the reduction has read `last`)
#pragma unroll
      for (int i = 0; i < n_g; i += 2) st_accumulator_pair<T>(last, i, dv[i], dv[i + 1]);
      named_barrier(1 + wg, 128);
      const int wkey0 = at.j * block_k + wg * 64;
      copy_out(other, dk_out, wkey0, Sk, at.hk, b);
      copy_out(last, dv_out, wkey0, Sk, at.hk, b);
    }
    bulk_wait();
  }
};

}  // namespace kk::tops::sm90
#endif  // KK_TARGET_CUDA
