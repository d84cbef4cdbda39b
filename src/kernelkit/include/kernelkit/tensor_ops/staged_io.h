// kernelkit/tensor_ops/staged_io.h: a destination's registers to and from a device tensor, on
// NVIDIA. Each thread holds pairs of a fragment layout (layout.h): written straight to memory, a
// warp's store covers 8 rows x 16 bytes, half of each 32-byte sector, and an epilogue of one
// 256 x 128 bf16 tile took 4.9 us of a 31 us tile at K = 2048 (H100, bench/notes/sm90_wgmma.md).
// A warpgroup scope (execution_simdgroups<4> or <8>) whose kernel got the warpgroup path's
// dynamic shared memory goes through it instead: the pairs into a swizzled tile (16-byte chunk c
// of row r at c ^ (r % 8): a warp's 8 rows land in 8 different banks), then whole rows in 16-byte
// copies (every sector full). Other scopes, kernels without that memory, threadgroup tensors and
// strides the vector copies cannot take go element pair by element pair; so do kernels with dynamic
// shared memory of their own (codegen's KK_TOPS_NO_WARPGROUP). Reductions and a convolution's
// rank-4 destination go element by element.
//
// The staging memory is the warpgroup group's slice (sm90_wgmma.h), free between runs: used only
// where the threadgroup is the scope's one group. Every thread of the scope calls load / store
// together (as any cooperative tensor member); each starts with a barrier (the slice's previous
// reader is done) and ends with one (its own reads are done: a run's copies into the slice start
// before the run's first barrier).
#pragma once

#if defined(KK_TARGET_CUDA) && !defined(KK_TOPS_NO_WARPGROUP)
#include <kernelkit/tensor_ops/sm90_wgmma.h>  // the warpgroups' barriers
#endif

namespace kk {
namespace tops {

template <class Layout, class E>
struct staged_io {
  static constexpr int W = Layout::simdgroups;
  static constexpr bool pairs = !Layout::whole && Layout::rank == 2;  // elements 2j, 2j + 1: one row, cols c, c + 1

  // v's elements to t (coordinates innermost first), those inside t's extents.
  template <class Tn>
  KK_FN static void store(const E* v, const Tn& t) {
    using U = remove_const_t<typename Tn::value_type>;
#if defined(KK_TARGET_CUDA) && !defined(KK_TOPS_NO_WARPGROUP)
    if constexpr (stageable<Tn, U>) {
      if (unsigned char* s = staging<U>(t)) {
        barrier();
        KK_TOPS_UNROLL
        for (int i = 0; i < Layout::capacity; i += 2) {
          int c[2];
          Layout::coords(i, c);  // (col, row) of the pair's first element
          if (Layout::is_valid(i))
            *reinterpret_cast<pair<U>*>(s + at<U>(c[1], c[0])) = pair<U>{convert<U>(v[i]), convert<U>(v[i + 1])};
        }
        barrier();
        copy<U, true>(s, t);
        barrier();
        return;
      }
    }
#endif
    if constexpr (pairs) {
      // A pair's first column is even: both elements adjacent and aligned as one wherever the
      // columns are contiguous, the rows' stride even and the tensor's start aligned.
      const bool paired = t.get_stride(0) == 1 && (t.get_stride(1) & 1) == 0 &&
                          reinterpret_cast<unsigned long long>(t.data()) % sizeof(pair<U>) == 0;
      KK_TOPS_UNROLL
      for (int i = 0; i < Layout::capacity; i += 2) {
        int c[2];
        Layout::coords(i, c);
        if (paired && Layout::is_valid(i + 1) && c[1] < int(t.get_extent(1)) && c[0] + 1 < int(t.get_extent(0))) {
          *reinterpret_cast<pair<U>*>(&t(c[0], c[1])) = pair<U>{convert<U>(v[i]), convert<U>(v[i + 1])};
        } else {
          store_one(v, t, i);
          store_one(v, t, i + 1);
        }
      }
    } else {
      KK_TOPS_UNROLL
      for (int i = 0; i < Layout::capacity; ++i) store_one(v, t, i);
    }
  }

  // v = t's elements (zero past its extents).
  template <class Tn>
  KK_FN static void load(E* v, const Tn& t) {
    using U = remove_const_t<typename Tn::value_type>;
#if defined(KK_TARGET_CUDA) && !defined(KK_TOPS_NO_WARPGROUP)
    if constexpr (stageable<Tn, U>) {
      if (unsigned char* s = staging<U>(t)) {
        barrier();
        copy<U, false>(s, t);
        barrier();
        KK_TOPS_UNROLL
        for (int i = 0; i < Layout::capacity; i += 2) {
          int c[2];
          Layout::coords(i, c);
          const pair<U> p = Layout::is_valid(i) ? *reinterpret_cast<const pair<U>*>(s + at<U>(c[1], c[0])) : pair<U>{};
          v[i] = convert<E>(p.x);
          v[i + 1] = convert<E>(p.y);
        }
        barrier();
        return;
      }
    }
#endif
    KK_TOPS_UNROLL
    for (int i = 0; i < Layout::capacity; ++i) {
      int c[Layout::coords_size];
      Layout::coords(i, c);
      v[i] = Layout::is_valid(i) && inside(t, c) ? convert<E>(element(t, c)) : E();
    }
  }

