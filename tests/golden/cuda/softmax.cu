/* fastcompile 0.1.0: kernel fc_c0bed3c26ca35b7c
 * graph f2870a10aed5ddf8
 * 7 ops, reduction, 3 sweeps per row */
#include "fc_cuda_kernel.h"

typedef fc_cu_launch<2, 2> fc_c0bed3c26ca35b7c_launch;

template <typename I>
static __device__ __forceinline__ void
fc_c0bed3c26ca35b7c_body(const fc_c0bed3c26ca35b7c_launch &L)
{
    __shared__ float sm0[32];
    __shared__ int smn0[32];
    __shared__ double sm1[32];
    static_assert(FC_CU_ROWCACHE % 4 == 0, "FC_CU_ROWCACHE: whole vectors of 4");
    int fc_err = 0;
    float *__restrict__ out0 = (float *)L.ptr[0];
    const float *__restrict__ in0 = (const float *)L.ptr[1];
    #pragma unroll 1
    for (I o = blockIdx.x; o < (I)L.n_outer; o += gridDim.x) {
        I ob[2];
        fc_cu_offsets<I, 2, 2>(o, (int)L.nd_outer, L.oshape, L.ostride, ob);
        bool fc_rv = (I)L.n_inner % 4 == 0;
        fc_rv = fc_rv && fc_cu_row_vec<4>(out0 + ob[0], L.istride[0][0], false);
        fc_rv = fc_rv && fc_cu_row_vec<4>(in0 + ob[1], L.istride[1][0], true);
        float rc1[FC_CU_ROWCACHE];
        /* sweep 1: 1 reduction */
        float acc0 = -INFINITY;
        int nan0 = 0;
        if (fc_rv) {
            #pragma unroll
            for (int k = 0; k < FC_CU_ROWCACHE; k += 4) {
                const I j = ((I)threadIdx.x + (I)(k / 4) * FC_CU_THREADS) * 4 + (I)(k % 4);
                if (j < (I)L.n_inner) {
                    fc_cu_vload_row<4>(rc1 + k, in0 + ob[1], j, L.istride[1][0]);
                }
            }
        }
        else {
            #pragma unroll
            for (int k = 0; k < FC_CU_ROWCACHE; k += 1) {
                const I j = ((I)threadIdx.x + (I)(k / 4) * FC_CU_THREADS) * 4 + (I)(k % 4);
                if (j < (I)L.n_inner) {
                    I ib[2];
                    ib[0] = j * (I)L.istride[0][0];
                    ib[1] = j * (I)L.istride[1][0];
                    rc1[k] = in0[ob[1] + ib[1]];
                }
            }
        }
        #pragma unroll
        for (int k = 0; k < FC_CU_ROWCACHE; k += 1) {
            const I j = ((I)threadIdx.x + (I)(k / 4) * FC_CU_THREADS) * 4 + (I)(k % 4);
            if (j < (I)L.n_inner) {
                const float x1 = rc1[k];
                const float t2 = x1;
                acc0 = t2 > acc0 ? t2 : acc0;
                nan0 |= t2 != t2;
            }
        }
        #pragma unroll 4
        for (I j = (I)threadIdx.x + (I)(FC_CU_ROWCACHE * FC_CU_THREADS); j < (I)L.n_inner; j += FC_CU_THREADS) {
            I ib[2];
            ib[0] = j * (I)L.istride[0][0];
            ib[1] = j * (I)L.istride[1][0];
            const float x1 = in0[ob[1] + ib[1]];
            const float t2 = x1;
            acc0 = t2 > acc0 ? t2 : acc0;
            nan0 |= t2 != t2;
        }
        acc0 = fc_cu_block_reduce(acc0, fc_cu_max(), sm0);
        nan0 = fc_cu_block_reduce(nan0, fc_cu_or(), smn0);
        const float t0 = nan0 ? (float)NAN : (float)acc0;
        /* sweep 2: 1 reduction */
        double acc1 = 0;
        #pragma unroll
        for (int k = 0; k < FC_CU_ROWCACHE; k += 1) {
            const I j = ((I)threadIdx.x + (I)(k / 4) * FC_CU_THREADS) * 4 + (I)(k % 4);
            if (j < (I)L.n_inner) {
                const float x1 = rc1[k];
                const float t2 = x1;
                const float t3 = (t2 - t0);
                const float t4 = fc_exp_f32(t3);
                acc1 += (double)t4;
            }
        }
        #pragma unroll 4
        for (I j = (I)threadIdx.x + (I)(FC_CU_ROWCACHE * FC_CU_THREADS); j < (I)L.n_inner; j += FC_CU_THREADS) {
            I ib[2];
            ib[0] = j * (I)L.istride[0][0];
            ib[1] = j * (I)L.istride[1][0];
            const float x1 = in0[ob[1] + ib[1]];
            const float t2 = x1;
            const float t3 = (t2 - t0);
            const float t4 = fc_exp_f32(t3);
            acc1 += (double)t4;
        }
        acc1 = fc_cu_block_reduce(acc1, fc_cu_sum(), sm1);
        const float t1 = (float)acc1;
        const float t5 = fc_reciprocal_f32(t1);
        /* final sweep: write full-size results */
        float so0[FC_CU_ROWCACHE];
        #pragma unroll
        for (int k = 0; k < FC_CU_ROWCACHE; k += 1) {
            const I j = ((I)threadIdx.x + (I)(k / 4) * FC_CU_THREADS) * 4 + (I)(k % 4);
            if (j < (I)L.n_inner) {
                const float x1 = rc1[k];
                const float t2 = x1;
                const float t3 = (t2 - t0);
                const float t4 = fc_exp_f32(t3);
                const float t6 = (t4 * t5);
                so0[k] = t6;
            }
            if (k % 4 == 3) {          /* a vector's last slot */
                const I j0 = j - 3;
                if (fc_rv) {
                    if (j0 < (I)L.n_inner) {
                        fc_cu_vstore<4>(out0 + ob[0] + j0, so0 + (k - 3));
                    }
                }
                else {
                    #pragma unroll
                    for (int e = 0; e < 4; e++) {
                        if (j0 + e < (I)L.n_inner) {
                            out0[ob[0] + (j0 + e) * (I)L.istride[0][0]] = so0[k - 3 + e];
                        }
                    }
                }
            }
        }
        #pragma unroll 4
        for (I j = (I)threadIdx.x + (I)(FC_CU_ROWCACHE * FC_CU_THREADS); j < (I)L.n_inner; j += FC_CU_THREADS) {
            I ib[2];
            ib[0] = j * (I)L.istride[0][0];
            ib[1] = j * (I)L.istride[1][0];
            const float x1 = in0[ob[1] + ib[1]];
            const float t2 = x1;
            const float t3 = (t2 - t0);
            const float t4 = fc_exp_f32(t3);
            const float t6 = (t4 * t5);
            out0[ob[0] + ib[0]] = t6;
        }
    }
    fc_cu_report(L.err, fc_err);
}

#if !defined(FC_CU_INDEX) || FC_CU_INDEX == 32
extern "C" __global__ void __launch_bounds__(FC_CU_THREADS, FC_CU_RED_BLOCKS_OR(4))
fc_c0bed3c26ca35b7c_i32(const fc_c0bed3c26ca35b7c_launch L)
{
    fc_c0bed3c26ca35b7c_body<int32_t>(L);
}
#endif

#if !defined(FC_CU_INDEX) || FC_CU_INDEX == 64
extern "C" __global__ void __launch_bounds__(FC_CU_THREADS, FC_CU_RED_BLOCKS_OR(4))
fc_c0bed3c26ca35b7c_i64(const fc_c0bed3c26ca35b7c_launch L)
{
    fc_c0bed3c26ca35b7c_body<int64_t>(L);
}
#endif
