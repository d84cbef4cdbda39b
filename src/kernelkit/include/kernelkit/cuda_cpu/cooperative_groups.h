// kernelkit/cuda_cpu/cooperative_groups.h: cooperative_groups on the CPU backend.
// Part of kernelkit/cuda_cpu.h, which includes it; not to be included alone.
#pragma once

// ===========================================================================
// cooperative_groups (<cooperative_groups.h>, reduce.h, scan.h, memcpy_async.h).

namespace cuda {
// cuda::aligned_size_t<N>(bytes): a byte count promised to be a multiple of N.
template <size_t N>
struct aligned_size_t {
  size_t value;
  constexpr explicit aligned_size_t(size_t v) : value(v) {}
  constexpr operator size_t() const { return value; }
};
}  // namespace cuda

namespace cooperative_groups {

namespace details {
enum group_kind : unsigned { kind_block, kind_tile, kind_coalesced, kind_grid };
}  // namespace details

// Any group (CUDA's thread_group): the base of the others.
class thread_group {
 public:
  unsigned long long size() const { return num_threads(); }
  unsigned long long num_threads() const {
    switch (kind_) {
      case details::kind_block: return block_threads();
      case details::kind_grid: return block_threads() * grid_blocks();
      case details::kind_coalesced: return unsigned(__builtin_popcount(mask_));
      default: return tile_;
    }
  }
  unsigned long long thread_rank() const {
    const kk_thread_ctx& t = ::kk_cuda_cpu::ctx();
    switch (kind_) {
      case details::kind_block: return t.tindex;
      case details::kind_grid: return block_rank() * block_threads() + t.tindex;
      case details::kind_coalesced: return unsigned(__builtin_popcount(mask_ & ((1u << (t.tindex & 31u)) - 1u)));
      default: return t.tindex & (tile_ - 1u);
    }
  }
  void sync(kk::site s = KK_SITE("thread_group::sync")) const {
    if (kind_ == details::kind_block) ::kk_cuda_cpu::sync_block(s);
    else if (kind_ == details::kind_grid) grid_sync_error(s);
    else ::kk_cuda_cpu::sync_warp(s);
  }
  bool is_valid() const { return kind_ != details::kind_grid; }

 protected:
  constexpr thread_group(details::group_kind kind, unsigned tile = 0, unsigned mask = 0)
      : kind_(kind), tile_(tile), mask_(mask) {}
  static unsigned long long block_threads() {
    const kk_dim3 b = ::kk_cuda_cpu::ctx().tg_dispatch;
    return static_cast<unsigned long long>(b.x) * b.y * b.z;
  }
  static unsigned long long grid_blocks() {
    const kk_dim3 n = ::kk_cuda_cpu::ctx().num_groups;
    return static_cast<unsigned long long>(n.x) * n.y * n.z;
  }
  static unsigned long long block_rank() {
    const kk_thread_ctx& t = ::kk_cuda_cpu::ctx();
    return (static_cast<unsigned long long>(t.gid.z) * t.num_groups.y + t.gid.y) * t.num_groups.x + t.gid.x;
  }
  [[noreturn]] static void grid_sync_error(const kk::site& s) {
    ::kk_cuda_cpu::fail(
        "cooperative_groups::grid_group::sync() needs a cooperative launch, which kk.cuda_kernel does not "
        "make (split the kernel into two launches)",
        s);
  }
  details::group_kind kind_;
  unsigned tile_;
  unsigned mask_;
};

class thread_block : public thread_group {
 public:
  constexpr thread_block() : thread_group(details::kind_block) {}
  void sync(kk::site s = KK_SITE("thread_block::sync")) const { ::kk_cuda_cpu::sync_block(s); }
  unsigned thread_rank() const { return ::kk_cuda_cpu::ctx().tindex; }
  unsigned size() const { return unsigned(block_threads()); }
  unsigned num_threads() const { return unsigned(block_threads()); }
  dim3 group_index() const { return dim3(::kk_cuda_cpu::ctx().gid); }
  dim3 thread_index() const { return dim3(::kk_cuda_cpu::ctx().tid); }
  dim3 group_dim() const { return dim3(::kk_cuda_cpu::ctx().tg_dispatch); }
  dim3 dim_threads() const { return group_dim(); }
};
inline thread_block this_thread_block() { return thread_block(); }

class grid_group : public thread_group {
 public:
  constexpr grid_group() : thread_group(details::kind_grid) {}
  // CUDA needs a cooperative launch for this; kk.cuda_kernel launches are not.
  void sync(kk::site s = KK_SITE("grid_group::sync")) const { grid_sync_error(s); }
  bool is_valid() const { return false; }
  unsigned long long thread_rank() const { return block_rank() * block_threads() + ::kk_cuda_cpu::ctx().tindex; }
  unsigned long long size() const { return block_threads() * grid_blocks(); }
  unsigned long long num_threads() const { return size(); }
  unsigned long long block_rank() const { return thread_group::block_rank(); }
  unsigned long long num_blocks() const { return grid_blocks(); }
  dim3 group_dim() const { return dim3(::kk_cuda_cpu::ctx().tg_dispatch); }
  dim3 dim_blocks() const { return dim3(::kk_cuda_cpu::ctx().num_groups); }
  dim3 block_index() const { return dim3(::kk_cuda_cpu::ctx().gid); }
  dim3 dim_threads() const {
    const kk_thread_ctx& t = ::kk_cuda_cpu::ctx();
    return dim3(t.tg_dispatch.x * t.num_groups.x, t.tg_dispatch.y * t.num_groups.y, t.tg_dispatch.z * t.num_groups.z);
  }
  dim3 thread_index() const {
    const kk_thread_ctx& t = ::kk_cuda_cpu::ctx();
    return dim3(t.gid.x * t.tg_dispatch.x + t.tid.x, t.gid.y * t.tg_dispatch.y + t.tid.y,
                t.gid.z * t.tg_dispatch.z + t.tid.z);
  }
};
inline grid_group this_grid() { return grid_group(); }

// N consecutive threads of the block (by thread_rank), N a power of two <= 32:
// within one warp, lanes aligned to N.
template <unsigned N, class Parent = void>
class thread_block_tile;

template <unsigned N>
class thread_block_tile<N, void> : public thread_group {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0,
                "thread_block_tile<N>: the CPU backend supports N = 1, 2, 4, 8, 16, 32");

