"""The torch backend's aot_autograd decomposition table.

In: torch's aten decompositions. Out: ``decompositions()``, the table aot_autograd applies to a
graph before the lowering sees it.
"""

import functools

import torch

aten = torch.ops.aten


# core ops, or lowered by hand (gelu_backward: the core's gelu_grad): do not decompose them
_KEEP = ("silu", "softplus", "logsumexp", "gelu_backward")


@functools.lru_cache(maxsize=None)
def decompositions():
    """The aot_autograd decomposition table: core aten, plus normalizations and a few activations
    decomposed into ops the core fuses, minus what is itself a core op. Built once per process:
    every graph aot_autograd compiles asks for it."""
    from torch._decomp import core_aten_decompositions, get_decompositions

    table = dict(core_aten_decompositions())
    table.update(
        get_decompositions(
            [
                aten.native_layer_norm,
                aten.native_batch_norm,
                aten._native_batch_norm_legit,
                aten._native_batch_norm_legit_functional,
                aten._native_batch_norm_legit_no_training,
                aten.native_group_norm,
                aten.hardtanh,
                aten.leaky_relu,
                aten.elu,
                aten.hardsigmoid,
                aten.hardswish,
                aten.mish,
                aten.rms_norm,
            ]
        )
    )
    for name in _KEEP:
        packet = getattr(aten, name)
        for ov in packet.overloads():
            table.pop(getattr(packet, ov), None)
    # Its decomposition saves a logsumexp that the (not decomposed) fused backward misreads:
    # gradients through nn.MultiheadAttention come out wrong (torch 2.13, aot_autograd with
    # core_aten_decompositions, also with the aot_eager compiler). The fused op is an extern.
    table.pop(aten._scaled_dot_product_flash_attention_for_cpu.default, None)
    return table
