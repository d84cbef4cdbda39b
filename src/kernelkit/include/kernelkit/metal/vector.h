// kernelkit/metal/vector.h: MSL vector types vec<T, N> (N = 2, 3, 4), their
// names (float4, half2, uint3, bool4...), operators, and packed_* types.
//
// Layout follows Metal: vec<T, 2> is aligned to 2*sizeof(T); vec<T, 3> has the
// size and alignment of vec<T, 4> (float3 is 16 bytes). packed_* types have no
// padding (packed_float3 is 12 bytes, aligned like float).
//
// Swizzles: the front end rewrites `v.xy` to `v.template swizzle<0, 1>()`, a new
// (const) vector, and `v.xy` left of an assignment (`=`, `+=`...) to
// `v.template swizzle_ref<0, 1>()`, a reference to those components that writes
// them (each component once, as MSL requires of an lvalue swizzle).
#pragma once

namespace metal {

template <class T, int N> struct vec;
template <class T, int N> struct packed_vec;

namespace kk_detail {
// MSL scalars: builtin arithmetic types plus half and bfloat.
template <class T> constexpr bool is_scalar = is_builtin_arith<T> || is_float16_v<T>;
template <class T> struct is_vec : false_type {};
template <class T, int N> struct is_vec<vec<T, N>> : true_type {};
template <class T> constexpr bool is_packed = false;
template <class T, int N> constexpr bool is_packed<packed_vec<T, N>> = true;

template <class T, int N> constexpr size_t vec_align = sizeof(T) * (N == 2 ? 2 : 4);

// Component I of a vector (vec or packed), by name.
template <unsigned I> struct component;
template <> struct component<0> { template <class V> static constexpr KK_FN auto& get(V& v) { return v.x; } };
template <> struct component<1> { template <class V> static constexpr KK_FN auto& get(V& v) { return v.y; } };
template <> struct component<2> { template <class V> static constexpr KK_FN auto& get(V& v) { return v.z; } };
template <> struct component<3> { template <class V> static constexpr KK_FN auto& get(V& v) { return v.w; } };

// vec<R, N>(f(a.x, b.x...), f(a.y, b.y...), ...): the one element-wise loop,
// written out so that every component stays in a register.
template <class R, int N, class F, class... V>
KK_FN vec<R, N> vmap(F f, const V&... v) {
  if constexpr (N == 2) {
    return vec<R, 2>(f(v.x...), f(v.y...));
  } else if constexpr (N == 3) {
    return vec<R, 3>(f(v.x...), f(v.y...), f(v.z...));
  } else {
    return vec<R, 4>(f(v.x...), f(v.y...), f(v.z...), f(v.w...));
  }
}
}  // namespace kk_detail

namespace kk_detail {
template <unsigned... I> constexpr bool distinct() {
  const unsigned c[] = {I...};
  for (unsigned i = 0; i < sizeof...(I); ++i)
    for (unsigned j = i + 1; j < sizeof...(I); ++j)
      if (c[i] == c[j]) return false;
  return true;
}
// Components I... of vector v (vec or packed) as an lvalue: assigned a vector of as many
// components, or a scalar (every one), or updated by a compound assignment.
template <class V, unsigned... I>
struct swizzle_ref {
  using T = typename V::value_type;
  using value_type = vec<T, sizeof...(I)>;
  static_assert(distinct<I...>(), "a swizzle written to names each component once");
  V& v;
  KK_FN value_type value() const { return value_type(component<I>::get(v)...); }
  KK_FN operator value_type() const { return value(); }
  KK_FN swizzle_ref& operator=(const value_type& r) {
    unsigned k = 0;
    ((component<I>::get(v) = r[k++]), ...);
    return *this;
  }
  KK_FN swizzle_ref& operator=(const swizzle_ref& r) { return *this = r.value(); }
  template <class S, enable_if_t<is_scalar<S>, int> = 0>
  KK_FN swizzle_ref& operator=(S s) { return *this = value_type(s); }
#define KK_SWIZZLE_UPDATE(op) \
  template <class R> KK_FN swizzle_ref& operator op##=(const R& r) { return *this = value_type(value() op r); }
  KK_SWIZZLE_UPDATE(+) KK_SWIZZLE_UPDATE(-) KK_SWIZZLE_UPDATE(*) KK_SWIZZLE_UPDATE(/) KK_SWIZZLE_UPDATE(%)
  KK_SWIZZLE_UPDATE(&) KK_SWIZZLE_UPDATE(|) KK_SWIZZLE_UPDATE(^) KK_SWIZZLE_UPDATE(<<) KK_SWIZZLE_UPDATE(>>)
#undef KK_SWIZZLE_UPDATE
};
}  // namespace kk_detail

// Members every vector has: indexing, swizzles (read and written), value_type.
#define KK_VEC_ACCESS(N)                                                                 \
  using value_type = T;                                                                  \
  KK_FN T& operator[](int i) { return reinterpret_cast<T*>(this)[i]; }                   \
  KK_FN const T& operator[](int i) const { return reinterpret_cast<const T*>(this)[i]; } \
  template <unsigned... I>                                                               \
  KK_FN const vec<T, sizeof...(I)> swizzle() const {                                     \
    static_assert(((I < N) && ...), "swizzle component out of range");                  \
    return vec<T, sizeof...(I)>(kk_detail::component<I>::get(*this)...);                 \
  }                                                                                      \
  template <unsigned... I>                                                               \
  KK_FN kk_detail::swizzle_ref<vec, I...> swizzle_ref() {                                \
    static_assert(((I < N) && ...), "swizzle component out of range");                  \
    return {*this};                                                                      \
  }

template <class T>
struct alignas(kk_detail::vec_align<T, 2>) vec<T, 2> {
  T x, y;

