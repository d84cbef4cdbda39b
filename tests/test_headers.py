"""The user's header: standard C++ headers work in it (its includes are made at global scope),
and MSL's names stay visible to its code, as in MLX."""

import pytest
import torch

import kernelkit as kk

HEADER = """
#include <metal_stdlib>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <climits>
#include <cmath>
using namespace metal;

inline float clamp_twice(float v) { return max(v, 0.0f) * 2.0f + float(std::abs(-1)) - 1.0f; }
constant int LIMIT = INT_MAX;
#ifdef KK_NEVER_DEFINED
#include <no_such_header_anywhere>
#endif
"""
BODY = "uint i = thread_position_in_grid.x; out[i] = clamp_twice(inp[i]) + (LIMIT > 0 ? 0.0f : 1.0f);"


@pytest.mark.host_only  # NVRTC has no C++ library: these headers are for the CPU backend
def test_standard_headers_in_a_metal_header():
    k = kk.metal_kernel("std_headers", ["inp"], ["out"], BODY, header=HEADER)
    x = torch.randn(64)
    out = k(inputs=[x], grid=(64, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(64,)],
            output_dtypes=[torch.float32])[0]
    torch.testing.assert_close(out, x.clamp(min=0) * 2)


@pytest.mark.host_only
def test_header_lines_keep_their_numbers_after_an_include():
    """An error after a hoisted include still names its own header line."""
    header = "#include <metal_stdlib>\n#include <climits>\nusing namespace metal;\nfloat f() { return undefined_name; }\n"
    with pytest.raises(kk.CompileError, match=r"header:4"):
        k = kk.metal_kernel("header_lines", ["inp"], ["out"], BODY.replace("clamp_twice", "f() +"),
                            header=header)
        k(inputs=[torch.randn(4)], grid=(4, 1, 1), threadgroup=(4, 1, 1),
          output_shapes=[(4,)], output_dtypes=[torch.float32])
