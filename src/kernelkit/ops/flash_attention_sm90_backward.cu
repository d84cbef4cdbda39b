// Flash attention backward on Hopper (sm_90a), 16-bit types, D = 64 or 128: the tensor-op layer's
// warp-specialised kernel (tensor_ops/sm90_attention_backward.h), a threadgroup for each block of
// 128 keys, key head and batch. q, k, v, dout: (B, H, S, D) views (the last dim packed, strides
// TMA can read); lse2, delta: flash_attention_sm90_prep.cu's; dq_acc: float sums in wgmma's
// accumulator order (flash_attention_sm90_dq.cu turns them into dq); dk, dv are written in the
// layout BSHD names.

  using F = kk::tops::sm90::attention_backward<T, D>;
  const int B = q_shape[0], H = q_shape[1], Sq = q_shape[2], Hkv = k_shape[1], Sk = k_shape[2];
  const F::operand tq{q, q_strides[0], q_strides[1], q_strides[2]};
  const F::operand tk{k, k_strides[0], k_strides[1], k_strides[2]};
  const F::operand tv{v, v_strides[0], v_strides[1], v_strides[2]};
  const F::operand tdo{dout, dout_strides[0], dout_strides[1], dout_strides[2]};
  // dk, dv: contiguous in their layout, (B, Hkv, Sk, D) or (B, Sk, Hkv, D)
  const long batch = long(Hkv) * Sk * D, head = BSHD ? D : long(Sk) * D, row = BSHD ? long(Hkv) * D : D;
  const F::output tdk{dk, batch, head, row}, tdv{dv, batch, head, row};
  F::run(tq, tk, tv, tdo, lse2, delta, dq_acc, tdk, tdv, B, H, Hkv, Sq, Sk, scale[0], causal[0]);