  vec() = default;
  template <class S, enable_if_t<kk_detail::is_scalar<S>, int> = 0>
  constexpr KK_FN vec(S s) : x(T(s)), y(T(s)) {}  // broadcast: float2 v = 0;
  constexpr KK_FN vec(T x_, T y_) : x(x_), y(y_) {}
  template <class U, enable_if_t<!is_same_v<U, T>, int> = 0>
  constexpr KK_FN explicit vec(const vec<U, 2>& v) : x(T(v.x)), y(T(v.y)) {}
  KK_VEC_ACCESS(2)
};

template <class T>
struct alignas(kk_detail::vec_align<T, 3>) vec<T, 3> {
  T x, y, z;

  vec() = default;
  template <class S, enable_if_t<kk_detail::is_scalar<S>, int> = 0>
  constexpr KK_FN vec(S s) : x(T(s)), y(T(s)), z(T(s)) {}
  constexpr KK_FN vec(T x_, T y_, T z_) : x(x_), y(y_), z(z_) {}
  constexpr KK_FN vec(const vec<T, 2>& xy, T z_) : x(xy.x), y(xy.y), z(z_) {}
  constexpr KK_FN vec(T x_, const vec<T, 2>& yz) : x(x_), y(yz.x), z(yz.y) {}
  template <class U, enable_if_t<!is_same_v<U, T>, int> = 0>
  constexpr KK_FN explicit vec(const vec<U, 3>& v) : x(T(v.x)), y(T(v.y)), z(T(v.z)) {}
  KK_VEC_ACCESS(3)
};

template <class T>
struct alignas(kk_detail::vec_align<T, 4>) vec<T, 4> {
  T x, y, z, w;

