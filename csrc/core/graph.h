/* Graph: building and checking the core's graph.
 * In: ops and attributes from the graph API. Out: FcGraph nodes. */
#ifndef FC_GRAPH_H
#define FC_GRAPH_H

#include "ir.h"

/* Add op over inputs `in` (attrs may be NULL). Composite ops are decomposed
 * here. Returns the result's node index, or -1 with an exception set
 * (TypeError for dtypes NumPy rejects, AxisError for bad axes). */
FC_INTERNAL int fc_graph_add(FcGraph *g, int op, const int *in, int nin, const FcNode *attrs);
FC_INTERNAL int fc_graph_add_composite(FcGraph *g, int op, int x, const FcNode *attrs);
/* Structural checks; 0, or -1 with RuntimeError naming the broken node. */
FC_INTERNAL int fc_graph_verify(const FcGraph *g);
/* Deep copy into an uninitialized dst; 0, or -1 with MemoryError. */
FC_INTERNAL int fc_graph_copy(FcGraph *dst, const FcGraph *src);
/* Common subexpressions: every node that reads a node equal to an earlier
 * one (same op, result type, attributes and inputs) at the same level
 * (level[i]: the segment node i runs in, -1 when dead) reads the earlier one
 * instead, so the later copy is dead unless it is a graph output (an output
 * keeps its own node: each output is an array of its own). Nodes at
 * different levels stay apart: each is computed where its readers are,
 * rather than one stored in an early segment and read back in a later one.
 * Inputs, externs and extern items are never merged, and an extern's
 * arguments are never redirected (it may write or return them). Run on a
 * verified graph; the result verifies too, with the same node count and
 * order. Returns how many nodes were merged, or -1 with MemoryError. */
FC_INTERNAL int fc_graph_cse(FcGraph *g, const int *level);

#endif
