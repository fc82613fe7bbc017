"""Where a call runs: Triton's interpreter or a GPU, and what that GPU is.

The interpreter is read once from TRITON_INTERPRET, as Triton reads it when it decorates the kernels; the GPU's compute
capability and SM count, and Triton's driver, are asked once (at small M the forward is bound by host time); the
current device and stream are asked of torch directly. A test that plays another machine (a Hopper GPU, on a CPU)
patches the names here: the other files read them through this module.
"""

import functools
import os

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

try:  # host-side TMA descriptors (Triton >= 3.4)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # older Triton: only the pointer kernel
    TensorDescriptor = None

# Read once, like Triton itself: the interpreter is chosen when the kernels are decorated.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def tracing(t):
    """True for the fake and functional tensors torch.compile traces the triton_ops with: no data, no address."""
    t = getattr(t, "base", t)  # a TMA descriptor: its tensor
    return isinstance(t, (FakeTensor, FunctionalTensor))


@functools.cache
def driver():
    from triton.runtime import driver as runtime_driver
    return runtime_driver.active


# Cached: at small M the forward is bound by host time, and these queries cost µs per call.
@functools.lru_cache(maxsize=None)
def capability(device):
    return torch.cuda.get_device_capability(device)


@functools.lru_cache(maxsize=None)
def num_sms(device):
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 3  # interpreter: a few persistent programs, so each one loops over several tiles


# Where a launch goes and on which stream: the two queries Triton's CUDA driver makes, asked of torch directly (through
# the driver's lazy proxy they cost several µs a call in a model's forward).
current_device = getattr(torch._C, "_cuda_getDevice", None)
current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
