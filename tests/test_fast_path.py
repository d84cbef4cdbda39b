"""The fast call path: a plain call like an earlier one reuses that call's plan, and gives the
same results and the same errors as the general path."""

import numpy as np
import pytest
import torch

import kernelkit as kk
from kernelkit import fastcall, kernel


@pytest.fixture(autouse=True, scope="module")
def _fastcall_built():
    """Plans wait for the extension (built in the background on first use): have it now."""
    fastcall.module()


@pytest.fixture(params=["fastcall_torch", "torch's Python methods"])
def lent(request):
    """The extension with fastcall_torch lent (tensors read, outputs allocated in C++), and
    without it (through torch's Python methods, as before it is built)."""
    module, helper = fastcall.module(), fastcall.torch_helper()
    if isinstance(module, str):
        pytest.skip(f"no extension here: {module}")
    if request.param == "fastcall_torch":
        assert not isinstance(helper, str), helper
        yield module
        return
    module.set_torch()
    try:
        yield module
    finally:
        if not isinstance(helper, str):
            module.set_torch(*fastcall.addresses(helper))

ADD = "uint i = thread_position_in_grid.x; out[i] = static_cast<T>(inp[i] * s + b);"


def _kernel():
    return kk.metal_kernel(name="fast_add", input_names=["inp", "s", "b"], output_names=["out"],
                           source=ADD)


def _call(k, x, s=2.0, b=1, shape=None, dtype=torch.float32, **kw):
    n = x.size if isinstance(x, np.ndarray) else x.numel()
    return k(inputs=[x, s, b], grid=(n, 1, 1), threadgroup=(32, 1, 1),
             output_shapes=[shape if shape is not None else (n,)], output_dtypes=[dtype],
             template=[("T", dtype)], **kw)[0]


def test_repeated_calls_take_the_fast_path_with_fresh_data(device, lent):
    k = _kernel()
    for n in (100, 100, 100, 37):
        x = torch.randn(n, device=device)
        s = float(torch.randn(()).item())
        out = _call(k, x, s=s, b=3)
        torch.testing.assert_close(out, x * s + 3, rtol=1e-6, atol=1e-6)
    assert len(k._plans) == 1  # a plan for the grid that came again


def test_repeated_output_shapes_are_fresh_contiguous_tensors(device, lent):
    k = _kernel()
    for shape in [(4, 8), (4, 8), (2, 16), (4, 8), (32,), (1, 32)]:
        x = torch.randn(32, device=device)
        out = _call(k, x, shape=shape)
        assert out.shape == shape and out.stride() == torch.empty(shape).stride()
        torch.testing.assert_close(out.reshape(-1), x * 2 + 1)
    kept = [_call(k, torch.full((32,), float(i), device=device), shape=(4, 8)) for i in range(3)]
    assert len({o.data_ptr() for o in kept}) == 3  # outputs kept alive are distinct
    for i, o in enumerate(kept):
        assert o.eq(2 * i + 1).all()


def test_plans_are_per_dtype_template_and_contiguity(device):
    k = _kernel()
    x = torch.randn(64, device=device)
    for dtype in (torch.float32, torch.float16, torch.float32):
        out = _call(k, x, dtype=dtype)
        assert out.dtype == dtype
        torch.testing.assert_close(out, (x * 2 + 1).to(dtype), rtol=1e-3, atol=1e-3)
    strided = torch.randn(128, device=device)[::2]
    for _ in range(3):  # not contiguous: copied every time, never a plan that skips the copy
        torch.testing.assert_close(_call(k, strided), strided * 2 + 1)
    assert len(k._plans) == 1  # float32's; float16 came once


def test_template_values_one_and_true_are_different_plans(device):
    k = kk.metal_kernel(name="fast_flag", input_names=["inp"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = inp[i] + F;")
    x = torch.zeros(8, device=device)
    kw = dict(grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)],
              output_dtypes=[torch.float32])
    for value, expected in ((2, 2.0), (True, 1.0), (2, 2.0), (True, 1.0)):
        assert k(inputs=[x], template=[("F", value)], **kw)[0].eq(expected).all()


