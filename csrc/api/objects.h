/* Graph API internals shared by graphobj.c (Graph, Value) and compiledobj.c (Compiled).
 * In: nothing. Out: the Graph object's layout and the helpers both files use. */
#ifndef FC_API_OBJECTS_H
#define FC_API_OBJECTS_H

#include <Python.h>
#include "../core/ir.h"

typedef struct {
    PyObject_HEAD
    FcGraph g;
    PyObject *externs;        /* list of callables; extern nodes index it */
    PyObject *views;          /* list beside externs: None, or bytes holding an FcViewSpec */
    PyObject *origin;         /* str "file:line" where the graph was made */
} GraphObject;

/* Graph.extern(fn, x, view=...): when x is an array of in_shape and in_strides
 * (elements; strides of size-1 dims are not compared), the extern's result is
 * the view of x's memory with out_shape, out_strides and offset (elements),
 * made in C without calling fn; otherwise fn runs. Graph.extern checks that
 * the view stays inside x's extent. */
typedef struct {
    int in_nd, out_nd;
    int64_t in_shape[FC_MAXDIM], in_strides[FC_MAXDIM];
    int64_t out_shape[FC_MAXDIM], out_strides[FC_MAXDIM];
    int64_t offset;
} FcViewSpec;

/* The view spec's view of a (borrowed), or NULL without an exception where a
 * does not match it or a byte size overflows (then the extern's function runs).
 * Returns: new reference, or NULL with an exception set where NumPy fails to
 * make the array. */
FC_INTERNAL PyObject *fc_api_view_apply(const FcViewSpec *vs, PyObject *a);

/* "file:line" of the Python code calling us. Returns: new reference. */
FC_INTERNAL PyObject *fc_api_caller_origin(void);
/* obj: borrowed; a dtype name, NumPy dtype or scalar type. Returns the FcDType, or -1 + TypeError. */
FC_INTERNAL int fc_api_parse_dtype(PyObject *obj);
/* The graph as text, one node per line. Returns: new reference. */
FC_INTERNAL PyObject *fc_api_dump_graph(const FcGraph *g);
/* Graph.compile(): a Compiled over a private copy of graph. graph: borrowed; returns: new reference. */
FC_INTERNAL PyObject *fc_api_compiled_new(GraphObject *graph);
/* Readies the Compiled type and adds it to module m (borrowed). 0, or -1 with an exception set. */
FC_INTERNAL int fc_api_compiled_init(PyObject *m);

#endif
