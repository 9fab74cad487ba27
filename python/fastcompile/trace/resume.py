"""Trace stage, resume: at a graph break, the transformed code object (calls
the partial graph, rebuilds the stack and locals, runs the breaking instruction
as is, then calls a resume function built from the original bytecode). In: the
traced state at the break; out: TraceResult.code (None when the frame must run
normally, e.g. a break inside a loop)."""

import dis
import sys
import types

from bytecode import Bytecode, FreeVar, Instr, Label, TryBegin

from . import guards as G
from .frame import localsplus_names
from . import graph_call
from .graph_call import graph_info
from .helpers import Lazy
from .interp import Tracer
from .runloop import Stop
from .sources import LocalSource
from .variables import NULL, Unsupported

PY311 = sys.version_info[:2] == (3, 11)
LOADS = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "DELETE_FAST")
_RESUME_CACHE = {}  # (code, offset, depth, live names) -> resume code


def reset():
    """Forget every resume function (fastcompile.reset())."""
    _RESUME_CACHE.clear()


def give_up(result, why):
    """No resume: the frame runs as plain Python (under the guards traced so far)."""
    result.code = None
    result.target = None
    result.breaks[-1].reason += "; %s: the frame runs normally" % why


def _call(n):
    return ([Instr("PRECALL", n)] if PY311 else []) + [Instr("CALL", n)]


def _make_fn(code, f_globals, closure):
    return types.FunctionType(code, f_globals, code.co_name, None, closure)


def resume_after_break(result, code, f_globals, f_builtins, closure, f_locals, tracer):
    top = getattr(tracer, "top_frame", None)
    if top is None or not hasattr(top, "cur"):
        return give_up(result, "break before the first instruction")
    idx = top.cur
    ins = top.instrs[idx]
    if ins.opname.startswith("LOAD_"):
        # e.g. an input the tracer cannot take (a meta tensor, one that requires grad): a resume
        # function would start with the same load and break again, resume after resume
        return give_up(result, "break at a load (%s)" % ins.opname)
    for j in top.instrs:
        if "BACKWARD" in j.opname and j.offset > ins.offset and j.argval <= ins.offset:
            return give_up(result, "graph break inside a loop")
    if ins.offset in top.protected:
        return give_up(result, "graph break inside a try/with block")
    if code.co_cellvars:
        return give_up(result, "resume of a frame with cell variables is not implemented")
    if code.co_flags & (0x20 | 0x80 | 0x100 | 0x200):
        return give_up(result, "generator frame")
    # restart: trace again up to the breaking instruction
    t2 = Tracer(
        code,
        f_globals,
        f_builtins,
        closure,
        f_locals,
        stop_at=idx,
        autograd=tracer.autograd,
        core_only=tracer.core_only,
    )
    if tracer.fx is None:
        t2.replay = iter(tracer.eager_log)  # the first trace's eager runs, not run again
    try:
        t2.run()
        return give_up(result, "restart did not reach the break")
    except Stop as s:
        frame = s.frame
    except Unsupported as e:
        return give_up(result, "restart failed (%s)" % e.reason)
    stack = list(frame.stack)
    consumed = {"CALL": (ins.arg or 0) + 2, "CALL_FUNCTION_EX": 3 + ((ins.arg or 0) & 1)}.get(ins.opname, 1)
    if any(v is NULL for v in stack[: len(stack) - consumed]):
        return give_up(result, "a pending call below the break on the stack")
    names = localsplus_names(code)
    nfree = len(code.co_freevars)
    bound = list(frame.locals)
    changed = [
        n
        for n in bound
        if not isinstance(frame.locals[n], Lazy) and getattr(frame.locals[n], "source", None) != _local_src(t2, n)
    ]
    try:
        run = graph_call.build(
            t2, [v for v in stack if v is not NULL] + [frame.locals[n] for n in changed], frame.user_stack()
        )
    except Unsupported as e:
        return give_up(result, e.reason)
    try:
        result.code = _transformed(code, f_globals, run, names, nfree, stack, changed, bound, top, idx)
    except Unsupported as e:
        return give_up(result, e.reason)
    except RuntimeError as e:  # bytecode could not assemble it (e.g. stack depth in a with-block)
        return give_up(result, "the resume code could not be assembled (%s)" % e)
    result.guards = t2.guards and G.dedupe(t2.guards)
    result.program = G.compile_program(result.guards)
    result.graphs = graph_info(t2, run)


