/* fastcompile 0.1.0: kernel fc_6733872648821b8b
 * graph c37f802d70e1a43c
 * 1 op, pointwise (flat) */
#include "fc_cuda_kernel.h"

typedef fc_cu_launch<2, 2> fc_6733872648821b8b_launch;

template <typename I>
static __device__ __forceinline__ void
fc_6733872648821b8b_body(const fc_6733872648821b8b_launch &L)
{
    int fc_err = 0;
    float *__restrict__ out0 = (float *)L.ptr[0];
    const float *__restrict__ in0 = (const float *)L.ptr[1];
    I fc_start = 0;           /* the scalar loop's first element */
    if (fc_cu_aligned<4>(out0) && fc_cu_aligned<4>(in0)) {
        const I nv = (I)L.n_outer / 4;
        fc_start = nv * 4;
        #pragma unroll 1
        for (I v0 = (I)blockIdx.x * (FC_CU_THREADS * FC_CU_VEC_UNROLL) + (I)threadIdx.x; v0 < nv;
             v0 += (I)gridDim.x * (FC_CU_THREADS * FC_CU_VEC_UNROLL)) {
            float st0[FC_CU_VEC_UNROLL * 4];
            float pf1[FC_CU_VEC_UNROLL * 4];
            #pragma unroll
            for (int u = 0; u < FC_CU_VEC_UNROLL; u++) {
                const I vu = v0 + (I)u * FC_CU_THREADS;
                const I vi = vu < nv ? vu : nv - 1;
                fc_cu_vload<4>(pf1 + u * 4, in0 + vi * 4);
            }
            #pragma unroll
            for (int w = 0; w < FC_CU_VEC_UNROLL * 4; w++) {
                const I i = (v0 + (I)(w / 4) * FC_CU_THREADS) * 4 + (I)(w % 4);
                const float x1 = pf1[w];
                const float t0 = fc_gelu_f32(x1);
                st0[w] = t0;
            }
            #pragma unroll
            for (int u = 0; u < FC_CU_VEC_UNROLL; u++) {
                const I vu = v0 + (I)u * FC_CU_THREADS;
                if (vu < nv) {
                    fc_cu_vstore<4>(out0 + vu * 4, st0 + u * 4);
                }
            }
        }
    }
    #pragma unroll 1
    for (I i0 = fc_start + (I)blockIdx.x * (FC_CU_THREADS * 4) + (I)threadIdx.x; i0 < (I)L.n_outer;
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
fc_6733872648821b8b_i32(const fc_6733872648821b8b_launch L)
{
    fc_6733872648821b8b_body<int32_t>(L);
}
#endif

#if !defined(FC_CU_INDEX) || FC_CU_INDEX == 64
extern "C" __global__ void __launch_bounds__(FC_CU_THREADS)
fc_6733872648821b8b_i64(const fc_6733872648821b8b_launch L)
{
    fc_6733872648821b8b_body<int64_t>(L);
}
#endif