 public:
  static constexpr unsigned numThreads = N;
  thread_block_tile(unsigned meta_rank, unsigned meta_size)
      : thread_group(details::kind_tile, N), meta_rank_(meta_rank), meta_size_(meta_size) {}

  static constexpr unsigned size() { return N; }
  static constexpr unsigned num_threads() { return N; }
  unsigned thread_rank() const { return ::kk_cuda_cpu::ctx().tindex & (N - 1u); }
  unsigned meta_group_rank() const { return meta_rank_; }
  unsigned meta_group_size() const { return meta_size_; }
  void sync(kk::site s = KK_SITE("thread_block_tile::sync")) const { ::kk_cuda_cpu::sync_warp(s); }

  template <class T>
  T shfl(T var, int src_rank, kk::site s = KK_SITE("thread_block_tile::shfl")) const {
    return __shfl_sync(0xffffffffu, var, src_rank, int(N), s);
  }
  template <class T>
  T shfl_up(T var, unsigned delta, kk::site s = KK_SITE("thread_block_tile::shfl_up")) const {
    return __shfl_up_sync(0xffffffffu, var, delta, int(N), s);
  }
  template <class T>
  T shfl_down(T var, unsigned delta, kk::site s = KK_SITE("thread_block_tile::shfl_down")) const {
    return __shfl_down_sync(0xffffffffu, var, delta, int(N), s);
  }
  template <class T>
  T shfl_xor(T var, unsigned lane_mask, kk::site s = KK_SITE("thread_block_tile::shfl_xor")) const {
    return __shfl_xor_sync(0xffffffffu, var, int(lane_mask), int(N), s);
  }
  // Votes: bit i of ballot is the tile's rank i.
  unsigned ballot(int predicate, kk::site s = KK_SITE("thread_block_tile::ballot")) const {
    return (::kk_cuda_cpu::ballot(predicate != 0, s) >> base()) & lanes();
  }
  int any(int predicate, kk::site s = KK_SITE("thread_block_tile::any")) const {
    return ((::kk_cuda_cpu::ballot(predicate != 0, s) >> base()) & lanes()) != 0;
  }
  int all(int predicate, kk::site s = KK_SITE("thread_block_tile::all")) const {
    return ((::kk_cuda_cpu::ballot(predicate == 0, s) >> base()) & lanes()) == 0;
  }
  template <class T>
  unsigned match_any(T value, kk::site s = KK_SITE("thread_block_tile::match_any")) const {
    return (__match_any_sync(lanes() << base(), value, s) >> base());
  }
  template <class T>
  unsigned match_all(T value, int& pred, kk::site s = KK_SITE("thread_block_tile::match_all")) const {
    return (__match_all_sync(lanes() << base(), value, &pred, s) >> base());
  }

 private:
  static unsigned base() { return ::kk_cuda_cpu::lane_id() & ~(N - 1u); }
  static constexpr unsigned lanes() { return N == 32 ? 0xffffffffu : (1u << N) - 1u; }
  unsigned meta_rank_, meta_size_;
};

