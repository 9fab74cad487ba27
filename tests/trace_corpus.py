"""Small functions for tests/test_trace.py: each entry is
Case(fn, args_factory, graphs, breaks, torch) -- the expected number of graphs
and breaks of the first trace of fn(*args)."""

# (tests/golden/explain/*.txt quote line numbers of this file: FASTCOMPILE_UPDATE_GOLDEN=1 rewrites them)
import math

import numpy as np

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    torch = None

SCALE = 2.0
OFFSET = np.float32(0.5)


class Case:
    def __init__(self, fn, args, graphs=1, breaks=0, torch=False, kwargs=None):
        self.fn, self.args, self.graphs, self.breaks, self.torch = fn, args, graphs, breaks, torch
        self.kwargs = kwargs or {}
        self.name = fn.__name__


def a2(*shape, dtype=np.float32, seed=0):
    r = np.random.default_rng(seed)
    return (r.standard_normal(shape) + 0.1).astype(dtype)


def helper_scale(x, s=3.0):
    return x * s


def make_adder(c):
    def add(x):
        return x + c

    return add


ADD5 = make_adder(5.0)


class Affine:
    def __init__(self, w, b):
        self.w, self.b = w, b

    def apply(self, x):
        return x * self.w + self.b


AFF = Affine(2.0, -1.0)

# ---------------------------------------------------------------- NumPy, no break


def np_add(x, y):
    return x + y


def np_ops(x, y):
    return (x - y) * (x / (np.abs(y) + 1)) ** 2 // 1 % 3


def np_unary(x):
    return -np.exp(x) + np.tanh(x) - np.sqrt(np.abs(x)) + np.log1p(np.abs(x))


def np_where(x):
    return np.where(x > 0, x, 0.1 * x)


def np_maxmin(x, y):
    return np.maximum(x, y) - np.minimum(x, 0)


def np_sum_axis(x):
    return np.sum(x, axis=1)


def np_mean_keep(x):
    return x.mean(axis=-1, keepdims=True)


def np_var_std(x):
    return np.var(x, axis=0) + x.std(axis=1, ddof=1).sum()


def np_argmax(x):
    return np.argmax(x, axis=1), x.argmin(axis=0)


def np_any_all(x):
    return np.any(x > 1, axis=0), (x < 5).all()


def np_full_reduce(x):
    return x.sum(), np.max(x), np.prod(x[:2, :2])


def np_astype(x):
    return (x * 10).astype(np.int32) + 1


def np_transpose(x):
    return x.T + 1, np.transpose(x) * 2


def np_reshape(x):
    return x.reshape(-1) * 2, x.reshape(x.shape[0], -1).sum(axis=1)


def np_index(x):
    return x[1:, ::2] + x[0, ::2], x[None, :, 0]


def np_matmul(x, y):
    return np.tanh(x @ y.T), np.dot(x, y.T).sum()


def np_concat(x, y):
    return np.concatenate([x, y], axis=0) * 2, np.stack((x, y)).mean(axis=0)


def np_compare(x, y):
    return (x > y) & (x < 1) | ~(y == 0)


def np_int_ops(a, b):
    return (a & b) ^ (a | 3), a // 3, a % 5


def np_clip(x):
    return np.clip(x, -0.5, 0.5) * 2


def np_shape_value(x):
    return x * x.shape[1]


def np_ndim_dtype(x):
    return x * x.ndim if x.dtype == np.float32 else x


def np_len(x):
    return x / len(x)


def np_global(x):
    return x * SCALE + OFFSET


def np_closure(x):
    return ADD5(x) * 2


def np_nested(x):
    return helper_scale(x) + helper_scale(x, s=0.5)


def np_lambda(x):
    f = lambda v: v * 3 + 1
    return f(x) - f(1.0)


def np_defaults(x, a=2, *, b=3.0):
    return x * a + b


def np_varargs(*xs):
    return sum(xs) * len(xs)


def np_kwargs(x, **kw):
    return x * kw["scale"] + kw.get("shift", 0)


def np_loop_range(x):
    acc = x
    for i in range(4):
        acc = acc * 0.5 + i
    return acc


def np_loop_list(x, ys):
    out = []
    for y in ys:
        out.append(x + y)
    return out


def np_dict_build(x):
    return {"a": x + 1, "b": [x * 2, (x - 1, 3)], "n": 7}


