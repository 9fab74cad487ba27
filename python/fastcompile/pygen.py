"""Generated Python: the straight-line functions fastcompile writes at compile time (the torch
backend's runner and extern clusters, the tracer's input reader) are made here, each keeping
its text as ``.source`` for reports and debugging."""


def function(lines, name, params, filename, glob):
    """``def name(params): lines`` compiled in the namespace ``glob`` (its globals); the
    function, with ``.source`` its text."""
    text = "def %s(%s):\n    %s\n" % (name, params, "\n    ".join(lines))
    exec(compile(text, filename, "exec"), glob)
    fn = glob[name]
    fn.source = text
    return fn
