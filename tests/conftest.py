"""One test body, every backend: the `device` fixture runs a test on the CPU backend
and, where there is an NVIDIA GPU, on CUDA.

Without a GPU, every kernel a test builds is also compiled for Hopper (sm_90; sm_90a for
tensor-op kernels, as on an H100) with NVRTC, so a GPU-only compile error fails CI.
"""

import os

os.environ.setdefault("KERNELKIT_POISON_OUTPUTS", "1")  # unwritten outputs read as NaN / max

import pytest  # noqa: E402
import torch  # noqa: E402

HAS_GPU = torch.cuda.is_available()
SM90_CHECK = os.environ.get("KERNELKIT_TEST_SM90", "1") != "0" and not HAS_GPU


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    if request.param == "cuda" and not HAS_GPU:
        pytest.skip("needs an NVIDIA GPU")
    return torch.device(request.param)


# A Metal kernel that uses simdgroup_matrix numbers its lanes in mma.sync's order on an NVIDIA GPU
# (target_cuda.h, KK_MMA_LANE_ORDER); this header turns that on, for tests of what lanes see.
@pytest.fixture(params=["", "#include <metal_simdgroup_matrix>\n"], ids=["hardware-lanes", "mma-lanes"])
def lane_order(request):
    return request.param


def pytest_configure(config):
    config.addinivalue_line("markers", "host_only: its kernels need the host's C++ library "
                                       "(<vector>...): not compiled for sm_90")


_HOST_ONLY = [False]  # the running test is marked host_only


@pytest.fixture
def nvrtc():
    """NVRTC, for tests that compile for a GPU without one (kk.compile_for); skips where NVIDIA's
    wheels are not installed (the wheel's CI job)."""
    try:
        from kernelkit.backends import cuda
        module = cuda._nvrtc()
        cuda.cuda_include_dirs()
    except Exception as e:  # noqa: BLE001 - any missing piece of NVIDIA's install
        pytest.skip(f"NVRTC unavailable: {e}")
    return module


@pytest.fixture(autouse=True)
def _fresh_kernels(request):
    """Each test builds its kernels anew: kernelkit keeps one kernel per constructor arguments
    process-wide (with its plans), and tests count plans and variants."""
    from kernelkit import kernel
    kernel._PREPARED.clear()
    _HOST_ONLY[0] = request.node.get_closest_marker("host_only") is not None


@pytest.fixture(autouse=True, scope="session")
def _compile_every_kernel_for_sm90():
    """Wrap variant building: each kernel built for the CPU is compiled for sm_90 too."""
    if not SM90_CHECK:
        yield
        return
    from kernelkit import cross
    from kernelkit.kernel import Kernel

    original = Kernel._build

    def build(self, *args, **kwargs):
        variant = original(self, *args, **kwargs)
        if _HOST_ONLY[0]:
            return variant
        cross.build_for(self, variant.signature, "sm_90")  # sm_90a for tensor-op kernels
        return variant

    Kernel._build = build
    yield
    Kernel._build = original
