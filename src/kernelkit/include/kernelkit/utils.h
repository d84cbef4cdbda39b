// kernelkit/utils.h: MLX's kernel utilities, which MLX prepends to every custom
// kernel (`metal::utils()`: mlx/backend/metal/kernels/utils.h with bf16.h,
// bf16_math.h, complex.h, defines.h and logging.h), under the same names:
//   Limits<T> (max, min, finite_max, finite_min), WorkPerThread<T>,
//   elem_to_loc (and _1, _2, _3, _2_nd, _3_nd), LoopedElemToLoc, ceildiv,
//   log1p (float, bfloat16_t, complex64_t), the complex simd_shuffle* overloads,
//   ConditionalType, cast_to, bfloat16_to_uint16 / uint16_to_bfloat16, mlx::os_log,
//   MLX_MTL_PRAGMA_UNROLL, MTL_CONST, instantiate_kernel and defines.h's constants;
//   complex_t / complex64_t are complex.h's. bf16_math.h's bfloat16_t math and MLX's
//   64-bit and bool simd_shuffle* overloads need nothing here: metal/math.h's and
//   metal/simd.h's functions take every scalar type.
// `#include "mlx/backend/metal/kernels/utils.h"` (and bf16.h...) finds the empty
// headers in include/mlx/: all of this is already there.
//
// Where the names live. MLX's are at global scope (beside `using namespace metal`);
// the user's header and body are compiled inside namespace metal. Types, templates
// and constants are at global scope here too: the user's code sees them, and a
// header that declares its own Limits, complex64_t or REDUCE_N_READS (in namespace
// metal) hides them instead of clashing. Functions that overload MSL's or the C
// library's names (log1p, simd_shuffle*) and the elem_to_loc family are in
// namespace metal, with the rest of MSL (a global log1p(float) would clash with
// the C++ library's), as is mlx::os_log (a header that opens `namespace mlx` opens
// metal::mlx).
#pragma once

#include "indexing.h"
#include "complex.h"

// MLX's loop hint (utils.h): the target compiler's "unroll fully" (the same tokens the
// front end writes for `_Pragma("clang loop unroll(full)")`, so a header that copies
// MLX's #define redefines it identically).
#define MLX_MTL_PRAGMA_UNROLL KK_UNROLL_FULL

// defines.h: `constant` under Metal, which the front end makes `const` (MLX writes it on
// constexpr data: `static MTL_CONST constexpr int N = 4;`).
#ifndef MTL_CONST
#define MTL_CONST const
#endif

// defines.h: an explicit instantiation of a templated kernel (its name is Metal's host_name).
#define instantiate_kernel(name, func, ...) template decltype(func<__VA_ARGS__>) func<__VA_ARGS__>;

// ---------------------------------------------------------------------------
// defines.h: the sizes MLX's reduction, softmax and RMS-norm kernels use.

static constexpr int MAX_REDUCE_SPECIALIZED_DIMS = 4;
static constexpr int REDUCE_N_READS = 4;
static constexpr int REDUCE_N_WRITES = 4;
static constexpr int SOFTMAX_N_READS = 4;
static constexpr int RMS_N_READS = 4;
static constexpr int RMS_LOOPED_LIMIT = 4096;

// ---------------------------------------------------------------------------
// bf16.h: bfloat16_t's bits.

KK_FN metal::uint16_t bfloat16_to_uint16(const metal::bfloat16_t x) { return metal::as_type<metal::uint16_t>(x); }
KK_FN metal::bfloat16_t uint16_to_bfloat16(const metal::uint16_t x) { return metal::as_type<metal::bfloat16_t>(x); }

// ---------------------------------------------------------------------------
// Work per thread of MLX's elementwise kernels: 8 bytes' worth of U.

template <typename U>
struct WorkPerThread {
  static_assert(sizeof(U) <= 8, "Type too large");
  static constexpr int n = 8 / sizeof(U);
};

// ---------------------------------------------------------------------------
// Limits<T>: the initial values of reductions. Floating types: max and min are
// +-infinity, finite_max and finite_min +-the largest finite value; integers:
// all four are numeric_limits' max() and min(); bool: max and min only; complex:
// max and min (+-inf, +-inf). (double, which Metal lacks, is a floating type, as
// in MLX's CPU and CUDA backends.)

template <typename U>
struct Limits {
  static constexpr U max = metal::numeric_limits<U>::max();
  static constexpr U min = metal::numeric_limits<U>::min();
  static constexpr U finite_max = metal::numeric_limits<U>::max();
  static constexpr U finite_min = metal::numeric_limits<U>::min();
};