@pytest.mark.parametrize("shape,error", [((-1,), ValueError), ((2.5,), ValueError), ([8], None),
                                         (8, ValueError)])
def test_output_shapes_after_a_plan_are_checked_as_before(device, shape, error, lent):
    k = _kernel()
    x = torch.randn(8, device=device)
    _call(k, x), _call(k, x)
    assert k._plans
    if error is None:
        torch.testing.assert_close(_call(k, x, shape=shape), x * 2 + 1)
    else:
        with pytest.raises(error, match="output_shapes"):
            _call(k, x, shape=shape)


def test_wrong_counts_and_types_after_a_plan_raise(device):
    k = _kernel()
    x = torch.randn(8, device=device)
    _call(k, x), _call(k, x)
    assert k._plans
    base = dict(grid=(8, 1, 1), threadgroup=(32, 1, 1), template=[("T", torch.float32)])
    with pytest.raises(ValueError, match="inputs"):
        k(inputs=[x, 2.0], output_shapes=[(8,)], output_dtypes=[torch.float32], **base)
    with pytest.raises(ValueError, match="output_shapes"):
        k(inputs=[x, 2.0, 1], output_shapes=[(8,), (8,)], output_dtypes=[torch.float32], **base)
    with pytest.raises(TypeError, match="inp"):
        k(inputs=[[1.0] * 8, 2.0, 1], output_shapes=[(8,)], output_dtypes=[torch.float32], **base)


def test_a_call_made_once_leaves_no_plan(device):
    k = _kernel()
    x = torch.randn(8, device=device)
    _call(k, x)
    assert not k._plans
    _call(k, x)
    assert len(k._plans) == 1


def test_numpy_inputs_never_use_a_tensor_plan(device):
    if device.type != "cpu":
        pytest.skip("NumPy arrays live on the CPU")
    k = _kernel()
    x = np.random.rand(16).astype(np.float32)
    for _ in range(2):
        out = _call(k, x)
        assert isinstance(out, np.ndarray)
        np.testing.assert_allclose(out, x * 2 + 1, rtol=1e-6)
    assert not k._plans


def test_poisoned_outputs_on_the_fast_path_show_unwritten_elements(device):
    k = kk.metal_kernel(name="fast_half", input_names=["inp"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = inp[i];")
    x = torch.randn(16, device=device)
    for _ in range(3):  # the third call runs on the plan
        out = k(inputs=[x], grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(16,)],
                output_dtypes=[torch.float32])[0]
        assert torch.equal(out[:8], x[:8]) and out[8:].isnan().all()


def test_repeated_calls_with_init_value_take_the_fast_path(device, monkeypatch, lent):
    """init_value (one for all outputs, or one or None per output) is part of a plan: repeated
    calls fill their fresh outputs without the general path, each value with its own plan."""
    k = kk.metal_kernel(name="fast_fill", input_names=["inp"], output_names=["out", "hits"],
                        source="uint i = thread_position_in_grid.x;"
                               "atomic_store_explicit(&out[i], inp[i], memory_order_relaxed);"
                               "atomic_fetch_add_explicit(&hits[i % 2], 1, memory_order_relaxed);",
                        atomic_outputs=True)
    x = torch.randn(16, device=device)

    def call(init):
        return k(inputs=[x], grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(16,), (3,)],
                 output_dtypes=[torch.float32, torch.int32], init_value=init)
    general = kernel.Kernel._call
    for init, rest, hits in [(5, 5.0, [9, 9, 5]), ([-1.5, 0], -1.5, [4, 4, 0]), (0, 0.0, [4, 4, 0])]:
        for i in range(4):
            if i == 3:  # by now a plan: the general path is not taken
                monkeypatch.setattr(kernel.Kernel, "_call", lambda *a, **kw: pytest.fail("general path"))
            out, got = call(init)
            assert torch.equal(out[:8], x[:8]) and (out[8:] == rest).all()
            assert got.tolist() == hits
            monkeypatch.setattr(kernel.Kernel, "_call", general)
    assert len(k._filled_plans) == 3 and all(len(p) == 1 for p in k._filled_plans.values())
    call(torch.tensor(2.0, device=device))  # a tensor value is not a key: the general path
    assert len(k._filled_plans) == 3


