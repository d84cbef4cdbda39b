// <MetalPerformancePrimitives/MetalPerformancePrimitives.h>: nothing to include. A kernel that includes
// it is generated with kernelkit/tensor_ops.h after its prelude (dialects/metal.py, codegen.py),
// which provides mpp::tensor_ops (matmul2d, convolution2d, reduce_rows...).
