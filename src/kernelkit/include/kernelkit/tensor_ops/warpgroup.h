// kernelkit/tensor_ops/warpgroup.h: matmul2d::run on Hopper warpgroups (wgmma, sm_90a), through
// sm90_wgmma.h's warpgroup_gemm, where it applies:
//   - scope execution_simdgroups<4> (one warpgroup, 3 stages: two threadgroups an SM) or
//     execution_simdgroups<8> (two warpgroups sharing the tile's B, each m / 2 rows, 4 stages:
//     a 256 x 128 tile reads 85 FLOP per operand byte from L2 where one warpgroup's 128 x 128
//     reads 64, and L2 bandwidth is the bound: bench/notes/sm90_wgmma.md); left and right
//     tensors (with scales planes only as MXFP8: fp8 both, 32 x 1 blocks along K, K-major both,
//     slices starting on a block), the destination a tensor or the op's destination cooperative
//     tensor, m a multiple of 64 per warpgroup (m <= 256) and n one of 64..256 (multiples of 64);
//     or the left input the op's left-input cooperative tensor (kernelkit's extension: its
//     registers are wgmma's A fragments, layout.h), half or bfloat, k a multiple of 16: run_rs,
//     B staged whole by cp.async, no tensor map (a loop of runs over slices pays no set-up);
//   - types warpgroup_gemm takes: half x half, bfloat x bfloat, fp8 x fp8 -> float, float x float
//     -> float with relaxed_precision (tf32), int8 x int8 -> int32;
//   - at run time: the input tensors in device (global) memory, and the launch gave the kernel the
//     dynamic shared memory warpgroup_gemm stages through. The CUDA backend gives a tensor-op
//     kernel what its warpgroup runs need: each run site names that amount in the cubin
//     (kk_tops_dynamic_smem<bytes>, read by backends/cuda.py). Otherwise run takes mma.sync.
// Not in a kernel with dynamic shared memory of its own (a CUDA body's extern __shared__, which
// would start where the warpgroup's does: codegen defines KK_TOPS_NO_WARPGROUP), nor where the
// kernel's static shared memory leaves no room (the backend then gives none).
// The accumulators are warpgroup_gemm's own (its coord layout), loaded from and stored to a
// destination tensor here; a cooperative destination is those registers (layout.h's layout is
// warpgroup_gemm's for these scopes and tiles), so an epilogue on it costs no memory trip.
#pragma once

#if defined(KK_TARGET_CUDA) && !defined(KK_TOPS_NO_WARPGROUP) && __has_include(<kernelkit/tensor_ops/sm90_wgmma.h>)
#include <kernelkit/tensor_ops/sm90_wgmma.h>
#define KK_TOPS_WGMMA 1

