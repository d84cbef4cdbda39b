// kernelkit/tensor_ops/tensor.h: metal::tensor, as <metal_tensor> declares it.
//
//   tensor<T, extents, descriptor = tensor_handle, tags...>   T: the element type (const allowed);
//   descriptor tensor_inline (built in the body over a pointer) or tensor_handle; tags:
//   tensor_offset (what slicing a handle adds) and a tensor_blockwise scales plane (formats.h).
//
// A tensor is a pointer, extents (innermost first) and strides (in elements; packed when not
// given: stride 0 is 1). Element (x, y) of a rank-2 tensor is at data + x * stride0 + y * stride1:
// x is the column, y the row. slice(x, y) moves the origin and keeps what is left of each extent;
// slice<E0, E1>(x, y) gives static extents. A slice never reaches past its tensor: each extent is
// clipped to what remains (Apple leaves an out-of-range static slice undefined), and tensor ops
// read the elements past a tensor's extents as zero and never write them.
#pragma once

namespace metal {

struct tensor_inline {};
struct tensor_handle {};
struct tensor_offset {};

namespace kk_detail {
struct no_plane {
  KK_FN float scale(int, int) const { return 1.0f; }
};
template <class... Tags> struct plane_of { using type = no_plane; };
template <class Tag, class... Rest> struct plane_of<Tag, Rest...> { using type = typename plane_of<Rest...>::type; };
template <class P, class S, kk::tops::usize B0, kk::tops::usize B1, class... Rest>
struct plane_of<tensor_blockwise<P, S, B0, B1>, Rest...> { using type = tensor_blockwise<P, S, B0, B1>; };
template <class... Tags> inline constexpr bool has_offset_v = (kk::tops::is_same_v<Tags, tensor_offset> || ... || false);

// Extents From converts to To as <metal_tensor>'s extents do (std::extents' converting constructor):
// the same rank, and each static extent of To is dynamic or the same in From. So a dextents tensor
// is built from static extents, tensor<T, dextents<int, 2>, tensor_inline>(p, extents<int, 64, 16>()),
// as kernels written for Apple's compiler do. (Here rather than in extents.h: it is the tensors'
// constructors that take them.)
template <class From, class To> inline constexpr bool extents_convertible_v = false;
template <class I, class J, kk::tops::usize... F, kk::tops::usize... T>
inline constexpr bool extents_convertible_v<extents<I, F...>, extents<J, T...>> =
    sizeof...(F) == sizeof...(T) && !kk::tops::is_same_v<extents<I, F...>, extents<J, T...>> &&
    ((T == dynamic_extent || T == F) && ...);
template <class To, class From>
KK_FN To extents_from(const From& from) {
  To to;
  for (kk::tops::usize r = 0; r < To::rank(); ++r) to.e[r] = typename To::index_type(from.extent(r));
  return to;
}
}  // namespace kk_detail

template <class T, class Extents, class Descriptor = tensor_handle, class... Tags>
struct tensor {
  // (Apple's doc comments also write tensor_offset in the descriptor's place: a handle's view, here too.)
  static_assert(kk::tops::is_same_v<Descriptor, tensor_handle> || kk::tops::is_same_v<Descriptor, tensor_inline> ||
                    kk::tops::is_same_v<Descriptor, tensor_offset>,
                "tensor: Descriptor template parameter must be one of tensor_handle or tensor_inline");
  static_assert(!kk_detail::has_offset_v<Tags...> || kk::tops::is_same_v<Descriptor, tensor_handle>,
                "tensor: tensor_offset is a tag of tensor_handle tensors only");

  using element_type = T;
  using value_type = kk::tops::remove_const_t<T>;
  using extents_type = Extents;
  using index_type = typename Extents::index_type;
  using size_type = kk::tops::usize;
  using rank_type = kk::tops::usize;
  using descriptor_type = Descriptor;
  using plane_type = typename kk_detail::plane_of<Tags...>::type;
  using reference = T&;
  static constexpr rank_type R = Extents::rank();

  T* ptr = nullptr;
  Extents ext;
  index_type str[R] = {};
  plane_type plane;

