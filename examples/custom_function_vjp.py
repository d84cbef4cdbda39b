"""A differentiable op from two kernels: kk.custom_function with a vjp (MLX's
mx.custom_function), trained through torch.autograd.

    python examples/custom_function_vjp.py
"""

import torch

import kernelkit as kk

device = "cuda" if torch.cuda.is_available() else "cpu"

# y = x * sigmoid(x) (SiLU) and its derivative, one thread per element
forward = kk.metal_kernel(
    name="silu", input_names=["x"], output_names=["y"],
    source="""
        uint i = thread_position_in_grid.x;
        float v = x[i];
        y[i] = v / (1.0f + metal::exp(-v));
    """,
)
backward = kk.metal_kernel(
    name="silu_vjp", input_names=["x", "cotangent"], output_names=["dx"],
    source="""
        uint i = thread_position_in_grid.x;
        float v = x[i];
        float s = 1.0f / (1.0f + metal::exp(-v));
        dx[i] = cotangent[i] * s * (1.0f + v * (1.0f - s));
    """,
)


def launch(kernel, *inputs):
    x = inputs[0]
    return kernel(inputs=list(inputs), grid=(x.numel(), 1, 1), threadgroup=(256, 1, 1),
                  output_shapes=[x.shape], output_dtypes=[x.dtype])[0]


@kk.custom_function
def silu(x):
    return launch(forward, x)


@silu.vjp
def silu_vjp(primals, cotangents, outputs):
    # one argument: primals is x itself, cotangents the output's cotangent
    return launch(backward, primals, cotangents)


x = torch.randn(10_000, device=device, requires_grad=True)
y = silu(x)
y.square().sum().backward()

reference = x.detach().clone().requires_grad_()
torch.nn.functional.silu(reference).square().sum().backward()
torch.testing.assert_close(y, torch.nn.functional.silu(reference))
torch.testing.assert_close(x.grad, reference.grad)
print(f"silu forward and gradient on {device}: ok")

# a few steps of gradient descent through the kernels
w = torch.zeros(256, device=device, requires_grad=True)
target = torch.linspace(0, 1, 256, device=device)
opt = torch.optim.SGD([w], lr=0.5)
for _ in range(100):
    opt.zero_grad()
    loss = (silu(w) - target).square().sum()
    loss.backward()
    opt.step()
assert loss.item() < 1e-3, loss.item()
print(f"fitted silu(w) to a target: loss {loss.item():.1e}")
