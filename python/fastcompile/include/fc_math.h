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
 * libmvec declarations, the bit casts and the helpers that differ (gelu,
 * float min/max). */

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
#define FC_SET_ERR(err) __atomic_store_n((err), 1, __ATOMIC_RELAXED)

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

/* ---- float32 gelu without libm (other activations: fc_math_common.h) -----
 * libmvec's erfcf costs ~1.1 ns per element, which made gelu compute-bound
 * at 1e7 elements. This one is inline and vectorizes to ~30 SIMD ops. With
 * a = |x| / sqrt2 and w = 0.4 a,
 *     erfc(a) = t * (1 + u R(u)) * exp(-a^2),   t = 1 / (1 + w),  u = w t,
 * u in [0, 1), where 1 + u R(u) (R of degree 7) is fitted (Lawson-weighted
 * Chebyshev, in double) to erfc(a) exp(a^2) / t, a smooth function of u that
 * falls from 1 to 0.23, on a in [0, 10]: relative error 6.7e-8.
 * - u = w t rather than 1 - t: the rounding of t then reaches u only
 *   relatively, so small |x| stay within 3 ULP.
 * - exp(-a^2) = exp(-x^2 / 2) does not wait for the division: a short
 *   dependency chain lets the out-of-order core overlap iterations.
 * - exp(y), y <= 0: one-constant reduction y = n ln2 + r (the float error of
 *   ln2, n * 1.9e-9, is below the rounding of y itself where n is large), a
 *   degree-6 polynomial (3e-9 relative) and 2^n built from the rounding
 *   constant's bits. Below y = -87 (x < -13.2, results under 2^-126) the
 *   result is flushed to zero; that also covers x = +-inf, where u is NaN.
 * Measured against double erfc on a 1.3e-5 grid of [-14, 14]: within
 * 3 + 1.5 x^2 ULP (x^2 / 2 is rounded before exp), relative error <= 5.2e-7
 * for |x| < 3. */
#if defined(__FMA__)
#define FC__FMAF(a, b, c) fmaf((a), (b), (c))
#else
#define FC__FMAF(a, b, c) ((a) * (b) + (c))
#endif
/* s * e^y for y in [-87, 0]; the caller masks other y. */
FC_INLINE float fc__scaled_exp_neg_f32(float y, float s) {
    const float round = 12582912.0f + 127.0f; /* 1.5 * 2^23 + bias: n + 127 lands in the low bits */
    float nb = FC__FMAF(y, 1.44269504088896341f, round);
    float n = nb - round;
    float r = FC__FMAF(n, -0.693147180559945f, y);
    float q = FC__FMAF(r, 1.381529879e-03f, 8.368718737e-03f);
    q = FC__FMAF(q, r, 4.166837373e-02f);
    q = FC__FMAF(q, r, 1.666652059e-01f);
    q = FC__FMAF(q, r, 4.999999352e-01f);
    float p = FC__FMAF(r * r, q, r);                      /* e^r - 1 */
    float s2n = s * fc__bits_f32(fc__f32_bits(nb) << 23);  /* s * 2^n */
    return FC__FMAF(p, s2n, s2n);
}
/* gelu: 0.5x(1 + erf(x/sqrt2)) computed as relu(x) - 0.5|x| erfc(|x|/sqrt2),
 * which is 0.5x*erfc(-x/sqrt2) for x <= 0 and x - 0.5x*erfc(x/sqrt2) for
 * x > 0: no cancellation for x << 0, and no select between two forms.
 * k = -0.5|x| is taken from min(x, 1e30) so that x = +inf gives
 * inf + (-5e29 * 0) = inf while x = -inf gives 0 + (-inf * 0) = NaN, as
 * torch; a NaN x makes e NaN. */
FC_INLINE float fc_gelu_f32(float x) {
    float a = fabsf(x);
    float w = 0.28284271247461901f * a;        /* 0.4 |x| / sqrt2 */
    float t = 1.0f / (w + 1.0f);
    float u = w * t;
    float r = FC__FMAF(u, 4.029110450e-02f, -1.863369763e-01f);
    r = FC__FMAF(r, u, 2.519609605e-01f);
    r = FC__FMAF(r, u, 4.841204470e-02f);
    r = FC__FMAF(r, u, -2.457402078e-01f);
    r = FC__FMAF(r, u, -4.703833790e-01f);
    r = FC__FMAF(r, u, 1.608382898e+00f);
    r = FC__FMAF(r, u, -1.820955466e+00f);
    float tp = FC__FMAF(t * u, r, t);                               /* t (1 + u R(u)) */
    float k = -0.5f * fabsf(x < 1e30f ? x : 1e30f);                 /* -0.5|x|, finite at +inf */
    float y = k * a;                                                /* -a^2 = -x^2 / 2 */
    float e = y < -87.0f ? 0.0f : fc__scaled_exp_neg_f32(y, tp);    /* erfc(|x| / sqrt2) */
    return FC__FMAF(k, e, x >= 0.0f ? x : -0.0f);  /* relu keeping the sign of zero: gelu(+-0) = +-0 */
}
#undef FC__FMAF
FC_INLINE double fc_gelu_f64(double x) { return 0.5 * x * erfc(-0.70710678118654752 * x); }

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
