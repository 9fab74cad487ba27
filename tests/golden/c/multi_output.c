/* fastcompile 0.1.0: kernel fc_7e1b896ebc510b93
 * graph 7752d090d6be767e
 * 2 ops, pointwise (flat) */
#include "fc_kernel.h"

static void
fc_7e1b896ebc510b93_range(const fc_launch *L, int64_t lo, int64_t hi, int *err)
{
    int fc_err = 0;
    float *restrict out0 = (float *)L->ptr[0];
    float *restrict out1 = (float *)L->ptr[1];
    const float *restrict in0 = (const float *)L->ptr[2];
    const float *restrict in1 = (const float *)L->ptr[3];
    const int fc_nt = FC_HAVE_NT && L->n_outer * 8 >= FC_NT_BYTES;
    for (int64_t i0 = lo; i0 < hi; i0 += FC_PF_BLOCK) {
        const int64_t i1 = hi - i0 > FC_PF_BLOCK ? i0 + FC_PF_BLOCK : hi;
        float fc_tmp0[FC_PF_BLOCK] __attribute__((aligned(64)));
        float *restrict w0 = fc_nt ? fc_tmp0 : out0 + i0;
        float fc_tmp1[FC_PF_BLOCK] __attribute__((aligned(64)));
        float *restrict w1 = fc_nt ? fc_tmp1 : out1 + i0;
        FC_PREFETCH_BLOCK(in0, i0, hi);
        FC_PREFETCH_BLOCK(in1, i0, hi);
        #pragma omp simd
        for (int64_t k = 0; k < i1 - i0; k++) {
            const int64_t i = i0 + k;
            const float x2 = in0[i];
            const float x3 = in1[i];
            const float t0 = (x2 + x3);
            const float t1 = fc_tanh_f32(t0);
            w0[k] = t0;
            w1[k] = t1;
        }
        if (fc_nt) {
            fc_stream_store(out0 + i0, fc_tmp0, (i1 - i0) * (int64_t)sizeof(*out0));
            fc_stream_store(out1 + i0, fc_tmp1, (i1 - i0) * (int64_t)sizeof(*out1));
        }
    }
    if (fc_nt) {
        FC_STREAM_FENCE();     /* the streamed lines reach memory before the region ends */
    }
    fc_report(err, fc_err);
}

FC_EXPORT int
fc_7e1b896ebc510b93(const fc_launch *L)
{
    int err = 0;
    FC_RUN_RANGES(L, L->n_outer, 16, fc_7e1b896ebc510b93_range, &err);
    return err;
}