@pytest.mark.parametrize("dtype,value", [(torch.float64, 1.0), (torch.float64, 0), (torch.int64, -1),
                                         (torch.int64, 7), (torch.bfloat16, 1.5), (torch.float16, float("nan")),
                                         (torch.bool, True), (torch.uint8, 3), (torch.int16, -2)])
def test_init_values_of_every_dtype_on_the_fast_path(device, dtype, value, lent):
    """A plan's fill (on CUDA the driver's memset where the value's bytes repeat a 1-, 2- or
    4-byte pattern, else fill_) gives what fill_ gives, on every call, odd sizes and empty ones."""
    k = kk.metal_kernel(name="fast_fill_only", input_names=["inp"], output_names=["out", "two"],
                        source="uint i = thread_position_in_grid.x; if (i == 0) two[0] = inp[0];")
    x = torch.zeros(1, dtype=dtype, device=device)
    for n in (37, 37, 37, 0, 5):
        out, two = k(inputs=[x], grid=(1, 1, 1), threadgroup=(1, 1, 1), output_shapes=[(n,), (2,)],
                     output_dtypes=[dtype, dtype], template=[("T", dtype)], init_value=value)
        want = torch.full((n,), value, dtype=dtype, device=device)
        assert torch.equal(out, want) or (want.isnan().all() and out.isnan().all() and out.numel() == n)
        assert two[0] == 0 and (two[1] == value or (two[1] != two[1] and value != value))


def test_memset_patterns_match_fill():
    """The CUDA plans' memset of a fill is fill_'s bytes: (unit, pattern, units an element)."""
    from kernelkit.backends import Fill
    from kernelkit.backends.cuda import _memset
    assert _memset(Fill(0), torch.float64) == (4, 0, 2)
    assert _memset(Fill(1.0), torch.float32) == (4, 0x3F800000, 1)
    assert _memset(Fill(1.0), torch.float64) is None               # 00 .. 00 f0 3f: no 4-byte pattern
    assert _memset(Fill(-1), torch.int64) == (4, 0xFFFFFFFF, 2)
    assert _memset(Fill(1.5), torch.bfloat16) == (2, 0x3FC0, 1)
    assert _memset(Fill(True), torch.bool) == (1, 1, 1)
    assert _memset(Fill(3), torch.int8) == (1, 3, 1)
    assert _memset(Fill(torch.tensor(2.0)), torch.float32) is None  # a tensor value: fill_
    for dtype, value in [(torch.float32, -2.5), (torch.int32, 123456), (torch.float16, 0.1), (torch.int64, -1)]:
        unit, pattern, count = _memset(Fill(value), dtype)
        want = torch.empty(1, dtype=dtype).fill_(value).view(torch.uint8)
        assert torch.equal(torch.tensor(list(pattern.to_bytes(unit, "little")) * count, dtype=torch.uint8), want)


def test_the_compiled_cuda_launcher_builds_here():
    """CI has no GPU, but proves the launcher extension compiles and loads."""
    module = fastcall.module()
    assert not isinstance(module, str), module
    if not torch.cuda.is_available():  # no driver entry points set: an error, not a crash
        with pytest.raises(RuntimeError, match="driver entry points"):
            module.launch(0, 0, 1, 1, 1, 1, 1, 1, 0, 0, b"\0" * 8)
    with pytest.raises(TypeError):
        module.launch(0, 0)


