/* Runtime, autotuning: per kernel and launch shape, the fastest launch settings.
 * In: a kernel's prepared fc_launch and a run callback. Out: chosen settings
 * per launch shape and the table of timed candidates (see tune.h). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "disk.h"
#include "tune.h"

/* Each candidate runs once untimed (caches, page faults of fresh outputs,
 * waking the OpenMP team), then FC_TUNE_MIN_REPS..FC_TUNE_MAX_REPS timed
 * runs, as many as fit in FC_TUNE_BUDGET_US; the median is its time. */
#define FC_TUNE_MIN_REPS 3
#define FC_TUNE_MAX_REPS 25
#define FC_TUNE_BUDGET_US 3000.0

static int
same_shape(const FcTuneEntry *e, const fc_launch *L)
{
    if (e->nd_outer != L->nd_outer || e->nd_inner != L->nd_inner) {
        return 0;
    }
    return memcmp(e->oshape, L->oshape, L->nd_outer * sizeof(int64_t)) == 0 &&
           memcmp(e->ishape, L->ishape, L->nd_inner * sizeof(int64_t)) == 0;
}

FcTuneEntry *
fc_tune_find(FcTuneTable *t, const fc_launch *L)
{
    for (int i = 0; i < t->n; i++) {
        if (same_shape(&t->entries[i], L)) {
            return &t->entries[i];
        }
    }
    return NULL;
}

static void
add_cand(FcTuneEntry *e, int nthreads, int64_t block)
{
    for (int i = 0; i < e->ncands; i++) {
        if (e->cands[i].nthreads == nthreads && e->cands[i].block == block) {
            return;
        }
    }
    if (e->ncands < FC_TUNE_MAXCANDS) {
        e->cands[e->ncands].nthreads = nthreads;
        e->cands[e->ncands].block = block;
        e->cands[e->ncands].us = 0;
        e->ncands++;
    }
}

/* Thread counts 1, 2, 4, ... and max_threads itself; column blocks (only when
 * the runtime would use them: block0 != 0) from 16 to 512 wide and block0,
 * each narrower than the launch's last dim, and the launch whole. */
static void
make_cands(FcTuneEntry *e, const fc_launch *L, int max_threads, int64_t block0)
{
    static const int64_t widths[] = {16, 32, 64, 128, 256, 512};
    const int64_t w = L->oshape[L->nd_outer - 1];
    int64_t blocks[8];
    int nb = 0;
    blocks[nb++] = 0;
    if (block0 != 0) {
        blocks[nb++] = block0;
        for (size_t i = 0; i < sizeof(widths) / sizeof(widths[0]); i++) {
            if (widths[i] < w && widths[i] != block0) {
                blocks[nb++] = widths[i];
            }
        }
    }
    for (int b = 0; b < nb; b++) {
        for (int n = 1;; n *= 2) {
            int nt = n < max_threads ? n : max_threads;
            add_cand(e, nt, blocks[b]);
            if (nt >= max_threads) {
                break;
            }
        }
    }
}

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Times candidate c; returns the kernel's error code (0: timed). No GIL. */
static int
time_cand(FcTuneCand *c, FcTuneRun run, void *ctx)
{
    double ts[FC_TUNE_MAX_REPS];
    int reps = FC_TUNE_MIN_REPS, err;
    if ((err = run(ctx, c->nthreads, c->block)) != 0) {
        return err;
    }
    for (int r = 0; r < reps; r++) {
        double t0 = 1e3 * fc_disk_now_ms();
        if ((err = run(ctx, c->nthreads, c->block)) != 0) {
            return err;
        }
        ts[r] = 1e3 * fc_disk_now_ms() - t0;
        if (r == 0) {
            /* as many runs as the budget allows, between the bounds */
            double fit = FC_TUNE_BUDGET_US / (ts[0] > 1.0 ? ts[0] : 1.0);
            reps = fit < FC_TUNE_MIN_REPS ? FC_TUNE_MIN_REPS : fit > FC_TUNE_MAX_REPS ? FC_TUNE_MAX_REPS : (int)fit;
        }
    }
    qsort(ts, reps, sizeof(double), cmp_double);
    c->us = reps % 2 ? ts[reps / 2] : 0.5 * (ts[reps / 2 - 1] + ts[reps / 2]);
    return 0;
}

