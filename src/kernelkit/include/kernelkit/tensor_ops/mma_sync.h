// kernelkit/tensor_ops/mma_sync.h: matmul2d::run on one warp's tensor cores (PTX mma.sync, sm_80+),
// for tensor operands (device or threadgroup memory) into any destination of a SIMD-group scope.
//
// The accumulators are the destination's registers as they are (layout.h is the m16n8 accumulator
// fragment). Per k step each warp reads its A fragments (its 16-row blocks) and B fragments (every
// 8-column block) and issues:
//   half x half, bfloat x bfloat        m16n8k16 (f16 / bf16 in, f32 accumulate)
//   int8 x int8 into integers           m16n8k32 (s8 / u8 in, s32 accumulate)
//   fp8 x fp8 (e4m3 / e5m2, unscaled)   m16n8k32 (sm_89+ fp8 in, f32 accumulate)
//   other mixes of these, scaled (MXFP8) operands, int8 into float:
//                                       m16n8k8 tf32, exact for every type but float; a float
//                                       operand is split into two tf32 (3xTF32: fp32 accuracy)
//                                       unless relaxed_precision
// How a fragment is read. The 16- and 8-bit shapes read a tensor whose contiguous side (extent 0)
// has stride 1 as rows of memory, a fragment at a time where the whole fragment lies inside the
// extents (and inside K): from threadgroup memory with ldmatrix (.trans where the rows run along
// the fragment's outer side; 16-byte aligned rows), from device memory with 32-bit loads (an 8 x 8
// block read across its rows is transposed in registers by movmatrix; 8-bit ones are read a byte at
// a time, unchecked). Everything else (the edges, other strides, tf32) reads element by element
// with bounds: zero past a tensor's extents and past K.
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
template <class E> KK_FN unsigned short raw16(const E& x) { return __builtin_bit_cast(unsigned short, x); }

// Register r of the m16n8k16 A fragment (r & 1: rows g + 8; r >> 1: columns 8 further) that a
// left-input cooperative tensor of 16-bit elements holds for its obl-th 16-row block and the
// 8-column blocks from ib0 (layout.h: elements (g, 2t), (g, 2t + 1) of each block, as they
// stand); zero past its columns. Both mma.sync (here) and wgmma (warpgroup.h) read it so.
template <class CT>
KK_FN unsigned left_fragment_register(const CT& l, int obl, int ib0, int r) {
  using L = typename CT::layout;
  const int ib = ib0 + (r >> 1), i = (obl * L::IB + ib) * 4 + (r & 1) * 2;
  return ib < L::IB ? pack16(raw16(l.v[i]), raw16(l.v[i + 1])) : 0u;
}
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