@pytest.mark.parametrize("uses", [set(), {"a_shape", "a_strides", "a_ndim", "b_ndim"}])
def test_the_compiled_launcher_packs_as_the_python_packer(uses, lent):
    """fastcall.cpp fills the argument block from signature.fill_table(); it must give the
    bytes signature.packer() gives, for pointers, Python scalars, shapes, strides and ndim."""
    from kernelkit.arrays import dtype_of
    from kernelkit.signature import InputSpec, Signature

    module = lent
    f32, i32, f16, b = (dtype_of(n) for n in ("float32", "int32", "float16", "bool"))
    sig = Signature([("a", InputSpec(f16, False, False, 8)), ("s", InputSpec(f32, True, True, 0)),
                     ("b", InputSpec(f32, False, False, 8)), ("n", InputSpec(i32, True, True, 0)),
                     ("flag", InputSpec(b, True, True, 0))],
                    [("out", f32), ("idx", i32)], False, [], uses | {"thread_position_in_grid"})
    a = torch.randn(3, 4, 5).to(torch.float16).transpose(0, 2)
    inputs = [a, float(torch.randn(()).item()), torch.randn(7), -123456, True]
    outputs = [torch.empty(5), torch.empty(2, dtype=torch.int32)]
    tail = (1000, 3, 2, 4096)
    plan = module.make_plan(0, 0, (1, 1, 1, 1, 1, 1, 0), sig.fill_table(), sig.constant_block(tail),
                            (torch.empty(0), torch.empty(0, dtype=torch.int32)), torch.Size,
                            lambda i: 0, 0, (None, None), lambda err: None, None)
    assert module.pack(plan, inputs, outputs) == sig.packer()(inputs, outputs, tail)
    with pytest.raises(OverflowError, match="int32"):
        module.pack(plan, [a, 1.0, inputs[2], 2**40, True], outputs)


def test_inputs_and_output_dtypes_do_not_trade_places(device):
    """A Python float input and an output dtype given as `float` must not share a plan."""
    k1 = kk.metal_kernel(name="fast_boundary", input_names=["inp", "s"], output_names=["out"],
                         source="uint i = thread_position_in_grid.x; out[i] = inp[i] * s;")
    x = torch.randn(8, device=device)
    kw = dict(grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)])
    for _ in range(2):
        torch.testing.assert_close(k1(inputs=[x, 3.0], output_dtypes=[torch.float32], **kw)[0], x * 3)
    with pytest.raises(ValueError, match="inputs"):
        k1(inputs=[x], output_dtypes=[float, torch.float32], **kw)


def test_python_ints_beyond_int32_are_refused(device):
    k = kk.metal_kernel(name="fast_int", input_names=["inp", "n"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = inp[i] + n;")
    x = torch.zeros(4, device=device)
    kw = dict(grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)], output_dtypes=[torch.float32])
    for _ in range(2):
        assert k(inputs=[x, 2**31 - 1], **kw)[0].eq(2.0**31).all()
        with pytest.raises(OverflowError, match="'n' = 2147483648 does not fit int32"):
            k(inputs=[x, 2**31], **kw)