template <unsigned N, class Parent>
class thread_block_tile : public thread_block_tile<N, void> {
 public:
  using thread_block_tile<N, void>::thread_block_tile;
};

template <unsigned N>
inline thread_block_tile<N, thread_block> tiled_partition(const thread_block&) {
  const unsigned threads = unsigned(thread_block().size());
  return thread_block_tile<N, thread_block>(::kk_cuda_cpu::ctx().tindex / N, (threads + N - 1) / N);
}
template <unsigned N, unsigned M, class P>
inline thread_block_tile<N, thread_block_tile<M, P>> tiled_partition(const thread_block_tile<M, P>& parent) {
  static_assert(N <= M, "tiled_partition: a tile of a tile must be smaller");
  return thread_block_tile<N, thread_block_tile<M, P>>(parent.thread_rank() / N, M / N);
}

// The live lanes of the warp (here: every lane that has not returned).
class coalesced_group : public thread_group {
 public:
  explicit coalesced_group(unsigned mask) : thread_group(details::kind_coalesced, 0, mask) {}
  unsigned size() const { return unsigned(__builtin_popcount(mask_)); }
  unsigned num_threads() const { return size(); }
  unsigned thread_rank() const {
    return unsigned(__builtin_popcount(mask_ & ((1u << ::kk_cuda_cpu::lane_id()) - 1u)));
  }
  unsigned meta_group_rank() const { return 0; }
  unsigned meta_group_size() const { return 1; }
  void sync(kk::site s = KK_SITE("coalesced_group::sync")) const { ::kk_cuda_cpu::sync_warp(s); }
  template <class T>
  T shfl(T var, unsigned src_rank, kk::site s = KK_SITE("coalesced_group::shfl")) const {
    return ::kk_cuda_cpu::shuffle(var, lane_of(src_rank % size()), s);
  }
  template <class T>
  T shfl_up(T var, unsigned delta, kk::site s = KK_SITE("coalesced_group::shfl_up")) const {
    const unsigned r = thread_rank();
    return ::kk_cuda_cpu::shuffle(var, r >= delta ? lane_of(r - delta) : ::kk_cuda_cpu::lane_id(), s);
  }
  template <class T>
  T shfl_down(T var, unsigned delta, kk::site s = KK_SITE("coalesced_group::shfl_down")) const {
    const unsigned r = thread_rank();
    return ::kk_cuda_cpu::shuffle(var, r + delta < size() ? lane_of(r + delta) : ::kk_cuda_cpu::lane_id(), s);
  }
  unsigned ballot(int predicate, kk::site s = KK_SITE("coalesced_group::ballot")) const {
    return compact(::kk_cuda_cpu::ballot(predicate != 0, s) & mask_);
  }
  int any(int predicate, kk::site s = KK_SITE("coalesced_group::any")) const {
    return (::kk_cuda_cpu::ballot(predicate != 0, s) & mask_) != 0;
  }
  int all(int predicate, kk::site s = KK_SITE("coalesced_group::all")) const {
    return (::kk_cuda_cpu::ballot(predicate == 0, s) & mask_) == 0;
  }

 private:
  unsigned lane_of(unsigned rank) const {  // the rank-th set bit of the mask
    unsigned m = mask_;
    for (unsigned i = 0; i < rank; ++i) m &= m - 1;
    return unsigned(__builtin_ctz(m));
  }
  unsigned compact(unsigned bits) const {  // bit i: the lane of rank i
    unsigned r = 0, i = 0;
    for (unsigned m = mask_; m; m &= m - 1, ++i)
      if (bits & (1u << __builtin_ctz(m))) r |= 1u << i;
    return r;
  }
};
inline coalesced_group coalesced_threads(kk::site s = KK_SITE("coalesced_threads")) {
  return coalesced_group(::kk_cuda_cpu::active_mask(s));
}

template <class Group>
inline void sync(const Group& g, kk::site s = KK_SITE("cooperative_groups::sync")) { g.sync(s); }
template <class Group>
inline void synchronize(const Group& g, kk::site s = KK_SITE("cooperative_groups::synchronize")) { g.sync(s); }
template <class Group>
inline unsigned long long thread_rank(const Group& g) { return g.thread_rank(); }
template <class Group>
inline unsigned long long group_size(const Group& g) { return g.size(); }