def np_dict_iter(x):
    d = {"p": 1.0, "q": 2.0}
    for k, v in d.items():
        x = x + v
    return x


def np_method(x):
    return AFF.apply(x)


def np_if_python(x, flag):
    if flag:
        return x + 1
    return x - 1


def np_enumerate_zip(x, y):
    r = x
    for i, (a, b) in enumerate(zip([x, y], [y, x])):
        r = r + a * b * i
    return r


def np_tuple_unpack(x, y):
    a, b = y, x
    c, *rest = (a, b, x)
    return c + rest[0] + rest[1]


def np_comprehension(x):
    return [x * i for i in range(3)]


def np_inplace(x):
    y = x + 1
    y += 2
    y *= 3
    return y


def np_fstring(x, n):
    name = f"v{n}"
    return {name: x + n}


def np_math(x):
    return x * math.sqrt(2.0) + math.pi


def np_passthrough(x, y):
    return x, y * 2, None, "s"


def np_no_array(a, b):
    return a * b + 1


def np_float64(x):
    return x / 3 + 1


def np_int_array(a):
    return a * 2 + 1, a > 3


def np_shape_unpack(x):
    n, m = x.shape
    return x.reshape(m, n)


# ---------------------------------------------------------------- NumPy, breaks


def br_print_mid(x):
    y = x + 1
    print("y", y.shape)
    return y * 2


def br_print_start(x):
    print("start")
    return x * 2


def br_print_end(x):
    y = np.exp(x)
    print("end")
    return y


def br_data_branch(x):
    y = x * 2
    if y.sum() > 0:
        return y + 1
    return y - 1


def br_with(x):
    y = x * 2
    with np.errstate(all="ignore"):
        z = np.log(y)
    return z + 1


def br_loop(x):
    for i in range(3):
        print(i)
        x = x + i
    return x


LOG = []


def br_side_effect(x):
    y = x + 1
    LOG.append(1)
    return y


def br_global_store(x):
    global SCALE2
    y = x + 1
    SCALE2 = 3
    return y


def _inner_print(v):
    print("inner")
    return v * 2


def br_inlined(x):
    y = x + 1
    z = _inner_print(y)
    return z + 1


def br_item(x):
    y = np.exp(x)
    s = float(y.sum())
    return y * s


def br_closure_resume(x):
    y = ADD5(x)
    print("c")
    return y * 2


def br_kw_call(x):
    y = x + 1
    print("k", end="\n")
    return y


def np_cell_closure(x):
    k = 2.0
    scale = lambda v: v * k
    return scale(x) + k


def np_mixed_args(x, *rest, scale=2.0, **kw):
    return x * scale + sum(rest) + kw.get("b", 0)


def np_method_chain(x):
    return x.reshape(-1).astype(np.float64).clip(-1, 1).sum(axis=0)


def br_inside_with(x):
    y = x * 2
    with np.errstate(all="ignore"):
        print("w")
        z = np.log(y)
    return z + 1


def br_cellvar(x):
    k = 3.0
    y = x * k
    print("cell")
    return (lambda v: v + k)(y)


def br_two(x):
    y = x + 1
    print("a")
    y = y * 2
    print("b")
    return y - 1


