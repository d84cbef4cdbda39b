// kernelkit/tensor_ops/cooperative_tensor.h: metal::cooperative_tensor<T, Extents, Layout>, the
// per-thread share of a tensor that an op spreads over the threads of its scope (which thread
// holds which element: layout.h). Apple's members: get_capacity, operator[], get / set (checked),
// is_valid_element (Apple's comments call it get_mask: both work), get_multidimensional_index and
// get_iterator (each by index, iterator or element pointer), begin / end, map_iterator, load / store
// (from / to a tensor: elements past the tensor's extents load as zero and are not stored). Kernels
// get one from a matmul2d or convolution2d op (matmul2d.h, convolution2d.h), never build one
// themselves. Its elements start at zero.
#pragma once

namespace metal {

template <class ElementType, class Extents, class Layout>
struct cooperative_tensor {
  static_assert(kk::tops::is_layout_v<Layout>, "cooperative_tensor: get one from a matmul2d or convolution2d op");
  using element_type = ElementType;
  using value_type = ElementType;
  using extents_type = Extents;
  using index_type = typename Extents::index_type;
  using thread_index_type = unsigned short;
  using thread_size_type = unsigned short;
  using layout = Layout;
  static constexpr int capacity = Layout::capacity;
  static constexpr int rank = Layout::rank;

  ElementType v[capacity > 0 ? capacity : 1] = {};

  template <class CT>
  struct basic_iterator {
    CT* ct;
    int idx;
    using element_type = ElementType;
    KK_FN auto& operator*() const { return ct->v[idx]; }
    KK_FN auto* operator->() const { return &ct->v[idx]; }
    KK_FN basic_iterator& operator++() { ++idx; return *this; }
    KK_FN basic_iterator operator++(int) { basic_iterator r = *this; ++idx; return r; }
    KK_FN basic_iterator& operator--() { --idx; return *this; }
    KK_FN basic_iterator operator--(int) { basic_iterator r = *this; --idx; return r; }
    KK_FN basic_iterator& operator+=(int d) { idx += d; return *this; }
    KK_FN basic_iterator operator+(int d) const { return {ct, idx + d}; }
    KK_FN bool operator==(const basic_iterator& o) const { return idx == o.idx && ct == o.ct; }
    KK_FN bool operator!=(const basic_iterator& o) const { return !(*this == o); }
    KK_FN bool is_valid_element() const { return Layout::is_valid(idx); }
    KK_FN array<index_type, rank> get_multidimensional_index() const { return ct->get_multidimensional_index(idx); }
    KK_FN int get_index() const { return idx; }
  };
  using iterator = basic_iterator<cooperative_tensor>;
  using const_iterator = basic_iterator<const cooperative_tensor>;

  static constexpr KK_FN int get_rank() { return rank; }
  constexpr KK_FN thread_size_type get_capacity() const { return thread_size_type(capacity); }
  KK_FN bool is_valid_element(int i) const { return Layout::is_valid(i); }
  template <class CT> KK_FN bool is_valid_element(basic_iterator<CT> it) const { return Layout::is_valid(it.idx); }
  KK_FN bool is_valid_element(const ElementType* p) const { return Layout::is_valid(index_of(p)); }
  KK_FN bool get_mask(int i) const { return Layout::is_valid(i); }
  KK_FN array<index_type, rank> get_multidimensional_index(int i) const {
    int c[Layout::coords_size];
    Layout::coords(i, c);
    array<index_type, rank> r;
    for (int d = 0; d < rank; ++d) r[d] = index_type(c[d]);
    return r;
  }
  template <class CT>
  KK_FN array<index_type, rank> get_multidimensional_index(basic_iterator<CT> it) const {
    return get_multidimensional_index(it.idx);
  }
  KK_FN array<index_type, rank> get_multidimensional_index(const ElementType* p) const {
    return get_multidimensional_index(index_of(p));
  }

  KK_FN ElementType& operator[](int i) { return v[i]; }
  KK_FN const ElementType& operator[](int i) const { return v[i]; }
  KK_FN ElementType get(int i) const { return is_valid_element(i) ? v[i] : ElementType(); }
  KK_FN void set(int i, ElementType x) {
    if (is_valid_element(i)) v[i] = x;
  }

