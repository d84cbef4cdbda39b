// kernelkit/tensor_ops/mma_sync.h: matmul2d::run on one warp's tensor cores (PTX mma.sync, sm_80+),
// for tensor operands (device or threadgroup memory) into any destination of a SIMD-group scope.
//
// The accumulators are the destination's registers as they are (layout.h is the m16n8 accumulator
// fragment). Per k step each warp reads its A fragments (its 16-row blocks) and B fragments (every
// 8-column block) from memory, element by element with bounds (zero outside), and issues:
//   half x half, bfloat x bfloat        m16n8k16 (f16 / bf16 in, f32 accumulate)
//   int8 x int8 into integers           m16n8k32 (s8 / u8 in, s32 accumulate)
//   fp8 x fp8 (e4m3 / e5m2, unscaled)   m16n8k32 (sm_89+ fp8 in, f32 accumulate)
//   other mixes of these, scaled (MXFP8) operands, int8 into float:
//                                       m16n8k8 tf32, exact for every type but float; a float
//                                       operand is split into two tf32 (3xTF32: fp32 accuracy)
//                                       unless relaxed_precision
#pragma once

#define KK_TOPS_MMA_SYNC 1

namespace kk {
namespace tops {

enum class mma_shape { none, f16, bf16, s8, fp8, tf32 };

constexpr KK_FN bool is_fp8(kind k) { return k == kind::e4m3 || k == kind::e5m2; }
// Exactly a tf32 once read (times a power of two for a scaled operand), float aside.
constexpr KK_FN bool tf32_input(kind k) {
  return k == kind::f32 || k == kind::f16 || k == kind::bf16 || k == kind::s8 || k == kind::u8 || is_fp8(k);
}

template <class LV, class RV, class DV, bool Scaled>
constexpr KK_FN mma_shape mma_shape_of() {
  constexpr kind l = kind_of<LV>, r = kind_of<RV>;
  if constexpr (l == kind::f16 && r == kind::f16) return mma_shape::f16;
  else if constexpr (l == kind::bf16 && r == kind::bf16) return mma_shape::bf16;
  else if constexpr (is_int8_v<LV> && is_int8_v<RV> && is_integer_v<DV>) return mma_shape::s8;
  else if constexpr (is_fp8(l) && is_fp8(r) && !Scaled) return mma_shape::fp8;
  else if constexpr (tf32_input(l) && tf32_input(r) && !is_integer_v<DV>) return mma_shape::tf32;
  else return mma_shape::none;
}
template <class LV, class RV, class DV, bool Scaled>
constexpr KK_FN bool mma_sync_supported() { return mma_shape_of<LV, RV, DV, Scaled>() != mma_shape::none; }

KK_FN unsigned pack16(unsigned short lo, unsigned short hi) { return unsigned(lo) | (unsigned(hi) << 16); }
KK_FN unsigned pack8(int a, int b, int c, int d) {
  return (unsigned(a) & 0xffu) | (unsigned(b) & 0xffu) << 8 | (unsigned(c) & 0xffu) << 16 | (unsigned(d) & 0xffu) << 24;
}
KK_FN float to_tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
}

template <mma_shape S>
KK_FN void mma(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  if constexpr (S == mma_shape::f16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else if constexpr (S == mma_shape::bf16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <kind A, kind B>
KK_FN void mma_fp8(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#define KK_TOPS_MMA_FP8(TA, TB)                                                                                 \
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." TA "." TB ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};" \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
  if constexpr (A == kind::e4m3 && B == kind::e4m3) KK_TOPS_MMA_FP8("e4m3", "e4m3");
  else if constexpr (A == kind::e4m3) KK_TOPS_MMA_FP8("e4m3", "e5m2");
  else if constexpr (B == kind::e4m3) KK_TOPS_MMA_FP8("e5m2", "e4m3");
  else KK_TOPS_MMA_FP8("e5m2", "e5m2");
#undef KK_TOPS_MMA_FP8
}

template <bool LeftUnsigned, bool RightUnsigned>
KK_FN void mma_s8(int (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#define KK_TOPS_MMA_S8(TA, TB)                                                                                  \
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32." TA "." TB ".s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};" \
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
  if constexpr (!LeftUnsigned && !RightUnsigned) KK_TOPS_MMA_S8("s8", "s8");
  else if constexpr (!LeftUnsigned) KK_TOPS_MMA_S8("s8", "u8");
  else if constexpr (!RightUnsigned) KK_TOPS_MMA_S8("u8", "s8");
  else KK_TOPS_MMA_S8("u8", "u8");
#undef KK_TOPS_MMA_S8
}

// A left-input cooperative tensor of one SIMD-group whose elements are half (bfloat) and whose
// right operand is too: its registers are the m16n8k16 A fragments as they stand (layout.h), so
// run reads them without a lane exchange.
template <class Left, class RV> inline constexpr bool mma_sync_left_input_v = false;
template <class E, class X, class L, class RV>
inline constexpr bool mma_sync_left_input_v<metal::cooperative_tensor<E, X, L>, RV> =
    L::which == role::left && L::simdgroups == 1 && (kind_of<E> == kind::f16 || kind_of<E> == kind::bf16) &&
    kind_of<E> == kind_of<RV>;

template <class Acc, mpp::tensor_ops::matmul2d_descriptor D, class Layout, class Left, class Right>
struct mma_sync_matmul {
  static constexpr KK_FN const char* name() {
    return S == mma_shape::f16 ? "mma.sync m16n8k16 f16" : S == mma_shape::bf16 ? "mma.sync m16n8k16 bf16"
         : S == mma_shape::s8 ? "mma.sync m16n8k32 s8" : S == mma_shape::fp8 ? "mma.sync m16n8k32 fp8" : split_left || split_right ? "mma.sync m16n8k8 3xTF32"
         : "mma.sync m16n8k8 tf32";
  }
  using LV = typename operand_traits<Left>::value_type;
  using RV = typename operand_traits<Right>::value_type;
  static constexpr mma_shape S = mma_shape_of<LV, RV, conditional_t<is_integer_v<Acc>, int, float>,
                                               operand_traits<Left>::scaled || operand_traits<Right>::scaled>();
  static constexpr bool bytes = S == mma_shape::s8 || S == mma_shape::fp8;  // 8-bit operands: 4 per register
  static constexpr int KSTEP = bytes ? 32 : S == mma_shape::tf32 ? 8 : 16;
  static constexpr bool tl = D.transpose_left, tr = D.transpose_right;
  // 3xTF32 for an exact float operand: the big part and the rest.
  static constexpr bool split_left = S == mma_shape::tf32 && kind_of<LV> == kind::f32 && !D.relaxed_precision;
  static constexpr bool split_right = S == mma_shape::tf32 && kind_of<RV> == kind::f32 && !D.relaxed_precision;

  static KK_FN void run(Acc (&acc)[Layout::capacity], const Left& left, const Right& right, int K) {
    const int g = int(lane_id() >> 2), t = int(lane_id() & 3);
    for (int k0 = 0; k0 < K; k0 += KSTEP) {
      for (int obl = 0; obl < Layout::OBW; ++obl) {
        const int m = Layout::row_of_slot(obl * 2);  // rows m and m + 8 (m = 16 * block + g)
        unsigned a[4], a_lo[4];
        fragment_a(left, m, k0, t, a, a_lo);
        for (int ib = 0; ib < Layout::IB; ++ib) {
          const int n = ib * 8 + g;
          unsigned b[2], b_lo[2];
          fragment_b(right, n, k0, t, b, b_lo);
          Acc(&c)[4] = *reinterpret_cast<Acc(*)[4]>(&acc[(obl * Layout::IB + ib) * 4]);
          if constexpr (S == mma_shape::s8) {
            mma_s8<kind_of<LV> == kind::u8, kind_of<RV> == kind::u8>(c, a, b);
          } else if constexpr (S == mma_shape::fp8) {
            mma_fp8<kind_of<LV>, kind_of<RV>>(c, a, b);
          } else {
            mma<S>(c, a, b);
            if constexpr (split_left) mma<S>(c, a_lo, b);
            if constexpr (split_right) mma<S>(c, a, b_lo);
          }
        }
      }
    }
  }

  // A (m x k) fragment of rows m, m + 8 and columns k0.. (see the PTX ISA's fragment layouts).
  static KK_FN void fragment_a(const Left& l, int m, int k0, int t, unsigned (&a)[4], unsigned (&lo)[4]) {
    if constexpr (is_cooperative_v<Left>) {  // mma_sync_left_input_v: elements (g, 2t), (g, 2t + 1) of each block
      using L = typename Left::layout;
      for (int r = 0; r < 4; ++r) {
        const int ib = k0 / 8 + (r >> 1), i = ((m / 16) * L::IB + ib) * 4 + (r & 1) * 2;
        a[r] = ib < L::IB ? pack16(raw16(l.v[i]), raw16(l.v[i + 1])) : 0u;
      }
    } else if constexpr (bytes) {
      for (int r = 0; r < 4; ++r) {
        const int row = m + 8 * (r & 1), k = k0 + 16 * (r >> 1) + 4 * t;
        a[r] = pack8(byte(l, tl ? row : k, tl ? k : row), byte(l, tl ? row : k + 1, tl ? k + 1 : row),
                     byte(l, tl ? row : k + 2, tl ? k + 2 : row), byte(l, tl ? row : k + 3, tl ? k + 3 : row));
      }
    } else if constexpr (S == mma_shape::tf32) {
      for (int r = 0; r < 4; ++r) {
        const float x = left_value<float, tl>(l, m + 8 * (r & 1), k0 + t + 4 * (r >> 1));
        const float big = to_tf32(x);
        a[r] = __float_as_uint(big);
        lo[r] = __float_as_uint(to_tf32(x - big));
      }
    } else {
      for (int r = 0; r < 4; ++r) {
        const int row = m + 8 * (r & 1), k = k0 + 8 * (r >> 1) + 2 * t;
        a[r] = pack16(bits(left_value<float, tl>(l, row, k)), bits(left_value<float, tl>(l, row, k + 1)));
      }
    }
  }
  // B (k x n) fragment of column n and rows k0..
  static KK_FN void fragment_b(const Right& rt, int n, int k0, int t, unsigned (&b)[2], unsigned (&lo)[2]) {
    if constexpr (bytes) {
      for (int r = 0; r < 2; ++r) {
        const int k = k0 + 16 * r + 4 * t;
        b[r] = pack8(byte(rt, tr ? k : n, tr ? n : k), byte(rt, tr ? k + 1 : n, tr ? n : k + 1),
                     byte(rt, tr ? k + 2 : n, tr ? n : k + 2), byte(rt, tr ? k + 3 : n, tr ? n : k + 3));
      }
    } else if constexpr (S == mma_shape::tf32) {
      for (int r = 0; r < 2; ++r) {
        const float x = right_value<float, tr>(rt, k0 + t + 4 * r, n);
        const float big = to_tf32(x);
        b[r] = __float_as_uint(big);
        lo[r] = __float_as_uint(to_tf32(x - big));
      }
    } else {
      for (int r = 0; r < 2; ++r) {
        const int k = k0 + 8 * r + 2 * t;
        b[r] = pack16(bits(right_value<float, tr>(rt, k, n)), bits(right_value<float, tr>(rt, k + 1, n)));
      }
    }
  }
  // The 8-bit pattern of tensor element (x, y), 0 outside (zero in every 8-bit format).
  template <class Tn> static KK_FN int byte(const Tn& t, int x, int y) {
    if (x < 0 || y < 0 || x >= int(t.get_extent(0)) || y >= int(t.get_extent(1))) return 0;
    return *reinterpret_cast<const unsigned char*>(&t(x, y));
  }
  template <class E> static KK_FN unsigned short raw16(const E& x) { return __builtin_bit_cast(unsigned short, x); }
  static KK_FN unsigned short bits(float x) {
    return S == mma_shape::bf16 ? kk::float_to_bfloat(x) : kk::float_to_half(x);
  }
};

}  // namespace tops
}  // namespace kk
