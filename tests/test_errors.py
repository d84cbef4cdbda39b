"""Bad input gets a clear error naming what was wrong and what was expected (issue 2)."""

import numpy as np
import pytest
import torch

import kernelkit as kk

BODY = "uint i = thread_position_in_grid.x; out[i] = a[i] + b[i];"


@pytest.fixture
def k():
    return kk.metal_kernel(name="add", input_names=["a", "b"], output_names=["out"], source=BODY)


def call(k, **kw):
    args = dict(inputs=[torch.zeros(4), torch.zeros(4)], grid=(4, 1, 1), threadgroup=(4, 1, 1),
                output_shapes=[(4,)], output_dtypes=[torch.float32])
    args.update(kw)
    return k(**args)


def test_list_lengths_disagreeing_with_names(k):
    with pytest.raises(ValueError, match=r"\[metal_kernel\] Expected `inputs` to have size 2 but got size 1"):
        call(k, inputs=[torch.zeros(4)])
    with pytest.raises(ValueError, match="`output_shapes` to have size 1 but got size 2"):
        call(k, output_shapes=[(4,), (4,)])
    with pytest.raises(ValueError, match="`output_dtypes` to have size 1 but got size 0"):
        call(k, output_dtypes=[])


def test_unknown_dtype(k):
    with pytest.raises(TypeError, match=r"output 'out': unsupported dtype 'float8'.*expected one of"):
        call(k, output_dtypes=["float8"])
    with pytest.raises(TypeError, match="input 'a': unsupported dtype torch.complex128"):
        call(k, inputs=[torch.zeros(4, dtype=torch.complex128), torch.zeros(4)])


def test_input_that_is_not_an_array(k):
    with pytest.raises(TypeError, match=r"input 'b' must be a torch.Tensor, a NumPy array, an "
                                        r"array with __dlpack__ .* or a Python bool/int/float; "
                                        r"got list"):
        call(k, inputs=[torch.zeros(4), [1.0, 2.0]])


@pytest.mark.gpu
def test_arrays_on_different_devices(k):
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    with pytest.raises(ValueError, match="inputs are on different devices"):
        call(k, inputs=[torch.zeros(4), torch.zeros(4, device="cuda")])


@pytest.mark.parametrize("bad", [(4, 1), (4, -1, 1), (4.0, 1, 1), "4", (True, 1, 1), (2**32, 1, 1),
                                 (np.float64(4), 1, 1), (torch.tensor(4.0), 1, 1)])
def test_grid_and_threadgroup_must_be_three_ints(k, bad):
    with pytest.raises(ValueError, match=r"`grid` must be three non-negative ints"):
        call(k, grid=bad)
    with pytest.raises(ValueError, match=r"`threadgroup` must be three positive ints"):
        call(k, threadgroup=bad)
    with pytest.raises(ValueError, match=r"`threadgroup` must be three positive ints"):
        call(k, threadgroup=(4, 1, 0))


def test_threadgroup_over_the_limit(k, device):
    with pytest.raises(ValueError, match=r"threadgroup \(64, 32, 1\).*1024"):
        call(k, inputs=[torch.zeros(4, device=device)] * 2, grid=(64, 32, 1), threadgroup=(64, 32, 1))


def test_template_name_colliding_with_a_parameter(k):
    with pytest.raises(ValueError, match="template name 'a' collides with a parameter"):
        call(k, template=[("a", torch.float32)])
    with pytest.raises(ValueError, match="template name 'a_shape' collides"):
        call(k, template=[("a_shape", 3)])
    with pytest.raises(TypeError, match="template value for 'T' must be a dtype, an int or a bool"):
        call(k, template=[("T", 1.5)])


def test_bad_names():
    with pytest.raises(ValueError, match="is not a C\\+\\+ identifier"):
        kk.metal_kernel(name="k", input_names=["a b"], output_names=["out"], source="")
    with pytest.raises(ValueError, match="named both as input and output"):
        kk.metal_kernel(name="k", input_names=["x"], output_names=["x"], source="")
    with pytest.raises(ValueError, match="Metal attribute name"):
        kk.metal_kernel(name="k", input_names=["grid_size"], output_names=["o"], source="")
    with pytest.raises(TypeError, match="input_names must be a list of strings"):
        kk.metal_kernel(name="k", input_names="x", output_names=["o"], source="")


