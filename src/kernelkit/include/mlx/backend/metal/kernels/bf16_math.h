// mlx/backend/metal/kernels/bf16_math.h: nothing to include. MLX prepends its kernel utilities
// (utils.h with bf16.h, bf16_math.h, complex.h, defines.h, logging.h) to every custom
// kernel; kernelkit/metal.h, the prelude of every generated kernel, already provides
// their names (kernelkit/utils.h, kernelkit/complex.h).
#pragma once