namespace metal {
namespace kk_detail {
template <typename U>
struct float_limit_values {
  static constexpr U max = numeric_limits<U>::infinity();
  static constexpr U min = -numeric_limits<U>::infinity();
  static constexpr U finite_max = numeric_limits<U>::max();
  static constexpr U finite_min = -numeric_limits<U>::max();
};
}  // namespace kk_detail
}  // namespace metal

template <> struct Limits<metal::half> : metal::kk_detail::float_limit_values<metal::half> {};
template <> struct Limits<metal::bfloat16_t> : metal::kk_detail::float_limit_values<metal::bfloat16_t> {};
template <> struct Limits<float> : metal::kk_detail::float_limit_values<float> {};
template <> struct Limits<double> : metal::kk_detail::float_limit_values<double> {};

template <>
struct Limits<bool> {
  static constexpr bool max = true;
  static constexpr bool min = false;
};

template <typename T>
struct Limits<complex_t<T>> {
  static constexpr complex_t<T> max =
      complex_t<T>(metal::numeric_limits<T>::infinity(), metal::numeric_limits<T>::infinity());
  static constexpr complex_t<T> min =
      complex_t<T>(-metal::numeric_limits<T>::infinity(), -metal::numeric_limits<T>::infinity());
};

// ---------------------------------------------------------------------------
// ConditionalType<c, T, U>::type: T if c, else U (std::conditional, which Metal lacks).

template <bool condition, typename T, typename U>
struct ConditionalType {
  using type = U;
};
template <typename T, typename U>
struct ConditionalType<true, T, U> {
  using type = T;
};

// cast_to<U>(val): static_cast, except that a float, bfloat16_t or complex64_t is true
// when any bit but the sign is set (subnormals are true, as without flush to zero).

template <typename U, typename T>
KK_FN U cast_to(T val) {
  return static_cast<U>(val);
}
template <>
KK_FN bool cast_to<bool, float>(float val) {
  return (metal::as_type<metal::uint32_t>(val) & 0x7FFFFFFFu) != 0;
}
template <>
KK_FN bool cast_to<bool, metal::bfloat16_t>(metal::bfloat16_t val) {
  return (metal::as_type<metal::uint16_t>(val) & 0x7FFFu) != 0;
}
template <>
KK_FN bool cast_to<bool, complex64_t>(complex64_t val) {
  return cast_to<bool, float>(val.real) || cast_to<bool, float>(val.imag);
}