// Reduction operators (reduce.h).
template <class T = void> struct plus { T operator()(const T& a, const T& b) const { return a + b; } };
template <class T = void> struct less { T operator()(const T& a, const T& b) const { return b < a ? b : a; } };
template <class T = void> struct greater { T operator()(const T& a, const T& b) const { return a < b ? b : a; } };
template <class T = void> struct bit_and { T operator()(const T& a, const T& b) const { return a & b; } };
template <class T = void> struct bit_or { T operator()(const T& a, const T& b) const { return a | b; } };
template <class T = void> struct bit_xor { T operator()(const T& a, const T& b) const { return a ^ b; } };
template <> struct plus<void> { template <class T> T operator()(const T& a, const T& b) const { return a + b; } };
template <> struct less<void> { template <class T> T operator()(const T& a, const T& b) const { return b < a ? b : a; } };
template <> struct greater<void> { template <class T> T operator()(const T& a, const T& b) const { return a < b ? b : a; } };
template <> struct bit_and<void> { template <class T> T operator()(const T& a, const T& b) const { return a & b; } };
template <> struct bit_or<void> { template <class T> T operator()(const T& a, const T& b) const { return a | b; } };
template <> struct bit_xor<void> { template <class T> T operator()(const T& a, const T& b) const { return a ^ b; } };

namespace details {
template <unsigned N, class P>
constexpr unsigned tile_width(const thread_block_tile<N, P>*) { return N; }
constexpr unsigned tile_width(const coalesced_group*) { return 32; }  // the active lanes of the warp
}  // namespace details

// The value folded over the group's threads (tiles and coalesced groups), in rank order.
template <class Group, class T, class Op>
inline std::decay_t<T> reduce(const Group& g, T&& value, Op&& op, kk::site s = KK_SITE("cooperative_groups::reduce")) {
  using V = std::decay_t<T>;
  constexpr unsigned W = details::tile_width(static_cast<const Group*>(nullptr));
  (void)g;
  return ::kk_cuda_cpu::reduce<W>(V(value), op, s);
}
// Prefix over the ranks up to this one (inclusive_scan) or before it (exclusive_scan;
// rank 0 gets V(), which CUDA leaves unspecified).
template <class Group, class T, class Op>
inline std::decay_t<T> inclusive_scan(const Group& g, T&& value, Op&& op,
                                      kk::site s = KK_SITE("cooperative_groups::inclusive_scan")) {
  using V = std::decay_t<T>;
  constexpr unsigned W = details::tile_width(static_cast<const Group*>(nullptr));
  (void)g;
  return ::kk_cuda_cpu::scan<W>(V(value), op, V(), true, s);
}
template <class Group, class T>
inline std::decay_t<T> inclusive_scan(const Group& g, T&& value,
                                      kk::site s = KK_SITE("cooperative_groups::inclusive_scan")) {
  return inclusive_scan(g, static_cast<T&&>(value), plus<std::decay_t<T>>(), s);
}
template <class Group, class T, class Op>
inline std::decay_t<T> exclusive_scan(const Group& g, T&& value, Op&& op,
                                      kk::site s = KK_SITE("cooperative_groups::exclusive_scan")) {
  using V = std::decay_t<T>;
  constexpr unsigned W = details::tile_width(static_cast<const Group*>(nullptr));
  (void)g;
  return ::kk_cuda_cpu::scan<W>(V(value), op, V(), false, s);
}
template <class Group, class T>
inline std::decay_t<T> exclusive_scan(const Group& g, T&& value,
                                      kk::site s = KK_SITE("cooperative_groups::exclusive_scan")) {
  return exclusive_scan(g, static_cast<T&&>(value), plus<std::decay_t<T>>(), s);
}

// memcpy_async: a synchronous copy shared by the group's threads; wait() is the
// group's sync (which makes the copy visible to the group, as on the GPU).
template <class Group>
inline void memcpy_async(const Group& g, void* dst, const void* src, size_t bytes) {
  const size_t n = size_t(g.size()), r = size_t(g.thread_rank());
  const size_t chunk = (bytes + n - 1) / n, begin = r * chunk < bytes ? r * chunk : bytes;
  const size_t end = begin + chunk < bytes ? begin + chunk : bytes;
  memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin, end - begin);
}
template <class Group, size_t A>
inline void memcpy_async(const Group& g, void* dst, const void* src, cuda::aligned_size_t<A> bytes) {
  memcpy_async(g, dst, src, size_t(bytes));
}
template <class Group, class T>
inline void memcpy_async(const Group& g, T* dst, size_t dst_count, const T* src, size_t src_count) {
  memcpy_async(g, static_cast<void*>(dst), static_cast<const void*>(src),
               sizeof(T) * (dst_count < src_count ? dst_count : src_count));
}
template <class Group>
inline void wait(const Group& g, kk::site s = KK_SITE("cooperative_groups::wait")) { g.sync(s); }
template <unsigned Count, class Group>
inline void wait_prior(const Group& g, kk::site s = KK_SITE("cooperative_groups::wait_prior")) { g.sync(s); }

}  // namespace cooperative_groups
