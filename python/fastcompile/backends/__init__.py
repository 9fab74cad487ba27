"""Backends: other frontends' graphs -> the fastcompile graph API.

``fastcompile.backends.torch``: the ``torch.compile(..., backend="fastcompile")`` backend
(FX graphs of aten ops in, compiled callables out). Importing this package does not import torch.
"""
