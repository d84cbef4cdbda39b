// Atomics, threadgroup declarations, barriers, SIMD-group functions as one
// lane sees them, and MLX's utilities (elem_to_loc, ceildiv).
#include "prelude_test.h"

namespace metal {

static_assert(sizeof(atomic_int) == 4 && sizeof(atomic<half>) == 2 && sizeof(atomic<ulong>) == 8 &&
                  alignof(atomic<double>) == 8 && __is_trivial(atomic_float),
              "atomic<T> has T's layout");
static_assert(is_same_v<decltype(simd_sum(half())), half> && is_same_v<decltype(simd_max(float4())), float4>,
              "SIMD-group functions keep the type");
static_assert(is_same_v<decltype(elem_to_loc(uint(), (const int*)0, (const int64_t*)0, 0)), uint>,
              "elem_to_loc follows elem's type");
static_assert(is_same_v<decltype(elem_to_loc(uint3(), (const int*)0, (const int64_t*)0, 0)), int64_t>,
              "the uint3 form defaults to int64_t");

KK_TEST_FN void test_atomics(kk_test_result& r) {
  // Buffers of T used as atomic<T>*, as atomic_outputs=True passes outputs.
  // In threadgroup memory: the GPU has no atomics on a thread's own memory.
  KK_THREADGROUP int ibuf[2];
  ibuf[0] = 5;
  ibuf[1] = 0;
  atomic_int* ia = reinterpret_cast<atomic_int*>(ibuf);
  CHECK(atomic_load_explicit(ia, memory_order_relaxed) == 5);
  atomic_store_explicit(ia, 7, memory_order_relaxed);
  CHECK(atomic_fetch_add_explicit(ia, 3, memory_order_relaxed) == 7 && ibuf[0] == 10);
  CHECK(atomic_fetch_sub_explicit(ia, 4, memory_order_relaxed) == 10 && ibuf[0] == 6);
  CHECK(atomic_fetch_min_explicit(ia, 2, memory_order_relaxed) == 6 && ibuf[0] == 2);
  CHECK(atomic_fetch_max_explicit(ia, 9, memory_order_relaxed) == 2 && ibuf[0] == 9);
  CHECK(atomic_fetch_and_explicit(ia, 3, memory_order_relaxed) == 9 && ibuf[0] == 1);
  CHECK(atomic_fetch_or_explicit(ia, 6, memory_order_relaxed) == 1 && ibuf[0] == 7);
  CHECK(atomic_fetch_xor_explicit(ia, 5, memory_order_relaxed) == 7 && ibuf[0] == 2);
  CHECK(atomic_exchange_explicit(ia, 11, memory_order_relaxed) == 2 && ibuf[0] == 11);
  int expected = 3;
  CHECK(!atomic_compare_exchange_weak_explicit(ia, &expected, 4, memory_order_relaxed, memory_order_relaxed));
  CHECK(expected == 11 && ibuf[0] == 11);
  CHECK(atomic_compare_exchange_weak_explicit(ia, &expected, 4, memory_order_relaxed, memory_order_relaxed));
  CHECK(ibuf[0] == 4 && ibuf[1] == 0);
  CHECK(atomic_fetch_add(ia, 1) == 4 && atomic_load(ia) == 5);
  volatile atomic_int* via = ia;  // Metal has volatile overloads
  CHECK(atomic_fetch_add_explicit(via, 1, memory_order_relaxed) == 5 && atomic_load_explicit(via, memory_order_relaxed) == 6);

  KK_THREADGROUP uint ubuf[1];
  ubuf[0] = 1;
  atomic_uint* ua = reinterpret_cast<atomic_uint*>(ubuf);
  atomic_fetch_add_explicit(ua, 1, memory_order_relaxed);  // int literal on atomic<uint>
  CHECK(ubuf[0] == 2 && atomic_fetch_sub_explicit(ua, 3u, memory_order_relaxed) == 2 && ubuf[0] == 0xffffffffu);
  CHECK(atomic_fetch_max_explicit(ua, 5u, memory_order_relaxed) == 0xffffffffu && atomic_fetch_min_explicit(ua, 5u, memory_order_relaxed) == 0xffffffffu && ubuf[0] == 5u);

  KK_THREADGROUP float fbuf[1];
  fbuf[0] = 1.5f;
  atomic_float* fa = reinterpret_cast<atomic_float*>(fbuf);
  CHECK(atomic_fetch_add_explicit(fa, 2, memory_order_relaxed) == 1.5f && fbuf[0] == 3.5f);
  CHECK(atomic_fetch_sub_explicit(fa, 0.5f, memory_order_relaxed) == 3.5f && fbuf[0] == 3.0f);
  CHECK(atomic_fetch_min_explicit(fa, -1.0f, memory_order_relaxed) == 3.0f && fbuf[0] == -1.0f);
  CHECK(atomic_fetch_max_explicit(fa, 8.0f, memory_order_relaxed) == -1.0f && fbuf[0] == 8.0f);
  float fexp = 8.0f;
  CHECK(atomic_compare_exchange_weak_explicit(fa, &fexp, 1.0f, memory_order_relaxed, memory_order_relaxed) && fbuf[0] == 1.0f);
  CHECK(atomic_exchange_explicit(fa, 2.0f, memory_order_relaxed) == 1.0f && atomic_load_explicit(fa, memory_order_relaxed) == 2.0f);

  KK_THREADGROUP long lbuf[1];
  lbuf[0] = -5;
  atomic<long>* la = reinterpret_cast<atomic<long>*>(lbuf);
  CHECK(atomic_fetch_add_explicit(la, 10, memory_order_relaxed) == -5 && lbuf[0] == 5);
  CHECK(atomic_fetch_min_explicit(la, -7, memory_order_relaxed) == 5 && lbuf[0] == -7);
  KK_THREADGROUP ulong ulbuf[1];
  ulbuf[0] = 1;
  atomic_ulong* ula = reinterpret_cast<atomic_ulong*>(ulbuf);
  CHECK(atomic_fetch_or_explicit(ula, 0x100000000ul, memory_order_relaxed) == 1 && ulbuf[0] == 0x100000001ul);
  CHECK(atomic_fetch_max_explicit(ula, 2ul, memory_order_relaxed) == 0x100000001ul && ulbuf[0] == 0x100000001ul);
  KK_THREADGROUP double dbuf[1];
  dbuf[0] = 0.25;
  atomic<double>* da = reinterpret_cast<atomic<double>*>(dbuf);
  CHECK(atomic_fetch_add_explicit(da, 0.5, memory_order_relaxed) == 0.25 && dbuf[0] == 0.75);
  CHECK(atomic_fetch_max_explicit(da, 0.5, memory_order_relaxed) == 0.75 && dbuf[0] == 0.75);

  // 16- and 8-bit atomics: each element changes, its neighbours do not.
  KK_THREADGROUP half2 hbuf2[2];  // half2: 4-byte aligned
  half* hbuf = reinterpret_cast<half*>(hbuf2);
  hbuf2[0] = half2(1.0f, 2.0f);
  hbuf2[1] = half2(3.0f, 4.0f);
  atomic<half>* ha = reinterpret_cast<atomic<half>*>(hbuf);
  CHECK(atomic_fetch_add_explicit(&ha[1], half(0.5f), memory_order_relaxed) == 2.0f);
  CHECK(atomic_fetch_add_explicit(&ha[2], 1, memory_order_relaxed) == 3.0f);
  CHECK(atomic_fetch_sub_explicit(&ha[0], half(0.25f), memory_order_relaxed) == 1.0f);
  CHECK(hbuf[0] == 0.75f && hbuf[1] == 2.5f && hbuf[2] == 4.0f && hbuf[3] == 4.0f);
  CHECK(atomic_fetch_max_explicit(&ha[3], half(9), memory_order_relaxed) == 4 && atomic_fetch_min_explicit(&ha[3], half(-1), memory_order_relaxed) == 9);
  CHECK(hbuf[3] == -1 && hbuf[2] == 4 && atomic_load_explicit(&ha[3], memory_order_relaxed) == -1);
  atomic_store_explicit(&ha[2], half(6), memory_order_relaxed);
  CHECK(atomic_exchange_explicit(&ha[2], half(7), memory_order_relaxed) == 6 && hbuf[2] == 7 && hbuf[1] == 2.5f);
  half hexp = half(1);
  CHECK(!atomic_compare_exchange_weak_explicit(&ha[2], &hexp, half(8), memory_order_relaxed, memory_order_relaxed) && hexp == 7);
  CHECK(atomic_compare_exchange_weak_explicit(&ha[2], &hexp, half(8), memory_order_relaxed, memory_order_relaxed) && hbuf[2] == 8);
  KK_THREADGROUP bfloat2 bbuf2[1];
  bfloat* bbuf = reinterpret_cast<bfloat*>(bbuf2);
  bbuf2[0] = bfloat2(1.0f, 2.0f);
  atomic<bfloat>* ba = reinterpret_cast<atomic<bfloat>*>(bbuf);
  CHECK(atomic_fetch_add_explicit(&ba[1], bfloat(1.0f), memory_order_relaxed) == 2 && bbuf[1] == 3 && bbuf[0] == 1);
  KK_THREADGROUP short2 sbuf2[1];
  short* sbuf = reinterpret_cast<short*>(sbuf2);
  sbuf2[0] = short2(10, -10);
  atomic<short>* sa = reinterpret_cast<atomic<short>*>(sbuf);
  CHECK(atomic_fetch_add_explicit(&sa[1], short(-5), memory_order_relaxed) == -10 && sbuf[1] == -15 && sbuf[0] == 10);
  CHECK(atomic_fetch_min_explicit(&sa[0], short(-20), memory_order_relaxed) == 10 && sbuf[0] == -20 && sbuf[1] == -15);
  KK_THREADGROUP uchar4 cbuf4[1];
  uchar* cbuf = reinterpret_cast<uchar*>(cbuf4);
  cbuf4[0] = uchar4(1, 2, 3, 4);
  atomic<uchar>* ca = reinterpret_cast<atomic<uchar>*>(cbuf);
  CHECK(atomic_fetch_or_explicit(&ca[3], uchar(0x80), memory_order_relaxed) == 4 && cbuf[3] == 0x84 && cbuf[2] == 3);
  KK_THREADGROUP bool4 flags4[1];
  bool* flags = reinterpret_cast<bool*>(flags4);
  flags4[0] = bool4(false);
  atomic_bool* fl = reinterpret_cast<atomic_bool*>(flags);
  CHECK(!atomic_exchange_explicit(&fl[2], true, memory_order_relaxed) && flags[2] && !flags[1] && !flags[3]);
  bool bexp = false;
  CHECK(!atomic_compare_exchange_weak_explicit(&fl[2], &bexp, false, memory_order_relaxed, memory_order_relaxed) && bexp);
}

KK_TEST_FN void test_threadgroup(kk_test_result& r) {
  // `threadgroup` declarations, as the front end rewrites them.
  KK_THREADGROUP float buf[16];
  KK_THREADGROUP half hbuf[8];
  KK_THREADGROUP float4 vbuf[2];
  KK_THREADGROUP atomic<int> count;
  KK_THREADGROUP atomic_uint hist[4];
  buf[3] = 1.5f;
  hbuf[1] = 2;
  vbuf[1] = float4(1, 2, 3, 4);
  atomic_store_explicit(&count, 0, memory_order_relaxed);
  atomic_store_explicit(&hist[2], 0u, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  atomic_fetch_add_explicit(&count, 2, memory_order_relaxed);
  atomic_fetch_add_explicit(&hist[2], 1u, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
  simdgroup_barrier(mem_flags::mem_none);
  threadgroup_barrier(mem_flags::mem_texture);
  CHECK(buf[3] == 1.5f && hbuf[1] == 2 && vbuf[1].w == 4 && atomic_load_explicit(&count, memory_order_relaxed) == 2);
  CHECK(atomic_load_explicit(&hist[2], memory_order_relaxed) == 1u);
}

KK_TEST_FN void test_one_lane_simd(kk_test_result& r) {
  // One active lane: reductions see only it, scans start from the identity,
  // shuffles return its own value.
  const float x = 2.5f;
  CHECK(simd_sum(x) == x && simd_product(x) == x && simd_min(x) == x && simd_max(x) == x);
  CHECK(simd_and(6u) == 6u && simd_or(6u) == 6u && simd_xor(6u) == 6u);
  CHECK(simd_prefix_inclusive_sum(x) == x && simd_prefix_exclusive_sum(x) == 0.0f);
  CHECK(simd_prefix_inclusive_product(3) == 3 && simd_prefix_exclusive_product(3) == 1);
  CHECK(simd_shuffle(x, 5) == x && simd_shuffle_up(x, 1) == x && simd_shuffle_down(x, 1) == x);
  CHECK(simd_shuffle_xor(x, 1) == x && simd_shuffle_rotate_up(x, 3) == x && simd_shuffle_rotate_down(x, 3) == x);
  CHECK(simd_broadcast(x, 0) == x && simd_broadcast_first(x) == x);
  CHECK(simd_shuffle_and_fill_up(x, 1.0f, 0) == x && simd_shuffle_and_fill_down(x, 1.0f, 0) == x);
  CHECK(simd_is_first() && simd_all(true) && !simd_all(false) && simd_any(true) && !simd_any(false));
  simd_vote vote = simd_ballot(true);
  CHECK(static_cast<uint64_t>(vote) == 1u && static_cast<uint>(simd_ballot(false)) == 0u);
  CHECK(vote.all() && vote.any() && !simd_ballot(false).any());
  CHECK(static_cast<uint64_t>(simd_active_threads_mask()) == 1u);
  CHECK(quad_sum(x) == x && quad_prefix_exclusive_sum(x) == 0 && quad_shuffle(x, 2) == x && quad_broadcast(x, 1) == x);
  CHECK(quad_shuffle_up(x, 1) == x && quad_shuffle_down(x, 1) == x && quad_shuffle_xor(x, 3) == x);
  CHECK(quad_shuffle_rotate_up(x, 1) == x && quad_shuffle_rotate_down(x, 1) == x && quad_broadcast_first(x) == x);
  CHECK(quad_is_first() && quad_all(true) && quad_any(true) && static_cast<uint>(quad_ballot(true)) == 1u);
  CHECK(quad_max(-1) == -1 && quad_prefix_inclusive_product(2.0f) == 2.0f);
  // Every scalar type and vectors.
  CHECK(simd_sum(half(1.5f)) == 1.5f && simd_max(bfloat(2.0f)) == 2 && simd_sum(3.0) == 3.0);
  CHECK(simd_shuffle(long(-5), 3) == -5 && simd_shuffle_down(ulong(7), 1) == 7ul && simd_broadcast(true, 0));
  CHECK(all(simd_sum(float4(1, 2, 3, 4)) == float4(1, 2, 3, 4)) && all(simd_shuffle(half3(1), 0) == half3(1)));
  CHECK(all(simd_min(int2(-1, 1)) == int2(-1, 1)) && all(simd_prefix_exclusive_sum(uint2(5)) == uint2(0)));
}

KK_TEST_FN void test_utils(kk_test_result& r) {
  // MLX's helpers: a (2, 3, 4) array seen through strides (12, 4, 1) and a
  // transposed view (1, 2, 6).
  const int shape[3] = {2, 3, 4};
  const int64_t strides[3] = {12, 4, 1}, tstrides[3] = {1, 2, 6};
  uint elem = 17;  // (1, 1, 1)
  CHECK(elem_to_loc(elem, shape, strides, 3) == 17u);
  CHECK(elem_to_loc(elem, shape, tstrides, 3) == 1u + 2u + 6u);
  CHECK(elem_to_loc(int64_t(23), shape, tstrides, 3) == 1 + 4 + 18);
  CHECK(elem_to_loc<int>(uint3(3, 2, 1), shape, tstrides, 3) == 3 * 6 + 2 * 2 + 1 * 1);
  CHECK(elem_to_loc_1<uint>(5u, tstrides[2]) == 30u && elem_to_loc_2(uint2(1, 2), strides + 1) == 9);
  CHECK(elem_to_loc_3(uint3(1, 2, 1), strides) == 1 + 8 + 12);
  const int64_t bstrides[3] = {0, 1, 3};
  vec<int64_t, 2> l2 = elem_to_loc_2_nd(uint3(3, 2, 1), shape, strides, bstrides, 3);
  CHECK(l2.x == 3 + 8 + 12 && l2.y == 9 + 2);
  vec<int64_t, 3> l3 = elem_to_loc_3_nd(uint3(3, 2, 1), shape, strides, bstrides, tstrides, 3);
  CHECK(l3.x == 23 && l3.y == 11 && l3.z == 18 + 4 + 1);
  int C = 40, threads_per_simdgroup = 32;
  CHECK(ceildiv(C, threads_per_simdgroup) * threads_per_simdgroup == 64 && ceildiv(64u, 32) == 2u);
  CHECK(ceildiv(size_t(1), 256) == 1 && ceildiv(0, 4) == 0);
}

KK_FN void test_sync(kk_test_result& r, uint) {
  test_atomics(r);
  test_threadgroup(r);
  test_one_lane_simd(r);
  test_utils(r);
}

}  // namespace metal

KK_TEST_MAIN(test_sync, 1)
