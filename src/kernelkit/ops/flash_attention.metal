// Flash attention on the tensor-ops layer (the talk's "advanced op"): what the three kernels
// (flash_attention_forward.metal, _dq.metal, _dkdv.metal) share.
//
// Every kernel is a template over T (the element type), A (the accumulator: float, or double for
// float64), D (the head dim), BK (the keys or queries a step reads), NW (SIMD-groups a
// threadgroup) and BSHD (the outputs' layout). The forward runs its ops over the whole
// threadgroup (execution_simdgroups<NW>: on Hopper one warpgroup, wgmma with the queries and
// the probabilities in registers); the backward's SIMD-groups each own 16 rows of the block and
// run execution_simdgroup ops on tiles they stage in threadgroup memory. Either way the
// cooperative tensors are the tensor cores' own fragments (layout.h), and a destination is reused
// as the next op's left input in registers. Scores are kept in the log2 domain (scaled by
// scale * log2(e)) so that exp2 does the softmax.
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace mpp::tensor_ops;

constant constexpr int FA_ROWS = 16;  // rows of a SIMD-group's block: one mma.sync fragment high

// Rows [0, ROWS) of a (rows x D) matrix with row stride `stride` into threadgroup memory, row r at
// dst + r * PITCH; rows at or past `valid` are zero, so that a product over the whole tile adds
// nothing for them (a masked score times a zero row, never times garbage: 0 * NaN is NaN).
// 16 bytes a load where the rows are 16-byte aligned (they are for packed tensors).
// PITCH is D plus 16 bytes (fa_pitch): the tensor cores' fragment loads (ldmatrix) read 8 rows of
// 16 bytes at once, and packed rows of 128, 256 or 512 bytes would put all 8 in the same banks.
template <int D, class T> METAL_FUNC constexpr int fa_pitch() { return D + int(16 / sizeof(T)); }

template <int ROWS, int D, int THREADS, class T>
METAL_FUNC void fa_stage(threadgroup T* dst, const device T* src, long stride, int valid, uint tid) {
  constexpr int V = 16 / sizeof(T), PITCH = fa_pitch<D, T>();  // V: elements in 16 bytes
  if (D % V == 0 && (ulong(src) | ulong(stride * long(sizeof(T)))) % 16 == 0) {
    for (uint e = tid; e < uint(ROWS * D / V); e += THREADS) {
      const int r = int(e) / (D / V), c = int(e) % (D / V) * V;
      *reinterpret_cast<threadgroup uint4*>(dst + r * PITCH + c) =
          r < valid ? *reinterpret_cast<const device uint4*>(src + r * stride + c) : uint4(0);
    }
    return;
  }
  for (uint e = tid; e < uint(ROWS * D); e += THREADS) {
    const int r = int(e) / D, c = int(e) % D;
    dst[r * PITCH + c] = r < valid ? src[r * stride + c] : T(0);
  }
}

// Element (b, h, s, 0) of a (B, H, S, D) tensor in the op's layout: (B, H, S, D) or (B, S, H, D).
template <bool BSHD>
METAL_FUNC long fa_offset(int b, int h, int s, int H, int S, int D) {
  return BSHD ? ((long(b) * S + s) * H + h) * D : ((long(b) * H + h) * S + s) * D;
}
