"""Compile errors point at the user's own lines (issue 7): a syntax error on line 3 of a body and a
type error in a header helper each produce a message that quotes that line and its number, in
both dialects, on both backends.

The CPU backend is tested through a real call (and the CUDA backend too where there is a GPU: the
`device` fixture). Without a GPU, the CUDA backend's path is taken by hand: the source generated
for the "cuda" target (as conftest.py generates it), compiled by NVRTC for sm_90 as CudaBackend
does, its CompileError given the kernel's context as CudaBackend.build gives it.
"""

import re

import pytest
import torch

import kernelkit as kk
from kernelkit import codegen
from kernelkit.arrays import dtype_of
from kernelkit.backends import cuda
from kernelkit.errors import CompileError
from kernelkit.signature import InputSpec, Signature

MAKE = {"metal": kk.metal_kernel, "cuda": kk.cuda_kernel}

# Each body and header spans its error's line number with the front end's rewrites before it (a
# block comment over two lines, address spaces, a template), so the numbers must survive them.
BODY_SYNTAX = {
    "metal": ("    uint i = thread_position_in_grid.x;  /* a comment over\n"
              "       two lines */ const device T* src = a; T v = src[i];\n"
              "    out[i] = v * (2.0f + );\n"
              "    out[i] += 1.0f;\n"),
    "cuda": ("    int i = blockIdx.x * blockDim.x + threadIdx.x;  /* a comment over\n"
             "       two lines */ const T* src = a; T v = src[i];\n"
             "    out[i] = v * (2.0f + );\n"
             "    out[i] += 1.0f;\n"),
}
GOOD_BODY = {
    "metal": "uint i = thread_position_in_grid.x;\nout[i] = twice(a[i]);\n",
    "cuda": "int i = blockIdx.x * blockDim.x + threadIdx.x;\nout[i] = twice(a[i]);\n",
}
HEADER_TYPE = {
    "metal": ("// helpers that read device memory\n"
              "inline float first(const device float* p) { return p[0]; }\n"
              "inline float twice(const device float& x) { int* q = &x; return 2.0f * *q; }\n"),
    "cuda": ("// helpers that read global memory\n"
             "__device__ inline float first(const float* p) { return p[0]; }\n"
             "__device__ inline float twice(const float& x) { int* q = &x; return 2.0f * *q; }\n"),
}
# The same type error in a template helper, seen only when the body instantiates it (line 2).
HEADER_TEMPLATE = {
    "metal": ("\ntemplate <typename T>\n"
              "T twice(T x) { thread T* p = x; return *p * 2; }\n"),
    "cuda": ("\ntemplate <typename T>\n"
             "__device__ T twice(T x) { T* p = x; return *p * 2; }\n"),
}
# (body, header, line, where, words the diagnostic has: g++, clang++ or NVRTC)
CASES = {
    "body_syntax": lambda d: (BODY_SYNTAX[d], "", 3, "body", r"expected"),
    "header_type": lambda d: (GOOD_BODY[d], HEADER_TYPE[d], 3, "header",
                              r"cannot (convert|initialize|be used to initialize)|invalid conversion"),
    "header_template": lambda d: (GOOD_BODY[d], HEADER_TEMPLATE[d], 3, "header",
                                  r"cannot (convert|initialize|be used to initialize)|invalid conversion"),
}
TEMPLATE = [("T", torch.float32)]


def _kernel(dialect, case):
    body, header, line, where, words = CASES[case](dialect)
    k = MAKE[dialect](name=f"broken_{case}", input_names=["a"], output_names=["out"], source=body,
                      header=header)
    return k, body, header, line, where, words


def _source(k, target: str) -> str:
    """The source the kernel generates for `target` for a float32 array input and output."""
    sig = Signature([("a", InputSpec(dtype_of("float32"), False, False, 8))],
                    [("out", dtype_of("float32"))], k.atomic_outputs,
                    [("T", dtype_of("float32"))], k._uses)
    return codegen.generate(k.dialect, target, k.name, sig, k._lowered_header, k._lowered_body,
                            k.math_mode, k.uses_sync)


