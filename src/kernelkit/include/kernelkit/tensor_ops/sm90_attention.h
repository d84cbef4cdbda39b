// kernelkit/tensor_ops/sm90_attention.h: a persistent, warp-specialised flash-attention forward
// for Hopper (FlashAttention-3's structure) in the layer, for kernels that own a whole launch
// (kk.ops.flash_attention's forward on sm_90).
//
// Why beside the talk's loop (ops/flash_attention_forward.metal, matmul2d runs of one
// warpgroup): each run there stages its operand when called and waits for it, then waits for its
// own MMAs, so the tensor cores idle under every copy and every softmax (376 TFLOP/s at B=4 H=16
// S=4096 D=128 bf16 against cuDNN's ~600, bench/notes/flash_attention.md). Here a producer
// warpgroup streams K and V through a pipeline of TMA stages while two consumer warpgroups
// (three at D = 64) compute, and each consumer issues the next block's QK^T before its softmax of
// this block and the PV product of the previous one, so exponentials run under MMAs.
//
// The contract:
//
//   namespace kk::tops::sm90 {
//   template <class T, int D>
//   struct attention_forward {
//     static constexpr int threads;          // 384: 2 consumer warpgroups, a producer (D = 64: 512, 3)
//     static constexpr int block_q;          // queries a tile, 64 a consumer warpgroup (128; D = 64: 192)
//     static constexpr int smem_bytes;       // its dynamic shared memory (the launcher gives it)
//     struct operand { const T* p; long batch, head, row; };   // strides, elements
//     __device__ static void run(const operand& q, const operand& k, const operand& v, const operand& o,
//                                float* lse, int* next_tile, int B, int H, int Hkv, int Sq, int Sk,
//                                float scale, bool causal);
//   };
//   }
//
// - T is __half or __nv_bfloat16, D 64 or 128; sums and softmax in float. Element (b, h, s, d) of
//   q is q.p[b * q.batch + h * q.head + s * q.row + d] (d packed), likewise k and v with Hkv
//   heads (query head h reads key/value head h / (H / Hkv)) and Sk rows, o (written) with H heads
//   and Sq rows. TMA's limits: bases 16-byte aligned, strides in bytes multiples of 16 (a size-1
//   dim's too) below 2^40, the caller checks them. scale > 0.
// - o = softmax(q k^T * scale) v per (b, h), causal: query i sees keys j <= i (top-left, as
//   torch's is_causal). lse[(b * H + h) * Sq + i] = the natural log of row i's sum of
//   exp(scores * scale).
// - Every thread of the threadgroup calls run; launch min(tiles, SMs) threadgroups, tiles =
//   B * H * ceil(Sq / block_q) (block_q = 128; 192 at D = 64); next_tile points to an int the
//   caller zeroed. As persistent_gemm: no extern __shared__ of the kernel's own, and the kernel's
//   header defines KK_MAX_THREADS_PER_THREADGROUP as `threads` (384, setmaxnreg 40 / 232; at
//   D = 64 512, 24 / 160).
//
// Pipeline: the producer's first thread takes the tiles (round-robin; causal ones, which differ
// in length, from a counter: detail::take_tile) and loads each one's Q (block_q x D) into one of
// two buffers, the tile's coordinates in a slot beside it (the next tile's Q lands under this
// tile's steps), then K and V blocks of BN = 128 keys, each through its own ring of Stages
// buffers (full / empty mbarriers). Consumer warpgroup g owns queries [64 g, 64 g + 64) of the
// tile. Step j: S_j = Q K_j^T (wgmma, both from shared memory) is issued, O is rescaled to the
// previous softmax's max under it, O += P_{j-1} V_{j-1} is issued (P in registers: the scores'
// accumulator layout is wgmma's A fragment), then S_j's softmax runs while P_{j-1} V_{j-1} is in
// flight. The consumer warpgroups (two; three at D = 64) take turns issuing their MMAs (named
// barriers, round robin), so one's softmax also runs under the others' MMAs. The output leaves
// through a 128-byte-swizzled buffer by TMA stores, the log-sum-exp from the registers. Measured
// against the alternatives (bench/notes/flash_attention.md): without the turns, -2% to -12%; a
// single Q buffer, -1% to -4% at D = 64; a second P buffer, packed under the MMAs, spills at
// D = 128 (ptxas then serialises every wgmma); a quarter of the exponentials on the FMA pipes
// (FlashAttention-4's cubic), -3% to -7% at D = 64.
#pragma once

