// Flash attention on the tensor-ops layer (the talk's "advanced op"): what the three kernels
// (flash_attention_forward.metal, _dq.metal, _dkdv.metal) share.
//
// Every kernel is a template over T (the element type), A (the accumulator: float, or double for
// float64), D (the head dim), BK (the keys or queries a step reads), NW (SIMD-groups a
// threadgroup: NW * 16 rows of queries or keys a block) and BSHD (the outputs' layout). Each runs
// its matmul2d ops over the whole threadgroup (execution_simdgroups<NW>: on Hopper one
// warpgroup's wgmma, whose register operand is a left-input cooperative tensor) and reads the
// tiles it slides over (K and V, or Q and dO) as device tensors, which the ops stage themselves.
// The cooperative tensors are the tensor cores' own fragments (layout.h): a destination is
// reused as the next op's left input in registers. Scores are kept in the log2 domain (scaled by
// scale * log2(e)) so that exp2 does the softmax.
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace mpp::tensor_ops;

constant constexpr int FA_ROWS = 16;  // rows of a block per SIMD-group: one mma.sync fragment high

// Element (b, h, s, 0) of a (B, H, S, D) tensor in the op's layout: (B, H, S, D) or (B, S, H, D).
template <bool BSHD>
METAL_FUNC long fa_offset(int b, int h, int s, int H, int S, int D) {
  return BSHD ? ((long(b) * S + s) * H + h) * D : ((long(b) * H + h) * S + s) * D;
}
