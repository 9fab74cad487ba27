/* Kernel support: per-type op helpers for generated C (fc_<stem>_<suffix>, as ops.def's templates).
 * In: operands already in the op's compute type. Out: NumPy-exact results, f16/bf16 storage, UB-free float->int casts. */
#ifndef FC_MATH_H
#define FC_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Compute-type suffixes and their C types:
 *   b uint8_t (0/1)   i8 i16 i32 i64 intN_t   u8 u16 u32 u64 uintN_t
 *   f32 float   f64 double   (float16/bfloat16 compute as f32)
 * Semantics follow NumPy 2.x ufuncs on x86-64 unless a comment says otherwise.
 * Everything is branch-free where that costs nothing, so loops vectorize.
 * Most helpers are one text with CUDA's, in fc_math_common.h; here are the
 * libmvec declarations, the bit casts and the helpers that differ (float64 gelu,
 * float32 exp, float min/max). */

/* Every helper is forced inline: GCC's heuristics leave a large one (gelu) as an
 * out-of-line call once a kernel uses it twice (the unit-stride and strided
 * versions of a run), and a loop with a call does not vectorize. */
#if defined(__GNUC__)
#define FC_INLINE static inline __attribute__((always_inline))
#else
#define FC_INLINE static inline
#endif

/* fc_math_common.h, included at the end, takes these */
#define FC_FN FC_INLINE
#define FC_BOOL_T uint8_t
#define FC_CMP_T int
#define FC_SET_ERR(err, code) __atomic_store_n((err), (code), __ATOMIC_RELAXED)

/* ---- libmvec: SIMD variants of libm ---------------------------------------
 * glibc declares these only under __FAST_MATH__; we never use -ffast-math but
 * do use -fno-math-errno, which is all gcc needs to call _ZGV* clones.
 * The attribute form works with and without -fopenmp (glibc uses it too). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    defined(__GLIBC__) && defined(__GLIBC_PREREQ) && !defined(__FAST_MATH__) && \
    !defined(FC_NO_LIBMVEC)
#define FC__SIMD __attribute__((__simd__("notinbranch")))
#define FC__VEC1(fn) FC__SIMD extern double fn(double); FC__SIMD extern float fn##f(float);
#define FC__VEC2(fn) FC__SIMD extern double fn(double, double); FC__SIMD extern float fn##f(float, float);
#if __GLIBC_PREREQ(2, 22)
FC__VEC1(exp) FC__VEC1(log) FC__VEC1(sin) FC__VEC1(cos) FC__VEC2(pow)
#endif
#if __GLIBC_PREREQ(2, 35)
FC__VEC1(exp2) FC__VEC1(expm1) FC__VEC1(log2) FC__VEC1(log10) FC__VEC1(log1p)
FC__VEC1(tan) FC__VEC1(tanh) FC__VEC1(asin) FC__VEC1(acos) FC__VEC1(atan)
FC__VEC1(sinh) FC__VEC1(cosh) FC__VEC1(asinh) FC__VEC1(acosh) FC__VEC1(atanh)
FC__VEC1(erf) FC__VEC1(erfc) FC__VEC2(atan2) FC__VEC2(hypot)
#endif
#undef FC__VEC1
#undef FC__VEC2
#undef FC__SIMD
#endif

/* ---- bit casts ----------------------------------------------------------- */
FC_INLINE uint32_t fc__f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
FC_INLINE float fc__bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* fmaf where the target has a fused multiply-add (x86 FMA3, aarch64, or the
 * compiler says fmaf is fast), else an unfused a * b + c (gelu's bounds,
 * fc_math_common.h, hold either way) */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA) || defined(__FP_FAST_FMAF)
#define FC__FMAF(a, b, c) fmaf((a), (b), (c))
#else
#define FC__FMAF(a, b, c) ((a) * (b) + (c))
#endif
#define FC__DIVF(p, q) ((p) / (q))     /* gelu's P / Q (CUDA: without the slow path) */

/* ---- float32 exp without libm ---------------------------------------------
 * libmvec's expf is a call per vector: every live register is spilled around
 * it, and it is most of a softmax row's time. This one is inline and computes
 * nothing conditionally (the vector loop has no branch; GCC's scalar
 * remainder loop may branch on the clamp), 29 AVX-512 instructions. On every
 * one of the 2^32 inputs, with FMA and without, it is at most one float from
 * the correctly rounded value (1.014 ULP real-valued, at x = 37.78; libmvec's
 * expf: 3 floats), checked against double exp:
 * - x is clamped to [-104, 88.8] (a NaN stays: the comparisons are false),
 *   which keeps n in [-150, 128]: -inf and x < -103.97 give +0, +inf and
 *   x > 88.72 overflow to inf in the last multiply.
 * - n = round(x log2 e) from the rounding constant's low bits, as in gelu;
 *   r = x - n ln2 in two steps (Cody-Waite: ln2's high part has 15
 *   significant bits, so n * it, |n| <= 150, is exact even without FMA),
 *   |r| <= ln2 / 2.
 * - e^r = 1 + r + r^2 Q(r), Q of degree 4: relative error 3.1e-9 as fitted
 *   (tools/fit_math.py), 3.9e-9 with the constants rounded to float.
 * - 2^n as two normal powers of two, 2^(n >> 1) and 2^(n - (n >> 1)): one of
 *   them alone would leave the exponent range below 2^-126; the scaling into
 *   the subnormals then rounds once (after p's own rounding: 2% of subnormal
 *   results are one float off). (n >> 1 of a negative int is an arithmetic
 *   shift in GCC and Clang.) */
