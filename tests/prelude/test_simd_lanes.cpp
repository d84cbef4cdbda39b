// SIMD-group and quad-group functions across the 32 lanes of one SIMD-group,
// with Metal's active-lane rules: a full group, lanes switched off by a branch
// (GPU only), and lanes that have returned; atomics from all lanes at once.
// Needs a target with real lanes (the GPU, or the CPU's fiber runtime through
// kk_test_entry); the single-lane shim cannot run it.
#include "prelude_test.h"

namespace metal {

// Sums and prefixes over the lanes set in `mask`, computed the plain way.
KK_FN uint expected_sum(uint mask, uint lo, uint hi) {  // sum of lane ids in [lo, hi) within mask
  uint s = 0;
  for (uint l = lo; l < hi; ++l)
    if ((mask >> l) & 1u) s += l;
  return s;
}
KK_FN uint first_lane(uint mask, uint lo, uint hi) {
  for (uint l = lo; l < hi; ++l)
    if ((mask >> l) & 1u) return l;
  return hi;
}

// Every lane in `mask` runs this; lane ids are the values. Each SIMD-group
// function is called by all of them, outside any branch, before checking.
KK_TEST_FN void check_group(kk_test_result& r, uint lane, uint mask) {
  const uint q0 = lane & ~3u, first = first_lane(mask, 0, 32), last = 31 - clz(mask);
  const uint total = expected_sum(mask, 0, 32);

  const uint sum = simd_sum(lane), incl = simd_prefix_inclusive_sum(lane), excl = simd_prefix_exclusive_sum(lane);
  const uint mn = simd_min(lane);
  const int mx = simd_max(int(lane));
  const uint o = simd_or(1u << lane), a = simd_and(~(1u << lane)), x = simd_xor(1u << lane);
  const int prod = simd_product(lane == first ? 3 : 1);
  const float eprod = simd_prefix_exclusive_product(2.0f);
  const float fsum = simd_sum(float(lane));
  const half hsum = simd_sum(half(lane));
  const double dsum = simd_sum(double(lane));
  const ulong lsum = simd_sum(ulong(lane) << 33);
  const float3 vsum = simd_sum(float3(lane, 1, -1.0f * lane));
  const int2 vmax = simd_max(int2(lane, -int(lane)));
  CHECK(sum == total && incl == expected_sum(mask, 0, lane + 1) && excl == expected_sum(mask, 0, lane));
  CHECK(mn == first && mx == int(last));
  CHECK(o == mask && a == ~mask && x == mask && prod == 3);
  CHECK(eprod == float(1u << popcount(mask & ((1u << lane) - 1u))));
  CHECK(fsum == float(total) && hsum == float(total) && dsum == double(total) && lsum == ulong(total) << 33);
  CHECK(all(vsum == float3(total, popcount(mask), -1.0f * total)) && all(vmax == int2(last, -int(first))));

  const uint bfirst = simd_broadcast_first(lane);
  const bool is_first = simd_is_first();
  const uint64_t odd = static_cast<uint64_t>(simd_ballot(lane % 2 == 1));
  const uint64_t act = static_cast<uint64_t>(simd_active_threads_mask());
  const bool all_true = simd_ballot(true).all(), all_inner = simd_ballot(lane != 0 && lane != 31).all();
  const bool v1 = simd_all(true), v2 = simd_any(false), v3 = simd_any(lane == first), v4 = simd_all(lane != first);
  CHECK(bfirst == first && is_first == (lane == first) && odd == (mask & 0xaaaaaaaau) && act == mask);
  CHECK(all_true && all_inner == !((mask & 1u) || (mask >> 31)) && v1 && !v2 && v3 && !v4);

  // Shuffles: reading an active lane gives its value.
  const uint up3 = lane >= 3 ? lane - 3 : lane, down5 = lane + 5 < 32 ? lane + 5 : lane;
  const uint rot = (lane + 7) & 31u, x6 = lane ^ 6u;
  const uint got_up = simd_shuffle_up(lane, 3), got_down = simd_shuffle_down(lane, 5);
  const uint got_rd = simd_shuffle_rotate_down(lane, 7), got_ru = simd_shuffle_rotate_up(lane, 25);
  const half got_x = simd_shuffle_xor(half(lane), 6);
  const uint got_s = simd_shuffle(lane * 10, first);
  const float2 got_b = simd_broadcast(float2(lane, 1), first);
  if ((mask >> up3) & 1u) CHECK(got_up == up3);
  if ((mask >> down5) & 1u) CHECK(got_down == down5);
  if ((mask >> rot) & 1u) CHECK(got_rd == rot && got_ru == rot);
  if ((mask >> x6) & 1u) CHECK(got_x == float(x6));
  CHECK(got_s == first * 10 && got_b.x == float(first) && got_b.y == 1.0f);

  // Quads: aligned groups of 4 lanes, each over its own active lanes.
  const uint qmask = (mask >> q0) & 0xfu, qf = first_lane(mask, q0, q0 + 4);
  const uint qsum = quad_sum(lane), qincl = quad_prefix_inclusive_sum(lane), qexcl = quad_prefix_exclusive_sum(lane);
  const uint qmax = quad_max(lane), qmin = quad_min(lane), qbf = quad_broadcast_first(lane);
  const bool qis_first = quad_is_first();
  const uint qeven = static_cast<uint>(quad_ballot(lane % 2 == 0)), qact = static_cast<uint>(quad_active_threads_mask());
  const bool qv1 = quad_all(true), qv2 = quad_any(lane == qf), qv3 = quad_any(false);
  CHECK(qsum == expected_sum(mask, q0, q0 + 4) && qincl == expected_sum(mask, q0, lane + 1) &&
        qexcl == expected_sum(mask, q0, lane));
  CHECK(qmax == q0 + 31 - clz(qmask) && qmin == qf && qbf == qf && qis_first == (lane == qf));
  CHECK(qeven == (qmask & 0x5u) && qact == qmask && qv1 && qv2 && !qv3);
  const uint qx = lane ^ 1u, qup = (lane & 3u) >= 1 ? lane - 1 : lane, qrot = q0 | ((lane + 1) & 3u);
  const uint got_qx = quad_shuffle_xor(lane, 1), got_qup = quad_shuffle_up(lane, 1);
  const uint got_qrot = quad_shuffle_rotate_down(lane, 1), got_qb = quad_broadcast(lane, qf - q0);
  if ((mask >> qx) & 1u) CHECK(got_qx == qx);
  if ((mask >> qup) & 1u) CHECK(got_qup == qup);
  if ((mask >> qrot) & 1u) CHECK(got_qrot == qrot);
  CHECK(got_qb == qf);
}

// Atomics from 32 lanes at once on neighbouring 8-, 16- and 32-bit values
// of one word (the compare-and-swap loops must not lose updates).
KK_TEST_FN void check_atomics(kk_test_result& r, uint lane) {
  KK_THREADGROUP uchar4 bytes[1];
  KK_THREADGROUP half2 halves[1];
  KK_THREADGROUP bfloat2 bhalves[1];
  KK_THREADGROUP short2 shorts[1];
  KK_THREADGROUP bool4 flags[1];
  KK_THREADGROUP float fsum[1];
  KK_THREADGROUP int isum[1];
  if (lane == 0) {
    bytes[0] = uchar4(0);
    halves[0] = half2(0);
    bhalves[0] = bfloat2(0);
    shorts[0] = short2(-1);
    flags[0] = bool4(false);
    fsum[0] = 0;
    isum[0] = 0;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  atomic_fetch_add_explicit(reinterpret_cast<atomic<uchar>*>(bytes) + lane % 4, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(reinterpret_cast<atomic<half>*>(halves) + lane % 2, half(1), memory_order_relaxed);
  atomic_fetch_sub_explicit(reinterpret_cast<atomic<bfloat>*>(bhalves) + lane % 2, bfloat(1), memory_order_relaxed);
  atomic_fetch_max_explicit(reinterpret_cast<atomic<short>*>(shorts) + lane % 2, short(lane), memory_order_relaxed);
  atomic_store_explicit(reinterpret_cast<atomic_bool*>(flags) + lane % 3, true, memory_order_relaxed);
  atomic_fetch_add_explicit(reinterpret_cast<atomic_float*>(fsum), 0.5f, memory_order_relaxed);
  atomic_fetch_add_explicit(reinterpret_cast<atomic_int*>(isum), int(lane), memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  CHECK(all(bytes[0] == uchar4(8)) && all(halves[0] == half2(16)) && all(bhalves[0] == bfloat2(-16)));
  CHECK(shorts[0].x == 30 && shorts[0].y == 31 && flags[0].x && flags[0].y && flags[0].z && !flags[0].w);
  CHECK(fsum[0] == 16.0f && isum[0] == 496);
  threadgroup_barrier(mem_flags::mem_threadgroup);
}

KK_FN void test_simd_lanes(kk_test_result& r, uint lane) {
  check_atomics(r, lane);

  // 1. The whole SIMD-group.
  check_group(r, lane, 0xffffffffu);
  // Values every lane sees in a full group.
  const uint up1 = simd_shuffle_up(lane, 1), down1 = simd_shuffle_down(lane, 1);
  const uint fill_up = simd_shuffle_and_fill_up(lane, lane + 100, 2);
  const uint fill_down = simd_shuffle_and_fill_down(lane, lane + 100, 2);
  const uint qfill_up = quad_shuffle_and_fill_up(lane, lane + 100, 1);
  const int iprod = simd_prefix_inclusive_product(lane < 4 ? 2 : 1);
  CHECK(up1 == (lane == 0 ? 0 : lane - 1) && down1 == (lane == 31 ? 31 : lane + 1));
  CHECK(fill_up == (lane >= 2 ? lane - 2 : lane + 130) && fill_down == (lane < 30 ? lane + 2 : lane + 70));
  CHECK(qfill_up == ((lane & 3u) >= 1 ? lane - 1 : lane + 103) && iprod == (1 << min(lane + 1, 4u)));
  threadgroup_barrier(mem_flags::mem_threadgroup);
  simdgroup_barrier(mem_flags::mem_none);

#if !defined(KK_TARGET_CPU)
  // Divergent SIMD-group functions: the CPU runtime requires every live lane of
  // a SIMD-group at each SIMD-group function (and reports it otherwise).
  // 2. A branch: lanes not divisible by 3.
  if (lane % 3 != 0) {
    uint m = 0;
    for (uint l = 0; l < 32; ++l)
      if (l % 3 != 0) m |= 1u << l;
    check_group(r, lane, m);
  }
  // 3. Lanes 8..19.
  if (lane >= 8 && lane < 20) check_group(r, lane, 0x000fff00u);
#endif

  // 4. The lanes that are left after the others returned.
  simdgroup_barrier(mem_flags::mem_none);
  if (lane >= 21 || lane == 4) return;
  check_group(r, lane, 0x001fffffu & ~(1u << 4));
}

}  // namespace metal

KK_TEST_MAIN(test_simd_lanes, 32)
