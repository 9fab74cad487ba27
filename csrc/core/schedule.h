/* Core, schedule: a compiled graph's levels and segments (externs split the graph).
 * In: a verified FcGraph. Out: FcSchedule, which the graph API runs a call by. */
#ifndef FC_SCHEDULE_H
#define FC_SCHEDULE_H

#include "ir.h"

struct FcPlan;

/* A segment: the core nodes between two rounds of extern calls. */
typedef struct {
    char *in_seg;             /* per graph node */
    int *inputs; int ninputs; /* nodes it reads from outside (inputs, externs, earlier segments) */
    int *outputs; int noutputs;
    struct FcPlan *plans;     /* runtime/plan.h: built per input key */
    int nplans;
} FcSegment;

typedef struct {
    int level;                /* 0: before any extern */
    FcSegment seg;
} FcSegmentSlot;

typedef struct {
    int *level;               /* per node */
    unsigned char *any_arg;   /* per graph input: only externs read it, so it may be any object */
    int nlevels;
    /* the call's schedule, by level (CSR: level L's entries are [start[L], start[L + 1])):
     * the externs that run before its segment, and the values released after it (their
     * last reader has run), so a freed buffer goes back to the pool within the call */
    int *ext_start, *ext_nodes;
    int *free_start, *free_nodes;
    FcSegmentSlot *segs;      /* one per level */
} FcSchedule;

/* Levels, then equal work merged within each level (fc_graph_cse, which
 * rewrites g), then one segment per level, then the call's schedule. s
 * starts zeroed; its arrays are PyMem (the caller frees them, also after a
 * failure). GIL held; 0, or -1 with an exception set. */
FC_INTERNAL int fc_schedule_build(FcGraph *g, FcSchedule *s);

#endif
