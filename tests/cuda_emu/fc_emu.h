/* CUDA emulation, kernel side: lets g++ compile a gen_cuda kernel for the CPU.
 * In: the kernel source and fc_cuda_kernel.h (force-included before them). Out: host code that
 * emu_cuda.c runs, each CUDA thread a fiber (tests/test_cuda_emulated.py). Not for speed. */
#ifndef FC_EMU_H
#define FC_EMU_H

/* the host's libm, its fixed-width typedefs renamed out of the way of
 * fc_cuda_math.h's own */
#define int8_t fc_emu_glibc_int8_t
#define int16_t fc_emu_glibc_int16_t
#define int32_t fc_emu_glibc_int32_t
#define int64_t fc_emu_glibc_int64_t
#define uint8_t fc_emu_glibc_uint8_t
#define uint16_t fc_emu_glibc_uint16_t
#define uint32_t fc_emu_glibc_uint32_t
#define uint64_t fc_emu_glibc_uint64_t
#include <math.h>
#include <string.h>
#undef int8_t
#undef int16_t
#undef int32_t
#undef int64_t
#undef uint8_t
#undef uint16_t
#undef uint32_t
#undef uint64_t

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static          /* one block runs at a time: a static is the block's */

struct fc_emu_dim { unsigned x, y, z; };
/* filled by emu_cuda.c; the pointers follow the fiber that runs */
struct fc_emu_api {
    const fc_emu_dim *tid, *bid, *bdim, *gdim;
    void (*block_sync)(void);
    void (*warp_sync)(void);
    unsigned long long *slots;     /* 32 per warp, for shuffles */
};
static const fc_emu_api *fc_emu;

#define threadIdx (*fc_emu->tid)
#define blockIdx (*fc_emu->bid)
#define blockDim (*fc_emu->bdim)
#define gridDim (*fc_emu->gdim)
#define __syncthreads() fc_emu->block_sync()
#define FC_RCP_APPROX(q) (1.0f / (q))  /* the device's rcp.approx (1 ULP); exact here */

template <typename T>
static T
fc_emu_shfl_down(T v, int d)
{
    unsigned lane = threadIdx.x & 31;
    unsigned long long *slots = fc_emu->slots + (threadIdx.x >> 5) * 32;
    T r = v;
    memcpy(&slots[lane], &v, sizeof(T));
    fc_emu->warp_sync();
    if (lane + d < 32) {
        memcpy(&r, &slots[lane + d], sizeof(T));
    }
    fc_emu->warp_sync();
    return r;
}
#define __shfl_down_sync(mask, v, d) fc_emu_shfl_down((v), (d))

static inline int
atomicCAS(int *p, int cmp, int val)
{
    int old = *p;
    if (old == cmp) {
        *p = val;
    }
    return old;
}

static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline long long __double_as_longlong(double d) { long long i; memcpy(&i, &d, 8); return i; }
static inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }

#endif