@pytest.mark.parametrize("name, why", [
    *((n, "is a C\\+\\+ or Metal keyword") for n in ("static_assert", "thread_local", "alignas",
                                                   "requires", "co_await", "threadgroup", "kernel")),
    *((n, "is a type, macro or namespace the kernel's prelude defines")
      for n in ("NULL", "uint3", "float4", "half2", "size_t", "INFINITY", "metal", "threadIdx")),
    *((n, "is reserved \\(.*\\)") for n in ("KK_FN", "kk_args", "__x", "_Tmp"))])
def test_reserved_names_are_refused_with_the_reason(name, why):
    for names in (dict(input_names=[name], output_names=["o"]), dict(input_names=[], output_names=[name])):
        with pytest.raises(ValueError, match=f"'{name}' {why}; choose another name"):
            kk.metal_kernel(name="k", source="", **names)


def test_a_kernel_name_is_any_identifier(device):
    """A kernel's name only ever follows a prefix (custom_kernel_<name>, kk_<name>): a keyword, a
    prelude name or a kk_ name is an MLX kernel name too (ZMLX names every kernel kk_...)."""
    a = torch.arange(4.0, device=device)
    for name in ("kk_copy", "static_assert"):
        k = kk.metal_kernel(name=name, input_names=["a"], output_names=["out"],
                            source="out[thread_position_in_grid.x] = a[thread_position_in_grid.x];")
        out = k(inputs=[a], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
                output_dtypes=[torch.float32])[0]
        assert torch.equal(out, a)
    with pytest.raises(ValueError, match="kernel name 'a b' is not a C\\+\\+ identifier"):
        kk.cuda_kernel(name="a b", input_names=[], output_names=["o"], source="")


def test_compile_options_checked():
    with pytest.raises(ValueError, match=r"unknown compile_options \['opt_level'\]"):
        kk.metal_kernel(name="k", input_names=[], output_names=["o"], source="",
                        compile_options={"opt_level": 3})
    with pytest.raises(ValueError, match="math_mode 'fastest' is not one of"):
        kk.metal_kernel(name="k", input_names=[], output_names=["o"], source="",
                        compile_options={"math_mode": "fastest"})


def test_compile_error_quotes_the_users_line(device):
    body = """uint i = thread_position_in_grid.x;
float v = a[i];
out[i] = v + undefined_name;
"""
    k = kk.metal_kernel(name="broken", input_names=["a"], output_names=["out"], source=body)
    with pytest.raises(kk.CompileError) as info:
        k(inputs=[torch.zeros(4, device=device)], grid=(4, 1, 1), threadgroup=(4, 1, 1),
          output_shapes=[(4,)], output_dtypes=[torch.float32])
    msg = str(info.value)
    assert "[metal_kernel] kernel 'broken' failed to compile" in msg
    assert "undefined_name" in msg
    assert "body line 3: out[i] = v + undefined_name;" in msg
    assert "custom_kernel_broken" in info.value.source  # the full generated source, on request


def test_compile_error_in_header_quotes_the_header_line(device):
    header = """
template <typename T>
T twice(T x) { return x * 2 + missing_symbol; }
"""
    body = "uint i = thread_position_in_grid.x; out[i] = twice(a[i]);"
    k = kk.metal_kernel(name="broken_header", input_names=["a"], output_names=["out"], source=body,
                        header=header)
    with pytest.raises(kk.CompileError, match=r"header line 3: T twice\(T x\)"):
        k(inputs=[torch.zeros(4, device=device)], grid=(4, 1, 1), threadgroup=(4, 1, 1),
          output_shapes=[(4,)], output_dtypes=[torch.float32])


def test_missing_cxx_compiler_is_a_clear_error(monkeypatch):
    from kernelkit.backends import cpu
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    cpu.compiler.cache_clear()
    try:
        with pytest.raises(cpu.CompilerNotFound, match="no C\\+\\+ compiler found.*install g\\+\\+"):
            cpu.compiler()
    finally:
        monkeypatch.undo()
        cpu.compiler.cache_clear()


