// kernelkit/entry_bounds.h: the CUDA entry's launch bounds, included after the body's header.
// A header that defines KK_MAX_THREADS_PER_THREADGROUP promises no larger threadgroup, and the
// compiler fits the kernel's registers to that many threads (__launch_bounds__): a kernel whose
// warpgroups trade registers (setmaxnreg) must start within its threadgroup's share.
#pragma once
#if defined(KK_MAX_THREADS_PER_THREADGROUP)
#define KK_ENTRY_BOUNDS __launch_bounds__(KK_MAX_THREADS_PER_THREADGROUP, 1)
#else
#define KK_ENTRY_BOUNDS
#endif