  // A pointer to T, or for an 8-bit format (fp8, ue8m0) a pointer to bytes: a uint8 buffer holds them.
  template <class P>
  static constexpr bool pointer_ok =
      kk::tops::is_same_v<P, T> || kk::tops::is_same_v<const P, T> ||
      (sizeof(value_type) == 1 && !kk::tops::is_integer_v<value_type> && kk::tops::is_integer_v<kk::tops::remove_const_t<P>> &&
       sizeof(P) == 1 && (kk::tops::is_same_v<const value_type, T> || !kk::tops::is_same_v<const kk::tops::remove_const_t<P>, P>));

  tensor() = default;
  template <class P, kk::tops::enable_if_t<pointer_ok<P>, int> = 0>
  KK_FN tensor(P* p, const Extents& e) : tensor(reinterpret_cast<T*>(p), e, 0) {}
  template <class P, class S, kk::tops::enable_if_t<pointer_ok<P>, int> = 0>
  KK_FN tensor(P* p, const Extents& e, const array<S, R>& strides) : ptr(reinterpret_cast<T*>(p)), ext(e) {
    for (rank_type r = 0; r < R; ++r) str[r] = index_type(strides[r]);
    bind_plane();
  }
  template <class P, class E2, kk::tops::enable_if_t<pointer_ok<P> && kk_detail::extents_convertible_v<E2, Extents>, int> = 0>
  KK_FN tensor(P* p, const E2& e) : tensor(p, kk_detail::extents_from<Extents>(e)) {}
  template <class P, class E2, class S,
            kk::tops::enable_if_t<pointer_ok<P> && kk_detail::extents_convertible_v<E2, Extents>, int> = 0>
  KK_FN tensor(P* p, const E2& e, const array<S, R>& strides) : tensor(p, kk_detail::extents_from<Extents>(e), strides) {}
  template <class P, class S, class Q = plane_type,
            kk::tops::enable_if_t<pointer_ok<P> && !kk::tops::is_same_v<Q, kk_detail::no_plane>, int> = 0>
  KK_FN tensor(P* p, const Extents& e, const array<S, R>& strides, const Q& scales) : tensor(p, e, strides) {
    plane = scales;
    bind_plane();
  }

 private:
  KK_FN tensor(T* p, const Extents& e, int) : ptr(p), ext(e) {
    index_type s = 1;
    for (rank_type r = 0; r < R; ++r) {
      str[r] = s;
      s *= e.extent(r);
    }
    bind_plane();
  }

 public:

  static constexpr KK_FN rank_type get_rank() { return R; }
  static constexpr KK_FN size_type get_static_extent(rank_type r) { return Extents::static_extent(r); }
  KK_FN index_type get_extent(rank_type r) const { return ext.extent(r); }
  KK_FN index_type get_stride(rank_type r) const { return str[r]; }
  KK_FN Extents extents() const { return ext; }
  KK_FN T* data() const { return ptr; }
  KK_FN const plane_type& get_scales() const { return plane; }

  template <class... Is, kk::tops::enable_if_t<sizeof...(Is) == R, int> = 0>
  KK_FN T& operator()(Is... idx) const {
    const index_type i[R] = {index_type(idx)...};
    return ptr[offset_of(i)];
  }
  template <class S>
  KK_FN T& operator[](const array<S, R>& idx) const {
    index_type i[R];
    for (rank_type r = 0; r < R; ++r) i[r] = index_type(idx[r]);
    return ptr[offset_of(i)];
  }
  template <class S, kk::tops::enable_if_t<R == 1 && kk::tops::is_integer_v<S>, int> = 0>
  KK_FN T& operator[](S i) const { return ptr[long(i) * str[0]]; }

