/* Python-facing types: fastcompile.graph.Graph, Value, Compiled.
 * In: calls from Python. Out: the core's graph and the runtime's plans. */
#ifndef FC_API_H
#define FC_API_H

#include <Python.h>
#include "../core/ir.h"

/* Adds Graph, Value, Compiled and ops() to `module`. module: borrowed.
 * Returns 0, or -1 with an exception set. */
FC_INTERNAL int fc_api_init(PyObject *module);
/* Counters of view externs (Graph.extern view=): "views_made" in C, "views_by_function" where
 * the argument's layout differed and the function ran. Returns: new dict, or NULL + exception. */
FC_INTERNAL PyObject *fc_api_stats(void);

#endif
