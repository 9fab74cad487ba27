/* fastcompile 0.1.0: kernel fc_8b0d0db6ca90c9f9
 * graph 2e7918992fb00831
 * 2 ops, pointwise */
#include "fc_kernel.h"

static void
fc_8b0d0db6ca90c9f9_range(const fc_launch *L, int64_t lo, int64_t hi, int *err)
{
    int fc_err = 0;
    float *restrict out0 = (float *)L->ptr[0];
    const float *restrict in0 = (const float *)L->ptr[1];
    {
        int64_t idx[FC_LAUNCH_MAXDIM];
        fc_unravel(lo, L->nd_outer, L->oshape, idx);
        for (int64_t j0 = lo; j0 < hi;) {
            const int64_t len = fc_run_length(L->nd_outer, L->oshape, idx, hi - j0);
            int64_t off[2];
            fc_offsets_run(L->nd_outer, idx, L->ostride, 2, off);
            float *restrict p0 = out0 + off[0];
            const int64_t s0 = L->ostride[0][L->nd_outer - 1];
            const float *restrict p1 = in0 + off[1];
            const int64_t s1 = L->ostride[1][L->nd_outer - 1];
            if (s0 == 1 && s1 == 1) {
                #pragma omp simd
                for (int64_t i = 0; i < len; i++) {
                    const float x1 = p1[i];
                    const float t0 = (x1 * ((float)(((double)2))));
                    const float t1 = fc_gelu_f32(t0);
                    p0[i] = t1;
                }
            }
            else {
                #pragma omp simd safelen(1)   /* strided: scalar, quick to compile */
                for (int64_t i = 0; i < len; i++) {
                    const float x1 = p1[i * s1];
                    const float t0 = (x1 * ((float)(((double)2))));
                    const float t1 = fc_gelu_f32(t0);
                    p0[i * s0] = t1;
                }
            }
            j0 += len;
            fc_advance_run(L->nd_outer, L->oshape, idx, len);
        }
    }
    fc_report(err, fc_err);
}

FC_EXPORT int
fc_8b0d0db6ca90c9f9(const fc_launch *L)
{
    int err = 0;
    FC_RUN_RANGES(L, L->n_outer, 16, fc_8b0d0db6ca90c9f9_range, &err);
    return err;
}
