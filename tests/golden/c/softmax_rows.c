/* fastcompile 0.1.0: kernel fc_7de556dbb39873a3
 * graph f2870a10aed5ddf8
 * 7 ops, reduction, 3 sweeps per row */
#include "fc_kernel.h"

typedef struct {
    float part0[FC_MAX_THREADS];
    int nan0[FC_MAX_THREADS];
    double part1[FC_MAX_THREADS];
} fc_7de556dbb39873a3_parts;

static void
fc_7de556dbb39873a3_body(const fc_launch *L, int64_t lo, int64_t hi, int *err, fc_7de556dbb39873a3_parts *P, int tid, int nth)
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
        float acc0 = -INFINITY;
        int nan0 = 0;
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
                if (s1 == 1 && len >= FC_LANES) {
                    float acc0_l[FC_LANES];
                    int nan0_l[FC_LANES];
                    for (int l = 0; l < FC_LANES; l++) {
                        acc0_l[l] = -INFINITY;
                        nan0_l[l] = 0;
                    }
                    for (; i0 + FC_LANES <= len; i0 += FC_LANES) {
                        #pragma omp simd
                        for (int l = 0; l < FC_LANES; l++) {
                            const int64_t i = i0 + l;
                            const float x1 = p1[i];
                            const float t2 = x1;
                            acc0_l[l] = t2 > acc0_l[l] ? t2 : acc0_l[l];
                            nan0_l[l] |= t2 != t2;
                        }
                    }
                    #if FC_LANES > 8
                    for (int l = 0; l < 8; l++) {
                        acc0_l[l] = acc0_l[l + 8] > acc0_l[l] ? acc0_l[l + 8] : acc0_l[l];
                        nan0_l[l] |= nan0_l[l + 8];
                    }
                    #endif
                    for (int l = 0; l < 4; l++) {
                        acc0_l[l] = acc0_l[l + 4] > acc0_l[l] ? acc0_l[l + 4] : acc0_l[l];
                        nan0_l[l] |= nan0_l[l + 4];
                    }
                    for (int l = 0; l < 2; l++) {
                        acc0_l[l] = acc0_l[l + 2] > acc0_l[l] ? acc0_l[l + 2] : acc0_l[l];
                        nan0_l[l] |= nan0_l[l + 2];
                    }
                    acc0_l[0] = acc0_l[1] > acc0_l[0] ? acc0_l[1] : acc0_l[0];
                    nan0_l[0] |= nan0_l[1];
                    acc0 = acc0_l[0] > acc0 ? acc0_l[0] : acc0;
                    nan0 |= nan0_l[0];
                }
                #pragma omp simd safelen(1)   /* strided, or a unit run's last elements: scalar, quick to compile */
                for (int64_t i = i0; i < len; i++) {
                    const float x1 = p1[i * s1];
                    const float t2 = x1;
                    acc0 = t2 > acc0 ? t2 : acc0;
                    nan0 |= t2 != t2;
                }
                j0 += len;
                fc_advance(L->nd_inner, L->ishape, idx, len);
            }
        }
        if (P != NULL) {
            P->part0[tid] = acc0;
            P->nan0[tid] = nan0;
            #pragma omp barrier
            acc0 = -INFINITY;
            nan0 = 0;
            for (int t = 0; t < nth; t++) {
                acc0 = P->part0[t] > acc0 ? P->part0[t] : acc0;
                nan0 |= P->part0[t] != P->part0[t];
                nan0 |= P->nan0[t];
            }
            #pragma omp barrier
        }
        const float t0 = nan0 ? (float)NAN : (float)acc0;
        /* sweep 2: 1 reduction */
        double acc1 = 0;
        {
            int64_t idx[FC_LAUNCH_MAXDIM];
            fc_unravel(jlo, L->nd_inner, L->ishape, idx);
            for (int64_t j0 = jlo; j0 < jhi;) {
                const int64_t len = fc_run_length(L->nd_inner, L->ishape, idx, jhi - j0);
                int64_t off[2];
                fc_offsets(L->nd_inner, idx, L->istride, 2, off);
                float *restrict p0 = out0 + ob0 + off[0];
                const int64_t s0 = L->istride[0][L->nd_inner - 1];
                const float *restrict p1 = in0 + ob1 + off[1];
                const int64_t s1 = L->istride[1][L->nd_inner - 1];
                int64_t i0 = 0;
                if (s0 == 1 && s1 == 1 && len >= (2 * FC_LANES)) {
                    double acc1_l[(2 * FC_LANES)];
                    for (int l = 0; l < (2 * FC_LANES); l++) {
                        acc1_l[l] = 0;
                    }
                    while (i0 + (2 * FC_LANES) <= len) {
                        const int64_t iend = len - i0 > 16 * (2 * FC_LANES) ? i0 + 16 * (2 * FC_LANES) : len;
                        float acc1_f[(2 * FC_LANES)];
                        for (int l = 0; l < (2 * FC_LANES); l++) {
                            acc1_f[l] = 0;
                        }
                        for (; i0 + (2 * FC_LANES) <= iend; i0 += (2 * FC_LANES)) {
                            #pragma omp simd
                            for (int l = 0; l < (2 * FC_LANES); l++) {
                                const int64_t i = i0 + l;
                                const float x1 = p1[i];
                                const float t2 = x1;
                                const float t3 = (t2 - t0);
                                const float t4 = fc_exp_f32(t3);
                                p0[i] = t4;
                                acc1_f[l] += t4;
                            }
                        }
                        for (int l = 0; l < (2 * FC_LANES); l++) {
                            acc1_l[l] += (double)acc1_f[l];
                        }
                    }
                    for (int l = 0; l < FC_LANES; l++) {
                        acc1_l[l] += acc1_l[l + FC_LANES];
                    }
                    #if FC_LANES > 8
                    for (int l = 0; l < 8; l++) {
                        acc1_l[l] += acc1_l[l + 8];
                    }
                    #endif
                    for (int l = 0; l < 4; l++) {
                        acc1_l[l] += acc1_l[l + 4];
                    }
                    for (int l = 0; l < 2; l++) {
                        acc1_l[l] += acc1_l[l + 2];
                    }
                    acc1_l[0] += acc1_l[1];
                    acc1 += acc1_l[0];
                }
                #pragma omp simd safelen(1)   /* strided, or a unit run's last elements: scalar, quick to compile */
                for (int64_t i = i0; i < len; i++) {
                    const float x1 = p1[i * s1];
                    const float t2 = x1;
                    const float t3 = (t2 - t0);
                    const float t4 = fc_exp_f32(t3);
                    p0[i * s0] = t4;
                    acc1 += (double)t4;
                }
                j0 += len;
                fc_advance(L->nd_inner, L->ishape, idx, len);
            }
        }
        if (P != NULL) {
            P->part1[tid] = acc1;
            #pragma omp barrier
            acc1 = 0;
            for (int t = 0; t < nth; t++) {
                acc1 += P->part1[t];
            }
            #pragma omp barrier
        }
        const float t1 = (float)acc1;
        const float t5 = fc_reciprocal_f32(t1);
        /* final sweep: write full-size results */
        {
            int64_t idx[FC_LAUNCH_MAXDIM];
            fc_unravel(jlo, L->nd_inner, L->ishape, idx);
            for (int64_t j0 = jlo; j0 < jhi;) {
                const int64_t len = fc_run_length(L->nd_inner, L->ishape, idx, jhi - j0);
                int64_t off[2];
                fc_offsets(L->nd_inner, idx, L->istride, 2, off);
                float *restrict p0 = out0 + ob0 + off[0];
                const int64_t s0 = L->istride[0][L->nd_inner - 1];
                if (s0 == 1) {
                    #pragma omp simd
                    for (int64_t i = 0; i < len; i++) {
                        const float t4 = p0[i];
                        const float t6 = (t4 * t5);
                        p0[i] = t6;
                    }
                }
                else {
                    #pragma omp simd safelen(1)   /* strided: scalar, quick to compile */
                    for (int64_t i = 0; i < len; i++) {
                        const float t4 = p0[i * s0];
                        const float t6 = (t4 * t5);
                        p0[i * s0] = t6;
                    }
                }
                j0 += len;
                fc_advance(L->nd_inner, L->ishape, idx, len);
            }
        }
        if (P == NULL || tid == 0) {
        }
        fc_advance(L->nd_outer, L->oshape, oidx, 1);
    }
    fc_report(err, fc_err);
}

static void
fc_7de556dbb39873a3_rows(const fc_launch *L, int64_t lo, int64_t hi, int *err)
{
    fc_7de556dbb39873a3_body(L, lo, hi, err, NULL, 0, 1);
}

FC_EXPORT int
fc_7de556dbb39873a3(const fc_launch *L)
{
    int err = 0;
    if (fc_use_split(L)) {
        fc_7de556dbb39873a3_parts P;
        #pragma omp parallel num_threads(L->nthreads)
        fc_7de556dbb39873a3_body(L, 0, L->n_outer, &err, &P, omp_get_thread_num(), omp_get_num_threads());
    }
    else {
        FC_RUN_RANGES(L, L->n_outer, 1, fc_7de556dbb39873a3_rows, &err);   /* rows: no rounding */
    }
    return err;
}
