/* fastcompile 0.1.0: kernel fc_6d158dd3f5270354
 * graph 5b7971e5004a27e2
 * 2 ops, reduction, 2 sweeps per row */
#include "fc_kernel.h"

typedef union {
    struct {
        double part0[FC_COLS_SPLIT_THREADS][FC_COLS];
    } l1;
} fc_6d158dd3f5270354_cparts;

static void
fc_6d158dd3f5270354_cols(const fc_launch *L, int64_t lo, int64_t hi, int *err, fc_6d158dd3f5270354_cparts *P, int tid, int nth)
{
    int fc_err = 0;
    int64_t jlo = 0, jhi = L->n_inner;
    int64_t oidx[FC_LAUNCH_MAXDIM];
    float *restrict out0 = (float *)L->ptr[0];
    const float *restrict in0 = (const float *)L->ptr[1];
    if (P != NULL) {
        fc_thread_range(L->n_inner, 16, tid, nth, &jlo, &jhi);
    }
    fc_unravel(lo, L->nd_outer, L->oshape, oidx);
    for (int64_t o = lo; o < hi;) {
        int64_t nb = fc_run_length(L->nd_outer, L->oshape, oidx, hi - o);
        nb = nb < FC_COLS ? nb : FC_COLS;
        const int64_t ob0 = fc_offset(L->nd_outer, oidx, L->ostride[0]);
        const int64_t ob1 = fc_offset(L->nd_outer, oidx, L->ostride[1]);
        float t0[FC_COLS];
        double acc0[FC_COLS];
        for (int64_t b = 0; b < nb; b++) {
            acc0[b] = 0;
        }
        {
            float acc0_f[FC_COLS];
            for (int64_t b = 0; b < nb; b++) {
                acc0_f[b] = 0;
            }
            int blk = 0;
            int64_t idx[FC_LAUNCH_MAXDIM];
            fc_unravel(jlo, L->nd_inner, L->ishape, idx);
            for (int64_t j0 = jlo; j0 < jhi;) {
                const int64_t len = fc_run_length(L->nd_inner, L->ishape, idx, jhi - j0);
                const float *restrict p1 = in0 + ob1 + fc_offset(L->nd_inner, idx, L->istride[1]);
                const int64_t s1 = L->istride[1][L->nd_inner - 1];
                for (int64_t i = 0; i < len; i++) {
                    if (i + FC_COLS_AHEAD < len) {
                        for (int64_t b = 0; b < nb; b += 16) {
                            __builtin_prefetch(p1 + (i + FC_COLS_AHEAD) * s1 + b, 0);
                        }
                    }
                    #pragma omp simd
                    for (int64_t b = 0; b < nb; b++) {
                        const float x1 = p1[i * s1 + b];
                        const float t1 = fc_exp_f32(x1);
                        acc0_f[b] += t1;
                    }
                    if (++blk == 16) {
                        for (int64_t b = 0; b < nb; b++) {
                            acc0[b] += (double)acc0_f[b];
                            acc0_f[b] = 0;
                        }
                        blk = 0;
                    }
                }
                j0 += len;
                fc_advance(L->nd_inner, L->ishape, idx, len);
            }
            for (int64_t b = 0; b < nb; b++) {
                acc0[b] += (double)acc0_f[b];
            }
        }
        if (P != NULL) {
            for (int64_t b = 0; b < nb; b++) {
                P->l1.part0[tid][b] = acc0[b];
            }
            #pragma omp barrier
            for (int64_t b = 0; b < nb; b++) {
                acc0[b] = 0;
                for (int t = 0; t < nth; t++) {
                    acc0[b] += P->l1.part0[t][b];
                }
            }
            #pragma omp barrier
        }
        for (int64_t b = 0; b < nb; b++) {
            t0[b] = (float)acc0[b];
        }
        if (P == NULL || tid == 0) {
            for (int64_t b = 0; b < nb; b++) {
                out0[ob0 + b] = t0[b];
            }
        }
        o += nb;
        fc_advance(L->nd_outer, L->oshape, oidx, nb);
    }
    fc_report(err, fc_err);
}

static void
fc_6d158dd3f5270354_cols_all(const fc_launch *L, int64_t lo, int64_t hi, int *err)
{
    fc_6d158dd3f5270354_cols(L, lo, hi, err, NULL, 0, 1);
}

typedef struct {
    double part0[FC_MAX_THREADS];
} fc_6d158dd3f5270354_parts;