  // The tensor seen from `origin`, with static extents E... (dynamic_extent: what remains).
  template <kk::tops::usize... E, class... Is,
            kk::tops::enable_if_t<sizeof...(E) == R && sizeof...(Is) == R, int> = 0>
  KK_FN auto slice(Is... origin) const {
    using Sliced = typename with_extents<metal::extents<index_type, E...>>::type;
    Sliced s;
    const index_type o[R] = {index_type(origin)...};
    s.ptr = ptr + offset_of(o);
    for (rank_type r = 0; r < R; ++r) {
      const index_type left = ext.extent(r) > o[r] ? index_type(ext.extent(r) - o[r]) : index_type(0);
      const size_type want = Sliced::extents_type::static_extent(r);
      s.ext.e[r] = want == dynamic_extent || index_type(want) > left ? left : index_type(want);
      s.str[r] = str[r];
    }
    s.plane = plane;
    shift_plane(s.plane, o);
    return s;
  }
  // slice(origin...): every extent dynamic, at any rank (<metal_tensor> forwards the same way).
  template <class... Is, kk::tops::enable_if_t<sizeof...(Is) == R, int> = 0>
  KK_FN auto slice(Is... origin) const {
    return [&]<kk::tops::usize... E>(metal::extents<index_type, E...>) {
      return this->template slice<E...>(origin...);
    }(dextents<index_type, R>());
  }
  // Apple's header comments write the static form static_slice<E...>(origin...), a name
  // <metal_tensor> lacks: kernels copied from them get slice<E...>.
  template <kk::tops::usize... E, class... Is>
  KK_FN auto static_slice(Is... origin) const { return slice<E...>(origin...); }

  // The same tensor type with other extents (and the offset tag a sliced handle carries).
  template <class E2> struct with_extents {
    using type = kk::tops::conditional_t<kk::tops::is_same_v<Descriptor, tensor_handle> && !kk_detail::has_offset_v<Tags...>,
                                         tensor<T, E2, Descriptor, Tags..., tensor_offset>, tensor<T, E2, Descriptor, Tags...>>;
  };

 private:
  KK_FN long offset_of(const index_type (&i)[R]) const {
    long o = 0;
    for (rank_type r = 0; r < R; ++r) o += long(i[r]) * long(str[r]);
    return o;
  }
  KK_FN void bind_plane() {
    if constexpr (!kk::tops::is_same_v<plane_type, kk_detail::no_plane>)
      plane.row_blocks = (int(ext.extent(0)) + int(plane_type::block0) - 1) / int(plane_type::block0);
  }
  template <class P>
  static KK_FN void shift_plane(P& p, const index_type (&o)[R]) {
    if constexpr (!kk::tops::is_same_v<P, kk_detail::no_plane>) {
      p.origin0 += int(o[0]);
      if constexpr (R > 1) p.origin1 += int(o[1]);
    }
  }
};

// tensor(pointer, extents[, strides[, scales]]): an inline tensor, as kernels write it.
template <class T, class I, kk::tops::usize... E>
tensor(T*, extents<I, E...>) -> tensor<T, extents<I, E...>, tensor_inline>;
template <class T, class I, kk::tops::usize... E, class S, kk::tops::usize N>
tensor(T*, extents<I, E...>, array<S, N>) -> tensor<T, extents<I, E...>, tensor_inline>;

// Apple's remove_addrspace_t: address spaces vanish in kernelkit, so it is the type itself.
template <class T> using remove_addrspace_t = T;

template <class T> inline constexpr bool is_tensor_v = false;
template <class T, class E, class D, class... Tags> inline constexpr bool is_tensor_v<tensor<T, E, D, Tags...>> = true;
template <class T> inline constexpr bool is_tensor_v<const T> = is_tensor_v<T>;
template <class T> inline constexpr bool is_tensor_inline_v = false;
template <class T, class E, class... Tags> inline constexpr bool is_tensor_inline_v<tensor<T, E, tensor_inline, Tags...>> = true;
template <class T> inline constexpr bool is_tensor_handle_v = false;
template <class T, class E, class... Tags> inline constexpr bool is_tensor_handle_v<tensor<T, E, tensor_handle, Tags...>> = true;
template <class T> inline constexpr bool has_tensor_offset_v = false;
template <class T, class E, class D, class... Tags>
inline constexpr bool has_tensor_offset_v<tensor<T, E, D, Tags...>> = kk_detail::has_offset_v<Tags...>;

}  // namespace metal
