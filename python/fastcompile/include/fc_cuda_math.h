/* Kernel support, CUDA: per-type op helpers for generated CUDA C (fc_<stem>_<suffix>, as ops.def's templates).
 * In: operands already in the op's compute type. Out: the same NumPy-exact results as fc_math.h, on the device. */
#ifndef FC_CUDA_MATH_H
#define FC_CUDA_MATH_H

/* The device twin of fc_math.h: same names, same semantics (NaN/inf as
 * NumPy, integer division by zero is 0, exact int64/uint64 comparisons,
 * float->int casts with x86-64's results, f16/bf16 storage rounded to
 * nearest even), written for NVRTC: no system headers, no libm, CUDA's
 * device math library (available in NVRTC without includes) instead.
 * Most helpers are one text with the CPU's, in fc_math_common.h (NVRTC gets
 * it from memory with this header); here are the types, the bit casts and
 * the helpers that differ (float64 gelu, float min/max). */

#define FC_DEV static __device__ __forceinline__

/* fc_math_common.h, included at the end, takes these */
#define FC_FN FC_DEV
#define FC_BOOL_T bool
#define FC_CMP_T bool
#define FC_SET_ERR(err, code) (*(err) = (code))     /* the kernel's local flag */
#define FC_EXPF(x) expf(x)                /* the device library's */

/* ---- fixed-width types and limits (NVRTC has no <stdint.h>) -------------- */
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;

#define INT8_MIN (-128)
#define INT16_MIN (-32768)
#define INT32_MIN (-2147483647 - 1)
#define INT64_MIN (-9223372036854775807LL - 1)
#define INT8_MAX 127
#define INT16_MAX 32767
#define INT32_MAX 2147483647
#define INT64_MAX 9223372036854775807LL
#define UINT8_MAX 255
#define UINT16_MAX 65535
#define UINT32_MAX 4294967295u
#define UINT64_MAX 18446744073709551615ull
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

/* ---- bit casts ----------------------------------------------------------- */
FC_DEV uint32_t fc__f32_bits(float x) { return __float_as_uint(x); }
FC_DEV float fc__bits_f32(uint32_t u) { return __uint_as_float(u); }

/* ---- gelu in float64 (float32: fc_math_common.h's, which uses FC__FMAF) --
 * 0.5x * erfc(-x/sqrt2), no cancellation for x << 0; gelu(-inf) is NaN, as
 * torch. gelu_grad: Phi(x) + x phi(x), the derivative of gelu (its backward). */
#define FC__FMAF(a, b, c) fmaf((a), (b), (c))
/* p / q for gelu's P / Q: p, q and p / q normal floats far from the range's
 * ends, where div.rn's fast path (the approximate reciprocal, refined, and
 * one correction of the quotient) is the correctly rounded result. Written
 * out, without div.rn's range check (FCHK) and the branch to its slow path
 * around each element, which kept ptxas from interleaving elements. Checked
 * on every c in [0, 14.5] (gelu's clamp), with the reciprocal exact and one
 * float either way: always p / q rounded to nearest. */
#ifndef FC_RCP_APPROX                /* (tests/cuda_emu's CPU emulation defines its own) */
FC_DEV float fc__rcp_approx(float q) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(q));   /* one MUFU.RCP */
    return y;
}
#define FC_RCP_APPROX(q) fc__rcp_approx(q)
#endif
FC_DEV float fc__div_normal(float p, float q) {
    const float y0 = FC_RCP_APPROX(q);
    const float y = fmaf(y0, fmaf(-q, y0, 1.0f), y0);
    const float q0 = p * y;
    return fmaf(y, fmaf(-q, q0, p), q0);
}
#define FC__DIVF(p, q) fc__div_normal((p), (q))
FC_DEV double fc_gelu_f64(double x) { return 0.5 * x * erfc(-0.70710678118654752 * x); }
FC_DEV double fc_gelu_grad_f64(double x) {
    return 0.5 * erfc(-0.70710678118654752 * x) + x * (exp(-0.5 * x * x) * 0.398942280401432678);
}

/* ---- hypot in float64: CUDA's overflows to inf where the result is near the
 * largest double (hypot(DBL_MAX, 1e300)); this one scales by the larger
 * magnitude. inf wins over NaN, as IEEE and NumPy. */
FC_DEV double fc__hypot_f64(double a, double b) {
    a = fabs(a);
    b = fabs(b);
    if (a == INFINITY || b == INFINITY) {
        return INFINITY;
    }
    if (a != a || b != b) {
        return a + b;
    }
    double m = a > b ? a : b, n = a > b ? b : a;
    if (m == 0.0) {
        return 0.0;
    }
    n /= m;
    return m * sqrt(1.0 + n * n);
}
#define FC_HYPOT_F64(a, b) fc__hypot_f64(a, b)

/* ---- maximum, minimum, fmax, fmin, clamp of floats (ints: fc_math_common.h):
 * NaN rules as fc_math.h's, without isunordered() */
#define FC__MINMAX_F(t, T)                                                     \
    FC_DEV T fc_maximum_##t(T a, T b) {                                        \
        T m = a > b ? a : b;                                                   \
        return (a != a || b != b) ? a + b : m;                                 \
    }                                                                          \
    FC_DEV T fc_minimum_##t(T a, T b) {                                        \
        T m = a < b ? a : b;                                                   \
        return (a != a || b != b) ? a + b : m;                                 \
    }                                                                          \
    FC_DEV T fc_fmax_##t(T a, T b) {                                           \
        T m = a > b ? a : b;                                                   \
        return (a != a || b != b) ? (b != b ? a : b) : m;                      \
    }                                                                          \
    FC_DEV T fc_fmin_##t(T a, T b) {                                           \
        T m = a < b ? a : b;                                                   \
        return (a != a || b != b) ? (b != b ? a : b) : m;                      \
    }                                                                          \
    FC_DEV T fc_clamp_##t(T x, T lo, T hi) { return fc_minimum_##t(fc_maximum_##t(x, lo), hi); }
FC__MINMAX_F(f32, float)
FC__MINMAX_F(f64, double)
#undef FC__MINMAX_F
/* relu: np.maximum(x, 0): NaN stays NaN, -0.0 becomes +0.0 */
FC_DEV float fc_relu_f32(float x) { return fc_maximum_f32(x, 0.0f); }
FC_DEV double fc_relu_f64(double x) { return fc_maximum_f64(x, 0.0); }

#include "fc_math_common.h"

#endif /* FC_CUDA_MATH_H */