#if defined(KK_TARGET_CUDA)
#include <kernelkit/tensor_ops/sm90_wgmma.h>

namespace kk::tops::sm90 {

namespace detail {
// What the attention kernels (attention_forward, attention_backward) share.
__device__ __forceinline__ float inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
template <class R, int N> __device__ __forceinline__ void fence_all(R (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) fence_operand(r[i]);
}
template <bool V> struct flag {
  static constexpr bool value = V;
};
// acc = A B^T over D (DC 128-byte chunks of it) for 16-bit A (64 rows) and B (N rows), both K-major
// and swizzled, chunk c of A at a + c * a_chunk bytes and of B at b + c * b_chunk: the scores.
template <int N, int E, int DC>
__device__ __forceinline__ void scores(float (&acc)[N / 2], unsigned a, unsigned a_chunk, unsigned b,
                                       unsigned b_chunk) {
  const unsigned long long da = descriptor(a, 16, 1024), db = descriptor(b, 16, 1024);
#pragma unroll
  for (int c = 0; c < DC; ++c)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      mma<N, E, E, 0, 0>(acc, da + ((c * a_chunk + kk * 32) >> 4), db + ((c * b_chunk + kk * 32) >> 4),
                         c > 0 || kk > 0);
}
// acc (+)= P X over K rows: P packed in registers (the scores' accumulator layout is wgmma's A
// fragment), X (K x D) read MN-major (wgmma's transpose bit) from 64-row chunks of DC slabs of
// 64 x 64 (a box each).
template <int D, int E, int K>
__device__ __forceinline__ void register_product(float (&acc)[D / 2], const unsigned (&p)[K / 4], unsigned x,
                                                 bool accumulate) {
  constexpr int DC = D / 64, box = 64 * 128;
  const unsigned long long db = descriptor(x, box, 1024);
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const unsigned a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
    mma_rs<D, E, 1>(acc, a, db + (((kk / 4) * DC * box + (kk % 4) * 16 * 128) >> 4), accumulate || kk > 0);
  }
}
// A persistent threadgroup's next tile after `tile`. Causal tiles differ in length: they are
// taken in order from the counter (dealt round-robin, the SMs' shares differed by up to 12% at
// B=4 H=16 S=4096); tiles all alike are dealt round-robin.
__device__ __forceinline__ int take_tile(int tile, int* counter, bool causal) {
  return causal ? int(gridDim.x) + atomicAdd(counter, 1) : tile + int(gridDim.x);
}
// Values i, i + 1 of a warpgroup's m64 accumulators, packed, into a buffer of 64-column chunks of
// 64 rows x 128 bytes whose 16-byte units are swizzled by the row (TMA's 128-byte swizzle):
// conflict-free, as the attention kernels' epilogues write their outputs before copying them out.
template <class T>
__device__ __forceinline__ void st_accumulator_pair(unsigned buf, int i, float x, float y) {
  const int lane = int(threadIdx.x & 31), w = int(threadIdx.x >> 5) & 3;
  const int row = w * 16 + (lane >> 2) + 8 * ((i >> 1) & 1), col = (i >> 2) * 8 + (lane & 3) * 2;
  const int cb = (col & 63) * 2;  // byte in the chunk's 128-byte row
  st_shared(buf + (col >> 6) * 8192 + row * 128 + ((((cb >> 4) ^ row) & 7) << 4) + (cb & 15), pack_pair<T>(x, y));
}
// A (D, rows, heads, batches) map of 16-bit elements in 64 x 64 boxes, strides in elements.
template <int D>
__device__ __forceinline__ void attention_map(unsigned map, const void* p, long row, long head, long batch, int rows,
                                              int heads, int batches) {
  make_map<1>(map, p, D, rows, row * 2, 64, 64, heads, head * 2, batches, batch * 2);
}
}  // namespace detail