def test_the_compiled_plan_key_is_the_python_one(lent):
    module = lent
    x, h = torch.randn(2, 3), torch.randn(4, 4).half().t()
    g = torch.randn(3, requires_grad=True)
    cases = [
        ([x, 1.0, 2, True], [torch.float32], (8, 1, 1), (8, 1, 1), None),
        ((h, x[0]), ("float16", np.float32), (8, 2, 1), (4, 2, 1), [("T", torch.float16), ["n", 1]]),
        ([x], [torch.float32], (8, 1, 1), (8, 1, 1), (("b", True),)),
        ([g, x.to(torch.int64), torch.randn(()), x[:, :0]], [torch.float32], (8, 1, 1), (8, 1, 1), None),
        ([torch.nn.Parameter(x), np.ones(3)], [torch.float32], (1, 1, 1), (1, 1, 1), None),
        ([x], [torch.float32], [8, 1, 1], (8, 1, 1), None),  # a list grid: no key
        ([x], [torch.float32], (8, 1, 1), (8, 1, 1), {"T": 1}),  # a dict template: no key
        ([x], [torch.float32], (8, 1, 1), (8, 1, 1), [("T", [1])]),  # unhashable value: no key
        ([x], [torch.float32], (8, 1, 1), (8, 1, 1), [5]),  # a pair that is no sequence: no key
        (x, [torch.float32], (8, 1, 1), (8, 1, 1), None),  # inputs no list: no key
    ]
    for args in cases:
        expected = kernel._plan_key(*args)
        got = module.key(*args)
        if got is not None:
            try:
                hash(got)
            except TypeError:
                got = None
        assert got == expected, args


