/* fastcompile 0.1.0: kernel fc_8f4d8f32f25b31b7
 * graph 63824aee2a848f92
 * 2 ops, pointwise (flat) */
#include "fc_kernel.h"

static void
fc_8f4d8f32f25b31b7_range(const fc_launch *L, int64_t lo, int64_t hi, int *err)
{
    int fc_err = 0;
    float *restrict out0 = (float *)L->ptr[0];
    const float *restrict in0 = (const float *)L->ptr[1];
    const int fc_nt = FC_HAVE_NT && L->n_outer * 4 >= FC_NT_BYTES;
    for (int64_t i0 = lo; i0 < hi; i0 += FC_PF_BLOCK) {
        const int64_t i1 = hi - i0 > FC_PF_BLOCK ? i0 + FC_PF_BLOCK : hi;
        float fc_tmp0[FC_PF_BLOCK] __attribute__((aligned(64)));
        float *restrict w0 = fc_nt ? fc_tmp0 : out0 + i0;
        FC_PREFETCH_BLOCK(in0, i0, hi);
        #pragma omp simd
        for (int64_t k = 0; k < i1 - i0; k++) {
            const int64_t i = i0 + k;
            const float x1 = in0[i];
            const float t0 = (x1 * ((float)(((double)2))));
            const float t1 = fc_gelu_f32(t0);
            w0[k] = t1;
        }
        if (fc_nt) {
            fc_stream_store(out0 + i0, fc_tmp0, (i1 - i0) * (int64_t)sizeof(*out0));
        }
    }
    if (fc_nt) {
        FC_STREAM_FENCE();     /* the streamed lines reach memory before the region ends */
    }
    fc_report(err, fc_err);
}

FC_EXPORT int
fc_8f4d8f32f25b31b7(const fc_launch *L)
{
    int err = 0;
    FC_RUN_RANGES(L, L->n_outer, 16, fc_8f4d8f32f25b31b7_range, &err);
    return err;
}