namespace kk {
namespace tops {

// CUDA's type for an element type, for warpgroup_gemm (void: none).
template <class T, kind K = kind_of<T>> struct cuda_type { using type = void; };
template <class T> struct cuda_type<T, kind::f16> { using type = __half; };
template <class T> struct cuda_type<T, kind::bf16> { using type = __nv_bfloat16; };
template <class T> struct cuda_type<T, kind::e4m3> { using type = __nv_fp8_e4m3; };
template <class T> struct cuda_type<T, kind::e5m2> { using type = __nv_fp8_e5m2; };
template <class T> struct cuda_type<T, kind::s8> { using type = signed char; };
template <class T> struct cuda_type<T, kind::f32> { using type = float; };

template <mpp::tensor_ops::matmul2d_descriptor D, int W, class Left, class Right, class Dest, class Acc>
struct warpgroup_matmul {
  using TA = typename cuda_type<typename operand_traits<Left>::value_type>::type;
  using TB = typename cuda_type<typename operand_traits<Right>::value_type>::type;
  // MXFP8: both inputs fp8 with scales planes of 32 x 1 blocks along K, K-major (A not
  // transposed, B transposed: the talk's tensor_blockwise<..., 32, 1> operands); run_scaled.
  template <class T> static constexpr bool mx_plane() {
    if constexpr (metal::is_tensor_v<T> && operand_traits<T>::scaled) {
      using P = typename remove_const_t<T>::plane_type;
      return P::block0 == 32 && P::block1 == 1;
    } else {
      return false;
    }
  }
  static constexpr bool scaled = operand_traits<Left>::scaled || operand_traits<Right>::scaled;
  static constexpr bool mx = mx_plane<Left>() && mx_plane<Right>() && !D.transpose_left && D.transpose_right &&
                             is_fp8(kind_of<typename operand_traits<Left>::value_type>) &&
                             is_fp8(kind_of<typename operand_traits<Right>::value_type>);
  static constexpr bool tensors = metal::is_tensor_v<Left> && metal::is_tensor_v<Right> &&
                                  (metal::is_tensor_v<Dest> || is_cooperative_v<Dest>) && (!scaled || mx);
  // A left-input cooperative tensor of the op (its registers are wgmma's A fragments: layout.h)
  // times a right tensor: wgmma with A from registers (run_rs), 16-bit types, K static.
  static constexpr bool registers = is_cooperative_v<Left> && metal::is_tensor_v<Right> &&
                                    (metal::is_tensor_v<Dest> || is_cooperative_v<Dest>) && !scaled &&
                                    D.k > 0 && D.k % 16 == 0 && !D.transpose_left;
  static constexpr bool float_ok = !is_same_v<TA, float> || D.relaxed_precision;  // wgmma's float is tf32
  static constexpr int WG = W == 8 ? 2 : 1;  // warpgroups sharing the tile
  static constexpr bool shape_ok = (W == 4 || W == 8) && D.m > 0 && D.m % (64 * WG) == 0 && D.n > 0 && D.n % 64 == 0 &&
                                   D.n <= 256;
  // (Another shape names a valid instantiation that `applies` rules out.)
  using gemm = sm90::warpgroup_gemm<(shape_ok ? D.m : 64), (shape_ok ? D.n : 64),
                                    conditional_t<is_same_v<TA, void>, float, TA>, conditional_t<is_same_v<TB, void>, float, TB>, Acc,
                                    WG == 1 ? 3 : 4, WG>;
  // The accumulators' layout: a destination cooperative tensor's (layout.h), loaded and stored
  // through staged_io.h.
  using dest_layout = layout<role::destination, D.m, D.n, W>;
  static constexpr bool applies = shape_ok && (tensors || (registers && gemm::is16)) && float_ok &&
                                  !is_same_v<TA, void> && !is_same_v<TB, void> && gemm::supported;
  // Dynamic shared memory a run takes from the group's slice.
  static constexpr int smem_bytes = registers ? gemm::rs_smem_bytes(D.k > 0 ? D.k : 16)
                                   : mx        ? gemm::scaled_smem_bytes
                                               : gemm::smem_bytes;

  static constexpr KK_FN const char* name() {
    if (registers)
      return WG == 1 ? "wgmma (sm90 warpgroup_gemm, one warpgroup, A in registers, B by cp.async)"
                     : "wgmma (sm90 warpgroup_gemm, two warpgroups, A in registers, B by cp.async)";
    return WG == 1 ? "wgmma (sm90 warpgroup_gemm, one warpgroup, 3 stages, TMA or cp.async)"
                   : "wgmma (sm90 warpgroup_gemm, two warpgroups, 4 stages, TMA or cp.async)";
  }

  // The thread's group of WG warpgroups in the threadgroup, and its thread in the group.
  static KK_FN int linear_thread() { return int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)); }