 private:
  template <class U> struct alignas(2 * sizeof(U)) pair { U x, y; };

  template <class Tn> static KK_FN void store_one(const E* v, const Tn& t, int i) {
    int c[Layout::coords_size];
    Layout::coords(i, c);
    if (Layout::is_valid(i) && inside(t, c)) element(t, c) = convert<remove_const_t<typename Tn::value_type>>(v[i]);
  }
  template <class Tn> static KK_FN bool inside(const Tn& t, const int (&c)[Layout::coords_size]) {
    for (int d = 0; d < Layout::rank; ++d)
      if (c[d] < 0 || c[d] >= int(t.get_extent(d))) return false;
    return true;
  }
  template <class Tn> static KK_FN auto& element(const Tn& t, const int (&c)[Layout::coords_size]) {
    if constexpr (Layout::rank == 1) return t(c[0]);
    else if constexpr (Layout::rank == 2) return t(c[0], c[1]);
    else return t(c[0], c[1], c[2], c[3]);  // a convolution's destination (convolution2d.h)
  }

#if defined(KK_TARGET_CUDA) && !defined(KK_TOPS_NO_WARPGROUP)
  static constexpr int rows = Layout::outer, cols = Layout::inner;
  template <class U> static constexpr int row_bytes = cols * int(sizeof(U));
  template <class U> static constexpr int chunks = row_bytes<U> / 16;  // 16-byte chunks a row

  // Whether t can go through the staging tile: a warpgroup scope's destination, rows of whole
  // 128-byte swizzle atoms, a plain tensor (no scales plane).
  template <class Tn, class U>
  static constexpr bool stageable = (W == 4 || W == 8) && pairs && Layout::which == role::destination &&
                                    Tn::get_rank() == 2 && rows % 16 == 0 && row_bytes<U> % 128 == 0 &&
                                    sizeof(U) <= 8 && is_same_v<typename Tn::plane_type, metal::kk_detail::no_plane>;
  // The staging tile for t, or null where the kernel has no room for it (uniform).
  template <class U, class Tn>
  static KK_FN unsigned char* staging(const Tn& t) {
    extern __shared__ __align__(16) unsigned char kk_sm90_dynamic_smem[];
    unsigned smem;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(smem));
    const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(kk_sm90_dynamic_smem));
    const unsigned skip = ((base + 1023) & ~1023u) - base;  // the slice's stages start on 1024 bytes
    if (blockDim.x * blockDim.y * blockDim.z != 32u * W || smem < skip + unsigned(rows * row_bytes<U>) ||
        !__isGlobal(t.data()))
      return nullptr;
    return kk_sm90_dynamic_smem + skip;
  }
  // Byte offset of (row, col) in the swizzled tile.
  template <class U> static KK_FN int at(int row, int col) {
    const int byte = col * int(sizeof(U));
    return row * row_bytes<U> + ((((byte >> 4) ^ row) & 7) | ((byte >> 4) & ~7)) * 16 + (byte & 15);
  }
  // (the scope's one group's barrier, as its runs number it)
  static KK_FN void barrier() {
    asm volatile("bar.sync %0, %1;\n" ::"n"(sm90::detail::group_barrier(W / 4, 0)), "r"(32 * W) : "memory");
  }

  // The tile's rows between shared memory s and t, 16 bytes a thread a step (whole sectors);
  // the parts of chunks past t's extents element by element (loads read them as zero).
  template <class U, bool ToTensor, class Tn>
  static KK_FN void copy(unsigned char* s, const Tn& t) {
    constexpr int per = 16 / int(sizeof(U)), threads = 32 * W;
    const int thread = int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
    const int rows_in = min_int(rows, int(t.get_extent(1))), cols_in = min_int(cols, int(t.get_extent(0)));
    const bool vec = t.get_stride(0) == 1 && (t.get_stride(1) * long(sizeof(U))) % 16 == 0 &&
                     reinterpret_cast<unsigned long long>(t.data()) % 16 == 0;
    static_assert(rows * chunks<U> % threads == 0, "staged_io: whole steps");
    KK_TOPS_UNROLL
    for (int n = 0; n < rows * chunks<U> / threads; ++n) {
      const int idx = thread + n * threads, r = idx / chunks<U>, c0 = (idx % chunks<U>) * per;
      uint4* tile = reinterpret_cast<uint4*>(s + at<U>(r, c0));
      if (vec && r < rows_in && c0 + per <= cols_in) {
        if constexpr (ToTensor) *reinterpret_cast<uint4*>(&t(c0, r)) = *tile;
        else *tile = *reinterpret_cast<const uint4*>(&t(c0, r));
        continue;
      }
      U* e = reinterpret_cast<U*>(tile);
#pragma unroll
      for (int j = 0; j < per; ++j) {
        const bool in = r < rows_in && c0 + j < cols_in;
        if constexpr (ToTensor) {
          if (in) t(c0 + j, r) = e[j];
        } else {
          e[j] = in ? U(t(c0 + j, r)) : U();
        }
      }
    }
  }
#endif
};

}  // namespace tops
}  // namespace kk
