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
 * at 1e7 elements. This one is inline and vectorizes to ~40 SIMD ops, 23 of
 * them multiplies or FMAs. With a = |x| / sqrt2 and w = 0.4 a,
 *     erfc(a) = t * (1 + u R(u)) * exp(-a^2),   t = 1 / (1 + w),  u = w t,
 * u in [0, 1), where 1 + u R(u) (R of degree 7) is fitted (Lawson-weighted
 * Chebyshev, in double) to erfc(a) exp(a^2) / t, a smooth function of u that
 * falls from 1 to 0.23, on a in [0, 10]: relative error 6.7e-8.
 * In terms of c = |x| (clamped, below) and C = 5 / sqrt2:
 *     t = C t',  t' = 1 / (c + C),  u = c t'
 * so w is never formed; C moves into the exp polynomial's coefficients.
 * - u = c t' rather than 1 - t: the rounding of t' then reaches u only
 *   relatively, so small |x| stay within 3 ULP.
 * - exp(-c^2 / 2) does not wait for the division: a short dependency chain
 *   lets the out-of-order core overlap iterations.
 * - exp: with c2 = c^2 (rounded), n = round(-c2 / 2 log2 e) and
 *   r' = c2 + 2 n ln2 = -2 r, r in [-ln2/2, ln2/2]; C e^r = C + r' Q(r') with
 *   Q of degree 5 (the degree-6 polynomial of 3e-9 relative error, its
 *   coefficients times C (-1/2)^k); 2^n is built from the rounding
 *   constant's bits. The float error of 2 ln2 reaches r as n * 1.9e-9, below
 *   the rounding of c2 itself where n is large.
 * - No branch and no select on the path to the result: GCC vectorizes a
 *   conditionally computed exp only with AVX-512 masks (each op then waits
 *   for the mask; 20% slower on Zen 4), and not at all with AVX2 (the loop
 *   stayed scalar: 8x slower). Instead every input is made safe:
 *   c = min(|x|, 14.5) in integer bits (NaN -> 14.5), so c2 <= 210.25,
 *   n >= -152; the biased exponent n + 127 is clamped at 0, which makes 2^n
 *   exactly 0 where the result is below 2^-126 (|x| > 13.2); between
 *   x = -13.2 and -13.3 the subnormal results are kept.
 * - The factor |x| is taken from min(x, 1e30) (signed integer min of the
 *   bits, so only x > 1e30 and positive NaNs are clamped), and the -1/2 of
 *   -|x| erfc / 2 sits in E's coefficients (an exact power-of-2 scaling: one
 *   multiply less, 3% faster on Zen 4): x = +inf gives 1e30 * -0 + inf =
 *   inf, x = -inf gives inf * -0 = NaN, as torch, and a NaN x is NaN
 *   through the product or the relu term.
 * - relu keeping the sign of zero is an unsigned min of the bits with
 *   0x80000000: -0 wherever the sign bit is set (one integer op instead of
 *   a compare and a blend).
 * Measured against double erfc on every 8th float of [-16, 16] and every
 * float of [-3, 3]: within 3 + 1.5 x^2 ULP (c^2 is rounded before exp),
 * at most 7.6 ULP for |x| < 3, as the form it replaced (7.7). */
#if defined(__FMA__)
#define FC__FMAF(a, b, c) fmaf((a), (b), (c))
#else
#define FC__FMAF(a, b, c) ((a) * (b) + (c))
#endif
FC_INLINE float fc_gelu_f32(float x) {
    const uint32_t ab = fc__f32_bits(x) & 0x7fffffffu;
    const float c = fc__bits_f32(ab < 0x41680000u ? ab : 0x41680000u);  /* min(|x|, 14.5) */
    const int32_t xb = (int32_t)fc__f32_bits(x);
    const int32_t mb = xb < 0x7149F2CA ? xb : 0x7149F2CA;                /* min(x, 1e30) */
    const float k = fc__bits_f32((uint32_t)mb & 0x7fffffffu);            /* |x|, finite at +inf */
    const float t = 1.0f / (c + 3.53553390593273762f);                   /* t' */
    const float u = c * t;
    float r = FC__FMAF(u, 4.029110450e-02f, -1.863369763e-01f);
    r = FC__FMAF(r, u, 2.519609605e-01f);
    r = FC__FMAF(r, u, 4.841204470e-02f);
    r = FC__FMAF(r, u, -2.457402078e-01f);
    r = FC__FMAF(r, u, -4.703833790e-01f);
    r = FC__FMAF(r, u, 1.608382898e+00f);
    r = FC__FMAF(r, u, -1.820955466e+00f);
    const float tp = FC__FMAF(t * u, r, t);                              /* t' (1 + u R(u)) */
    const float c2 = c * c;
    const float round = 12582912.0f + 127.0f;  /* 1.5 * 2^23 + bias: n + 127 lands in the low bits */
    const float nb = FC__FMAF(c2, -0.72134752044448170f, round);
    const float n = nb - round;
    const float rp = FC__FMAF(n, 1.38629436111989061f, c2);              /* r' = -2r */
    float q = FC__FMAF(rp, -3.815973226e-05f, 4.623107632e-04f);
    q = FC__FMAF(q, rp, -4.603748379e-03f);
    q = FC__FMAF(q, rp, 3.682815540e-02f);
    q = FC__FMAF(q, rp, -2.209708405e-01f);
    q = FC__FMAF(q, rp, 8.838834765e-01f);
    const float E = FC__FMAF(rp, q, -1.767766953e+00f);                   /* -C e^r / 2 */
    int32_t ib = (int32_t)fc__f32_bits(nb) - 0x4B400000;                  /* n + 127 */
    ib = ib < 0 ? 0 : ib;                                                /* 2^n = 0 below 2^-126 */
    const float e = tp * fc__bits_f32((uint32_t)ib << 23) * E;           /* -erfc(|x| / sqrt2) / 2 */
    const uint32_t xb32 = fc__f32_bits(x);
    /* relu keeping the sign of zero, gelu(+-0) = +-0: -0 for every x with the sign bit set */
    return FC__FMAF(k, e, fc__bits_f32(xb32 < 0x80000000u ? xb32 : 0x80000000u));
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