// 32 bits at a generic address (4-byte aligned).
KK_FN unsigned load32(const void* p) { return *reinterpret_cast<const unsigned*>(p); }
// The warp's 8 x 8 16-bit matrix in the fragment layout (lane 4g + t: row g, columns 2t, 2t + 1),
// transposed.
KK_FN unsigned movmatrix_trans(unsigned x) {
  unsigned r;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
  return r;
}
// Lane i gives the shared address of row i % 8 of matrix i / 8 (16 bytes); register j receives
// matrix j in the fragment layout (.trans: transposed). volatile: the threadgroup memory it reads
// changes between barriers that the compiler does not see as writes to it.
template <bool Trans> KK_FN void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
template <bool Trans> KK_FN void ldmatrix_x2(unsigned (&r)[2], unsigned addr) {
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// How a tensor operand's interior fragments are read (the same on every lane: one tensor a warp).
enum class fetch { elements, generic, shared };

// A tensor operand as rows of memory: element (o, k) of the logical matrix (o: m for the left,
// n for the right) at p + o * ld + k when KC (k runs along memory rows), else at p + k * ld + o.
template <class E, bool KC>
struct rows_view {
  const E* p;
  long ld;
  unsigned sp;       // p in the shared window (fetch::shared)
  int outer, inner;  // the extents along o and k (k clipped to K)
  fetch how;
  KK_FN long offset(int o, int k) const { return KC ? long(o) * ld + k : long(k) * ld + o; }
  KK_FN const E* at(int o, int k) const { return p + offset(o, k); }
  KK_FN unsigned saddr(int o, int k) const { return sp + unsigned(offset(o, k)) * unsigned(sizeof(E)); }
  KK_FN bool inside(int o0, int rows, int k0, int cols) const {
    return how != fetch::elements && o0 + rows <= outer && k0 + cols <= inner;
  }
  // The four bytes (o, k..k + 3), unchecked.
  KK_FN unsigned bytes4(int o, int k) const {
    const auto b = [&](int j) { return int(*reinterpret_cast<const unsigned char*>(at(o, k + j))); };
    return pack8(b(0), b(1), b(2), b(3));
  }
};
struct no_rows {};

// t (a tensor of 16- or 8-bit elements) seen as rows; extent 0 is its contiguous side.
template <bool KC, class Tn>
KK_FN rows_view<typename operand_traits<Tn>::value_type, KC> rows_of(const Tn& t, int K) {
  using E = typename operand_traits<Tn>::value_type;
  rows_view<E, KC> v;
  v.p = t.data();
  v.ld = long(t.get_stride(1));
  v.outer = int(t.get_extent(KC ? 1 : 0));
  v.inner = min_int(K, int(t.get_extent(KC ? 0 : 1)));
  const bool shared = __isShared(v.p);
  v.sp = shared ? unsigned(__cvta_generic_to_shared(v.p)) : 0u;
  const unsigned long align = reinterpret_cast<unsigned long>(v.p) | static_cast<unsigned long>(v.ld * long(sizeof(E)));
  // 8-bit rows along o have no ldmatrix (b16 only) nor movmatrix: read a byte at a time, any alignment.
  constexpr bool byte_columns = sizeof(E) == 1 && !KC;
  v.how = t.get_stride(0) != 1                               ? fetch::elements
          : shared && !byte_columns && align % 16 == 0      ? fetch::shared
          : byte_columns || align % 4 == 0                  ? fetch::generic
                                                            : fetch::elements;
  return v;
}

// A left-input cooperative tensor whose elements are half (bfloat) and whose
// right operand is too: its registers are the m16n8k16 A fragments as they stand (layout.h), so
// run reads them without a lane exchange.
template <class Left, class RV> inline constexpr bool mma_sync_left_input_v = false;
template <class E, class X, class L, class RV>
inline constexpr bool mma_sync_left_input_v<metal::cooperative_tensor<E, X, L>, RV> =
    L::which == role::left && (kind_of<E> == kind::f16 || kind_of<E> == kind::bf16) &&
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
  // The 16- and 8-bit shapes take the operands' bits as they are: a register is 32 bits of memory.
  static constexpr bool vec = S == mma_shape::f16 || S == mma_shape::bf16 || bytes;
  static constexpr int EPR = bytes ? 4 : 2;  // elements a register
  static constexpr int CW = 4 * EPR;         // elements in 16 bytes: a row of an ldmatrix block (KSTEP / 2)
  static constexpr bool tl = D.transpose_left, tr = D.transpose_right;
  // 3xTF32 for an exact float operand: the big part and the rest.
  static constexpr bool split_left = S == mma_shape::tf32 && kind_of<LV> == kind::f32 && !D.relaxed_precision;
  static constexpr bool split_right = S == mma_shape::tf32 && kind_of<RV> == kind::f32 && !D.relaxed_precision;
  static constexpr int OBW = Layout::OBW, IB = Layout::IB, IBP = (IB + 1) / 2;  // IBP: pairs of column blocks

  // One k step's fragments: the A fragment of each of the SIMD-group's 16-row blocks, the B
  // fragments of every 8-column block (in pairs: one ldmatrix.x4 reads two).
  struct fragments {
    unsigned a[OBW][4], a_lo[OBW][4], b[IBP][2][2], b_lo[IBP][2][2];
  };
  // A cooperative left input's k loop (its static extent) is unrolled: its registers are then
  // indexed by constants (a run-time index puts the whole input in local memory).
  static constexpr int static_steps = is_cooperative_v<Left> ? ceil_div(D.k, KSTEP) : 0;
  // Over a dynamic K (a tile matmul: the op is the kernel's work), step k + 1's fragments are read
  // before step k's products, hiding the loads' latency behind the tensor cores, where two steps'
  // fragments fit beside the accumulators. A static K's op is mostly one among others whose
  // registers stay live (flash attention's): there the second set makes ptxas spill, and each pair
  // of B fragments is read just before its products.
  static constexpr int fragment_regs = 4 * OBW * (split_left ? 2 : 1) + 4 * IBP * (split_right ? 2 : 1);
  static constexpr bool prefetch = D.dynamic_k() && Layout::capacity + 2 * fragment_regs <= 128;

  static KK_FN void run(Acc (&acc)[Layout::capacity], const Left& left, const Right& right, int K) {
    // Memory rows: a left tensor's run along k unless transposed; a right one's only if transposed.
    const auto lv = view<!tl>(left, K);
    const auto rv = view<tr>(right, K);
    const int steps = static_steps ? static_steps : ceil_div(K, KSTEP);
    // Every fragment inside the operands, the right one's in shared memory (a staged tile, flash
    // attention's): one check here, and the loop reads each fragment with ldmatrix (or, for a left
    // operand in device memory, 32-bit loads) and no per-fragment test (those tests and their
    // branches were most of an attention tile's instructions).
    if constexpr (ldsm_right) {
      const int whole = whole_tiles(lv, rv, steps);
      if (whole == 1) return steps_of<1>(acc, left, right, lv, rv, steps, K);
      if constexpr (!is_cooperative_v<Left>) {
        if (whole == 2) return steps_of<2>(acc, left, right, lv, rv, steps, K);
      }
    }
    steps_of<0>(acc, left, right, lv, rv, steps, K);
  }

 private:
  static constexpr bool ldsm_left = vec && !is_cooperative_v<Left> && !(bytes && tl);
  static constexpr bool ldsm_right = vec && !is_cooperative_v<Right> && !(bytes && !tr);
  // 1: every fragment inside, the left operand cooperative or in shared memory (ldmatrix); 2: the
  // left one in device memory (32-bit loads); 0: otherwise.
  template <class LR, class RR>
  static KK_FN int whole_tiles(const LR& lv, const RR& rv, int steps) {
    if (rv.how != fetch::shared || !rv.inside(0, 8 * IB, 0, steps * KSTEP)) return 0;
    if constexpr (is_cooperative_v<Left>) {
      return 1;
    } else {
      bool in = true;
      KK_TOPS_UNROLL
      for (int obl = 0; obl < OBW; ++obl)
        in = in && lv.inside(Layout::row_of_slot(obl * 2) - int(lane_id() >> 2), 16, 0, steps * KSTEP);
      return !in ? 0 : lv.how == fetch::shared && ldsm_left ? 1 : 2;
    }
  }

  template <int Whole, class LR, class RR>
  static KK_FN void steps_of(Acc (&acc)[Layout::capacity], const Left& left, const Right& right, const LR& lv,
                             const RR& rv, int steps, int K) {
    fragments cur;
    if constexpr (prefetch) {
      if (steps > 0) {
        load_a<Whole>(cur, left, lv, 0, K);
        KK_TOPS_UNROLL
        for (int p = 0; p < IBP; ++p) load_b<Whole>(cur, right, rv, p, 0, K);
      }
    }
    if constexpr (static_steps > 0) {
      KK_TOPS_UNROLL
      for (int s = 0; s < static_steps; ++s) step<Whole>(acc, cur, left, right, lv, rv, s, steps, K);
    } else {
      for (int s = 0; s < steps; ++s) step<Whole>(acc, cur, left, right, lv, rv, s, steps, K);
    }
  }

  template <bool KC, class Op> static KK_FN auto view(const Op& op, int K) {
    if constexpr (vec && !is_cooperative_v<Op>) return rows_of<KC>(op, K);
    else return no_rows{};
  }

  // Step s's products. Prefetching, cur holds its fragments on entry and the next step's on return.
  template <int Whole, class LR, class RR>
  static KK_FN void step(Acc (&acc)[Layout::capacity], fragments& cur, const Left& left, const Right& right,
                         const LR& lv, const RR& rv, int s, int steps, int K) {
    if constexpr (prefetch) {
      fragments next;
      if (s + 1 < steps) {
        load_a<Whole>(next, left, lv, (s + 1) * KSTEP, K);
        KK_TOPS_UNROLL
        for (int p = 0; p < IBP; ++p) load_b<Whole>(next, right, rv, p, (s + 1) * KSTEP, K);
      }
      KK_TOPS_UNROLL
      for (int p = 0; p < IBP; ++p) products(acc, cur, p);
      cur = next;
    } else {
      load_a<Whole>(cur, left, lv, s * KSTEP, K);
      KK_TOPS_UNROLL
      for (int p = 0; p < IBP; ++p) {
        load_b<Whole>(cur, right, rv, p, s * KSTEP, K);
        products(acc, cur, p);
      }
    }
  }

  // Whole (whole_tiles' answer): 1 or 2, every fragment is read unchecked, the right one's with
  // ldmatrix, the left one's with ldmatrix (1) or 32-bit loads (2).
  template <int Whole, class LR>
  static KK_FN void load_a(fragments& f, const Left& left, const LR& lv, int k0, int K) {
    KK_TOPS_UNROLL
    for (int obl = 0; obl < OBW; ++obl) {
      const int m0 = Layout::row_of_slot(obl * 2) - int(lane_id() >> 2);
      if constexpr (Whole == 1 && ldsm_left) ldsm_a(lv, m0, k0, f.a[obl]);
      else if constexpr (Whole == 2) loads_a(lv, m0, k0, f.a[obl]);
      else fragment_a(left, lv, obl, m0, k0, K, f.a[obl], f.a_lo[obl]);
    }
  }
  template <int Whole, class RR>
  static KK_FN void load_b(fragments& f, const Right& right, const RR& rv, int p, int k0, int K) {
    if constexpr (Whole != 0) ldsm_b(rv, 16 * p, 2 * p + 1 < IB, k0, f.b[p]);
    else fragments_b(right, rv, 16 * p, 2 * p + 1 < IB, k0, K, f.b[p], f.b_lo[p]);
  }

  // The products of column blocks 2p and 2p + 1.
  static KK_FN void products(Acc (&acc)[Layout::capacity], const fragments& f, int p) {
    KK_TOPS_UNROLL
    for (int j = 0; j < 2; ++j) {
      const int ib = 2 * p + j;
      if (ib >= IB) break;
      KK_TOPS_UNROLL
      for (int obl = 0; obl < OBW; ++obl) {
        Acc(&c)[4] = *reinterpret_cast<Acc(*)[4]>(&acc[(obl * IB + ib) * 4]);
        if constexpr (S == mma_shape::s8) {
          mma_s8<kind_of<LV> == kind::u8, kind_of<RV> == kind::u8>(c, f.a[obl], f.b[p][j]);
        } else if constexpr (S == mma_shape::fp8) {
          mma_fp8<kind_of<LV>, kind_of<RV>>(c, f.a[obl], f.b[p][j]);
        } else {
          mma<S>(c, f.a[obl], f.b[p][j]);
          if constexpr (split_left) mma<S>(c, f.a_lo[obl], f.b[p][j]);
          if constexpr (split_right) mma<S>(c, f.a[obl], f.b_lo[p][j]);
        }
      }
    }
  }

  // The A (m x k) fragment of the 16-row block m0 (the obl-th of this SIMD-group) and columns k0..
  // (the PTX ISA's fragment layouts: a[r] holds row g + 8 (r & 1), columns from KSTEP / 2 (r >> 1)).
  template <class LR>
  static KK_FN void fragment_a(const Left& l, const LR& v, int obl, int m0, int k0, int K, unsigned (&a)[4], unsigned (&lo)[4]) {
    const int g = int(lane_id() >> 2), t = int(lane_id() & 3);
    if constexpr (is_cooperative_v<Left>) {  // mma_sync_left_input_v
      KK_TOPS_UNROLL
      for (int r = 0; r < 4; ++r) a[r] = left_fragment_register(l, obl, k0 / 8, r);
      return;
    } else {
      if constexpr (vec) {
        if (v.inside(m0, 16, k0, KSTEP)) return rows_a(v, m0, k0, a);
      }
      KK_TOPS_UNROLL
      for (int r = 0; r < 4; ++r) {
        const int row = m0 + g + 8 * (r & 1);
        if constexpr (bytes) {
          const int k = k0 + 16 * (r >> 1) + 4 * t;
          a[r] = pack8(lbyte(l, row, k, K), lbyte(l, row, k + 1, K), lbyte(l, row, k + 2, K), lbyte(l, row, k + 3, K));
        } else if constexpr (S == mma_shape::tf32) {
          const float x = lvalue(l, row, k0 + t + 4 * (r >> 1), K), big = to_tf32(x);
          a[r] = __float_as_uint(big);
          lo[r] = __float_as_uint(to_tf32(x - big));
        } else {
          const int k = k0 + 8 * (r >> 1) + 2 * t;
          a[r] = pack16(bits(lvalue(l, row, k, K)), bits(lvalue(l, row, k + 1, K)));
        }
      }
    }
  }
  // An interior A fragment from memory rows (v.how is generic or shared).
  template <class E, bool KC>
  static KK_FN void rows_a(const rows_view<E, KC>& v, int m0, int k0, unsigned (&a)[4]) {
    if constexpr (!(bytes && !KC)) {
      if (v.how == fetch::shared) return ldsm_a(v, m0, k0, a);
    }
    loads_a(v, m0, k0, a);
  }
  // An interior A fragment read with 32-bit loads (any memory).
  template <class E, bool KC>
  static KK_FN void loads_a(const rows_view<E, KC>& v, int m0, int k0, unsigned (&a)[4]) {
    const int i = int(lane_id()), g = i >> 2, t = i & 3;
    KK_TOPS_UNROLL
    for (int r = 0; r < 4; ++r) {
      const int o = m0 + 8 * (r & 1), k = k0 + CW * (r >> 1);
      if constexpr (KC) a[r] = load32(v.at(o + g, k + EPR * t));
      else if constexpr (bytes) a[r] = v.bytes4(o + g, k + 4 * t);
      else a[r] = movmatrix_trans(load32(v.at(o + 2 * t, k + g)));  // read as k rows of m, transposed
    }
  }

  // The A fragment from shared memory rows: matrix j = a[j], rows m0 + 8 (j & 1), the (j >> 1)-th
  // 16 bytes of k.
  template <class E, bool KC>
  static KK_FN void ldsm_a(const rows_view<E, KC>& v, int m0, int k0, unsigned (&a)[4]) {
    const int i = int(lane_id()), j = i >> 3;
    ldmatrix_x4<!KC>(a, ldmatrix_row(v, m0 + 8 * (j & 1), k0 + CW * (j >> 1), i));
  }
  // The B fragments of column blocks n0 and (two) n0 + 8 from shared memory rows: matrix j of an
  // x4 is b[j >> 1][j & 1].
  template <class E, bool KC>
  static KK_FN void ldsm_b(const rows_view<E, KC>& v, int n0, bool two, int k0, unsigned (&b)[2][2]) {
    if (!two) return ldsm_b1(v, n0, k0, b[0]);
    const int i = int(lane_id()), j = i >> 3;
    unsigned r[4];
    ldmatrix_x4<!tr>(r, ldmatrix_row(v, n0 + 8 * (j >> 1), k0 + CW * (j & 1), i));
    b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
  }
  // The B fragment of column block n0 alone: lanes 0..15 give the addresses, matrix j = b[j].
  template <class E, bool KC>
  static KK_FN void ldsm_b1(const rows_view<E, KC>& v, int n0, int k0, unsigned (&b)[2]) {
    const int i = int(lane_id());
    ldmatrix_x2<!tr>(b, ldmatrix_row(v, n0, k0 + CW * ((i >> 3) & 1), i));
  }

  // The B (k x n) fragments of column blocks n0 and (two) n0 + 8, rows k0..
  template <class RR>
  static KK_FN void fragments_b(const Right& rt, const RR& v, int n0, bool two, int k0, int K, unsigned (&b)[2][2],
                                unsigned (&lo)[2][2]) {
    if constexpr (vec) {
      if constexpr (!(bytes && !tr)) {
        if (two && v.how == fetch::shared && v.inside(n0, 16, k0, KSTEP)) return ldsm_b(v, n0, true, k0, b);
      }
    }
    fragment_b(rt, v, n0, k0, K, b[0], lo[0]);
    if (two) fragment_b(rt, v, n0 + 8, k0, K, b[1], lo[1]);
  }
  // The B fragment of column block n0: b[r] holds column g, rows from KSTEP / 2 r.
  template <class RR>
  static KK_FN void fragment_b(const Right& rt, const RR& v, int n0, int k0, int K, unsigned (&b)[2], unsigned (&lo)[2]) {
    const int i = int(lane_id()), g = i >> 2, t = i & 3;
    if constexpr (vec) {
      if (v.inside(n0, 8, k0, KSTEP)) {
        if constexpr (!(bytes && !tr)) {
          if (v.how == fetch::shared) return ldsm_b1(v, n0, k0, b);
        }
        KK_TOPS_UNROLL
        for (int r = 0; r < 2; ++r) {
          const int k = k0 + CW * r;
          if constexpr (tr) b[r] = load32(v.at(n0 + g, k + EPR * t));
          else if constexpr (bytes) b[r] = v.bytes4(n0 + g, k + 4 * t);
          else b[r] = movmatrix_trans(load32(v.at(n0 + 2 * t, k + g)));  // read as k rows of n, transposed
        }
        return;
      }
    }
    const int n = n0 + g;
    KK_TOPS_UNROLL
    for (int r = 0; r < 2; ++r) {
      if constexpr (bytes) {
        const int k = k0 + 16 * r + 4 * t;
        b[r] = pack8(rbyte(rt, k, n, K), rbyte(rt, k + 1, n, K), rbyte(rt, k + 2, n, K), rbyte(rt, k + 3, n, K));
      } else if constexpr (S == mma_shape::tf32) {
        const float x = rvalue(rt, k0 + t + 4 * r, n, K), big = to_tf32(x);
        b[r] = __float_as_uint(big);
        lo[r] = __float_as_uint(to_tf32(x - big));
      } else {
        const int k = k0 + 8 * r + 2 * t;
        b[r] = pack16(bits(rvalue(rt, k, n, K)), bits(rvalue(rt, k + 1, n, K)));
      }
    }
  }
  // This lane's ldmatrix row address for the 8 x 8 (16-bit units) block from (o0, k0): row i % 8
  // of o (KC: memory rows are o) or of k.
  template <class E, bool KC>
  static KK_FN unsigned ldmatrix_row(const rows_view<E, KC>& v, int o0, int k0, int i) {
    return KC ? v.saddr(o0 + (i & 7), k0) : v.saddr(o0, k0 + (i & 7));
  }

  // Element reads with bounds: zero past the tensor's extents and past K.
  static KK_FN float lvalue(const Left& l, int m, int k, int K) { return k < K ? left_value<float, tl>(l, m, k) : 0.0f; }
  static KK_FN float rvalue(const Right& r, int k, int n, int K) { return k < K ? right_value<float, tr>(r, k, n) : 0.0f; }
  static KK_FN int lbyte(const Left& l, int m, int k, int K) { return k < K ? byte(l, tl ? m : k, tl ? k : m) : 0; }
  static KK_FN int rbyte(const Right& r, int k, int n, int K) { return k < K ? byte(r, tr ? k : n, tr ? n : k) : 0; }
  // The 8-bit pattern of tensor element (x, y), 0 outside (zero in every 8-bit format).
  template <class Tn> static KK_FN int byte(const Tn& t, int x, int y) {
    if (x < 0 || y < 0 || x >= int(t.get_extent(0)) || y >= int(t.get_extent(1))) return 0;
    return *reinterpret_cast<const unsigned char*>(&t(x, y));
  }
  static KK_FN unsigned short bits(float x) {
    return S == mma_shape::bf16 ? kk::float_to_bfloat(x) : kk::float_to_half(x);
  }
};

}  // namespace tops
}  // namespace kk
