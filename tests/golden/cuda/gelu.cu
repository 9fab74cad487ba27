/* fastcompile 0.1.0: kernel fc_fcd1f203fc3d06c0
 * graph c37f802d70e1a43c
 * 1 op, pointwise (flat) */
#include "fc_cuda_kernel.h"

typedef fc_cu_launch<2, 2> fc_fcd1f203fc3d06c0_launch;

template <typename I>
static __device__ __forceinline__ void
fc_fcd1f203fc3d06c0_body(const fc_fcd1f203fc3d06c0_launch &L)
{
    int fc_err = 0;
    float *__restrict__ out0 = (float *)L.ptr[0];
    const float *__restrict__ in0 = (const float *)L.ptr[1];
    #pragma unroll 1
    for (I i = (I)blockIdx.x * FC_CU_THREADS + (I)threadIdx.x; i < (I)L.n_outer;
         i += (I)gridDim.x * FC_CU_THREADS) {
        const float x1 = in0[i];
        const float t0 = fc_gelu_f32(x1);
        out0[i] = t0;
    }
    fc_cu_report(L.err, fc_err);
}

extern "C" __global__ void __launch_bounds__(FC_CU_THREADS)
fc_fcd1f203fc3d06c0_i32(const fc_fcd1f203fc3d06c0_launch L)
{
    fc_fcd1f203fc3d06c0_body<int32_t>(L);
}

extern "C" __global__ void __launch_bounds__(FC_CU_THREADS)
fc_fcd1f203fc3d06c0_i64(const fc_fcd1f203fc3d06c0_launch L)
{
    fc_fcd1f203fc3d06c0_body<int64_t>(L);
}
