// kernelkit/tensor_ops.h: Apple's TensorOps (metal::tensor, cooperative_tensor,
// mpp::tensor_ops::matmul2d, convolution2d, reduce_rows...) and, in an MSL kernel, simdgroup_matrix.
//
// A kernel that names them is compiled as C++20 and generated with KK_TENSOR_OPS defined
// (dialects: `defines`), and this header follows the dialect's prelude: MSL bodies include
// <metal_tensor>, <metal_cooperative_tensor>, <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
// or <metal_simdgroup_matrix> (empty: everything is here), CUDA bodies <kernelkit/tensor_ops.h>.
// One header per concept, in the order they build on each other; DESIGN.md "Tensor ops".
#pragma once

#include "tensor_ops/base.h"                // traits, thread position, lane_read
#include "tensor_ops/formats.h"             // element types, fp8 formats, tensor_blockwise
#include "tensor_ops/extents.h"             // extents, dextents, array, dynamic_length_v
#include "tensor_ops/tensor.h"              // metal::tensor, slice
#include "tensor_ops/descriptor.h"          // matmul2d_descriptor, execution scopes
#include "tensor_ops/layout.h"              // which thread holds which element
#include "tensor_ops/staged_io.h"           // a cooperative tensor to and from a tensor
#include "tensor_ops/cooperative_tensor.h"  // metal::cooperative_tensor
#include "tensor_ops/operands.h"            // operands as logical matrices, lane exchange
#include "tensor_ops/loops.h"               // the loops path
#if defined(KK_TARGET_CUDA)
#include "tensor_ops/mma_sync.h"            // the warp tensor-core path (sm_80+)
#include "tensor_ops/warpgroup.h"           // the warpgroup path (wgmma, sm_90a)
#include "tensor_ops/sm90_persistent.h"     // a persistent warp-specialised GEMM (library ops)
#include "tensor_ops/sm90_attention.h"      // a warp-specialised flash-attention forward (library ops)
#include "tensor_ops/sm90_attention_backward.h"  // its backward (library ops)
#endif
#include "tensor_ops/matmul2d.h"            // matmul2d, its path
#include "tensor_ops/convolution2d.h"       // convolution2d (on the loops path)
#include "tensor_ops/reduction.h"           // reduce_rows, reduce_columns
#if defined(KK_TENSOR_OPS_MSL)
#include "tensor_ops/simdgroup_matrix.h"    // MSL's simdgroup_matrix (the MSL dialect)
#endif