def _local_src(tracer, name):
    return LocalSource(name, tracer.slots[name]) if name in tracer.slots else None


def _abstract(code, instrs):
    bc = Bytecode.from_code(code)
    real = [x for x in bc if isinstance(x, Instr)]
    if [x.name for x in real] != [i.opname for i in instrs]:
        raise Unsupported("bytecode and dis disagree on %s" % code.co_name)
    return bc, real


def _transformed(code, f_globals, run, names, nfree, stack, changed, bound, top, idx):
    bc, real = _abstract(code, top.instrs)
    ins = top.instrs[idx]
    out = []
    if nfree:
        out.append(Instr("COPY_FREE_VARS", nfree))
    out.append(Instr("RESUME", 0))
    out += [Instr("PUSH_NULL"), Instr("LOAD_CONST", run)]
    for s in run.slots:
        name = names[s]
        out.append(Instr("LOAD_DEREF", FreeVar(name)) if s >= len(names) - nfree else Instr("LOAD_FAST", name))
    out += _call(len(run.slots))
    j = 0
    for v in stack:
        if v is NULL:
            out += [Instr("PUSH_NULL"), Instr("SWAP", 2)]
        else:
            out += [Instr("COPY", 1), Instr("LOAD_CONST", j), Instr("BINARY_SUBSCR"), Instr("SWAP", 2)]
            j += 1
    for name in changed:
        out += [Instr("COPY", 1), Instr("LOAD_CONST", j), Instr("BINARY_SUBSCR"), Instr("STORE_FAST", name)]
        j += 1
    out.append(Instr("POP_TOP"))
    _locate(out, _graph_line(code, run, real[idx].lineno))
    prelude = len(out)
    depth = len(stack)
    op = ins.opname
    nxt = top.instrs[idx + 1].offset if idx + 1 < len(top.instrs) else None
    if "JUMP" in op and "_IF_" in op:
        other = Label()
        keep_on_jump = op.endswith("_OR_POP")
        out.append(_copy(real[idx], other))
        out += _resume_call(code, f_globals, nxt, depth - 1, bound, top)
        out.append(other)
        out += _resume_call(code, f_globals, ins.argval, depth if keep_on_jump else depth - 1, bound, top)
    else:
        k = idx - 1
        while op == "CALL" and k >= 0 and top.instrs[k].opname == "PRECALL":
            k -= 1
        if op == "CALL" and k >= 0 and top.instrs[k].opname == "KW_NAMES":
            out.append(_copy(real[k]))
        if op == "CALL" and PY311:
            out.append(Instr("PRECALL", ins.arg))
        out.append(_copy(real[idx]))
        if nxt is None:
            raise Unsupported("break at the last instruction")
        effect = (
            dis.stack_effect(ins.opcode, ins.arg, jump=False)
            if ins.opcode >= dis.HAVE_ARGUMENT
            else dis.stack_effect(ins.opcode)
        )
        if PY311 and op == "CALL":
            effect = -(ins.arg + 1)
        out += _resume_call(code, f_globals, nxt, depth + effect, bound, top)
    _locate(out[prelude:], real[idx].lineno)
    new = Bytecode(out)
    _copy_meta(new, bc)
    new.argnames = list(bc.argnames)
    new.argcount, new.posonlyargcount, new.kwonlyargcount = bc.argcount, bc.posonlyargcount, bc.kwonlyargcount
    new.flags = bc.flags
    return new.to_code()


def _locate(instrs, lineno):
    """Line numbers for tracebacks through the transformed code (instructions copied from the
    original keep their own location)."""
    for x in instrs:
        if isinstance(x, Instr) and not (isinstance(x.lineno, int) and x.lineno > 0):  # unset
            x.lineno = lineno