namespace metal {

// ---------------------------------------------------------------------------
// logging.h: mlx::os_log. Metal before 3.2 (and kernelkit) logs nothing.

namespace mlx {
struct os_log {
  constexpr KK_FN os_log(const char*, const char*) {}
  template <typename... Args>
  KK_FN void log_debug(const char*, Args...) const {}
};
}  // namespace mlx

// ---------------------------------------------------------------------------
// elem_to_loc: the offset of an element of a strided array (`name_shape`,
// `name_strides`, `name_ndim`), and ceildiv.

// Location of the elem-th element (row-major order) of an array with these
// shape and strides. IdxT follows elem: a `uint elem` gives a uint offset.
template <typename IdxT = int64_t>
KK_FN IdxT elem_to_loc(IdxT elem, const int* shape, const int64_t* strides, int ndim) {
  return kk::elem_to_loc(elem, shape, strides, ndim);
}

// A 3-D thread position: x and y index the last two dimensions, z the others.
template <typename IdxT = int64_t>
KK_FN IdxT elem_to_loc(uint3 elem, const int* shape, const int64_t* strides, int ndim) {
  IdxT loc = elem.x * IdxT(strides[ndim - 1]) + elem.y * IdxT(strides[ndim - 2]);
  for (int d = ndim - 3; d >= 0; --d) {
    loc += (elem.z % shape[d]) * IdxT(strides[d]);
    elem.z /= shape[d];
  }
  return loc;
}

// Fixed dimensions.
template <typename IdxT = int64_t>
KK_FN IdxT elem_to_loc_1(uint elem, const int64_t& stride) {
  return elem * IdxT(stride);
}
template <typename IdxT = int64_t>
KK_FN IdxT elem_to_loc_2(uint2 elem, const int64_t strides[2]) {
  return elem.x * IdxT(strides[1]) + elem.y * IdxT(strides[0]);
}
template <typename IdxT = int64_t>
KK_FN IdxT elem_to_loc_3(uint3 elem, const int64_t strides[3]) {
  return elem.x * IdxT(strides[2]) + elem.y * IdxT(strides[1]) + elem.z * IdxT(strides[0]);
}

// Two and three arrays sharing a shape, one index walk.
template <typename IdxT = int64_t>
KK_FN vec<IdxT, 2> elem_to_loc_2_nd(uint3 elem, const int* shape, const int64_t* a_strides,
                                    const int64_t* b_strides, int ndim) {
  vec<IdxT, 2> loc = {
      IdxT(elem.x * IdxT(a_strides[ndim - 1]) + IdxT(elem.y) * IdxT(a_strides[ndim - 2])),
      IdxT(elem.x * IdxT(b_strides[ndim - 1]) + elem.y * IdxT(b_strides[ndim - 2]))};
  for (int d = ndim - 3; d >= 0; --d) {
    uint l = elem.z % shape[d];
    loc.x += l * IdxT(a_strides[d]);
    loc.y += l * IdxT(b_strides[d]);
    elem.z /= shape[d];
  }
  return loc;
}
template <typename IdxT = int64_t>
KK_FN vec<IdxT, 3> elem_to_loc_3_nd(uint3 elem, const int* shape, const int64_t* a_strides,
                                    const int64_t* b_strides, const int64_t* c_strides, int ndim) {
  vec<IdxT, 3> loc = {
      IdxT(elem.x * IdxT(a_strides[ndim - 1])) + IdxT(elem.y * IdxT(a_strides[ndim - 2])),
      IdxT(elem.x * IdxT(b_strides[ndim - 1])) + IdxT(elem.y * IdxT(b_strides[ndim - 2])),
      IdxT(elem.x * IdxT(c_strides[ndim - 1])) + IdxT(elem.y * IdxT(c_strides[ndim - 2]))};
  for (int d = ndim - 3; d >= 0; --d) {
    uint l = elem.z % shape[d];
    loc.x += l * IdxT(a_strides[d]);
    loc.y += l * IdxT(b_strides[d]);
    loc.z += l * IdxT(c_strides[d]);
    elem.z /= shape[d];
  }
  return loc;
}

using kk::ceildiv;  // ceil(N / M) for positive integers

// ---------------------------------------------------------------------------
// log1p(x) = log(1 + x), accurate for small x (Goldberg's: x * log(1 + x) / ((1 + x) - 1)).
// MLX's overloads take float, bfloat16_t and complex64_t; half and integers are
// computed as float (as Metal converts them to MLX's float overload), double in
// double. Those extras are templates, so that a header's own log1p(half) wins.

KK_FN float log1p(float x) {
  const float xp1 = 1.0f + x;
  if (xp1 == ::Limits<float>::max) return ::Limits<float>::max;
  if (xp1 == 1.0f) return x;
  return x * (metal::log(xp1) / (xp1 - 1.0f));
}

KK_FN bfloat16_t log1p(bfloat16_t x) {
  const float xp1 = 1.0f + static_cast<float>(x);
  if (xp1 == ::Limits<float>::max) return ::Limits<bfloat16_t>::max;
  if (xp1 == 1.0f) return x;
  return bfloat16_t(x * (metal::log(xp1) / (xp1 - 1.0f)));
}

KK_FN complex64_t log1p(complex64_t in) {
  const float x = in.real, y = in.imag;
  const float zabs = metal::precise::sqrt(x * x + y * y);
  const float theta = metal::atan2(y, x + 1);
  if (zabs < 0.5f) {
    const float r = x * (2 + x) + y * y;
    if (r == 0) return {x, theta};  // underflow
    return {0.5f * log1p(r), theta};
  }
  return {metal::log(metal::sqrt((x + 1) * (x + 1) + y * y)), theta};
}

template <typename T, enable_if_t<is_integral_v<T> || is_same_v<T, half>, int> = 0>
KK_FN float log1p(T x) {
  return log1p(static_cast<float>(x));
}
template <typename T, enable_if_t<is_same_v<T, double>, int> = 0>
KK_FN double log1p(T x) {
  const double xp1 = 1.0 + x;
  if (xp1 == ::Limits<double>::max) return xp1;
  if (xp1 == 1.0) return x;
  return x * (metal::log(xp1) / (xp1 - 1.0));
}

// ---------------------------------------------------------------------------
// MLX's SIMD shuffles of complex values, lane by lane (simd.h's take every other
// scalar, 64-bit integers and bool included, as MLX's overloads of them do).

template <typename T>
KK_FN complex_t<T> simd_shuffle(complex_t<T> data, uint lane, kk::site s = KK_SYNC_SITE("simd_shuffle")) {
  return complex_t<T>(simd_shuffle(data.real, lane, s), simd_shuffle(data.imag, lane, s));
}
template <typename T>
KK_FN complex_t<T> simd_shuffle_down(complex_t<T> data, uint delta, kk::site s = KK_SYNC_SITE("simd_shuffle_down")) {
  return complex_t<T>(simd_shuffle_down(data.real, delta, s), simd_shuffle_down(data.imag, delta, s));
}
template <typename T>
KK_FN complex_t<T> simd_shuffle_up(complex_t<T> data, uint delta, kk::site s = KK_SYNC_SITE("simd_shuffle_up")) {
  return complex_t<T>(simd_shuffle_up(data.real, delta, s), simd_shuffle_up(data.imag, delta, s));
}
template <typename T>
KK_FN complex_t<T> simd_shuffle_and_fill_up(complex_t<T> data, complex_t<T> filling, uint delta,
                                            kk::site s = KK_SYNC_SITE("simd_shuffle_and_fill_up")) {
  return complex_t<T>(simd_shuffle_and_fill_up(data.real, filling.real, delta, 32, s),
                      simd_shuffle_and_fill_up(data.imag, filling.imag, delta, 32, s));
}

}  // namespace metal

