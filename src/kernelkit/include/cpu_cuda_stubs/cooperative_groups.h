// CPU build of a kk.cuda_kernel (this directory is on the include path of the
// CPU target only): the CUDA header's names come from kernelkit/cuda_cpu.h.
#pragma once
#include <kernelkit/cuda_cpu.h>