def _check_message(err: CompileError, k, text: str, line: int, where: str, words: str, target: str):
    msg = str(err)
    lines = msg.split("\n")
    assert lines[0] == f"[{k.caller}] kernel '{k.name}' failed to compile:"
    quote = f"    {where} line {line}: {text.splitlines()[line - 1].strip()}"
    assert quote in lines, msg
    # the quote follows the compiler's diagnostic on that line
    if target == "cuda":  # NVRTC: `body(3): error: ...`
        location = re.compile(rf"{where}\({line}\): error: (.*)")
    else:  # g++ / clang++: `body:3:22: error: ...`
        location = re.compile(rf"{where}:{line}:\d+: error: (.*)")
    diagnostic = location.fullmatch(lines[lines.index(quote) - 1])
    assert diagnostic, msg
    assert re.search(words, diagnostic.group(1)), diagnostic.group(0)
    for log_line in err.log.splitlines():  # all of the compiler's log is there
        assert log_line in lines
    assert msg.rstrip().endswith("(the full generated source is in the exception's `source`, or "
                                 "printed with verbose=True)")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dialect", ["metal", "cuda"])
def test_compile_error_quotes_the_line_through_a_call(device, dialect, case):
    k, body, header, line, where, words = _kernel(dialect, case)
    with pytest.raises(kk.CompileError) as info:
        k(inputs=[torch.zeros(4, device=device)], grid=(4, 1, 1), threadgroup=(4, 1, 1),
          output_shapes=[(4,)], output_dtypes=[torch.float32], template=TEMPLATE)
    err = info.value
    _check_message(err, k, header if where == "header" else body, line, where, words, device.type)
    assert err.source == _source(k, device.type)  # the full generated source


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dialect", ["metal", "cuda"])
def test_compile_error_quotes_the_line_nvrtc(dialect, case):
    """The CUDA backend's path without a GPU: NVRTC's log format is quoted as g++'s is."""
    k, body, header, line, where, words = _kernel(dialect, case)
    source = _source(k, "cuda")
    flags = tuple(k.dialect.compile_flags("cuda", k.math_mode))
    try:
        with pytest.raises(CompileError) as info:
            cuda.compile_source(source, "sm_90", k.math_mode, flags)
    except cuda.CudaUnavailable as e:
        pytest.skip(f"NVRTC is not installed: {e}")
    assert info.value.source == source
    err = info.value.with_context(f"[{k.caller}] kernel {k.name!r}", k.source, k.header)  # as CudaBackend.build
    assert isinstance(err, kk.CompileError) and err.source == source and err.log == info.value.log
    _check_message(err, k, header if where == "header" else body, line, where, words, "cuda")


def test_instantiation_site_is_quoted_too():
    """g++ names the body line that instantiated the broken template helper ("required from
    here"); that line is quoted as well."""
    k, body, header, _, _, _ = _kernel("metal", "header_template")
    with pytest.raises(kk.CompileError) as info:
        k(inputs=[torch.zeros(4)], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
          output_dtypes=[torch.float32], template=TEMPLATE)
    lines = str(info.value).split("\n")
    quote = "    body line 2: out[i] = twice(a[i]);"
    assert quote in lines
    assert re.match(r"body:2:\d+:", lines[lines.index(quote) - 1])


def test_instantiation_site_is_quoted_too_nvrtc():
    """NVRTC names the instantiating line as `detected during instantiation of "..." at line 2 of
    body`: quoted as g++'s "required from here" is."""
    k, body, header, _, _, _ = _kernel("metal", "header_template")
    source = _source(k, "cuda")
    try:
        with pytest.raises(CompileError) as info:
            cuda.compile_source(source, "sm_90", k.math_mode, tuple(k.dialect.compile_flags("cuda", k.math_mode)))
    except cuda.CudaUnavailable as e:
        pytest.skip(f"NVRTC is not installed: {e}")
    lines = str(info.value.with_context(f"[{k.caller}] kernel {k.name!r}", k.source, k.header)).split("\n")
    site = next(i for i, line in enumerate(lines) if re.search(r"at line 2 of \"?body\"?", line))
    assert lines[site + 1] == "    body line 2: out[i] = twice(a[i]);", "\n".join(lines)