/* tools/fit_math.py: e^r = 1 + r + r^2 Q(r) within 3.1e-09 relative */
#define FC_EXPF_Q4 1.381430891e-03f
#define FC_EXPF_Q3 8.368850686e-03f
#define FC_EXPF_Q2 4.166840017e-02f
#define FC_EXPF_Q1 1.666651964e-01f
#define FC_EXPF_Q0 4.999999404e-01f
FC_INLINE float fc__expf(float x) {
    float xc = x > 88.8f ? 88.8f : x;
    xc = xc < -104.0f ? -104.0f : xc;
    const float round = 12582912.0f;                     /* 1.5 * 2^23: n lands in nb's low bits */
    const float nb = FC__FMAF(xc, 1.44269504088896341f, round);
    const float n = nb - round;
    float r = FC__FMAF(n, -0.693145751953125f, xc);      /* ln2 = 0x3F317200 + 1.4286e-6 */
    r = FC__FMAF(n, -1.428606765330187045e-06f, r);
    float q = FC__FMAF(r, FC_EXPF_Q4, FC_EXPF_Q3);
    q = FC__FMAF(q, r, FC_EXPF_Q2);
    q = FC__FMAF(q, r, FC_EXPF_Q1);
    q = FC__FMAF(q, r, FC_EXPF_Q0);
    const float p = FC__FMAF(r * r, q, r) + 1.0f;        /* e^r */
    const int32_t ni = (int32_t)fc__f32_bits(nb) - 0x4B400000;   /* n */
    const int32_t n1 = ni >> 1, n2 = ni - n1;            /* both in [-75, 64] */
    return p * fc__bits_f32((uint32_t)(n1 + 127) << 23) * fc__bits_f32((uint32_t)(n2 + 127) << 23);
}
#if defined(FC_LIBMVEC_EXPF)    /* -DFC_LIBMVEC_EXPF in cflags: libmvec's expf instead (A/B runs) */
#define FC_EXPF(x) expf(x)
#else
#define FC_EXPF(x) fc__expf(x)
#endif
#undef FC_EXPF_Q4
#undef FC_EXPF_Q3
#undef FC_EXPF_Q2
#undef FC_EXPF_Q1
#undef FC_EXPF_Q0
FC_INLINE double fc_gelu_f64(double x) { return 0.5 * x * erfc(-0.70710678118654752 * x); }
FC_INLINE double fc_gelu_grad_f64(double x) {
    return 0.5 * erfc(-0.70710678118654752 * x) + x * (exp(-0.5 * x * x) * 0.398942280401432678);
}

/* ---- maximum, minimum, fmax, fmin, clamp of floats (ints: fc_math_common.h)
 * maximum/minimum propagate NaN (a + b is the first NaN operand); on a
 * tie (-0.0 vs +0.0) they return the second operand, as NumPy does.
 * fmax/fmin ignore NaN and also return the second operand on a tie: NumPy's
 * SIMD path (its short-array scalar path returns the first).
 * The isunordered() forms keep nested calls (clamp, relu6) vectorizable: a
 * NaN test on a select's result makes gcc 12 build mask selects it cannot vectorize. */
#define FC__MINMAX_F(t, T)                                                                \
    FC_INLINE T fc_maximum_##t(T a, T b) {                                            \
        T m = a > b ? a : b;                                                              \
        return isunordered(a, b) ? a + b : m;                                             \
    }                                                                                     \
    FC_INLINE T fc_minimum_##t(T a, T b) {                                            \
        T m = a < b ? a : b;                                                              \
        return isunordered(a, b) ? a + b : m;                                             \
    }                                                                                     \
    FC_INLINE T fc_fmax_##t(T a, T b) {                                               \
        T m = a > b ? a : b;                                                              \
        return isunordered(a, b) ? (b != b ? a : b) : m;                                  \
    }                                                                                     \
    FC_INLINE T fc_fmin_##t(T a, T b) {                                               \
        T m = a < b ? a : b;                                                              \
        return isunordered(a, b) ? (b != b ? a : b) : m;                                  \
    }                                                                                     \
    FC_INLINE T fc_clamp_##t(T x, T lo, T hi) { return fc_minimum_##t(fc_maximum_##t(x, lo), hi); }
FC__MINMAX_F(f32, float)
FC__MINMAX_F(f64, double)
#undef FC__MINMAX_F
/* relu: np.maximum(x, 0): NaN stays NaN, -0.0 becomes +0.0 */
FC_INLINE float fc_relu_f32(float x) { return fc_maximum_f32(x, 0.0f); }
FC_INLINE double fc_relu_f64(double x) { return fc_maximum_f64(x, 0.0); }

#include "fc_math_common.h"

#endif /* FC_MATH_H */
