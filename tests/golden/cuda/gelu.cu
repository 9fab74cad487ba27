/* fastcompile 0.1.0: kernel fc_95a537edb40bfda9
 * graph c37f802d70e1a43c
 * 1 op, pointwise (flat) */
#include "fc_cuda_kernel.h"

typedef fc_cu_launch<2, 2> fc_95a537edb40bfda9_launch;

template <typename I>
static __device__ __forceinline__ void
fc_95a537edb40bfda9_body(const fc_95a537edb40bfda9_launch &L)
{
    int fc_err = 0;
    float *__restrict__ out0 = (float *)L.ptr[0];
    const float *__restrict__ in0 = (const float *)L.ptr[1];
    #pragma unroll 1
    for (I i0 = (I)blockIdx.x * (FC_CU_THREADS * 4) + (I)threadIdx.x; i0 < (I)L.n_outer;
         i0 += (I)gridDim.x * (FC_CU_THREADS * 4)) {
        float pf1[4];
        #pragma unroll
        for (int u = 0; u < 4; u++) {
            const I iu = i0 + (I)u * FC_CU_THREADS;
            const I i = iu < (I)L.n_outer ? iu : (I)L.n_outer - 1;
            pf1[u] = in0[i];
        }
        #pragma unroll
        for (int u = 0; u < 4; u++) {
            const I i = i0 + (I)u * FC_CU_THREADS;
            const float x1 = pf1[u];
            const float t0 = fc_gelu_f32(x1);
            if (i < (I)L.n_outer) {
                out0[i] = t0;
            }
        }
    }
    fc_cu_report(L.err, fc_err);
}

#if !defined(FC_CU_INDEX) || FC_CU_INDEX == 32
extern "C" __global__ void __launch_bounds__(FC_CU_THREADS)
fc_95a537edb40bfda9_i32(const fc_95a537edb40bfda9_launch L)
{
    fc_95a537edb40bfda9_body<int32_t>(L);
}
#endif

#if !defined(FC_CU_INDEX) || FC_CU_INDEX == 64
extern "C" __global__ void __launch_bounds__(FC_CU_THREADS)
fc_95a537edb40bfda9_i64(const fc_95a537edb40bfda9_launch L)
{
    fc_95a537edb40bfda9_body<int64_t>(L);
}
#endif