def test_without_the_extension_plans_run_in_python(device, monkeypatch):
    """No C++ compiler or Python headers: the same key and plans, computed in Python."""
    fastcall.module().set_call()  # Kernel's own tp_call (the next plan made puts fastcall's back)
    monkeypatch.setattr(fastcall, "_result", "no compiler (simulated)")
    monkeypatch.setattr(kernel, "_fast_call", kernel._python_call)
    if device.type == "cuda":
        from kernelkit.backends import cuda
        monkeypatch.setattr(cuda, "_launcher", "no compiler (simulated)")
    k = _kernel()
    for n in (64, 64, 64):
        x = torch.randn(n, device=device)
        torch.testing.assert_close(_call(k, x, shape=(2, n // 2)), (x * 2 + 1).view(2, n // 2))
    (plan,) = k._plans.values()
    assert isinstance(plan.__self__, kernel._Plan)
    with pytest.raises(ValueError, match="output_shapes"):
        _call(k, x, shape=(-1,))


def test_the_python_call_runs_a_c_plan(device):
    """A call that began on the Python path while another thread loaded the extension finds a C plan
    (a capsule) there: it runs it (the cache stress test's threads met this)."""
    k = _kernel()
    x = torch.randn(64, device=device)
    for _ in range(3):
        _call(k, x, shape=(2, 32))
    (plan,) = k._plans.values()
    assert not callable(plan)  # fastcall.cpp's plan
    outputs = kernel._python_call(k._plans, [x, 2.0, 1], [(2, 32)], [torch.float32], (64, 1, 1), (32, 1, 1),
                                  [("T", torch.float32)])
    torch.testing.assert_close(outputs[0], (x * 2 + 1).view(2, 32))


def test_plain_calls_with_a_plan_skip_the_python_call(device, monkeypatch):
    """Once fastcall is loaded, Kernel's tp_call runs a plain call's plan in C (none of
    __call__'s Python), and hands every other call to the Python __call__, which Dynamo traces."""
    k = _kernel()
    x = torch.randn(32, device=device)
    _call(k, x), _call(k, x)
    assert type(k).__call__ is kernel.Kernel.__dict__["__call__"]  # what Dynamo inlines
    taken = []
    monkeypatch.setattr(kernel, "_is_compiling", lambda: taken.append(1) or False)
    torch.testing.assert_close(_call(k, x), x * 2 + 1)
    torch.testing.assert_close(_call(k, x, stream=None, verbose=False, init_value=None, timeout=None,
                                     check_bounds=None, ensure_row_contiguous=None), x * 2 + 1)
    assert not taken
    for extra in ({"init_value": 0}, {"verbose": 0}, {"ensure_row_contiguous": True}):
        torch.testing.assert_close(_call(k, x, **extra), x * 2 + 1)
        assert len(taken) == 1
        taken.clear()
    with pytest.raises(TypeError, match="unexpected keyword argument 'grids'"):
        k(inputs=[x, 2.0, 1], grids=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(32,)],
          output_dtypes=[torch.float32], template=[("T", torch.float32)])
    with pytest.raises(TypeError, match="positional"):
        k([x, 2.0, 1])


@pytest.mark.filterwarnings("ignore:.*not differentiable")
def test_the_last_plan_runs_only_for_its_key(device, lent):
    """fastcall's tp_call runs the plan a kernel ran last where a call's key arguments read the
    same (by value, fingerprint or identity): a tensor changed in place, another scalar type or
    template value, a new grid find their own plan or the general path."""
    k = _kernel()
    x = torch.randn(4, 8, device=device)
    for s, b, dtype, grid in [(2.0, 1, torch.float32, 32)] * 3 + [(2, 1, torch.float32, 32)] * 3 + [
            (2.0, True, torch.float32, 32), (2.0, 1, torch.float16, 32), (2.0, 1, torch.float32, 16),
            (2.0, 1, torch.float32, 32)]:
        out = k(inputs=[x, s, b], grid=(grid, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(32,)],
                output_dtypes=[dtype], template=[("T", dtype)])[0]
        assert out.dtype == dtype
        torch.testing.assert_close(out[:grid].float(), (x.reshape(-1) * s + b)[:grid], rtol=1e-3, atol=1e-3)
    x.t_()  # the same tensor, no longer contiguous: copied by the general path every time
    for _ in range(3):
        torch.testing.assert_close(_call(k, x), x.contiguous().reshape(-1) * 2 + 1)
    x.t_()
    y = x.clone().requires_grad_()
    for t in (x, y, x, y):
        torch.testing.assert_close(_call(k, t), x.reshape(-1) * 2 + 1)
    assert len(k._plans) == 3  # (float, int), (int, int) and the grid of 16 came again: each a plan


def test_plain_calls_take_the_op_while_torch_compiles(device, monkeypatch):
    """torch.compiler.is_compiling() (non-strict export sets it in eager code) sends a plain call
    with a plan to the op as before, never to the plan."""
    k = _kernel()
    x = torch.randn(32, device=device)
    _call(k, x), _call(k, x)
    ops = []
    monkeypatch.setattr(kernel.Kernel, "_op_call", lambda self, *a: ops.append(a) or ["op"])
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    assert _call(k, x) == "op" and len(ops) == 1
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", False)
    torch.testing.assert_close(_call(k, x), x * 2 + 1)
    assert len(ops) == 1


def test_plans_launch_on_torchs_current_stream(device):
    """A plan reads torch's current stream at each call (its id in C++, the handle kept per id):
    work queued on that stream before the call is seen, whichever stream was current before."""
    if device.type != "cuda":
        pytest.skip("streams are CUDA's")
    k = _kernel()
    x = torch.zeros(1 << 16, device=device)
    _call(k, x), _call(k, x)
    side, other = torch.cuda.Stream(), torch.cuda.Stream()
    for i, s in enumerate([side, torch.cuda.current_stream(), side, other, side,
                           torch.cuda.current_stream()]):
        with torch.cuda.stream(s):
            torch.cuda._sleep(20_000_000)  # the stream busy: a launch on another would not wait
            x.fill_(float(i))
            out = _call(k, x)
        s.synchronize()
        assert out.eq(2 * i + 1).all(), i


def test_a_plan_refuses_too_few_inputs_or_outputs():
    """The C plan reads inputs and outputs by index: short sequences are an error, not a crash."""
    from kernelkit.arrays import dtype_of
    from kernelkit.signature import InputSpec, Signature

    module = fastcall.module()
    f32 = dtype_of("float32")
    sig = Signature([("a", InputSpec(f32, False, False, 8)), ("b", InputSpec(f32, False, False, 8))],
                    [("out", f32)], False, [], {"thread_position_in_grid"})
    args = ((1, 1, 1, 1, 1, 1, 0), sig.fill_table(), sig.constant_block((1, 1, 1, 0)))
    plan = module.make_plan(0, 0, *args, (torch.empty(0),), torch.Size, lambda i: 0, 0, (None,),
                            lambda err: None, None)
    with pytest.raises(ValueError, match="fewer inputs or outputs"):
        module.pack(plan, [torch.empty(2)], [torch.empty(2)])
    with pytest.raises(ValueError, match="fewer inputs or outputs"):
        module.pack(plan, [torch.empty(2), torch.empty(2)], [])
    with pytest.raises(ValueError, match="more output fields than prototypes"):
        module.make_plan(0, 0, *args, (), torch.Size, lambda i: 0, 0, (), lambda err: None,
                         None)
    with pytest.raises(TypeError, match="bad arguments"):  # a prepare entry per prototype
        module.make_plan(0, 0, *args, (torch.empty(0),), torch.Size, lambda i: 0, 0, (), lambda err: None,
                         None)


def test_every_output_empty_after_a_plan_runs_no_kernel(device, lent, monkeypatch):
    """A plan is made for a grid, not for shapes: a call with that grid whose outputs are all
    empty must take the general path (outputs made, no kernel), never launch into them."""
    k = _kernel()
    x = torch.randn(64, device=device)
    _call(k, x), _call(k, x)
    assert k._plans
    general = kernel.Kernel._call
    taken = []
    monkeypatch.setattr(kernel.Kernel, "_call", lambda *a, **kw: taken.append(1) or general(*a, **kw))
    for shape in [(0,), (4, 0), torch.Size([0, 3])]:
        out = _call(k, x, shape=shape)
        assert out.shape == shape and out.device.type == device.type
    assert len(taken) == 3
    torch.testing.assert_close(_call(k, x), x * 2 + 1)  # the plan still runs
    assert len(taken) == 3


def test_numpy_integer_shapes_after_a_plan(device, lent):
    """Shapes of other ints than Python's take the general path, which converts them."""
    k = _kernel()
    x = torch.randn(32, device=device)
    _call(k, x), _call(k, x)
    for shape in [(np.int64(4), 8), (np.int32(32),), (torch.tensor(2), 16)]:
        out = _call(k, x, shape=shape)
        assert out.shape == tuple(int(s) for s in shape)
        torch.testing.assert_close(out.reshape(-1), x * 2 + 1)


def _helper_function(name, restype, *argtypes):
    """One of fastcall_torch's functions through ctypes, holding the GIL as fastcall.cpp does
    (PYFUNCTYPE: an exception the function sets is raised)."""
    import ctypes
    helper = fastcall.torch_helper()
    if isinstance(helper, str):
        pytest.fail(f"fastcall_torch did not build: {helper}")
    return ctypes.PYFUNCTYPE(restype, *argtypes)(ctypes.cast(getattr(helper, name), ctypes.c_void_p).value)


def test_fastcall_torch_builds_here_and_is_lent():
    """CI has no GPU, but proves fastcall_torch.cpp compiles against the installed torch (CPU-only
    there), loads and is lent to the extension: repeated calls then read tensors in C++."""
    helper = fastcall.torch_helper()
    assert not isinstance(helper, str), helper
    assert fastcall.node_attach is not None  # custom_function's C++ node, built into that library
    x = torch.randn(2, 3)
    assert fastcall.module().key([x], [torch.float32], (8, 1, 1), (8, 1, 1), None)[4] == \
        (torch.float32, torch.device("cpu"), 2, True, False)


@pytest.mark.parametrize("shape", [(), (0,), (32,), (2, 3, 4)])
def test_fastcall_torch_allocates_as_torch_empty(device, shape):
    import ctypes
    empty = _helper_function("kk_empty", ctypes.py_object, ctypes.py_object,
                             ctypes.POINTER(ctypes.c_int64), ctypes.c_int64)
    for dtype in (torch.float32, torch.bfloat16, torch.int8, torch.bool):
        proto = torch.empty((), dtype=dtype, device=device)
        out = empty(proto, (ctypes.c_int64 * max(len(shape), 1))(*shape), len(shape))
        reference = torch.empty(shape, dtype=dtype, device=device)
        assert type(out) is torch.Tensor and not out.requires_grad
        assert (out.shape, out.stride(), out.dtype, out.device) == \
            (reference.shape, reference.stride(), dtype, reference.device)
    with pytest.raises(TypeError, match="expected a torch.Tensor"):
        empty(3, (ctypes.c_int64 * 1)(1), 1)


def test_fastcall_torch_allocates_through_torch_where_more_takes_part(device):
    """Deterministic fill of new memory and a TorchDispatchMode see fastcall_torch's outputs,
    as they see torch.empty's (it leaves the dispatcher out only where nothing else takes part)."""
    import ctypes

    from torch.utils._python_dispatch import TorchDispatchMode
    empty = _helper_function("kk_empty", ctypes.py_object, ctypes.py_object,
                             ctypes.POINTER(ctypes.c_int64), ctypes.c_int64)
    proto, shape = torch.empty((), device=device), (ctypes.c_int64 * 1)(64)
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert empty(proto, shape, 1).isnan().all()
    finally:
        torch.use_deterministic_algorithms(deterministic)

    class Seen(TorchDispatchMode):
        ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))
    with Seen():
        assert empty(proto, shape, 1).shape == (64,)
    assert Seen.ops == ["aten.empty.memory_format"]