def _graph_line(code, run, default):
    """The last line of the frame's own code that put an op into the graph (else default)."""
    own = {ln for _, ln in dis.findlinestarts(code) if ln is not None}
    lines = [ln for fname, ln in getattr(run, "lines", ()) if fname == code.co_filename and ln in own]
    return max(lines) if lines else default


def _copy(instr, arg=None):
    new = Instr(instr.name, instr.arg if arg is None else arg) if instr.require_arg() else Instr(instr.name)
    new.location = instr.location
    return new


def _copy_meta(new, bc):
    for attr in ("name", "filename", "first_lineno", "freevars", "docstring"):
        setattr(new, attr, getattr(bc, attr))
    if hasattr(bc, "qualname"):
        new.qualname = bc.qualname
    new.cellvars = []


def _live(top, offset, bound):
    used = {i.argval for i in top.instrs if i.offset >= offset and i.opname in LOADS}
    return [n for n in bound if n in used]


def _resume_call(code, f_globals, offset, depth, bound, top):
    live = _live(top, offset, bound)
    rcode = resume_code(code, offset, depth, live, top)
    out = [Instr("BUILD_TUPLE", depth), Instr("PUSH_NULL"), Instr("SWAP", 2)]
    if code.co_freevars:
        out += [
            Instr("PUSH_NULL"),
            Instr("LOAD_CONST", _make_fn),
            Instr("LOAD_CONST", rcode),
            Instr("LOAD_CONST", f_globals),
        ]
        out += [Instr("LOAD_CLOSURE", FreeVar(n)) for n in code.co_freevars]
        out += [Instr("BUILD_TUPLE", len(code.co_freevars))] + _call(3)
    else:
        out.append(Instr("LOAD_CONST", _make_fn(rcode, f_globals, None)))
    out.append(Instr("SWAP", 2))
    out += [Instr("LOAD_FAST", n) for n in live]
    out += _call(1 + len(live)) + [Instr("RETURN_VALUE")]
    return out


def resume_code(code, offset, depth, live, top):
    """A code object running `code` from `offset`; args: (stack tuple, *live locals)."""
    key = (code, offset, depth, tuple(live))
    if key in _RESUME_CACHE:
        return _RESUME_CACHE[key]
    bc, real = _abstract(code, top.instrs)
    target = real[top.index_of[offset]]
    label = Label()
    body = []
    prefix_done = False
    for x in bc:
        if not prefix_done and isinstance(x, Instr) and x.name in ("MAKE_CELL", "COPY_FREE_VARS", "RESUME"):
            continue
        if isinstance(x, Instr):
            prefix_done = True
        if x is target:
            # jump in before the pseudo-instructions that open a try/with region at the target
            # (a TryBegin left behind the label is dead code to bytecode: depth 32768 there)
            k = len(body)
            while k and isinstance(body[k - 1], TryBegin):
                k -= 1
            body.insert(k, label)
        body.append(x)
    pre = []
    if code.co_freevars:
        pre.append(Instr("COPY_FREE_VARS", len(code.co_freevars)))
    pre.append(Instr("RESUME", 0))
    for i in range(depth):
        pre += [Instr("LOAD_FAST", "__fc_stack"), Instr("LOAD_CONST", i), Instr("BINARY_SUBSCR")]
    pre.append(Instr("JUMP_FORWARD", label))
    new = Bytecode(pre + body)
    _copy_meta(new, bc)
    new.name = "__resume_%s_at_%d" % (code.co_name, offset)
    if hasattr(new, "qualname"):
        new.qualname = new.name
    new.argnames = ["__fc_stack"] + list(live)
    new.argcount, new.posonlyargcount, new.kwonlyargcount = len(new.argnames), 0, 0
    new.flags = bc.flags & ~(0x04 | 0x08)
    rcode = new.to_code()
    _RESUME_CACHE[key] = rcode
    return rcode
