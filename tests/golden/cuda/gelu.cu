/* fastcompile 0.1.0: kernel fc_94a180f18ca7a9ac
 * graph c37f802d70e1a43c
 * 1 op, pointwise (flat) */
#include "fc_cuda_kernel.h"

typedef fc_cu_launch<2, 2> fc_94a180f18ca7a9ac_launch;

template <typename I>
static __device__ __forceinline__ void
fc_94a180f18ca7a9ac_body(const fc_94a180f18ca7a9ac_launch &L)
{
    int fc_err = 0;
    float *__restrict__ out0 = (float *)L.ptr[0];
    const float *__restrict__ in0 = (const float *)L.ptr[1];
    #pragma unroll 1
    for (I i0 = (I)blockIdx.x * (FC_CU_THREADS * 4) + (I)threadIdx.x; i0 < (I)L.n_outer;
         i0 += (I)gridDim.x * (FC_CU_THREADS * 4)) {
        #pragma unroll
        for (int u = 0; u < 4; u++) {
            const I iu = i0 + (I)u * FC_CU_THREADS;
            const I i = iu < (I)L.n_outer ? iu : (I)L.n_outer - 1;
            const float x1 = in0[i];
            const float t0 = fc_gelu_f32(x1);
            if (iu < (I)L.n_outer) {
                out0[i] = t0;
            }
        }
    }
    fc_cu_report(L.err, fc_err);
}

#if !defined(FC_CU_INDEX) || FC_CU_INDEX == 32
extern "C" __global__ void __launch_bounds__(FC_CU_THREADS)
fc_94a180f18ca7a9ac_i32(const fc_94a180f18ca7a9ac_launch L)
{
    fc_94a180f18ca7a9ac_body<int32_t>(L);
}
#endif

#if !defined(FC_CU_INDEX) || FC_CU_INDEX == 64
extern "C" __global__ void __launch_bounds__(FC_CU_THREADS)
fc_94a180f18ca7a9ac_i64(const fc_94a180f18ca7a9ac_launch L)
{
    fc_94a180f18ca7a9ac_body<int64_t>(L);
}
#endif