  // Whether this run can take the path (uniform over the group): the threadgroup's first group of
  // the op's width stages through the start of the dynamic shared memory (the backend gives one
  // slice, the largest run's); later groups run on mma.sync. (Slices j * bytes for later groups
  // would overlap the first group's where a kernel's ops differ in size: a group running a small
  // op beside one running a large op.)
  static KK_FN bool ready(const Left& l, const Right& r) {
    if constexpr (!applies) {
      return false;
    } else {
      asm volatile("" ::"l"(&kk_tops_dynamic_smem<smem_bytes>));
      unsigned smem;
      asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(smem));
      // The first group only, as an inequality: a later one would need a MiB more than any GPU
      // gives (written as group == 0, the optimiser specialised the code after it and ptxas
      // rescheduled flash attention's 255-register kernels: 3-6% slower at D = 64, H100).
      const unsigned group = unsigned(linear_thread() / gemm::threads);
      const bool first = smem >= unsigned(smem_bytes) + (group << 20);
      bool blocks_aligned = true;  // a scaled slice starts on a block of K
      if constexpr (mx) blocks_aligned = l.plane.origin0 % 32 == 0 && r.plane.origin0 % 32 == 0;
      if constexpr (registers) return first && __isGlobal(r.ptr);
      else return first && __isGlobal(l.ptr) && __isGlobal(r.ptr) && blocks_aligned;
    }
  }

  // A cooperative left input's registers as wgmma's A fragments: the warp's mi-th 16-row block
  // (its mi-th outer block) at k16 step s, column blocks 2s and 2s + 1 (mma.sync's A fragment).
  using fragments_t = unsigned[gemm::rows / 64][D.k > 0 ? D.k / 16 : 1][4];
  static KK_FN void pack(const Left& l, fragments_t& a) {
    if constexpr (registers) {
      static_assert(is_same_v<typename Left::layout, layout<role::left, D.m, D.k, W>>,
                    "warpgroup path: the cooperative left input is not the op's");
#pragma unroll
      for (int mi = 0; mi < gemm::rows / 64; ++mi)
#pragma unroll
        for (int s = 0; s < D.k / 16; ++s)
#pragma unroll
          for (int r = 0; r < 4; ++r) a[mi][s][r] = left_fragment_register(l, mi, 2 * s, r);
    }
  }

  // destination (+)= left * right over K.
  static KK_FN void run(const Left& l, const Right& r, Dest& d, int K) {
    if constexpr (applies) {
      constexpr bool tl = D.transpose_left, tr = D.transpose_right;
      constexpr bool accumulate = D.matmul_mode == mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate;
      const int t = linear_thread() % gemm::threads;
      // A (m, k) and B (k, n) strides in elements: a left tensor is (K, M) (or (M, K) transposed)
      const long b_rs = r.get_stride(tr ? 0 : 1), b_cs = r.get_stride(tr ? 1 : 0);
      const int n_valid = min_int(D.n, int(r.get_extent(tr ? 1 : 0)));
      K = min_int(K, tr ? int(r.get_extent(0)) : int(r.get_extent(1)));
      using DV = typename operand_traits<Dest>::value_type;
      Acc acc[gemm::acc_per_thread];
      if constexpr (is_cooperative_v<Dest>) {
        static_assert(Dest::capacity == gemm::acc_per_thread, "warpgroup path: the cooperative destination is not the op's");
#pragma unroll
        for (int i = 0; i < gemm::acc_per_thread; ++i) acc[i] = accumulate ? convert<Acc>(d.v[i]) : Acc(0);
      } else if (accumulate && !operand_traits<Dest>::scaled) {
        staged_io<dest_layout, Acc>::load(acc, d);
      } else {
#pragma unroll
        for (int i = 0; i < gemm::acc_per_thread; ++i) {
          int row, col;
          gemm::coord(i, t, row, col);
          acc[i] = accumulate ? tensor_value<Acc>(d, col, row) : Acc(0);
        }
      }
      if constexpr (registers) {
        fragments_t a;
        pack(l, a);
        gemm::template run_rs<D.k>(acc, a, reinterpret_cast<const TB*>(r.ptr), b_rs, b_cs, n_valid, K, accumulate);
      } else {
        const long a_rs = l.get_stride(tl ? 0 : 1), a_cs = l.get_stride(tl ? 1 : 0);
        const int m_valid = min_int(D.m, int(l.get_extent(tl ? 0 : 1)));
        K = min_int(K, tl ? int(l.get_extent(1)) : int(l.get_extent(0)));
        if constexpr (mx) {
          // A is (K, M) sliced at (origin0, origin1), its scales row-major (M, row_blocks); B likewise (K, N)
          const auto &pa = l.plane, &pb = r.plane;
          const sm90::block_scales scales{pa.scales + long(pa.origin1) * pa.row_blocks + pa.origin0 / 32, pa.row_blocks,
                                          pb.scales + long(pb.origin1) * pb.row_blocks + pb.origin0 / 32, pb.row_blocks,
                                          (K + 31) / 32};
          gemm::run_scaled(acc, reinterpret_cast<const TA*>(l.ptr), a_rs, a_cs, reinterpret_cast<const TB*>(r.ptr),
                           b_rs, b_cs, m_valid, n_valid, K, accumulate, scales);
        } else {
          gemm::run(acc, reinterpret_cast<const TA*>(l.ptr), a_rs, a_cs, reinterpret_cast<const TB*>(r.ptr), b_rs,
                    b_cs, m_valid, n_valid, K, accumulate);
        }
      }
      if constexpr (is_cooperative_v<Dest>) {
#pragma unroll
        for (int i = 0; i < gemm::acc_per_thread; ++i) d.v[i] = convert<DV>(acc[i]);
      } else {
        staged_io<dest_layout, Acc>::store(acc, d);
      }
    }
  }
};

}  // namespace tops
}  // namespace kk
#endif
