// kernelkit/utils.h: MLX's indexing helpers for kernel bodies (the overloads
// of mlx/backend/metal/kernels/utils.h that custom kernels use): elem_to_loc
// for strided inputs (`name_shape`, `name_strides`, `name_ndim`) and ceildiv.
// Included by metal.h; the names live in namespace metal, like the rest of MSL.
#pragma once

#include "indexing.h"

namespace metal {

// Location of the elem-th element (row-major order) of an array with these
// shape and strides. IdxT follows elem: a `uint elem` gives a uint offset.
template <typename IdxT = int64_t>
KK_FN IdxT elem_to_loc(IdxT elem, const int* shape, const int64_t* strides, int ndim) {
  return kk::elem_to_loc(elem, shape, strides, ndim);
}

// A 3-D thread position: x and y index the last two dimensions, z the others.
template <typename IdxT = int64_t>
KK_FN IdxT elem_to_loc(uint3 elem, const int* shape, const int64_t* strides, int ndim) {
  IdxT loc = elem.x * IdxT(strides[ndim - 1]) + elem.y * IdxT(strides[ndim - 2]);
  for (int d = ndim - 3; d >= 0; --d) {
    loc += (elem.z % shape[d]) * IdxT(strides[d]);
    elem.z /= shape[d];
  }
  return loc;
}

// Fixed dimensions.
template <typename IdxT = int64_t>
KK_FN IdxT elem_to_loc_1(uint elem, const int64_t& stride) {
  return elem * IdxT(stride);
}
template <typename IdxT = int64_t>
KK_FN IdxT elem_to_loc_2(uint2 elem, const int64_t strides[2]) {
  return elem.x * IdxT(strides[1]) + elem.y * IdxT(strides[0]);
}
template <typename IdxT = int64_t>
KK_FN IdxT elem_to_loc_3(uint3 elem, const int64_t strides[3]) {
  return elem.x * IdxT(strides[2]) + elem.y * IdxT(strides[1]) + elem.z * IdxT(strides[0]);
}

// Two and three arrays sharing a shape, one index walk.
template <typename IdxT = int64_t>
KK_FN vec<IdxT, 2> elem_to_loc_2_nd(uint3 elem, const int* shape, const int64_t* a_strides,
                                    const int64_t* b_strides, int ndim) {
  vec<IdxT, 2> loc = {
      IdxT(elem.x * IdxT(a_strides[ndim - 1]) + IdxT(elem.y) * IdxT(a_strides[ndim - 2])),
      IdxT(elem.x * IdxT(b_strides[ndim - 1]) + elem.y * IdxT(b_strides[ndim - 2]))};
  for (int d = ndim - 3; d >= 0; --d) {
    uint l = elem.z % shape[d];
    loc.x += l * IdxT(a_strides[d]);
    loc.y += l * IdxT(b_strides[d]);
    elem.z /= shape[d];
  }
  return loc;
}
template <typename IdxT = int64_t>
KK_FN vec<IdxT, 3> elem_to_loc_3_nd(uint3 elem, const int* shape, const int64_t* a_strides,
                                    const int64_t* b_strides, const int64_t* c_strides, int ndim) {
  vec<IdxT, 3> loc = {
      IdxT(elem.x * IdxT(a_strides[ndim - 1])) + IdxT(elem.y * IdxT(a_strides[ndim - 2])),
      IdxT(elem.x * IdxT(b_strides[ndim - 1])) + IdxT(elem.y * IdxT(b_strides[ndim - 2])),
      IdxT(elem.x * IdxT(c_strides[ndim - 1])) + IdxT(elem.y * IdxT(c_strides[ndim - 2]))};
  for (int d = ndim - 3; d >= 0; --d) {
    uint l = elem.z % shape[d];
    loc.x += l * IdxT(a_strides[d]);
    loc.y += l * IdxT(b_strides[d]);
    loc.z += l * IdxT(c_strides[d]);
    elem.z /= shape[d];
  }
  return loc;
}

using kk::ceildiv;  // ceil(N / M) for positive integers

}  // namespace metal