  vec() = default;
  template <class S, enable_if_t<kk_detail::is_scalar<S>, int> = 0>
  constexpr KK_FN vec(S s) : x(T(s)), y(T(s)), z(T(s)), w(T(s)) {}
  constexpr KK_FN vec(T x_, T y_, T z_, T w_) : x(x_), y(y_), z(z_), w(w_) {}
  constexpr KK_FN vec(const vec<T, 2>& xy, T z_, T w_) : x(xy.x), y(xy.y), z(z_), w(w_) {}
  constexpr KK_FN vec(T x_, const vec<T, 2>& yz, T w_) : x(x_), y(yz.x), z(yz.y), w(w_) {}
  constexpr KK_FN vec(T x_, T y_, const vec<T, 2>& zw) : x(x_), y(y_), z(zw.x), w(zw.y) {}
  constexpr KK_FN vec(const vec<T, 2>& xy, const vec<T, 2>& zw) : x(xy.x), y(xy.y), z(zw.x), w(zw.y) {}
  constexpr KK_FN vec(const vec<T, 3>& xyz, T w_) : x(xyz.x), y(xyz.y), z(xyz.z), w(w_) {}
  constexpr KK_FN vec(T x_, const vec<T, 3>& yzw) : x(x_), y(yzw.x), z(yzw.y), w(yzw.z) {}
  template <class U, enable_if_t<!is_same_v<U, T>, int> = 0>
  constexpr KK_FN explicit vec(const vec<U, 4>& v) : x(T(v.x)), y(T(v.y)), z(T(v.z)), w(T(v.w)) {}
  KK_VEC_ACCESS(4)
};
#undef KK_VEC_ACCESS

// ---------------------------------------------------------------------------
// Operators: element-wise, vector op vector of the same type, and vector op
// scalar either way (the scalar is converted to the element type first).

#define KK_VEC_BINARY(op, R)                                                                \
  template <class T, int N>                                                                 \
  KK_FN vec<R, N> operator op(const vec<T, N>& a, const vec<T, N>& b) {                     \
    return kk_detail::vmap<R, N>([](const T& x, const T& y) { return R(x op y); }, a, b);   \
  }                                                                                         \
  template <class T, int N, class S, enable_if_t<kk_detail::is_scalar<S>, int> = 0>         \
  KK_FN vec<R, N> operator op(const vec<T, N>& a, const S& s) {                             \
    const T t = T(s);                                                                       \
    return kk_detail::vmap<R, N>([t](const T& x) { return R(x op t); }, a);                 \
  }                                                                                         \
  template <class T, int N, class S, enable_if_t<kk_detail::is_scalar<S>, int> = 0>         \
  KK_FN vec<R, N> operator op(const S& s, const vec<T, N>& b) {                             \
    const T t = T(s);                                                                       \
    return kk_detail::vmap<R, N>([t](const T& y) { return R(t op y); }, b);                 \
  }

#define KK_VEC_COMPOUND(op)                                      \
  template <class T, int N, class U>                             \
  KK_FN vec<T, N>& operator op##=(vec<T, N>& a, const U& b) {    \
    return a = a op b;                                           \
  }

KK_VEC_BINARY(+, T)
KK_VEC_BINARY(-, T)
KK_VEC_BINARY(*, T)
KK_VEC_BINARY(/, T)
KK_VEC_BINARY(%, T)
KK_VEC_BINARY(&, T)
KK_VEC_BINARY(|, T)
KK_VEC_BINARY(^, T)
KK_VEC_BINARY(<<, T)
KK_VEC_BINARY(>>, T)
KK_VEC_BINARY(==, bool)
KK_VEC_BINARY(!=, bool)
KK_VEC_BINARY(<, bool)
KK_VEC_BINARY(>, bool)
KK_VEC_BINARY(<=, bool)
KK_VEC_BINARY(>=, bool)
KK_VEC_BINARY(&&, bool)
KK_VEC_BINARY(||, bool)
KK_VEC_COMPOUND(+)
KK_VEC_COMPOUND(-)
KK_VEC_COMPOUND(*)
KK_VEC_COMPOUND(/)
KK_VEC_COMPOUND(%)
KK_VEC_COMPOUND(&)
KK_VEC_COMPOUND(|)
KK_VEC_COMPOUND(^)
KK_VEC_COMPOUND(<<)
KK_VEC_COMPOUND(>>)
#undef KK_VEC_BINARY
#undef KK_VEC_COMPOUND