static void
fc_6d158dd3f5270354_body(const fc_launch *L, int64_t lo, int64_t hi, int *err, fc_6d158dd3f5270354_parts *P, int tid, int nth)
{
    int fc_err = 0;
    int64_t jlo = 0, jhi = L->n_inner;
    int64_t oidx[FC_LAUNCH_MAXDIM];
    float *restrict out0 = (float *)L->ptr[0];
    const float *restrict in0 = (const float *)L->ptr[1];
    if (P != NULL) {
        fc_thread_range(L->n_inner, 16, tid, nth, &jlo, &jhi);
    }
    fc_unravel(lo, L->nd_outer, L->oshape, oidx);
    for (int64_t o = lo; o < hi; o++) {
        const int64_t ob0 = fc_offset(L->nd_outer, oidx, L->ostride[0]);
        const int64_t ob1 = fc_offset(L->nd_outer, oidx, L->ostride[1]);
        /* sweep 1: 1 reduction */
        double acc0 = 0;
        {
            int64_t idx[FC_LAUNCH_MAXDIM];
            fc_unravel(jlo, L->nd_inner, L->ishape, idx);
            for (int64_t j0 = jlo; j0 < jhi;) {
                const int64_t len = fc_run_length(L->nd_inner, L->ishape, idx, jhi - j0);
                int64_t off[2];
                fc_offsets(L->nd_inner, idx, L->istride, 2, off);
                const float *restrict p1 = in0 + ob1 + off[1];
                const int64_t s1 = L->istride[1][L->nd_inner - 1];
                int64_t i0 = 0;
                if (s1 == 1 && len >= (2 * FC_LANES)) {
                    double acc0_l[(2 * FC_LANES)];
                    for (int l = 0; l < (2 * FC_LANES); l++) {
                        acc0_l[l] = 0;
                    }
                    while (i0 + (2 * FC_LANES) <= len) {
                        const int64_t iend = len - i0 > 16 * (2 * FC_LANES) ? i0 + 16 * (2 * FC_LANES) : len;
                        float acc0_f[(2 * FC_LANES)];
                        for (int l = 0; l < (2 * FC_LANES); l++) {
                            acc0_f[l] = 0;
                        }
                        for (; i0 + (2 * FC_LANES) <= iend; i0 += (2 * FC_LANES)) {
                            #pragma omp simd
                            for (int l = 0; l < (2 * FC_LANES); l++) {
                                const int64_t i = i0 + l;
                                const float x1 = p1[i];
                                const float t1 = fc_exp_f32(x1);
                                acc0_f[l] += t1;
                            }
                        }
                        for (int l = 0; l < (2 * FC_LANES); l++) {
                            acc0_l[l] += (double)acc0_f[l];
                        }
                    }
                    for (int l = 0; l < FC_LANES; l++) {
                        acc0_l[l] += acc0_l[l + FC_LANES];
                    }
                    #if FC_LANES > 8
                    for (int l = 0; l < 8; l++) {
                        acc0_l[l] += acc0_l[l + 8];
                    }
                    #endif
                    for (int l = 0; l < 4; l++) {
                        acc0_l[l] += acc0_l[l + 4];
                    }
                    for (int l = 0; l < 2; l++) {
                        acc0_l[l] += acc0_l[l + 2];
                    }
                    acc0_l[0] += acc0_l[1];
                    acc0 += acc0_l[0];
                }
                #pragma omp simd safelen(1)   /* strided, or a unit run's last elements: scalar, quick to compile */
                for (int64_t i = i0; i < len; i++) {
                    const float x1 = p1[i * s1];
                    const float t1 = fc_exp_f32(x1);
                    acc0 += (double)t1;
                }
                j0 += len;
                fc_advance(L->nd_inner, L->ishape, idx, len);
            }
        }
        if (P != NULL) {
            P->part0[tid] = acc0;
            #pragma omp barrier
            acc0 = 0;
            for (int t = 0; t < nth; t++) {
                acc0 += P->part0[t];
            }
            #pragma omp barrier
        }
        const float t0 = (float)acc0;
        if (P == NULL || tid == 0) {
            out0[ob0] = t0;
        }
        fc_advance(L->nd_outer, L->oshape, oidx, 1);
    }
    fc_report(err, fc_err);
}

static void
fc_6d158dd3f5270354_rows(const fc_launch *L, int64_t lo, int64_t hi, int *err)
{
    fc_6d158dd3f5270354_body(L, lo, hi, err, NULL, 0, 1);
}

FC_EXPORT int
fc_6d158dd3f5270354(const fc_launch *L)
{
    int err = 0;
    if (fc_use_cols(L, 0x0ULL)) {
        if (fc_use_cols_split(L)) {
            fc_6d158dd3f5270354_cparts P;
            #pragma omp parallel num_threads(L->nthreads)
            fc_6d158dd3f5270354_cols(L, 0, L->n_outer, &err, &P, omp_get_thread_num(), omp_get_num_threads());
        }
        else {
            FC_RUN_RANGES(L, L->n_outer, 16, fc_6d158dd3f5270354_cols_all, &err);
        }
        return err;
    }
    if (fc_use_split(L)) {
        fc_6d158dd3f5270354_parts P;
        #pragma omp parallel num_threads(L->nthreads)
        fc_6d158dd3f5270354_body(L, 0, L->n_outer, &err, &P, omp_get_thread_num(), omp_get_num_threads());
    }
    else {
        FC_RUN_RANGES(L, L->n_outer, 1, fc_6d158dd3f5270354_rows, &err);   /* rows: no rounding */
    }
    return err;
}
