"""The graph API: the one contract between every frontend and the C core.

    g = Graph()
    x = g.input("float32", 2)
    y = g.call("gelu", x)
    g.output(g.call("sum", y, axis=-1))
    f = g.compile()
    (out,) = f(np.ones((4, 8), np.float32))

``ops()`` lists the op table (name -> arity, kind, meaning).
"""

from ._C import Compiled, Graph, Value, ops

__all__ = ["Graph", "Value", "Compiled", "ops"]
