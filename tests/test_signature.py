"""Signature generation (SPEC §2): what the generated kernel takes, from what the body uses."""

import numpy as np
import pytest
import torch

import kernelkit as kk
from kernelkit.signature import ATTRIBUTES

COPY = """
    uint i = thread_position_in_grid.x;
    out[i] = inp[i];
"""


def _copy_kernel(source=COPY, **kw):
    return kk.metal_kernel(name="copy", input_names=["inp"], output_names=["out"], source=source, **kw)


def _msl_view(capsys, kernel, inputs, **kw):
    kernel(inputs=inputs, grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
           output_dtypes=[torch.float32], verbose=True, **kw)
    out = capsys.readouterr().out
    return out.split("// the C++ that is compiled")[0]


def test_inputs_typed_by_dtype_and_outputs_by_output_dtypes(capsys):
    view = _msl_view(capsys, _copy_kernel(), [torch.zeros(4, dtype=torch.float16)])
    assert "const device float16_t* inp [[buffer(0)]]" in view
    assert "device float* out [[buffer(1)]]" in view
    assert "uint3 thread_position_in_grid [[thread_position_in_grid]]" in view


def test_shape_helpers_only_when_mentioned(capsys):
    view = _msl_view(capsys, _copy_kernel(), [torch.zeros(4)])
    assert "inp_shape" not in view and "inp_strides" not in view and "inp_ndim" not in view
    body = COPY + "    // inp_strides in a comment does not count\n    int n = inp_ndim + inp_shape[0];\n"
    view = _msl_view(capsys, _copy_kernel(body), [torch.zeros(4)])
    assert "const constant int* inp_shape" in view
    assert "const constant int& inp_ndim" in view
    assert "inp_strides [[" not in view


def test_each_attribute_only_when_mentioned(capsys):
    view = _msl_view(capsys, _copy_kernel(), [torch.zeros(4)])
    assert [a for a in ATTRIBUTES if f"[[{a}]]" in view] == ["thread_position_in_grid"]
    # a longer identifier containing an attribute's name is not a mention (word boundary)
    body = "uint my_grid_size_x = 1;\n" + COPY
    view = _msl_view(capsys, _copy_kernel(body), [torch.zeros(4)])
    assert "[[grid_size]]" not in view


def test_all_twenty_attributes_have_their_types(capsys):
    body = COPY + "".join(f"    auto v_{a} = {a};\n" for a in ATTRIBUTES)
    view = _msl_view(capsys, _copy_kernel(body), [torch.zeros(4)])
    assert len(ATTRIBUTES) == 20
    for name, ctype in ATTRIBUTES.items():
        assert f"{ctype} {name} [[{name}]]" in view


def test_scalars_and_zero_d_arrays_by_reference(capsys):
    body = """
        uint i = thread_position_in_grid.x;
        out[i] = inp[i] * s + float(n) + (flag ? 1.0f : 0.0f) + z;
    """
    k = kk.metal_kernel(name="scal", input_names=["inp", "s", "n", "flag", "z"], output_names=["out"],
                        source=body)
    inp = torch.arange(4, dtype=torch.float32)
    z = torch.tensor(0.5)
    out = k(inputs=[inp, 2.0, 3, True, z], grid=(4, 1, 1), threadgroup=(4, 1, 1),
            output_shapes=[(4,)], output_dtypes=[torch.float32], verbose=True)[0]
    view = capsys.readouterr().out.split("// the C++ that is compiled")[0]
    assert "const constant float& s" in view
    assert "const constant int32_t& n" in view
    assert "const constant bool& flag" in view
    assert "const constant float& z" in view
    torch.testing.assert_close(out, inp * 2 + 3 + 1 + 0.5)


def test_templates_dtype_int_bool():
    body = """
        uint i = thread_position_in_grid.x;
        T v = T(inp[i]);
        out[i] = USE_BIAS ? float(v) + N : float(v);
    """
    k = kk.metal_kernel(name="tmpl", input_names=["inp"], output_names=["out"], source=body)
    inp = torch.tensor([1.7, 2.2, -3.5, 4.0])
    for use_bias, n in [(True, 256), (False, 7)]:
        out = k(inputs=[inp], template=[("T", torch.int32), ("N", n), ("USE_BIAS", use_bias)],
                grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
                output_dtypes=[torch.float32])[0]
        expected = inp.to(torch.int32).float() + (n if use_bias else 0)
        torch.testing.assert_close(out, expected)


def test_dtype_spellings_are_equivalent():
    k = _copy_kernel()
    x = torch.arange(4, dtype=torch.float64)
    for spec in (torch.float64, np.float64, np.dtype("float64"), "float64", "double"):
        out = k(inputs=[x], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
                output_dtypes=[spec])[0]
        assert out.dtype == torch.float64
        torch.testing.assert_close(out, x)


def test_numpy_in_numpy_out():
    x = np.arange(4, dtype=np.float32)
    out = _copy_kernel()(inputs=[x], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
                         output_dtypes=[np.float32])[0]
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, x)


def test_verbose_prints_the_compiled_source(capsys):
    _copy_kernel()(inputs=[torch.zeros(4)], grid=(4, 1, 1), threadgroup=(4, 1, 1),
                   output_shapes=[(4,)], output_dtypes=[torch.float32], verbose=True)
    compiled = capsys.readouterr().out.split("// the C++ that is compiled")[1]
    assert "custom_kernel_copy" in compiled and "#include <kernelkit/metal.h>" in compiled


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                   torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                                   torch.uint16, torch.uint32, torch.uint64, torch.bool])
def test_every_dtype_round_trips(device, dtype):
    if dtype == torch.bool:
        x = torch.rand(37, device=device) > 0.5
    elif dtype.is_floating_point:
        x = torch.randn(37, device=device).to(dtype)
    else:
        x = torch.randint(0, 100, (37,), device=device).to(dtype)
    out = _copy_kernel()(inputs=[x], grid=(37, 1, 1), threadgroup=(32, 1, 1),
                         output_shapes=[(37,)], output_dtypes=[dtype])[0]
    assert torch.equal(out, x)


def test_template_as_a_dict_each_call_its_own():
    body = "out[thread_position_in_grid.x] = N;"
    k = kk.metal_kernel(name="tdict", input_names=[], output_names=["out"], source=body)
    for n in (3, 7):
        out = k(inputs=[], template={"N": n}, grid=(2, 1, 1), threadgroup=(2, 1, 1),
                output_shapes=[(2,)], output_dtypes=[torch.int32], stream="cpu")[0]
        assert out.tolist() == [n, n]
