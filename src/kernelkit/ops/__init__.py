"""The seeds' kernels as ops, each written with the public API, each with a plain-torch reference."""

from .exp import exp, exp_reference, exp_strided
from .flash_attention import flash_attention, flash_attention_reference
from .grid_sample import grid_sample, grid_sample_seed, grid_sample_torch, grid_sample_vjp
from .linalg import cholesky, cholesky_ex, cholesky_reference, qr, qr_reference
from .matmul_add_relu import matmul_add_relu, matmul_add_relu_reference
from .mxfp8 import dequantize_mxfp8, mxfp8_matmul, quantize_mxfp8, quantize_mxfp8_reference

__all__ = ["exp", "exp_strided", "exp_reference", "grid_sample", "grid_sample_vjp", "grid_sample_seed",
           "grid_sample_torch", "matmul_add_relu", "matmul_add_relu_reference", "quantize_mxfp8",
           "dequantize_mxfp8", "quantize_mxfp8_reference", "mxfp8_matmul",
           "flash_attention", "flash_attention_reference", "cholesky", "cholesky_ex",
           "cholesky_reference", "qr", "qr_reference"]