NUMPY_CASES = [
    Case(np_add, lambda: (a2(3, 4), a2(3, 4, seed=1))),
    Case(np_ops, lambda: (a2(3, 4), a2(3, 4, seed=1))),
    Case(np_unary, lambda: (a2(5, 6),)),
    Case(np_where, lambda: (a2(5, 6),)),
    Case(np_maxmin, lambda: (a2(5, 6), a2(6, seed=2))),
    Case(np_sum_axis, lambda: (a2(5, 6),)),
    Case(np_mean_keep, lambda: (a2(5, 6),)),
    Case(np_var_std, lambda: (a2(5, 6),)),
    Case(np_argmax, lambda: (a2(5, 6),)),
    Case(np_any_all, lambda: (a2(5, 6),)),
    Case(np_full_reduce, lambda: (a2(5, 6),)),
    Case(np_astype, lambda: (a2(5, 6),)),
    Case(np_transpose, lambda: (a2(5, 6),)),
    Case(np_reshape, lambda: (a2(5, 6),)),
    Case(np_index, lambda: (a2(5, 6),)),
    Case(np_matmul, lambda: (a2(5, 6), a2(4, 6, seed=3))),
    Case(np_concat, lambda: (a2(5, 6), a2(5, 6, seed=3))),
    Case(np_compare, lambda: (a2(5, 6), a2(5, 6, seed=3))),
    Case(np_int_ops, lambda: (np.arange(12, dtype=np.int64).reshape(3, 4), np.arange(4, dtype=np.int64))),
    Case(np_clip, lambda: (a2(5, 6),)),
    Case(np_shape_value, lambda: (a2(5, 6),)),
    Case(np_ndim_dtype, lambda: (a2(5, 6),)),
    Case(np_len, lambda: (a2(5, 6),)),
    Case(np_global, lambda: (a2(5, 6),)),
    Case(np_closure, lambda: (a2(5, 6),)),
    Case(np_nested, lambda: (a2(5, 6),)),
    Case(np_lambda, lambda: (a2(5, 6),)),
    Case(np_defaults, lambda: (a2(5, 6),)),
    Case(np_defaults, lambda: (a2(5, 6), 4), kwargs={"b": 1.5}),
    Case(np_varargs, lambda: (a2(5, 6), a2(5, 6, seed=4), a2(5, 6, seed=5))),
    Case(np_kwargs, lambda: (a2(5, 6),), kwargs={"scale": 2.0, "shift": 1.0}),
    Case(np_loop_range, lambda: (a2(5, 6),)),
    Case(np_loop_list, lambda: (a2(5, 6), [1.0, a2(6, seed=6), 3])),
    Case(np_dict_build, lambda: (a2(5, 6),)),
    Case(np_dict_iter, lambda: (a2(5, 6),)),
    Case(np_method, lambda: (a2(5, 6),)),
    Case(np_if_python, lambda: (a2(5, 6), True)),
    Case(np_if_python, lambda: (a2(5, 6), 0)),
    Case(np_enumerate_zip, lambda: (a2(5, 6), a2(5, 6, seed=7))),
    Case(np_tuple_unpack, lambda: (a2(5, 6), a2(5, 6, seed=7))),
    Case(np_comprehension, lambda: (a2(5, 6),)),
    Case(np_inplace, lambda: (a2(5, 6),)),
    Case(np_fstring, lambda: (a2(5, 6), 3)),
    Case(np_math, lambda: (a2(5, 6),)),
    Case(np_passthrough, lambda: (a2(5, 6), a2(5, 6, seed=8))),
    Case(np_no_array, lambda: (3, 4), graphs=0),
    Case(np_float64, lambda: (a2(5, 6, dtype=np.float64),)),
    Case(np_int_array, lambda: (np.arange(10, dtype=np.int32),)),
    Case(np_shape_unpack, lambda: (a2(5, 6),)),
    Case(br_print_mid, lambda: (a2(5, 6),), breaks=1),
    Case(br_print_start, lambda: (a2(5, 6),), graphs=0, breaks=1),
    Case(br_print_end, lambda: (a2(5, 6),), breaks=1),
    Case(br_data_branch, lambda: (a2(5, 6),), breaks=1),
    Case(br_with, lambda: (a2(5, 6),), breaks=1),
    Case(br_loop, lambda: (a2(5, 6),), graphs=0, breaks=1),
    Case(br_side_effect, lambda: (a2(5, 6),), breaks=1),
    Case(br_global_store, lambda: (a2(5, 6),), breaks=1),
    Case(br_inlined, lambda: (a2(5, 6),), breaks=1),
    Case(br_item, lambda: (a2(5, 6),), breaks=1),
    Case(br_closure_resume, lambda: (a2(5, 6),), breaks=1),
    Case(br_kw_call, lambda: (a2(5, 6),), breaks=1),
    Case(np_cell_closure, lambda: (a2(5, 6),)),
    Case(np_mixed_args, lambda: (a2(5, 6), 1.0, a2(6, seed=9)), kwargs={"scale": 0.5, "b": 2.0}),
    Case(np_method_chain, lambda: (a2(5, 6),)),
    Case(br_inside_with, lambda: (a2(5, 6),), breaks=1),
    Case(br_cellvar, lambda: (a2(5, 6),), graphs=0, breaks=1),
    Case(br_two, lambda: (a2(5, 6),), breaks=1),
]

# ---------------------------------------------------------------- torch

