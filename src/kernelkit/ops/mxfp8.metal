// MXFP8 (OCP Microscaling Formats v1.0): blocks of 32 values along a row share one E8M0 scale
// X = 2^(floor(log2(amax)) - 8) (8: E4M3's largest exponent); each value is V / X in E4M3
// (bias 7, no infinities, S.1111.111 NaN), rounded to nearest even and saturated to +-448.
// Everything here is exact: powers of two are built from their bits, rounding is integer work.
#pragma METAL fp contract(off)

// E8M0 exponent of a block whose largest magnitude is amax: clamped to [-127, 127]; a zero or
// subnormal amax gives -127 (E8M0's smallest), so its values encode as zeros or subnormals.
inline int mx_shared_exponent(float amax) {
  const int biased = int((as_type<uint>(amax) >> 23) & 0xffu);
  return biased == 0 ? -127 : metal::clamp(biased - 127 - 8, -127, 127);
}

// 2^e for e in [-126, 127]
inline float mx_pow2(int e) { return as_type<float>(uint(e + 127) << 23); }

// A float (already divided by the block's scale) as E4M3 bits.
inline uchar mx_to_e4m3(float v) {
  const uint bits = as_type<uint>(v);
  const uchar sign = uchar((bits >> 24) & 0x80u);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x7fffffu) != 0u) return sign | 0x7f;  // NaN
  const uint a = bits & 0x7fffffffu;
  if (a >= 0x43e00000u) return sign | 0x7e;  // |v| >= 448 (infinity too): saturated
  const int exponent = int(a >> 23) - 127;
  if (exponent < -6) {  // E4M3's subnormals: multiples of 2^-9, nearest even
    return sign | uchar(metal::rint(as_type<float>(a) * 512.0f));  // 8 rounds up to 2^-6's code
  }
  uint keep = (a >> 20) & 7u;  // three mantissa bits; the other 20 decide the rounding
  const uint rest = a & 0xfffffu;
  int e = exponent + 7;
  if (rest > 0x80000u || (rest == 0x80000u && (keep & 1u))) {
    if (++keep == 8u) { keep = 0u; ++e; }
  }
  if (e > 15 || (e == 15 && keep == 7u)) return sign | 0x7e;  // rounded past 448
  return sign | uchar((uint(e) << 3) | keep);
}

// E4M3 bits as a float
inline float mx_from_e4m3(uchar b) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const uint e = (b >> 3) & 15u, m = b & 7u;
  if (e == 15u && m == 7u) return metal::numeric_limits<float>::quiet_NaN();
  return sign * (e == 0u ? float(m) * 0.001953125f : mx_pow2(int(e) - 7) * (1.0f + float(m) * 0.125f));
}