  KK_FN iterator begin() { return {this, 0}; }
  KK_FN iterator end() { return {this, capacity}; }
  KK_FN const_iterator begin() const { return {this, 0}; }
  KK_FN const_iterator end() const { return {this, capacity}; }
  KK_FN iterator get_iterator(int i) { return {this, i}; }
  KK_FN const_iterator get_iterator(int i) const { return {this, i}; }
  KK_FN iterator get_iterator(const ElementType* p) { return {this, index_of(p)}; }
  KK_FN const_iterator get_iterator(const ElementType* p) const { return {this, index_of(p)}; }

  // This tensor's element that belongs with `it`'s element of another cooperative tensor of the
  // same op (a reduction's entry for a destination element's row or column); end() if this thread
  // holds none.
  template <class It>
  KK_FN iterator map_iterator(It it) { return {this, map_index(it)}; }
  template <class It>
  KK_FN const_iterator map_iterator(It it) const { return {this, map_index(it)}; }

  // From / to a tensor of the same rank (staged_io.h: pairs, or whole rows through shared memory).
  // A rank-1 tensor loads into a rank-2 or rank-4 cooperative tensor broadcast over the other
  // coordinates, as a bias (element (x, y) = t[x]: numpy's (N,) against (M, N); a convolution's
  // (o, x, y, n) = t[o]); the Metal Shading Language specification's gemmBias example loads one
  // (§7.2.1).
  template <class T, class E, class D, class... Tags>
  KK_FN void load(const tensor<T, E, D, Tags...>& t) {
    static_assert(E::rank() == rank || (E::rank() == 1 && rank >= 2), "cooperative_tensor::load: the tensor's rank differs");
    if constexpr (E::rank() == rank) {
      kk::tops::staged_io<Layout, ElementType>::load(v, t);
    } else {
      KK_TOPS_UNROLL
      for (int i = 0; i < capacity; ++i) {
        int c[Layout::coords_size];
        Layout::coords(i, c);
        v[i] = c[0] < int(t.get_extent(0)) ? kk::tops::convert<ElementType>(t[c[0]]) : ElementType(0);
      }
    }
  }
  template <class T, class E, class D, class... Tags>
  KK_FN void store(const tensor<T, E, D, Tags...>& t) const {
    static_assert(E::rank() == rank, "cooperative_tensor::store: the tensor's rank differs");
    kk::tops::staged_io<Layout, ElementType>::store(v, t);
  }

 private:
  KK_FN int index_of(const ElementType* p) const { return int(p - v); }
  template <class It>
  KK_FN int map_index(It it) const {
    using Other = typename kk::tops::remove_cvref_t<decltype(*it.ct)>::layout;
    static_assert(kk::tops::iterator_compatible_v<Other, Layout>,
                  "map_iterator: the cooperative tensors do not come from the same op's scope and extents");
    // A destination's element into its row (column) reduction: the element's row (column) slot,
    // known from the element's index alone, so an unrolled loop indexes the reduction with
    // constants (kept in registers, not local memory).
    if constexpr (Other::which == kk::tops::role::destination && Layout::which == kk::tops::role::row_reduction) {
      return Other::row_slot(it.idx);
    } else if constexpr (Other::which == kk::tops::role::destination &&
                         Layout::which == kk::tops::role::column_reduction) {
      return Other::col_slot(it.idx);
    } else {
      int row, col;  // in the destination's (row, column) space, as every layout of one op
      Other::at(it.idx, row, col);
      const int i = Layout::index_of(row, col);
      return i < 0 ? capacity : i;
    }
  }

};

}  // namespace metal

namespace mpp {
namespace tensor_ops {
// Whether b.map_iterator(a's iterator) finds b's element for each of a's.
template <class EA, class XA, class LA, class EB, class XB, class LB>
KK_FN bool is_iterator_compatible(const metal::cooperative_tensor<EA, XA, LA>&, const metal::cooperative_tensor<EB, XB, LB>&) {
  return kk::tops::iterator_compatible_v<LA, LB>;
}
}  // namespace tensor_ops
}  // namespace mpp