template <class T, int N> KK_FN vec<T, N> operator+(const vec<T, N>& a) { return a; }
template <class T, int N> KK_FN vec<T, N> operator-(const vec<T, N>& a) {
  return kk_detail::vmap<T, N>([](const T& x) { return T(-x); }, a);
}
template <class T, int N> KK_FN vec<T, N> operator~(const vec<T, N>& a) {
  return kk_detail::vmap<T, N>([](const T& x) { return T(~x); }, a);
}
template <class T, int N> KK_FN vec<bool, N> operator!(const vec<T, N>& a) {
  return kk_detail::vmap<bool, N>([](const T& x) { return !x; }, a);
}
template <class T, int N> KK_FN vec<T, N>& operator++(vec<T, N>& a) { return a += 1; }
template <class T, int N> KK_FN vec<T, N>& operator--(vec<T, N>& a) { return a -= 1; }
template <class T, int N> KK_FN vec<T, N> operator++(vec<T, N>& a, int) { vec<T, N> old = a; a += 1; return old; }
template <class T, int N> KK_FN vec<T, N> operator--(vec<T, N>& a, int) { vec<T, N> old = a; a -= 1; return old; }

// all / any of a boolean vector (and of a scalar, for generic code).
template <int N> KK_FN bool all(const vec<bool, N>& v) {
  bool r = v.x && v.y;
  if constexpr (N > 2) r = r && v.z;
  if constexpr (N > 3) r = r && v.w;
  return r;
}
template <int N> KK_FN bool any(const vec<bool, N>& v) {
  bool r = v.x || v.y;
  if constexpr (N > 2) r = r || v.z;
  if constexpr (N > 3) r = r || v.w;
  return r;
}
KK_FN bool all(bool b) { return b; }
KK_FN bool any(bool b) { return b; }

// ---------------------------------------------------------------------------
// packed_* vectors: storage without padding. They convert to and from vec, and
// their operators forward to vec's.

#define KK_PACKED_ACCESS(N)                                                              \
  using value_type = T;                                                                  \
  packed_vec() = default;                                                                \
  KK_FN packed_vec(const vec<T, N>& v) { *this = v; }                                    \
  KK_FN operator vec<T, N>() const { return unpack(); }                                  \
  KK_FN T& operator[](int i) { return reinterpret_cast<T*>(this)[i]; }                   \
  KK_FN const T& operator[](int i) const { return reinterpret_cast<const T*>(this)[i]; } \
  template <unsigned... I>                                                               \
  KK_FN const vec<T, sizeof...(I)> swizzle() const {                                     \
    static_assert(((I < N) && ...), "swizzle component out of range");                  \
    return vec<T, sizeof...(I)>(kk_detail::component<I>::get(*this)...);                 \
  }                                                                                      \
  template <unsigned... I>                                                               \
  KK_FN kk_detail::swizzle_ref<packed_vec, I...> swizzle_ref() {                         \
    static_assert(((I < N) && ...), "swizzle component out of range");                  \
    return {*this};                                                                      \
  }

template <class T>
struct packed_vec<T, 2> {
  T x, y;
  KK_FN packed_vec(T x_, T y_) : x(x_), y(y_) {}
  KK_FN packed_vec& operator=(const vec<T, 2>& v) { x = v.x; y = v.y; return *this; }
  KK_FN vec<T, 2> unpack() const { return vec<T, 2>(x, y); }
  KK_PACKED_ACCESS(2)
};
template <class T>
struct packed_vec<T, 3> {
  T x, y, z;
  KK_FN packed_vec(T x_, T y_, T z_) : x(x_), y(y_), z(z_) {}
  KK_FN packed_vec& operator=(const vec<T, 3>& v) { x = v.x; y = v.y; z = v.z; return *this; }
  KK_FN vec<T, 3> unpack() const { return vec<T, 3>(x, y, z); }
  KK_PACKED_ACCESS(3)
};
template <class T>
struct packed_vec<T, 4> {
  T x, y, z, w;
  KK_FN packed_vec(T x_, T y_, T z_, T w_) : x(x_), y(y_), z(z_), w(w_) {}
  KK_FN packed_vec& operator=(const vec<T, 4>& v) { x = v.x; y = v.y; z = v.z; w = v.w; return *this; }
  KK_FN vec<T, 4> unpack() const { return vec<T, 4>(x, y, z, w); }
  KK_PACKED_ACCESS(4)
};
#undef KK_PACKED_ACCESS