// ---------------------------------------------------------------------------
// LoopedElemToLoc<DIM, OffsetT, General>: the offset of consecutive elements of a
// strided array, carried from one element to the next (next(), or next(n) for n
// elements on) instead of recomputed: the last DIM dimensions carry their
// indices, the others are recomputed with elem_to_loc when they change.
// General = false: a one-dimensional walk over the last stride only.

template <int DIM, typename OffsetT = metal::size_t, bool General = true>
struct LoopedElemToLoc {
  int dim;
  LoopedElemToLoc<DIM - 1, OffsetT, General> inner_looper;
  OffsetT offset{0};
  int index{0};

  KK_FN LoopedElemToLoc(int dim_) : dim(dim_), inner_looper(dim_ - 1) {}

  KK_FN void next(const int* shape, const metal::int64_t* strides) {
    if (dim == 0) return;
    index++;
    offset += OffsetT(strides[dim - 1]);
    if (index >= shape[dim - 1]) {
      index = 0;
      inner_looper.next(shape, strides);
      offset = inner_looper.offset;
    }
  }

  KK_FN void next(int n, const int* shape, const metal::int64_t* strides) {
    if (dim == 0) return;
    index += n;
    offset += n * OffsetT(strides[dim - 1]);
    if (index >= shape[dim - 1]) {
      int extra = index - shape[dim - 1];
      if (extra >= shape[dim - 1]) {
        inner_looper.next(1 + extra / shape[dim - 1], shape, strides);
        extra = extra % shape[dim - 1];
      } else {
        inner_looper.next(shape, strides);
      }
      index = 0;
      offset = inner_looper.offset;
      if (extra > 0) next(extra, shape, strides);
    }
  }

  KK_FN OffsetT location() { return offset; }
};

template <typename OffsetT>
struct LoopedElemToLoc<1, OffsetT, true> {
  int dim;
  OffsetT offset{0};
  unsigned index{0};

  KK_FN LoopedElemToLoc(int dim_) : dim(dim_) {}

  KK_FN void next(const int* shape, const metal::int64_t* strides) {
    index++;
    if (dim > 1) {
      offset = metal::elem_to_loc<OffsetT>(index, shape, strides, dim);
    } else {
      offset += OffsetT(strides[0]);
    }
  }

  KK_FN void next(int n, const int* shape, const metal::int64_t* strides) {
    index += n;
    if (dim > 1) {
      offset = metal::elem_to_loc<OffsetT>(index, shape, strides, dim);
    } else {
      offset = index * OffsetT(strides[0]);
    }
  }

  KK_FN OffsetT location() { return offset; }
};

template <typename OffsetT>
struct LoopedElemToLoc<1, OffsetT, false> {
  OffsetT offset{0};

  KK_FN LoopedElemToLoc(int) {}

  KK_FN void next(const int*, const metal::int64_t* strides) { offset += OffsetT(strides[0]); }
  KK_FN void next(int n, const int*, const metal::int64_t* strides) { offset += n * OffsetT(strides[0]); }

  KK_FN OffsetT location() { return offset; }
};
