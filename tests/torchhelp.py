"""Shared by the torch backend's tests (test_torch_backend.py, test_torch_lowering.py,
test_torch_training.py, gpu/test_cuda_torch.py): the backend compile, the models and the SGD
step. Importing it skips the importing module where torch is not installed.
"""

import copy
import functools

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the torch backend is not tested")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from fastcompile.backends import torch as fbt  # noqa: E402


def compile_fc(fn, record=None, **kw):
    return torch.compile(fn, backend=functools.partial(fbt.backend, record=record, **kw), dynamic=False)


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ----------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d, 64), nn.GELU(), nn.Linear(64, 64), nn.SiLU(), nn.LayerNorm(64), nn.Linear(64, 10)
        )

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean((2, 3)))


class Block(nn.Module):
    def __init__(self, d=64, h=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class RNN(nn.Module):
    """An Elman cell written by hand, unrolled over the sequence by Dynamo."""

    def __init__(self, d=16, hidden=32):
        super().__init__()
        self.wx = nn.Linear(d, hidden)
        self.wh = nn.Linear(hidden, hidden, bias=False)
        self.out = nn.Linear(hidden, 4)

    def forward(self, x):
        h = torch.zeros(x.shape[0], self.wh.in_features)
        for t in range(x.shape[1]):
            h = torch.tanh(self.wx(x[:, t]) + self.wh(h))
        return self.out(h)


MODELS = {
    "mlp": (MLP, lambda: torch.randn(16, 32)),
    "cnn_bn": (CNN, lambda: torch.randn(4, 3, 16, 16)),
    "transformer_block": (Block, lambda: torch.randn(2, 16, 64)),
    "rnn_loop": (RNN, lambda: torch.randn(8, 6, 16)),
}
TOL = dict(rtol=1e-4, atol=1e-4)


FRONTENDS = ["torch.compile", "fastcompile.compile"]


def _frontend(frontend, module, record):
    """The module compiled by torch.compile(backend=fastcompile) or by fastcompile.compile."""
    if frontend == "torch.compile":
        return compile_fc(module, record=record)
    import fastcompile

    fastcompile.reset()
    return fastcompile.compile(module)


def _fc_graphs(module):
    """fastcompile.compile's traced graphs of module.forward (GraphInfo), newest entry first,
    and the torch-backend runners of those traced in autograd mode."""
    from fastcompile import _C

    graphs, runners = [], []
    for entry in _C.code_entries(type(module).forward.__code__):
        assert not entry.info.result.breaks, entry.info.result.breaks
        for g in entry.info.result.graphs:
            graphs.append(g)
            runners.extend(getattr(g.compiled, "runners", ()))
    return graphs, runners


def sgd_steps(pairs, x):
    """One SGD step (lr 0.1, MSE against one random target) for each (model, how to call it);
    per pair: (loss, gradients, updated parameters, buffers)."""
    results, target = [], []
    for model, run in pairs:
        loss, grads = _sgd_step(model, run, torch.optim.SGD(model.parameters(), lr=0.1), x, target)
        results.append(
            (loss, grads, [p.detach().clone() for p in model.parameters()], [b.clone() for b in model.buffers()])
        )
    return results


def _training_pair(name):
    """(eager model, a copy to compile, input) of MODELS[name], in training mode, seeded."""
    torch.manual_seed(0)
    cls, make = MODELS[name]
    ref = cls().train()
    return ref, copy.deepcopy(ref), make()


def _sgd_step(model, run, opt, x, target):
    """One step of opt on MSE against target[0] (drawn at the first call, when target is
    empty); returns (loss, gradients)."""
    out = run(x)
    if not target:
        target.append(torch.randn_like(out))
    loss = F.mse_loss(out, target[0])
    opt.zero_grad()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    opt.step()
    return loss.detach(), grads