template <class T, int D>
struct attention_forward {
  static constexpr int E = wgmma_type<T>::id;
  static constexpr bool supported = detail::arch_ok && (E == F16 || E == BF16) && (D == 64 || D == 128);
  // Consumer warpgroups, 64 queries each: at D = 64 a step's MMAs are half as long beside the same
  // softmax, and a third warpgroup's softmax runs under the other two's MMAs (FlashAttention-3's
  // shape: +2-7% over two warpgroups with 192-key steps at B=4 H=16, H100), the registers then
  // 160 a consumer thread
  static constexpr int consumers = D == 64 ? 3 : 2;
  static constexpr int threads = 128 * (consumers + 1), consumer_threads = 128 * consumers, block_q = 64 * consumers;
  static constexpr int BN = 128, Stages = D == 64 ? 4 : 2;
  static constexpr int producer_regs = consumers == 3 ? 24 : 40, consumer_regs = consumers == 3 ? 160 : 232;
  static constexpr int DC = D / 64;                        // 128-byte chunks of a row
  static constexpr int box = 64 * 128;                     // a TMA box: 64 rows x 128 bytes
  static constexpr int q_bytes = block_q * D * 2, kv_bytes = BN * D * 2, o_bytes = 64 * D * 2;
  // two Q buffers (a tile's and the next's), the K and V rings, a consumer warpgroup's output buffer
  // each; barriers (1024), 4 maps (512), + 1024 to align
  static constexpr int smem_bytes = 2 * q_bytes + 2 * Stages * kv_bytes + consumers * o_bytes + 1024 + 512 + 1024;

  struct operand {
    const T* p;
    long batch, head, row;  // strides, elements
  };

