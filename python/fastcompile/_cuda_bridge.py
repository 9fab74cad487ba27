"""The torch side of running compiled graphs on CUDA (csrc/runtime/devarray.c calls it).

Imported by the C core only once a torch tensor reaches a compiled graph, so importing
fastcompile never imports torch. Outputs come from torch's caching allocator on the device's
current stream, the stream every kernel is launched on."""

import torch

TENSOR = torch.Tensor
_empty = torch.empty
_full = torch.full
_current_stream = torch.cuda.current_stream
_DEVICES = [torch.device("cuda", i) for i in range(16)]  # the runtime's device indices: 0-15


def empty(shape, dtype, dev):
    """A new tensor of torch ``dtype`` on CUDA device ``dev`` (an index); contents undefined."""
    return _empty(shape, dtype=dtype, device=_DEVICES[dev])


def full(value, dtype, dev):
    """A 0-d tensor holding ``value`` (a constant of the graph) on CUDA device ``dev``."""
    return _full((), value, dtype=dtype, device=dev)


# The stream as torch's C++ gives it (what inductor's generated code calls): no torch.cuda.Stream
# object built at each call, a few microseconds less per call. Older torch: through the object.
if callable(getattr(torch._C, "_cuda_getCurrentRawStream", None)):
    stream = torch._C._cuda_getCurrentRawStream
else:

    def stream(dev):
        """torch's current stream on CUDA device ``dev``, as the CUstream handle (an int)."""
        return _current_stream(dev).cuda_stream
