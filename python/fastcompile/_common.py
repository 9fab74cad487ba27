"""Helpers and tables that more than one stage reads: the tracer (trace/) and the torch
backend (backends/torch/). Plain functions, no state; torch is passed in, never imported."""


def hashable(x):
    """Whether x can be a dict key or a set member."""
    try:
        hash(x)
        return True
    except TypeError:
        return False


# torch dtype name -> NumPy dtype name, for every dtype the core stores as it is (bfloat16 is
# not here: the torch backend carries it as float32, the tracer leaves it to torch)
_TORCH_TO_NUMPY_NAMES = (
    ("bool", "bool"),
    ("int8", "int8"),
    ("int16", "int16"),
    ("int32", "int32"),
    ("int64", "int64"),
    ("uint8", "uint8"),
    ("uint16", "uint16"),
    ("uint32", "uint32"),
    ("uint64", "uint64"),
    ("float16", "float16"),
    ("float32", "float32"),
    ("float64", "float64"),
)


def torch_numpy_dtypes(torch):
    """{torch dtype: NumPy dtype name} for the dtypes the core holds as NumPy holds them."""
    return {getattr(torch, t): n for t, n in _TORCH_TO_NUMPY_NAMES if hasattr(torch, t)}


# torch's CPU ops that take a Python scalar (or a 0-d tensor of another float dtype) next to a
# float16/bfloat16 tensor as it is, in float32 (opmath: x * 100000 is 0 at 0); its other ops
# make it a float16 first (x - 0.1 is 0 at float16(0.1), x < 0.1 compares with float16(0.1)).
# Both torch routes read it: the tracer's (trace/record.py) and the backend's lowering
TORCH_OPMATH_SCALAR = frozenset(("mul", "div", "floordiv"))