  __device__ static void run(const operand& q, const operand& k, const operand& v, const operand& o, float* lse,
                             int* next_tile, int B, int H, int Hkv, int Sq, int Sk, float scale, bool causal) {
    static_assert(supported, "attention_forward: 16-bit types, D = 64 or 128, on sm_90a");
#if defined(KK_TOPS_NO_WARPGROUP)
    static_assert(!supported, "attention_forward stages through the kernel's dynamic shared memory: a body "
                              "with its own extern __shared__ cannot use it");
#endif
    using namespace detail;
    const unsigned base = persistent_smem<smem_bytes, threads>();
    const unsigned ks = base + 2 * q_bytes, vs = ks + Stages * kv_bytes, outs = vs + Stages * kv_bytes;
    const unsigned bars = outs + consumers * o_bytes, maps = bars + 1024;
    // barriers: q full and q empty pairs, the k full / k empty / v full / v empty rings; slots
    // word; the tile of each Q buffer (index, batch, head, first query: 16 bytes)
    const unsigned q_full = bars, q_empty = bars + 16, k_full = bars + 32, k_empty = k_full + 8 * Stages,
                   v_full = k_empty + 8 * Stages, v_empty = v_full + 8 * Stages, slot_word = v_empty + 8 * Stages,
                   tile_slots = slot_word + 16;
    const int t = int(threadIdx.x), warp = t >> 5;
    const unsigned sm = current_sm();

    // The producer's first warp makes the maps (Q, K; V, O) and sets up the barriers.
    if (warp == 4 * consumers)
      publish_maps<4>(sm, maps, slot_word, [&] {
        make(maps, q, Sq, H, B);
        make(maps + 128, k, Sk, Hkv, B);
        make(maps + 256, v, Sk, Hkv, B);
        make(maps + 384, o, Sq, H, B);
        ring_init(q_full, q_empty, 2, consumer_threads / 32);
        ring_init(k_full, k_empty, Stages, consumer_threads / 32);
        ring_init(v_full, v_empty, Stages, consumer_threads / 32);
      });
    __syncthreads();
    const int slots = read_slots(slot_word);

    const int nq = (Sq + block_q - 1) / block_q, tiles = B * H * nq, group = H / Hkv;
    if (warp >= 4 * consumers) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(producer_regs) : "memory");
      if (t == consumer_threads) {
        const void *map_q = map_in(sm, slots, 0), *map_k = map_in(sm, slots, 1), *map_v = map_in(sm, slots, 2);
        acquire_map(map_q);
        acquire_map(map_k);
        acquire_map(map_v);
        int it = 0;
        for (int n = 0, tile = int(blockIdx.x);; ++n, tile = take_tile(tile, next_tile, causal)) {
          // Q buffer n % 2 and its tile slot: free once tile n - 2's QK^T products are done (past
          // the last tile, the slot tells the consumers so; the barrier's arrival releases it).
          // The slot holds the tile's coordinates too: the consumers read them under no wait.
          const unsigned qf = q_full + 8 * (n & 1), qb = base + (n & 1) * q_bytes;
          int b = 0, h = 0, q0 = 0;
          if (tile < tiles) where(tile, nq, H, Sq, causal, b, h, q0);
          if (n > 1) mbar_wait(q_empty + 8 * (n & 1), ((n >> 1) - 1) & 1);
          asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(tile_slots + 16 * (n & 1)), "r"(tile),
                       "r"(b), "r"(h), "r"(q0) : "memory");
          if (tile >= tiles) {
            mbar_arrive(qf);
            break;
          }
          const int hk = h / group, blocks = key_blocks(q0, Sk, causal);
          mbar_expect_tx(qf, q_bytes);
#pragma unroll
          for (int c = 0; c < DC; ++c)
#pragma unroll
            for (int r = 0; r < block_q / 64; ++r)
              tma_load_4d(qb + c * block_q * 128 + r * box, map_q, 64 * c, q0 + 64 * r, h, b, qf);
          for (int j = 0; j < blocks; ++j, ++it) {
            const int s = it % Stages, use = it / Stages;
            // K block: chunk c of 128 rows x 128 bytes (K-major B of Q K^T); V block: 64-key
            // chunks of DC slabs of 64 x 64 (MN-major B of P V)
            if (use > 0) mbar_wait(k_empty + 8 * s, (use & 1) ^ 1);
            mbar_expect_tx(k_full + 8 * s, kv_bytes);
#pragma unroll
            for (int c = 0; c < DC; ++c)
#pragma unroll
              for (int r = 0; r < BN / 64; ++r)
                tma_load_4d(ks + s * kv_bytes + c * BN * 128 + r * box, map_k, 64 * c, j * BN + 64 * r, hk, b,
                            k_full + 8 * s);
            if (use > 0) mbar_wait(v_empty + 8 * s, (use & 1) ^ 1);
            mbar_expect_tx(v_full + 8 * s, kv_bytes);
#pragma unroll
            for (int r = 0; r < BN / 64; ++r)
#pragma unroll
              for (int c = 0; c < DC; ++c)
                tma_load_4d(vs + s * kv_bytes + (r * DC + c) * box, map_v, 64 * c, j * BN + 64 * r, hk, b,
                            v_full + 8 * s);
          }
        }
      }
    } else {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(consumer_regs) : "memory");
      consume(t, base, ks, vs, outs + (warp >> 2) * o_bytes, q_full, q_empty, k_full, k_empty, v_full, v_empty,
              tile_slots, map_in(sm, slots, 3), lse, tiles, H, Sq, Sk, scale, causal);
    }
    __syncthreads();  // every copy landed and was read, every store written: barriers and slots are free
    if (t == consumer_threads) {
      ring_inval(q_full, q_empty, 2);
      ring_inval(k_full, k_empty, Stages);
      ring_inval(v_full, v_empty, Stages);
      release_slots(sm, slots);
    }
  }

 private:
  static constexpr int n_s = BN / 2, n_o = D / 2, n_p = BN / 4;  // a thread's scores, outputs, packed P

  // A (D, rows, heads, batches) map of 64 x 64 boxes.
  __device__ static void make(unsigned map, const operand& x, int rows, int heads, int batches) {
    detail::attention_map<D>(map, x.p, x.row, x.head, x.batch, rows, heads, batches);
  }
  // Tile `tile`'s batch, head and first query: the query blocks of a head are consecutive, so the
  // SMs' tiles in flight share K and V in L2; causal tiles run the longest (last) blocks first and
  // end at Sq, so that the one left over is the first, which reads the fewest keys: it starts at 0
  // and overlaps the next (a TMA coordinate below 0 faults), whose rows it writes bit for bit as
  // that tile does (the same products and steps; past a row's last key a step adds exact zeros).
  // At D = 64 (192 queries a tile) that is 6% less work at S = 4096 than a partial last tile.
  __device__ static void where(int tile, int nq, int H, int Sq, bool causal, int& b, int& h, int& q0) {
    const int bh = tile / nq, qb = tile - bh * nq;
    b = bh / H;
    h = bh - b * H;
    q0 = causal ? max(Sq - (qb + 1) * block_q, 0) : qb * block_q;
  }
  // Key blocks a tile reads: causal tiles stop at their last query.
  __device__ static int key_blocks(int q0, int Sk, bool causal) {
    const int kend = causal ? min(Sk, q0 + block_q) : Sk;
    return (kend + BN - 1) / BN;
  }


  // The online softmax of a block's scores in place (exponentials, log2 domain), this thread's two
  // rows' max m and partial sums l updated; returns in alpha the factors of the old state.
  // Mask: keys >= Sk, and with causal keys past the row, are -inf (a compile-time choice: a branch
  // between an MMA's issue and its wait makes ptxas wait for it at the branch).
  template <bool Mask>
  __device__ static void softmax(float (&s)[n_s], float (&m)[2], float (&l)[2], float (&alpha)[2], float scale2,
                                 int key0, int row0, int Sk, bool causal) {
    const int lane = threadIdx.x & 31;
    if constexpr (Mask) {
      // element i is (row r, key key0 + first + off(i)): it is seen where off(i) <= last[r]
      const int first = (lane & 3) * 2;
      int last[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) last[r] = (causal ? min(Sk - 1, row0 + 8 * r) : Sk - 1) - key0 - first;
#pragma unroll
      for (int i = 0; i < n_s; ++i) s[i] = (i >> 2) * 8 + (i & 1) > last[(i >> 1) & 1] ? -detail::inf() : s[i];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int i = 0; i < n_s / 4; ++i) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      alpha[r] = detail::ex2((m[r] - mx) * scale2);
      m[r] = mx;
      const float ms = mx * scale2;
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < n_s / 4; ++i) {
        s[4 * i + 2 * r] = detail::ex2(fmaf(s[4 * i + 2 * r], scale2, -ms));
        s[4 * i + 2 * r + 1] = detail::ex2(fmaf(s[4 * i + 2 * r + 1], scale2, -ms));
        sum += s[4 * i + 2 * r] + s[4 * i + 2 * r + 1];
      }
      l[r] = l[r] * alpha[r] + sum;
    }
  }

  __device__ static void rescale(float (&o)[n_o], const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < n_o; ++i) o[i] *= alpha[(i >> 1) & 1];
  }


  __device__ static void consume(int t, unsigned q_smem, unsigned ks, unsigned vs, unsigned out, unsigned q_full,
                                 unsigned q_empty, unsigned k_full, unsigned k_empty, unsigned v_full,
                                 unsigned v_empty, unsigned tile_slots, const void* map_o, float* lse, int tiles,
                                 int H, int Sq, int Sk, float scale, bool causal) {
    using namespace detail;
    const int wg = t >> 7, tw = t & 127, w = tw >> 5, lane = tw & 31, barrier = 1 + wg;
    const bool leader = lane == 0;
    const float scale2 = scale * 1.4426950408889634f;  // log2(e): exp2 does the softmax
    // The warpgroups take turns issuing their MMAs (FlashAttention-3's ping-pong, round robin):
    // each waits on its own barrier before its S product and lets the next go once its P V is
    // issued, so one's softmax runs under the others' MMAs. Warpgroup 0 goes first. A turn's
    // barrier joins two warpgroups: its owner and the one before.
    const int my_turn = 1 + consumers + wg, their_turn = 1 + consumers + (wg + 1) % consumers, turn = 256;
    if (wg == consumers - 1) named_barrier_arrive(their_turn, turn);
    if (tw == 0) acquire_map(map_o);
    float o[n_o], s[n_s];
    unsigned p[n_p];
    int it = 0;
#pragma unroll 1
    for (int n = 0;; ++n) {
      mbar_wait(q_full + 8 * (n & 1), (n >> 1) & 1);
      int tile, b, h, q0;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(tile), "=r"(b), "=r"(h), "=r"(q0) : "r"(tile_slots + 16 * (n & 1)) : "memory");
      tile = __shfl_sync(0xffffffffu, tile, 0);  // (uniform: ptxas keeps what follows in uniform registers)
      if (tile >= tiles) break;
      b = __shfl_sync(0xffffffffu, b, 0);
      h = __shfl_sync(0xffffffffu, h, 0);
      q0 = __shfl_sync(0xffffffffu, q0, 0);
      const int blocks = key_blocks(q0, Sk, causal);
      const int row_lo = q0 + wg * 64, row0 = row_lo + w * 16 + (lane >> 2);  // this thread's rows: row0, row0 + 8
      // Blocks from `unmasked` on need masking: they pass Sk or, causal, hold a key past this
      // warpgroup's first row.
      const int unmasked = causal ? min(Sk / BN, (row_lo + 1) / BN) : Sk / BN;
      // Blocks this warpgroup computes: a causal tile's last ones may hold no key of its rows (at
      // D = 64 up to one of the first warpgroup's, 3% of the work at S = 4096).
      const int mine = causal ? min(blocks, (min(Sk, row_lo + 64) + BN - 1) / BN) : blocks;
      float m[2] = {-detail::inf(), -detail::inf()}, l[2] = {0.0f, 0.0f}, alpha[2];
      // this warpgroup's 64 rows of each chunk of the tile's Q buffer; its barriers
      const unsigned q_tile = q_smem + (n & 1) * q_bytes + wg * box, qe = q_empty + 8 * (n & 1);

      // Block 0's scores and probabilities, then the steps; P_j is packed once the MMAs are done
      // reading P_{j-1}.
      {
        const int st = it % Stages;
        mbar_wait(k_full + 8 * st, (it / Stages) & 1);
        named_barrier(my_turn, turn);
        detail::fence_all(s);
        wgmma_fence();
        detail::scores<BN, E, DC>(s, q_tile, block_q * 128, ks + st * kv_bytes, BN * 128);
        wgmma_commit();
        named_barrier_arrive(their_turn, turn);
        wgmma_wait<0>();
        detail::fence_all(s);
        mbar_arrive_if(k_empty + 8 * st, leader);
        mbar_arrive_if(qe, leader && blocks == 1);
        if (unmasked > 0) softmax<false>(s, m, l, alpha, scale2, 0, row0, Sk, causal);
        else softmax<true>(s, m, l, alpha, scale2, 0, row0, Sk, causal);
#pragma unroll
        for (int i = 0; i < n_p; ++i) p[i] = pack_pair<T>(s[2 * i], s[2 * i + 1]);
      }
      // O (rescaled to the last softmax's max) += P V of the block in V stage sv
      const auto issue_pv = [&](int sv, bool accumulate) {
        if (accumulate) rescale(o, alpha);
        mbar_wait(v_full + 8 * sv, (it / Stages) & 1);
        detail::fence_all(o);
        wgmma_fence();
        detail::register_product<D, E, BN>(o, p, vs + sv * kv_bytes, accumulate);
        wgmma_commit();
      };
      const auto step = [&](int j, auto mask) {
        const int sk = (it + 1) % Stages, sv = it % Stages;  // block j's K stage, block j - 1's V stage
        mbar_wait(k_full + 8 * sk, ((it + 1) / Stages) & 1);
        named_barrier(my_turn, turn);
        detail::fence_all(s);
        wgmma_fence();
        detail::scores<BN, E, DC>(s, q_tile, block_q * 128, ks + sk * kv_bytes, BN * 128);
        wgmma_commit();
        issue_pv(sv, j > 1);
        named_barrier_arrive(their_turn, turn);
        detail::fence_all(p);
        wgmma_wait<1>();  // S_j landed
        detail::fence_all(s);
        mbar_arrive_if(k_empty + 8 * sk, leader);
        mbar_arrive_if(qe, leader && j == blocks - 1);
        softmax<decltype(mask)::value>(s, m, l, alpha, scale2, j * BN, row0, Sk, causal);
        detail::fence_all(s);  // the softmax stays before the wait (it does not touch memory: it could sink)
        detail::fence_all(l);
        detail::fence_all(alpha);
        wgmma_wait<0>();
        detail::fence_all(o);
        detail::fence_all(p);  // read by the MMAs until now
        mbar_arrive_if(v_empty + 8 * sv, leader);
#pragma unroll
        for (int i = 0; i < n_p; ++i) p[i] = pack_pair<T>(s[2 * i], s[2 * i + 1]);
        ++it;
      };
      int j = 1;
#pragma unroll 1
      for (; j < min(unmasked, mine); ++j) step(j, detail::flag<false>{});
#pragma unroll 1
      for (; j < mine; ++j) step(j, detail::flag<true>{});
      {  // the last block's P V
        const int sv = it % Stages;
        issue_pv(sv, mine > 1);
        wgmma_wait<0>();
        detail::fence_all(o);
        mbar_arrive_if(v_empty + 8 * sv, leader);
        ++it;
      }
      // The tile's blocks past this warpgroup's rows: its turns kept and their stages freed, once
      // landed (an arrival before would count towards the stage's previous use).
#pragma unroll 1
      for (; causal && j < blocks; ++j, ++it) {
        const int st = it % Stages, phase = (it / Stages) & 1;
        mbar_wait(k_full + 8 * st, phase);
        named_barrier(my_turn, turn);
        named_barrier_arrive(their_turn, turn);
        mbar_arrive_if(k_empty + 8 * st, leader);
        mbar_arrive_if(qe, leader && j == blocks - 1);
        mbar_wait(v_full + 8 * st, phase);
        mbar_arrive_if(v_empty + 8 * st, leader);
      }

      // Epilogue: the rows' sums across their quad, O / sum into the buffer (DC chunks of 64 rows x
      // 128 bytes, swizzled), a TMA store each; the log-sum-exp by each quad's first lane.
      float inv[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        inv[r] = 1.0f / l[r];
        const int row = row0 + 8 * r;
        if ((lane & 3) == 0 && row < Sq)
          lse[(long(b) * H + h) * Sq + row] = (m[r] * scale2 + __log2f(l[r])) * 0.6931471805599453f;
      }
      if (tw == 0) bulk_wait_read();  // the previous tile's stores have read the buffer
      named_barrier(barrier, 128);
#pragma unroll
      for (int i = 0; i < n_o; i += 2)
        detail::st_accumulator_pair<T>(out, i, o[i] * inv[(i >> 1) & 1], o[i + 1] * inv[(i >> 1) & 1]);
      fence_proxy_async();
      named_barrier(barrier, 128);
      if (tw == 0) {
#pragma unroll
        for (int c = 0; c < DC; ++c) tma_store_4d(map_o, out + c * box, 64 * c, row_lo, h, b);
        bulk_commit();
      }
    }
    if (wg == 0) named_barrier(my_turn, turn);  // the last warpgroup's last turn, given back
    if (tw == 0) bulk_wait();
  }
};

}  // namespace kk::tops::sm90
#endif  // KK_TARGET_CUDA