def test_invalid_memory_access_is_a_launch_error_and_the_process_lives():
    """CPU backend: a kernel dereferencing a wild pointer fails its launch with the
    address; the next launch works (the process is not killed by SIGSEGV)."""
    body = "device float* p = (device float*)(0x10); out[0] = p[0];"
    k = kk.metal_kernel(name="wild", input_names=["a"], output_names=["out"], source=body)
    with pytest.raises(kk.KernelLaunchError,
                       match=r"kernel '.*wild.*': invalid memory access at address 0x10 \(SIGSEGV\) "
                             r"in thread \(0,0,0\) of threadgroup \(0,0,0\), grid position \(0,0,0\) "
                             r"\(the CPU backend stopped the launch; an "
                             r"out-of-bounds index is the usual cause\)"):
        k(inputs=[torch.zeros(4)], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
          output_dtypes=[torch.float32])
    k = kk.metal_kernel(name="add", input_names=["a", "b"], output_names=["out"], source=BODY)
    (out,) = call(k, inputs=[torch.arange(4.0), torch.ones(4)])
    assert out.tolist() == [1.0, 2.0, 3.0, 4.0]


# --- errors a new user meets, said in their terms ------------------------------------------------

@pytest.mark.parametrize("source", [
    'extern "C" __global__ void add_one(const float* x, float* y) {\n  int i = threadIdx.x;\n  y[i] = x[i] + 1;\n}',
    "[[kernel]] void add_one(device const float* x [[buffer(0)]]) { }",
    "kernel void add_one(device float* y) { y[0] = 1; }"])
def test_a_whole_function_as_the_source(source):
    for factory in (kk.metal_kernel, kk.cuda_kernel):
        with pytest.raises(ValueError, match=r"holds a whole kernel function .*add_one.*pass only "
                                             r"the statements inside its braces"):
            factory(name="add_one", input_names=["x"], output_names=["y"], source=source)


def test_extern_shared_without_shared_memory():
    body = "extern __shared__ float tile[];\ntile[threadIdx.x] = x[threadIdx.x];\ny[threadIdx.x] = tile[0];"
    with pytest.raises(ValueError, match=r"`extern __shared__` memory but shared_memory=0: pass "
                                         r"shared_memory=<bytes>"):
        kk.cuda_kernel(name="tiles", input_names=["x"], output_names=["y"], source=body)
    kk.cuda_kernel(name="tiles", input_names=["x"], output_names=["y"], source=body, shared_memory=1024)


def test_a_0d_input_indexed_says_it_is_a_value():
    k = kk.metal_kernel(name="scale", input_names=["inp", "s"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = inp[i] * s[0];")
    with pytest.raises(kk.CompileError, match=r"hint: input 's' is a 0-d array or a Python number: "
                                              r"it is passed as a value"):
        k(inputs=[torch.randn(4), torch.tensor(2.0)], grid=(4, 1, 1), threadgroup=(4, 1, 1),
          output_shapes=[(4,)], output_dtypes=[torch.float32])


def test_assigning_an_atomic_output_says_outputs_are_atomic():
    k = kk.metal_kernel(name="assign", input_names=["inp"], output_names=["out"], atomic_outputs=True,
                        source="uint i = thread_position_in_grid.x; out[i] = inp[i];")
    with pytest.raises(kk.CompileError, match=r"hint: with atomic_outputs=True every output is "
                                              r"`device atomic<T>\*`: \['out'\] cannot be assigned"):
        k(inputs=[torch.randn(4)], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
          output_dtypes=[torch.float32])


def test_check_bounds_reports_outputs_never_written(device):
    """The CUDA habit grid=(blocks, 1, 1): too few threads, most of the output never written."""
    k = kk.metal_kernel(name="copy", input_names=["inp"], output_names=["out", "flags"],
                        source="uint i = thread_position_in_grid.x; out[i] = inp[i]; flags[i] = 1;")
    x = torch.randn(1024, device=device)
    args = dict(inputs=[x], threadgroup=(256, 1, 1), output_shapes=[(1024,), (1024,)],
                output_dtypes=[torch.float32, torch.uint8], check_bounds=True)
    with pytest.warns(kk.UnwrittenOutputWarning) as record:
        k(**args, grid=(1024 // 256, 1, 1))
    texts = [str(w.message) for w in record]
    assert any("left 1020 of the 1024 elements of output 'out' unwritten (the first at flat index 4)"
               in t for t in texts) and any("output 'flags'" in t for t in texts)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, flags = k(**args, grid=(1024, 1, 1))  # every element written: no warning
        k(**{**args, "grid": (4, 1, 1)}, init_value=0)  # an init_value says unwritten is meant
    torch.testing.assert_close(out, x)
