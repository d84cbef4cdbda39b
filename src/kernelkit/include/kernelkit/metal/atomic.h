// kernelkit/metal/atomic.h: MSL atomics. atomic<T> is a struct holding a T
// (same size and alignment: an output buffer of T passed as atomic<T>* works),
// operated on by Metal's free functions (atomic_fetch_add_explicit...). Every
// memory order is relaxed, which is what Metal offers for device atomics.
//
// T = int, uint, long, ulong, float, double use the target's atomics. Types
// narrower than 32 bits (bool, char, short, half, bfloat) are emulated with a
// compare-and-swap on the aligned 32-bit word that contains them (the GPU and
// x86 are little-endian); half/bfloat add and sub use the target's native
// 16-bit add when it has one (KK_HAS_ATOMIC_ADD_F16).
#pragma once

namespace metal {

enum memory_order {
  memory_order_relaxed,
  memory_order_consume,
  memory_order_acquire,
  memory_order_release,
  memory_order_acq_rel,
  memory_order_seq_cst,
};

template <class T>
struct atomic {
  T kk_value;  // trivially constructible: `KK_THREADGROUP atomic<int> n;` is allowed
};
typedef atomic<int> atomic_int;
typedef atomic<uint> atomic_uint;
typedef atomic<long> atomic_long;
typedef atomic<ulong> atomic_ulong;
typedef atomic<bool> atomic_bool;
typedef atomic<float> atomic_float;
typedef atomic<half> atomic_half;
typedef atomic<bfloat> atomic_bfloat;
typedef atomic<double> atomic_double;
static_assert(sizeof(atomic<half>) == 2 && sizeof(atomic<float>) == 4 && alignof(atomic<double>) == 8,
              "atomic<T> must have T's layout");

namespace kk_detail {
template <class T> struct identity { using type = T; };
template <class T> using identity_t = typename identity<T>::type;  // blocks deduction

// The type the target's atomics are called with.
template <class T> struct atomic_storage { using type = T; };
template <> struct atomic_storage<long> { using type = long long; };
template <> struct atomic_storage<unsigned long> { using type = unsigned long long; };
template <class T> using atomic_storage_t = typename atomic_storage<T>::type;
template <class T> constexpr bool atomic_emulated = sizeof(T) < 4;

template <class T> KK_FN T* value_ptr(const volatile atomic<T>* obj) {
  return const_cast<T*>(&obj->kk_value);
}
template <class T> KK_FN atomic_storage_t<T>* storage_ptr(const volatile atomic<T>* obj) {
  return reinterpret_cast<atomic_storage_t<T>*>(value_ptr(obj));
}

// Same-size unsigned integer, to compare and splice bit patterns.
template <int Size> struct uint_of_size;
template <> struct uint_of_size<1> { using type = uchar; };
template <> struct uint_of_size<2> { using type = ushort; };
template <class T> KK_FN uint bits_of(T v) {
  return __builtin_bit_cast(typename uint_of_size<sizeof(T)>::type, v);
}
template <class T> KK_FN T from_bits_of(uint b) {
  return __builtin_bit_cast(T, static_cast<typename uint_of_size<sizeof(T)>::type>(b));
}

// Read-modify-write of a 1- or 2-byte value: CAS on its 32-bit word until
// `next = f(current)` lands. Returns the value before. Skips the write when
// f leaves the value unchanged (fetch_min that does not lower it, for example).
template <class T, class F>
KK_FN T emulated_rmw(T* p, F f) {
  const size_t addr = reinterpret_cast<size_t>(p);
  uint* word = reinterpret_cast<uint*>(addr & ~size_t(3));
  const uint shift = uint(addr & 3) * 8;
  const uint mask = ((1u << (sizeof(T) * 8)) - 1u) << shift;
  uint old = kk::atomic_load(word);
  for (;;) {
    const T cur = from_bits_of<T>((old & mask) >> shift);
    const uint desired = (old & ~mask) | (bits_of(T(f(cur))) << shift);
    if (desired == old) return cur;
    uint expected = old;
    if (kk::atomic_compare_exchange(word, &expected, desired)) return cur;
    old = expected;
  }
}
template <class T> KK_FN T emulated_load(T* p) {
  const size_t addr = reinterpret_cast<size_t>(p);
  const uint w = kk::atomic_load(reinterpret_cast<uint*>(addr & ~size_t(3)));
  return from_bits_of<T>((w >> (uint(addr & 3) * 8)) & ((1u << (sizeof(T) * 8)) - 1u));
}

#ifdef KK_HAS_ATOMIC_ADD_F16
template <class T> struct native_f16 { using type = void; };
template <> struct native_f16<half> { using type = kk::half_t; };
template <> struct native_f16<bfloat> { using type = kk::bfloat_t; };
template <class T> constexpr bool has_native_f16_add = !is_same_v<typename native_f16<T>::type, void>;
#else
template <class T> constexpr bool has_native_f16_add = false;
#endif
}  // namespace kk_detail

// ---------------------------------------------------------------------------
// The functions. Pointers may be const/volatile-qualified (Metal has volatile
// overloads); the operand's type is not deduced, so `atomic_fetch_add_explicit(p, 1, ...)`
// works on atomic<uint>* and atomic<float>*.

template <class T>
KK_FN T atomic_load_explicit(const volatile atomic<T>* obj, memory_order = memory_order_relaxed) {
  if constexpr (kk_detail::atomic_emulated<T>) return kk_detail::emulated_load(kk_detail::value_ptr(obj));
  else return T(kk::atomic_load(kk_detail::storage_ptr(obj)));
}

template <class T>
KK_FN void atomic_store_explicit(volatile atomic<T>* obj, kk_detail::identity_t<T> desired,
                                 memory_order = memory_order_relaxed) {
  if constexpr (kk_detail::atomic_emulated<T>) {
    kk_detail::emulated_rmw(kk_detail::value_ptr(obj), [&](T) { return desired; });
  } else {
    kk::atomic_store(kk_detail::storage_ptr(obj), kk_detail::atomic_storage_t<T>(desired));
  }
}

template <class T>
KK_FN T atomic_exchange_explicit(volatile atomic<T>* obj, kk_detail::identity_t<T> desired,
                                 memory_order = memory_order_relaxed) {
  if constexpr (kk_detail::atomic_emulated<T>) {
    return kk_detail::emulated_rmw(kk_detail::value_ptr(obj), [&](T) { return desired; });
  } else {
    return T(kk::atomic_exchange(kk_detail::storage_ptr(obj), kk_detail::atomic_storage_t<T>(desired)));
  }
}

// Compares bit patterns; on failure *expected receives the current value.
template <class T>
KK_FN bool atomic_compare_exchange_weak_explicit(volatile atomic<T>* obj, T* expected,
                                                 kk_detail::identity_t<T> desired,
                                                 memory_order = memory_order_relaxed,
                                                 memory_order = memory_order_relaxed) {
  if constexpr (kk_detail::atomic_emulated<T>) {
    const uint want = kk_detail::bits_of(*expected);
    const T cur = kk_detail::emulated_rmw(kk_detail::value_ptr(obj), [&](T c) {
      return kk_detail::bits_of(c) == want ? desired : c;
    });
    if (kk_detail::bits_of(cur) == want) return true;
    *expected = cur;
    return false;
  } else {
    using S = kk_detail::atomic_storage_t<T>;
    return kk::atomic_compare_exchange(kk_detail::storage_ptr(obj), reinterpret_cast<S*>(expected), S(desired));
  }
}
template <class T>
KK_FN bool atomic_compare_exchange_strong_explicit(volatile atomic<T>* obj, T* expected,
                                                   kk_detail::identity_t<T> desired,
                                                   memory_order s = memory_order_relaxed,
                                                   memory_order f = memory_order_relaxed) {
  return atomic_compare_exchange_weak_explicit(obj, expected, desired, s, f);
}

// fetch_<op>: NEW is the emulated path's new value from `a` (current) and `b` (operand).
#define KK_ATOMIC_FETCH(op, NEW)                                                                  \
  template <class T>                                                                             \
  KK_FN T atomic_fetch_##op##_explicit(volatile atomic<T>* obj, kk_detail::identity_t<T> b,      \
                                       memory_order = memory_order_relaxed) {                    \
    if constexpr (kk_detail::atomic_emulated<T>) {                                               \
      return kk_detail::emulated_rmw(kk_detail::value_ptr(obj), [&](T a) { return NEW; });       \
    } else {                                                                                     \
      using S = kk_detail::atomic_storage_t<T>;                                                  \
      return T(kk::atomic_fetch_##op(kk_detail::storage_ptr(obj), S(b)));                        \
    }                                                                                            \
  }
KK_ATOMIC_FETCH(min, min(a, b))
KK_ATOMIC_FETCH(max, max(a, b))
KK_ATOMIC_FETCH(and, T(a & b))
KK_ATOMIC_FETCH(or, T(a | b))
KK_ATOMIC_FETCH(xor, T(a ^ b))
#undef KK_ATOMIC_FETCH

template <class T>
KK_FN T atomic_fetch_add_explicit(volatile atomic<T>* obj, kk_detail::identity_t<T> b,
                                  memory_order = memory_order_relaxed) {
#ifdef KK_HAS_ATOMIC_ADD_F16
  if constexpr (kk_detail::has_native_f16_add<T>) {
    using S = typename kk_detail::native_f16<T>::type;
    return T::from_bits(kk::atomic_fetch_add(reinterpret_cast<S*>(kk_detail::value_ptr(obj)), S{b.bits}).bits);
  } else
#endif
  if constexpr (kk_detail::atomic_emulated<T>) {
    return kk_detail::emulated_rmw(kk_detail::value_ptr(obj), [&](T a) { return T(a + b); });
  } else {
    using S = kk_detail::atomic_storage_t<T>;
    return T(kk::atomic_fetch_add(kk_detail::storage_ptr(obj), S(b)));
  }
}
template <class T>
KK_FN T atomic_fetch_sub_explicit(volatile atomic<T>* obj, kk_detail::identity_t<T> b,
                                  memory_order order = memory_order_relaxed) {
  if constexpr (kk_detail::has_native_f16_add<T>) {
    return atomic_fetch_add_explicit(obj, T(-b), order);
  } else if constexpr (kk_detail::atomic_emulated<T>) {
    return kk_detail::emulated_rmw(kk_detail::value_ptr(obj), [&](T a) { return T(a - b); });
  } else {
    using S = kk_detail::atomic_storage_t<T>;
    return T(kk::atomic_fetch_sub(kk_detail::storage_ptr(obj), S(b)));
  }
}

// The forms without _explicit (memory_order_relaxed: Metal has no other for device memory).
template <class T> KK_FN T atomic_load(const volatile atomic<T>* obj) { return atomic_load_explicit(obj); }
template <class T> KK_FN void atomic_store(volatile atomic<T>* obj, kk_detail::identity_t<T> v) {
  atomic_store_explicit(obj, v);
}
template <class T> KK_FN T atomic_exchange(volatile atomic<T>* obj, kk_detail::identity_t<T> v) {
  return atomic_exchange_explicit(obj, v);
}
template <class T>
KK_FN bool atomic_compare_exchange_weak(volatile atomic<T>* obj, T* expected, kk_detail::identity_t<T> desired) {
  return atomic_compare_exchange_weak_explicit(obj, expected, desired);
}
#define KK_ATOMIC_IMPLICIT(op)                                                                  \
  template <class T> KK_FN T atomic_fetch_##op(volatile atomic<T>* obj, kk_detail::identity_t<T> v) { \
    return atomic_fetch_##op##_explicit(obj, v);                                               \
  }
KK_ATOMIC_IMPLICIT(add)
KK_ATOMIC_IMPLICIT(sub)
KK_ATOMIC_IMPLICIT(min)
KK_ATOMIC_IMPLICIT(max)
KK_ATOMIC_IMPLICIT(and)
KK_ATOMIC_IMPLICIT(or)
KK_ATOMIC_IMPLICIT(xor)
#undef KK_ATOMIC_IMPLICIT

}  // namespace metal