def test_fastcall_torch_reads_a_view_as_torch_does(device):
    import ctypes
    view = _helper_function("kk_view", ctypes.c_int64, ctypes.py_object, ctypes.POINTER(ctypes.c_void_p),
                            ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
                            ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)))
    t = torch.randn(4, 5, 6, device=device).transpose(0, 2)[1:]
    data = ctypes.c_void_p()
    sizes, strides = ctypes.POINTER(ctypes.c_int64)(), ctypes.POINTER(ctypes.c_int64)()
    assert view(t, ctypes.byref(data), ctypes.byref(sizes), ctypes.byref(strides)) == 3
    assert data.value == t.data_ptr()
    assert (sizes[0], sizes[1], sizes[2]) == t.shape and (strides[0], strides[1], strides[2]) == t.stride()
    with pytest.raises(TypeError, match="expected a torch.Tensor"):
        view(np.ones(3), ctypes.byref(data), ctypes.byref(sizes), ctypes.byref(strides))



@pytest.mark.parametrize("init", [None, 1.5])  # outputs poisoned (the tests' default), or filled
@pytest.mark.filterwarnings("ignore:.*is not differentiable:UserWarning")
def test_a_plan_given_a_torch_func_tensor_fails_on_the_input(device, monkeypatch, lent, init):
    """A plan packs its inputs before it fills its outputs, so a tensor of a torch.func transform
    (which has no storage) fails as itself, not as a fill that the transform refuses."""
    k = kk.metal_kernel(name="fast_copy", input_names=["inp"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = inp[i];")

    def call(a):
        return k(inputs=[a], grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)],
                 output_dtypes=[torch.float32], init_value=init)[0]

    x = torch.randn(8, device=device)
    general = kernel.Kernel._call
    # grad's tensors read as requiring grad, vmap's as what they batch: plain calls like them
    for like, transform in ((x.clone().requires_grad_(), torch.func.grad(lambda a: call(a).sum())),
                            (x, torch.func.vmap(call))):
        for _ in range(3):  # a plan made
            call(like)
        monkeypatch.setattr(kernel.Kernel, "_call", lambda *a, **kw: pytest.fail("general path"))
        with pytest.raises(RuntimeError, match="doesn't have storage"):
            transform(x[None] if like is x else x)
        monkeypatch.setattr(kernel.Kernel, "_call", general)
