"""Trace stage, interpreter: symbolic execution of one frame's bytecode
(CPython 3.11 and 3.12) into a graph, guards and, at an unsupported point, a
break. In: code, globals, builtins, closure, bound locals; out: the final
state (return value or the stack and locals at the break).

Tracer is one class written in parts, one mixin per job: frame.py (the top frame),
runloop.py (the loop, value wrapping), opcodes.py, calls.py (calls, inlining),
record.py (array ops into the graph); helpers.py holds what they share."""

import builtins as _builtins

from fastcompile.graph import Graph

from . import sources as S
from .calls import CallHandlers
from .frame import FrameSetup, localsplus_names
from .helpers import sync_torch
from .opcodes import OpcodeHandlers
from .record import ArrayRecorder
from .runloop import RunLoop
from .variables import Unsupported


class Tracer(FrameSetup, RunLoop, OpcodeHandlers, CallHandlers, ArrayRecorder):
    """One trace of one frame. stop_at: index of the top-frame instruction to
    stop before (a restart after a break)."""

    def __init__(self, code, f_globals, f_builtins, closure, f_locals, stop_at=None, autograd=False, core_only=False):
        sync_torch()
        self.core_only = core_only  # no optional switch to autograd mode (NeedAutograd.optional)
        self.code, self.f_globals, self.closure = code, f_globals, closure or ()
        self.f_builtins = f_builtins if isinstance(f_builtins, dict) else vars(f_builtins or _builtins)
        self.f_locals, self.stop_at = f_locals, stop_at
        self.graph = Graph()
        self.inputs = []  # (source, kind, example) per graph input
        self.scalar_exprs = []  # the ScalarVars of float arithmetic (scalar_op), in trace order
        self.extern_results = []  # per extern of the graph, in order: (eager result, run function,
        #                             its array arguments' examples), from tracing
        self.arrays = {}  # (id(array), source), autograd mode id(array) -> ArrayVar of inputs
        self.keep = []  # objects whose id is a key above
        self.guards = []
        self.wrapped = {}  # source -> Var
        self.op_count = 0
        self.lines = []  # (filename, lineno) of each op
        self.steps = 0
        self.slots = {n: i for i, n in enumerate(localsplus_names(code))}
        # autograd mode: every torch op is recorded as a node of an FX graph, which runs through
        # aot_autograd and the core (forward and backward) instead of the core graph above
        self.autograd = autograd
        if autograd:
            import torch.fx
        self.fx = torch.fx.Graph() if autograd else None
        self.fx_placeholders = []
        if autograd:
            self.guard(S.CallSource(torch.is_grad_enabled), "eq", torch.is_grad_enabled())
        # the core route's eager runs, in order: (function, argument examples, result). A restart
        # after a graph break (resume.resume_after_break) replays them instead of running them
        # again: an extern with side effects (BatchNorm in training mode under no_grad updates
        # its running statistics) would run twice on the first call
        self.eager_log = []
        self.replay = None

    # ------------------------------------------------------------------ errors

    def unsupported(self, reason, whole_frame=False):
        raise Unsupported(reason, self.frame.user_stack(), whole_frame)
