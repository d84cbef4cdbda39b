// kernelkit/metal/atomic.h: MSL atomics. atomic<T> is a struct holding a T
// (same size and alignment: an output buffer of T passed as atomic<T>* works),
// operated on by Metal's free functions (atomic_fetch_add_explicit...). Every
// memory order is relaxed, which is what Metal offers for device atomics.
//
// T: int, uint, long, ulong, float, double, bool, and, beyond Metal, half,
// bfloat, short, char. Each call is one target atomic on T (the targets take
// any 1-, 2-, 4- or 8-byte type, and compute with T's operators where they
// have no instruction); half/bfloat add and sub use the target's native
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
// The threads a fence orders memory for (atomic_thread_fence's last argument); Metal's values.
enum thread_scope {
  thread_scope_thread = 0,
  thread_scope_threadgroup = 1,
  thread_scope_device = 2,
  thread_scope_simdgroup = 4,
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

// The T inside, as the target's atomics take it (without const/volatile).
template <class T> KK_FN T* value_ptr(const volatile atomic<T>* obj) { return const_cast<T*>(&obj->kk_value); }

#ifdef KK_HAS_ATOMIC_ADD_F16
template <class T> struct native_f16 { using type = void; };
template <> struct native_f16<half> { using type = kk::half_t; };
template <> struct native_f16<bfloat> { using type = kk::bfloat_t; };
template <class T> constexpr bool has_native_f16_add = !is_same_v<typename native_f16<T>::type, void>;
// The target's one-instruction add on 16-bit floats.
template <class T> KK_FN T native_f16_add(const volatile atomic<T>* obj, T v) {
  using S = typename native_f16<T>::type;
  return T::from_bits(kk::atomic_fetch_add(reinterpret_cast<S*>(value_ptr(obj)), S{v.bits}).bits);
}
#else
template <class T> constexpr bool has_native_f16_add = false;
template <class T> KK_FN T native_f16_add(const volatile atomic<T>*, T v) { return v; }  // not used
#endif
}  // namespace kk_detail

// ---------------------------------------------------------------------------
// The functions. Pointers may be const/volatile-qualified (Metal has volatile
// overloads); the operand's type is not deduced, so `atomic_fetch_add_explicit(p, 1, ...)`
// works on atomic<uint>* and atomic<float>*.

template <class T>
KK_FN T atomic_load_explicit(const volatile atomic<T>* obj, memory_order = memory_order_relaxed) {
  return kk::atomic_load(kk_detail::value_ptr(obj));
}
template <class T>
KK_FN void atomic_store_explicit(volatile atomic<T>* obj, kk_detail::identity_t<T> desired,
                                 memory_order = memory_order_relaxed) {
  kk::atomic_store(kk_detail::value_ptr(obj), desired);
}
template <class T>
KK_FN T atomic_exchange_explicit(volatile atomic<T>* obj, kk_detail::identity_t<T> desired,
                                 memory_order = memory_order_relaxed) {
  return kk::atomic_exchange(kk_detail::value_ptr(obj), desired);
}

// Compares bit patterns; on failure *expected receives the current value.
template <class T>
KK_FN bool atomic_compare_exchange_weak_explicit(volatile atomic<T>* obj, T* expected,
                                                 kk_detail::identity_t<T> desired,
                                                 memory_order = memory_order_relaxed,
                                                 memory_order = memory_order_relaxed) {
  return kk::atomic_compare_exchange(kk_detail::value_ptr(obj), expected, desired);
}
template <class T>
KK_FN bool atomic_compare_exchange_strong_explicit(volatile atomic<T>* obj, T* expected,
                                                   kk_detail::identity_t<T> desired,
                                                   memory_order s = memory_order_relaxed,
                                                   memory_order f = memory_order_relaxed) {
  return atomic_compare_exchange_weak_explicit(obj, expected, desired, s, f);
}

#define KK_ATOMIC_FETCH(op)                                                                      \
  template <class T>                                                                             \
  KK_FN T atomic_fetch_##op##_explicit(volatile atomic<T>* obj, kk_detail::identity_t<T> v,      \
                                       memory_order = memory_order_relaxed) {                    \
    return kk::atomic_fetch_##op(kk_detail::value_ptr(obj), v);                                 \
  }
KK_ATOMIC_FETCH(min)
KK_ATOMIC_FETCH(max)
KK_ATOMIC_FETCH(and)
KK_ATOMIC_FETCH(or)
KK_ATOMIC_FETCH(xor)
#undef KK_ATOMIC_FETCH

template <class T>
KK_FN T atomic_fetch_add_explicit(volatile atomic<T>* obj, kk_detail::identity_t<T> v,
                                  memory_order = memory_order_relaxed) {
  if constexpr (kk_detail::has_native_f16_add<T>) return kk_detail::native_f16_add(obj, v);
  else return kk::atomic_fetch_add(kk_detail::value_ptr(obj), v);
}
template <class T>
KK_FN T atomic_fetch_sub_explicit(volatile atomic<T>* obj, kk_detail::identity_t<T> v,
                                  memory_order = memory_order_relaxed) {
  if constexpr (kk_detail::has_native_f16_add<T>) return kk_detail::native_f16_add(obj, T(-v));
  else return kk::atomic_fetch_sub(kk_detail::value_ptr(obj), v);
}

// Metal's 64-bit min and max (atomic_ulong, MSL 2.4): no value returned. Any T here.
template <class T>
KK_FN void atomic_max_explicit(volatile atomic<T>* obj, kk_detail::identity_t<T> v, memory_order = memory_order_relaxed) {
  kk::atomic_fetch_max(kk_detail::value_ptr(obj), v);
}
template <class T>
KK_FN void atomic_min_explicit(volatile atomic<T>* obj, kk_detail::identity_t<T> v, memory_order = memory_order_relaxed) {
  kk::atomic_fetch_min(kk_detail::value_ptr(obj), v);
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