TORCH_CASES = []
if torch is not None:
    torch.manual_seed(0)

    def t2(*shape, dtype=None):
        return torch.randn(*shape, dtype=dtype or torch.float32)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(16, 4)
            self.drop = nn.Dropout(0.2)

        def forward(self, x):
            return self.fc2(self.drop(self.act(self.fc1(x))))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(8)
            self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])
            self.seq = nn.Sequential(nn.Linear(8, 8), nn.SiLU(), nn.ReLU())
            self.emb = nn.Embedding(10, 8)
            self.sm = nn.Softmax(dim=-1)

        def forward(self, x, idx):
            h = self.ln(x + self.emb(idx))
            for layer in self.layers:
                h = h + layer(h)
            return self.sm(self.seq(h)), F.log_softmax(h, dim=1)

    MLP_M = MLP().eval().requires_grad_(False)
    BLOCK_M = Block().eval().requires_grad_(False)

    def th_add(x, y):
        return x + y * 2

    def th_funcs(x):
        return torch.exp(x) + torch.tanh(x) - torch.sigmoid(x) * torch.relu(x)

    def th_methods(x):
        return x.exp().sum(dim=1, keepdim=True) + x.mean(-1, keepdim=True) + x.abs().max()

    def th_F(x):
        return F.gelu(x) + F.silu(x) + F.relu(x) + F.softmax(x, dim=-1)

    def th_gelu_tanh(x):
        return F.gelu(x, approximate="tanh")

    def th_int_div(a, b):
        return a / b, a // 2, (a > 2).float()

    def th_casts(x):
        return x.double() * 2, (x * 10).long(), x.to(torch.float64)

    def th_view(x):
        return x.view(-1) * 2, x.permute(1, 0) + 1, x.unsqueeze(0).sum(0)

    def th_matmul(x, y):
        return torch.tanh(x @ y.T), torch.matmul(x, y.T)

    def th_where(x):
        return torch.where(x > 0, x, x * 0.1), torch.clamp(x, -0.5, 0.5)

    def th_var(x):
        return x.var(dim=1), torch.std(x, dim=0, unbiased=False)

    def th_layer_norm(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)

    def th_linear(x, w):
        return F.linear(x, w)

    def th_mlp(x):
        return MLP_M(x)

    def th_block(x, idx):
        return BLOCK_M(x, idx)

    def th_size(x):
        return x * x.size(0) + x.dim()

    def th_cat(x, y):
        return torch.cat([x, y], dim=0).softmax(-1)

    def th_break_print(x):
        y = torch.relu(x)
        print("t")
        return y + 1

    def th_break_item(x):
        y = x.exp()
        if y.sum().item() > 0:
            return y
        return -y

    TORCH_CASES = [
        Case(th_add, lambda: (t2(3, 4), t2(3, 4)), torch=True),
        Case(th_funcs, lambda: (t2(3, 4),), torch=True),
        Case(th_methods, lambda: (t2(3, 4),), torch=True),
        Case(th_F, lambda: (t2(3, 4),), torch=True),
        Case(th_gelu_tanh, lambda: (t2(3, 4),), torch=True),
        Case(th_int_div, lambda: (torch.arange(12).reshape(3, 4), torch.arange(1, 5)), torch=True),
        Case(th_casts, lambda: (t2(3, 4),), torch=True),
        Case(th_view, lambda: (t2(3, 4),), torch=True),
        Case(th_matmul, lambda: (t2(3, 4), t2(5, 4)), torch=True),
        Case(th_where, lambda: (t2(3, 4),), torch=True),
        Case(th_var, lambda: (t2(3, 4),), torch=True),
        Case(th_layer_norm, lambda: (t2(3, 4), t2(4), t2(4)), torch=True),
        Case(th_linear, lambda: (t2(3, 4), t2(6, 4)), torch=True),
        Case(th_mlp, lambda: (t2(5, 8),), torch=True),
        Case(th_block, lambda: (t2(5, 8), torch.randint(0, 10, (5,))), torch=True),
        Case(th_size, lambda: (t2(3, 4),), torch=True),
        Case(th_cat, lambda: (t2(3, 4), t2(2, 4)), torch=True),
        Case(th_break_print, lambda: (t2(3, 4),), breaks=1, torch=True),
        Case(th_break_item, lambda: (t2(3, 4),), breaks=1, torch=True),
    ]

CASES = NUMPY_CASES + TORCH_CASES
