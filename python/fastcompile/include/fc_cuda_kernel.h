/* Kernel support, CUDA: the fixed skeletons every generated CUDA kernel uses.
 * In: an fc_cu_launch packed by csrc/runtime/cuda.c. Out: index math, error reporting, block reductions. */
#ifndef FC_CUDA_KERNEL_H
#define FC_CUDA_KERNEL_H

#include "fc_cuda_math.h"

#ifndef FC_CU_THREADS              /* (defined before: benchmarks/gpu_tuning.py's variants) */
#define FC_CU_THREADS 256          /* threads per block, every kernel */
#endif
/* Vectors a thread takes per trip of a flat kernel's vector loop (16 bytes of
 * the widest operand each), so that 32 bytes per thread and input are in
 * flight together. */
#ifndef FC_CU_VEC_UNROLL
#define FC_CU_VEC_UNROLL 2
#endif
/* Reduction kernels: row elements a thread keeps in registers (its row
 * cache), a multiple of 16 / the widest operand's size (one vector) */
#ifndef FC_CU_ROWCACHE
#define FC_CU_ROWCACHE 16
#endif
/* Reduction kernels ask ptxas for n resident blocks of 256 threads per SM
 * (__launch_bounds__; n = 4: at most 64 registers a thread, 2: 128, 1: 255),
 * n chosen by gen_cuda from what the row cache holds (red_blocks). Left
 * alone, ptxas gave softmax and layernorm 100-150 registers, 2 blocks per
 * SM, too few rows in flight to cover the memory's latency. Defining
 * FC_CU_RED_BLOCKS overrides n (benchmarks/gpu_tuning.py). */
#ifdef FC_CU_RED_BLOCKS
#define FC_CU_RED_BLOCKS_OR(n) FC_CU_RED_BLOCKS
#else
#define FC_CU_RED_BLOCKS_OR(n) (n)
#endif
#define FC_ERR_NEGATIVE_POWER 1    /* as fc_launch.h */
#define FC_ERR_EMPTY_REDUCE 2
#define FC_ERR_ZERO_DIVISION 3

/* The kernel parameter, passed by value. NOPS operands, ND the kernel's rank
 * before collapsing (the runtime collapses to nd_outer + nd_inner <= ND dims
 * per space). Every field is 8 bytes, so the host packs it as an int64 array
 * in this order: n_outer, n_inner, nd_outer, nd_inner, err, ptr[NOPS],
 * oshape[ND], ishape[ND], ostride[NOPS][ND], istride[NOPS][ND].
 * Strides are in elements, 0 where an operand is broadcast. */
template <int NOPS, int ND>
struct fc_cu_launch {
    int64_t n_outer, n_inner;
    int64_t nd_outer, nd_inner;
    int *err;                      /* device int, 0 on entry; NULL: unchecked */
    char *ptr[NOPS];
    int64_t oshape[ND];
    int64_t ishape[ND];
    int64_t ostride[NOPS][ND];
    int64_t istride[NOPS][ND];
};

/* first error wins */
FC_DEV void
fc_cu_report(int *err, int e)
{
    if (e != 0 && err != 0) {
        atomicCAS(err, 0, e);
    }
}

/* per-operand element offsets of flat position lin (C order) in a space of
 * nd dims. I: the index type (int32_t when everything fits, else int64_t);
 * the outermost dim needs no division. */
template <typename I, int NOPS, int ND>
FC_DEV void
fc_cu_offsets(I lin, int nd, const int64_t *shape, const int64_t (*stride)[ND], I *off)
{
#pragma unroll
    for (int o = 0; o < NOPS; o++) {
        off[o] = 0;
    }
    for (int d = nd - 1; d > 0; d--) {
        I s = (I)shape[d];
        I q = lin / s, r = lin - q * s;
#pragma unroll
        for (int o = 0; o < NOPS; o++) {
            off[o] += r * (I)stride[o][d];
        }
        lin = q;
    }
#pragma unroll
    for (int o = 0; o < NOPS; o++) {
        off[o] += lin * (I)stride[o][0];
    }
}

/* ---- block reductions -------------------------------------------------------
 * Every thread of the block calls them with its partial; every thread gets
 * the block's result. Warp shuffles, then one value per warp through shared
 * memory. Sub-int types travel as int. */
#define FC__SHFL(T, W)                                                          \
    FC_DEV T fc_cu_shfl_down(T v, int d) { return (T)__shfl_down_sync(0xffffffffu, (W)v, d); }
FC__SHFL(bool, int) FC__SHFL(int8_t, int) FC__SHFL(int16_t, int) FC__SHFL(int32_t, int)
FC__SHFL(int64_t, long long) FC__SHFL(uint8_t, unsigned) FC__SHFL(uint16_t, unsigned)
FC__SHFL(uint32_t, unsigned) FC__SHFL(uint64_t, unsigned long long)
FC__SHFL(float, float) FC__SHFL(double, double)
#undef FC__SHFL

