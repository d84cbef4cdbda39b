// Flash attention forward on Hopper (sm_90a), 16-bit types, D = 64 or 128: the tensor-op layer's
// warp-specialised kernel (tensor_ops/sm90_attention.h), one threadgroup an SM walking the tiles
// of 128 queries (192 at D = 64); flash_attention_forward.metal is the same op on every other
// path. q, k, v: (B, H, S, D) views (the last dim packed, strides TMA can read); o is written in
// the layout BSHD names, lse as (B, H, Sq); next_tile: the threadgroups' tile counter, zeroed.
// Causal and not are kernels of their own (CAUSAL): without the causal branches ptxas schedules
// the non-causal one 5% faster (D = 128; D = 64 with fewer spills too), the causal ones as fast
// as one kernel for both (H100).

  using F = kk::tops::sm90::attention_forward<T, D>;
  const int B = q_shape[0], H = q_shape[1], Sq = q_shape[2], Hkv = k_shape[1], Sk = k_shape[2];
  const F::operand tq{q, q_strides[0], q_strides[1], q_strides[2]};
  const F::operand tk{k, k_strides[0], k_strides[1], k_strides[2]};
  const F::operand tv{v, v_strides[0], v_strides[1], v_strides[2]};
  // o, contiguous in its layout: (B, H, Sq, D) or (B, Sq, H, D)
  const long od = D;
  const F::operand to{o, long(H) * Sq * od, BSHD ? od : long(Sq) * od, BSHD ? long(H) * od : od};
  F::run(tq, tk, tv, to, lse, next_tile, B, H, Hkv, Sq, Sk, scale[0], CAUSAL);
