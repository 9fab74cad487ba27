"""Trace stage, codegen: at a graph break, the transformed code object (calls
the partial graph, rebuilds the stack and locals, runs the breaking instruction
as is, then calls a resume function built from the original bytecode). In: the
traced state at the break; out: TraceResult.code."""


def resume_after_break(result, code, f_globals, f_builtins, closure, f_locals, tracer):
    result.code = None