struct fc_cu_sum { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };
struct fc_cu_prod { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a * b; } };
struct fc_cu_max { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return b > a ? b : a; } };
struct fc_cu_min { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return b < a ? b : a; } };
struct fc_cu_or { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a | b; } };
struct fc_cu_and { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a & b; } };

template <typename T, typename F>
FC_DEV T
fc_cu_block_reduce(T v, F f, T *smem /* [32] */)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
        v = f(v, fc_cu_shfl_down(v, d));
    }
    __syncthreads();               /* smem may still be read from the last call */
    if (lane == 0) {
        smem[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        v = smem[lane < nwarps ? lane : 0];
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) {
            T o = fc_cu_shfl_down(v, d);
            v = lane + d < nwarps ? f(v, o) : v;
        }
        if (lane == 0) {
            smem[0] = v;
        }
    }
    __syncthreads();
    return smem[0];
}

/* argmax/argmin: (value, first index); the first NaN beats everything, ties
 * go to the smaller index (threads see interleaved indices) */
template <typename T, bool MAX>
FC_DEV void
fc_cu_argpick(T &a, int64_t &ia, T b, int64_t ib)
{
    bool an = a != a, bn = b != b;
    bool take;
    if (an || bn) {
        take = bn && (!an || ib < ia);
    }
    else if (a == b) {
        take = ib < ia;
    }
    else {
        take = MAX ? b > a : b < a;
    }
    if (take) {
        a = b;
        ia = ib;
    }
}

template <typename T, bool MAX>
FC_DEV void
fc_cu_block_argreduce(T &v, int64_t &idx, T *smem, int64_t *smem_idx /* [32] each */)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
        T ov = fc_cu_shfl_down(v, d);
        int64_t oi = fc_cu_shfl_down(idx, d);
        if (lane + d < 32) {
            fc_cu_argpick<T, MAX>(v, idx, ov, oi);
        }
    }
    __syncthreads();
    if (lane == 0) {
        smem[warp] = v;
        smem_idx[warp] = idx;
    }
    __syncthreads();
    if (warp == 0) {
        v = smem[lane < nwarps ? lane : 0];
        idx = smem_idx[lane < nwarps ? lane : 0];
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) {
            T ov = fc_cu_shfl_down(v, d);
            int64_t oi = fc_cu_shfl_down(idx, d);
            if (lane + d < nwarps) {
                fc_cu_argpick<T, MAX>(v, idx, ov, oi);
            }
        }
        if (lane == 0) {
            smem[0] = v;
            smem_idx[0] = idx;
        }
    }
    __syncthreads();
    v = smem[0];
    idx = smem_idx[0];
}

/* ---- 16-byte vector access ---------------------------------------------------
 * V elements of T as one load or store (V * sizeof(T) <= 16 bytes, a power of
 * two): ld/st.global.v2/v4 where the address is aligned to the vector's size,
 * which fc_cu_aligned checks first (a view into a torch tensor may not be). */
template <typename T, int V>
struct alignas(sizeof(T) * V) fc_cu_vec {
    T v[V];
};

template <int V, typename T>
FC_DEV bool
fc_cu_aligned(const T *p)
{
    return ((unsigned long long)p & (unsigned long long)(sizeof(T) * V - 1)) == 0;
}

template <int V, typename T>
FC_DEV void
fc_cu_vload(T *dst, const T *src)
{
    const fc_cu_vec<T, V> w = *(const fc_cu_vec<T, V> *)src;
#pragma unroll
    for (int e = 0; e < V; e++) {
        dst[e] = w.v[e];
    }
}

template <int V, typename T>
FC_DEV void
fc_cu_vstore(T *dst, const T *src)
{
    fc_cu_vec<T, V> w;
#pragma unroll
    for (int e = 0; e < V; e++) {
        w.v[e] = src[e];
    }
    *(fc_cu_vec<T, V> *)dst = w;
}

/* a row of the reductions' vector path: an operand with inner stride 1 and an
 * aligned row start, or (inputs only) stride 0, one value for the whole row */
template <int V, typename T>
FC_DEV bool
fc_cu_row_vec(const T *row, int64_t stride, bool is_input)
{
    return stride == 1 ? fc_cu_aligned<V>(row) : stride == 0 && is_input;
}

/* V elements of a row from position j (stride 1), or its one value V times (stride 0) */
template <int V, typename T, typename I>
FC_DEV void
fc_cu_vload_row(T *dst, const T *row, I j, int64_t stride)
{
    if (stride == 0) {
#pragma unroll
        for (int e = 0; e < V; e++) {
            dst[e] = row[0];
        }
    }
    else {
        fc_cu_vload<V>(dst, row + j);
    }
}

#endif /* FC_CUDA_KERNEL_H */