int
fc_tune_run(FcTuneTable *t, const fc_launch *L, int max_threads, int64_t block0, FcTuneRun run, void *ctx)
{
    FcTuneEntry e;
    int err = 0;
    memset(&e, 0, sizeof(e));
    e.nd_outer = L->nd_outer;
    e.nd_inner = L->nd_inner;
    memcpy(e.oshape, L->oshape, L->nd_outer * sizeof(int64_t));
    memcpy(e.ishape, L->ishape, L->nd_inner * sizeof(int64_t));
    make_cands(&e, L, max_threads < 1 ? 1 : max_threads, block0);

    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < e.ncands && err == 0; i++) {
        err = time_cand(&e.cands[i], run, ctx);
        if (e.cands[i].us < e.cands[e.best].us) {
            e.best = i;
        }
    }
    if (err == 0) {
        err = run(ctx, e.cands[e.best].nthreads, e.cands[e.best].block);   /* the outputs kept */
    }
    Py_END_ALLOW_THREADS
    if (err != 0) {
        return err;
    }
    if (fc_tune_find(t, L) != NULL) {
        return 0;       /* another thread tuned this shape meanwhile: one entry per shape */
    }
    if (t->entries == NULL) {
        t->entries = PyMem_Calloc(FC_TUNE_MAXENTRIES, sizeof(FcTuneEntry));
        if (t->entries == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    if (t->n < FC_TUNE_MAXENTRIES) {
        t->entries[t->n++] = e;
    }
    else {
        t->entries[t->next] = e;
        t->next = (t->next + 1) % FC_TUNE_MAXENTRIES;
    }
    return 0;
}

void
fc_tune_free(FcTuneTable *t)
{
    PyMem_Free(t->entries);
    t->entries = NULL;
    t->n = t->next = 0;
}

/* a tuple of n int64s; returns: new reference */
static PyObject *
shape_tuple(const int64_t *shape, int n)
{
    PyObject *r = PyTuple_New(n);
    for (int d = 0; r != NULL && d < n; d++) {
        PyObject *v = PyLong_FromLongLong(shape[d]);
        if (v == NULL) {
            Py_CLEAR(r);
            break;
        }
        PyTuple_SET_ITEM(r, d, v);
    }
    return r;
}

/* one Compiled.tuning record for e; returns: new reference */
static PyObject *
entry_dict(const FcTuneEntry *e, const char *name)
{
    const FcTuneCand *b = &e->cands[e->best];
    PyObject *cands = NULL, *outer = NULL, *inner = NULL, *d = NULL;
    if ((cands = PyList_New(e->ncands)) == NULL) {
        goto cleanup;
    }
    for (int c = 0; c < e->ncands; c++) {
        PyObject *v = Py_BuildValue("(iLd)", e->cands[c].nthreads, (long long)e->cands[c].block, e->cands[c].us);
        if (v == NULL) {
            goto cleanup;
        }
        PyList_SET_ITEM(cands, c, v);
    }
    if ((outer = shape_tuple(e->oshape, e->nd_outer)) == NULL ||
            (inner = shape_tuple(e->ishape, e->nd_inner)) == NULL) {
        goto cleanup;
    }
    d = Py_BuildValue("{s:s,s:O,s:O,s:i,s:L,s:d,s:K,s:O}", "kernel", name, "outer", outer, "inner", inner,
                      "threads", b->nthreads, "block", (long long)b->block, "us", b->us,
                      "uses", (unsigned long long)e->uses, "candidates", cands);
cleanup:
    Py_XDECREF(cands);
    Py_XDECREF(outer);
    Py_XDECREF(inner);
    return d;
}

int
fc_tune_report(const FcTuneTable *t, const char *name, PyObject *list)
{
    for (int i = 0; i < t->n; i++) {
        PyObject *d = entry_dict(&t->entries[i], name);
        int rc = d != NULL ? PyList_Append(list, d) : -1;
        Py_XDECREF(d);
        if (rc < 0) {
            return -1;
        }
    }
    return 0;
}
