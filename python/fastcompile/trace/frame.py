"""Trace stage, frame: a trace's frames (instructions, locals, cells, stack) and its start
from the real frame: the top frame's locals and closure cells, read lazily. In: a code object and
the frame's locals; out: the Frame the run loop executes."""

import dis
import linecache

from . import sources as S
from .helpers import Lazy
from .variables import CellVar


def localsplus_names(code):
    names, i = [], 0
    while True:
        try:
            names.append(code._varname_from_oparg(i))
        except (IndexError, ValueError):
            return names
        i += 1


def protected_offsets(code):
    """Offsets covered by the exception table (try/except/with bodies)."""
    out = set()
    instrs = list(dis.get_instructions(code))
    for e in dis._parse_exception_table(code):
        if _cleanup_only(instrs, e.target):
            continue  # 3.12 inlined comprehension: restores a local, reraises
        out.update(range(e.start, e.end, 2))
    return out


def _cleanup_only(instrs, target):
    started = False
    for ins in instrs:
        if ins.offset == target:
            started = True
        if started:
            if ins.opname in ("PUSH_EXC_INFO", "WITH_EXCEPT_START", "CHECK_EXC_MATCH"):
                return False
            if ins.opname == "RERAISE":
                return True
    return False


class Frame:
    def __init__(self, code, f_globals, f_builtins, parent, top=False):
        self.code, self.f_globals, self.f_builtins, self.parent, self.top = code, f_globals, f_builtins, parent, top
        every = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
        self.instrs = [i for i in every if i.opname != "EXTENDED_ARG"]
        self.index_of = {ins.offset: k for k, ins in enumerate(self.instrs)}
        # a jump to an instruction with EXTENDED_ARG prefixes targets the first prefix
        prefixes = []
        for ins in every:
            if ins.opname == "EXTENDED_ARG":
                prefixes.append(ins.offset)
            else:
                self.index_of.update((p, self.index_of[ins.offset]) for p in prefixes)
                prefixes = []
        self.protected = protected_offsets(code)
        self.locals = {}  # name -> Var (fast locals)
        self.cells = {}  # name -> CellVar (cellvars and freevars)
        self.stack = []
        self.pc = 0
        self.kw_names = None
        self.lineno = code.co_firstlineno

    def user_stack(self):
        out, f = [], self
        while f is not None:
            line = linecache.getline(f.code.co_filename, f.lineno).strip()
            out.append((f.code.co_filename, f.lineno, f.code.co_name, line))
            f = f.parent
        return out[::-1]


class FrameSetup:
    """Tracer methods: the top frame, set up from the real one."""

    # ------------------------------------------------------------------ running

    def run(self):
        code = self.code
        frame = Frame(code, self.f_globals, self.f_builtins, None, top=True)
        names = localsplus_names(code)
        nfree = len(code.co_freevars)
        for i, name in enumerate(code.co_freevars):
            cell_src = S.ClosureSource(name, i)
            frame.cells[name] = CellVar(external=True, loader=self._loader(name, cell_src))
        for name in names[: len(names) - nfree]:
            if name in self.f_locals:
                src = S.LocalSource(name, self.slots[name])
                frame.locals[name] = Lazy(self._loader(name, src))
        self.frame = self.top_frame = frame
        return self.run_frame(frame)

    def _loader(self, name, src):
        def load():
            if isinstance(src, S.ClosureSource):
                try:
                    value = self.closure[src.index].cell_contents
                except (ValueError, IndexError):
                    value = self.f_locals[name]
            else:
                value = self.f_locals[name]
            return self.wrap(value, src)

        return load