namespace kk_detail {
template <class T> KK_FN const T& unpack(const T& v) { return v; }
template <class T, int N> KK_FN vec<T, N> unpack(const packed_vec<T, N>& v) { return v.unpack(); }
}  // namespace kk_detail

#define KK_PACKED_BINARY(op)                                                                 \
  template <class A, class B, enable_if_t<kk_detail::is_packed<A> || kk_detail::is_packed<B>, int> = 0> \
  KK_FN auto operator op(const A& a, const B& b)->decltype(kk_detail::unpack(a) op kk_detail::unpack(b)) { \
    return kk_detail::unpack(a) op kk_detail::unpack(b);                                    \
  }
KK_PACKED_BINARY(+)
KK_PACKED_BINARY(-)
KK_PACKED_BINARY(*)
KK_PACKED_BINARY(/)
KK_PACKED_BINARY(%)
KK_PACKED_BINARY(&)
KK_PACKED_BINARY(|)
KK_PACKED_BINARY(^)
KK_PACKED_BINARY(==)
KK_PACKED_BINARY(!=)
KK_PACKED_BINARY(<)
KK_PACKED_BINARY(>)
KK_PACKED_BINARY(<=)
KK_PACKED_BINARY(>=)
#undef KK_PACKED_BINARY
template <class T, int N, class U>
KK_FN packed_vec<T, N>& operator+=(packed_vec<T, N>& a, const U& b) { return a = a + b; }
template <class T, int N, class U>
KK_FN packed_vec<T, N>& operator-=(packed_vec<T, N>& a, const U& b) { return a = a - b; }
template <class T, int N, class U>
KK_FN packed_vec<T, N>& operator*=(packed_vec<T, N>& a, const U& b) { return a = a * b; }
template <class T, int N, class U>
KK_FN packed_vec<T, N>& operator/=(packed_vec<T, N>& a, const U& b) { return a = a / b; }
template <class T, int N> KK_FN vec<T, N> operator-(const packed_vec<T, N>& a) { return -a.unpack(); }

// ---------------------------------------------------------------------------
// Names.

#define KK_VEC_NAMES(T, name)                                                        \
  typedef vec<T, 2> name##2;                                                         \
  typedef vec<T, 3> name##3;                                                         \
  typedef vec<T, 4> name##4;                                                         \
  typedef packed_vec<T, 2> packed_##name##2;                                         \
  typedef packed_vec<T, 3> packed_##name##3;                                         \
  typedef packed_vec<T, 4> packed_##name##4;
KK_VEC_NAMES(float, float)
KK_VEC_NAMES(half, half)
KK_VEC_NAMES(bfloat, bfloat)
KK_VEC_NAMES(double, double)
KK_VEC_NAMES(char, char)
KK_VEC_NAMES(uchar, uchar)
KK_VEC_NAMES(short, short)
KK_VEC_NAMES(ushort, ushort)
KK_VEC_NAMES(int, int)
KK_VEC_NAMES(uint, uint)
KK_VEC_NAMES(long, long)
KK_VEC_NAMES(ulong, ulong)
KK_VEC_NAMES(bool, bool)
#undef KK_VEC_NAMES

static_assert(sizeof(float3) == 16 && alignof(float3) == 16, "Metal layout");
static_assert(sizeof(half2) == 4 && sizeof(packed_float3) == 12, "Metal layout");

}  // namespace metal
