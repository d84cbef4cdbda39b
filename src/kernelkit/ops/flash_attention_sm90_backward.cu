// Flash attention backward on Hopper (sm_90a), 16-bit types, D = 64 or 128: the tensor-op layer's
// warp-specialised kernel (tensor_ops/sm90_attention_backward.h), persistent threadgroups over the
// blocks of 128 keys of each key head and batch. q, k, v, dout: (B, H, S, D) views (the last dim
// packed, strides TMA can read); lse2, delta and dq_acc: flash_attention_sm90_prep.cu's, dq_acc
// the zeroed float sums the kernel adds dS K into, in wgmma's accumulator order
// (flash_attention_sm90_dq.cu turns them into dq), then the tile counter. dq_acc is an input
// because the prep kernel zeroes it; the kernel API has no in-out buffers, hence the const_cast.
// dk, dv are written in the layout BSHD names. Causal and not are kernels of their own (CAUSAL):
// without the other's branches ptxas spills less (D = 128 non-causal: 20 bytes of spill stores
// against 44).

  using F = kk::tops::sm90::attention_backward<T, D>;
  const int B = q_shape[0], H = q_shape[1], Sq = q_shape[2], Hkv = k_shape[1], Sk = k_shape[2];
  const F::operand tq{q, q_strides[0], q_strides[1], q_strides[2]};
  const F::operand tk{k, k_strides[0], k_strides[1], k_strides[2]};
  const F::operand tv{v, v_strides[0], v_strides[1], v_strides[2]};
  const F::operand tdo{dout, dout_strides[0], dout_strides[1], dout_strides[2]};
  // dk, dv: contiguous in their layout, (B, Hkv, Sk, D) or (B, Sk, Hkv, D)
  const long batch = long(Hkv) * Sk * D, head = BSHD ? D : long(Sk) * D, row = BSHD ? long(Hkv) * D : D;
  const F::output tdk{dk, batch, head, row}, tdv{dv, batch, head, row};
  float* sums = const_cast<float*>(dq_acc);
  const long sqp = (Sq + F::block_q - 1) / F::block_q * F::block_q;  // (prep's Sqp)
  int* next_tile = reinterpret_cast<int*>(sums + long(B) * H * sqp * D);
  F::run(tq, tk, tv, tdo, lse2, delta, sums, tdk, tdv, next_tile, B, H, Hkv, Sq, Sk, scale[0], CAUSAL);
