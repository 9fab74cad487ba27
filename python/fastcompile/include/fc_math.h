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
 * at 1e7 elements. This one is inline and vectorizes to 31 SIMD ops, 16 of
 * them multiplies or FMAs: the loop is bound by the FMA pipes (not by
 * latency: Estrin's scheme for the polynomials made it slower), so every
 * multiply counts. With c = |x| (clamped, below) and a = c / sqrt2:
 *     -erfc(a) / 2 = P(c) / Q(c) * exp(-c^2 / 2)
 * where P / Q (P of degree 3, Q monic of degree 4, both with positive
 * coefficients up to P's sign, so Horner never cancels for c >= 0) is a
 * rational fit of -erfcx(a) / 2 on c in [0, 14.5] whose relative error is
 * weighted by 1 / (1 + 4c^2): 1.4e-8 at c = 0, where rounding alone takes
 * most of the tolerance of 4 + 2x^2 ULP, and let grow with c, 8 times as
 * fast as that tolerance (tools/fit_math.py derives every constant here).
 * - exp: with c2 = c^2 (rounded), n = round(-c2 / 2 log2 e) and
 *   r' = c2 + 2 n ln2 = -2 r, r in [-ln2/2, ln2/2]; e^r = 1 + r' S(r') with
 *   S of degree 4 (relative error 9e-8). n sits in the low bits of the
 *   rounding constant's sum nb, so shifting nb's bits left by 23 gives n in
 *   the exponent field: one integer add scales e^r in [0.7, 1.42] by 2^n, no
 *   multiply. The float error of 2 ln2 reaches r as n * 1.9e-9, below the
 *   rounding of c2 itself where n is large.
 * - No branch and nothing computed conditionally: GCC vectorizes a
 *   conditionally computed exp only with AVX-512 masks (each op then waits
 *   for the mask; 20% slower on Zen 4), and not at all with AVX2 (the loop
 *   stayed scalar: 8x slower). Instead every input is made safe (the one
 *   select, below, picks between two computed values):
 *   c = min(|x|, 14.5) in integer bits (NaN -> 14.5), so c2 <= 210.25,
 *   n >= -152; where n < -125 (c > 13.19) the add would leave the normal
 *   range, and e^r 2^n is zeroed instead (a compare and a zero-masked add):
 *   gelu(x) there is below 0.6 FLT_MIN and becomes -0 (torch's float
 *   gelu is 0 for every x < -5.54).
 * - The factor |x| is taken from min(x, 1e30) (signed integer min of the
 *   bits, so only x > 1e30 and positive NaNs are clamped), and the -1/2 of
 *   -|x| erfc / 2 sits in P's coefficients (an exact power-of-2 scaling):
 *   x = +inf gives 1e30 * -0 + inf = inf (torch's vectorized gelu gives
 *   NaN, its scalar one inf), x = -inf gives inf * -0 = NaN, as torch, and a
 *   NaN x is NaN through the product or the relu term.
 * - relu keeping the sign of zero is an unsigned min of the bits with
 *   0x80000000: -0 wherever the sign bit is set. Written with <=: GCC turns
 *   "< 0x80000000u" into a sign test and a blend, two ops instead of one.
 * Checked on every float with |x| < 16 against double erfc, with FMA and
 * without: within 4 + 2x^2 ULP or FLT_MIN (c^2 is rounded before exp: that
 * is the 2x^2). In the tests' measure (floats between the result and the
 * rounded exact value) at most 0.998 of it, 4 ULP near x = -0.063, and 0.95
 * for |x| >= 0.5; in real-valued ULP 0.996 (x = -0.34). The rational form
 * replaced a degree-7 polynomial in c / (c + 5 / sqrt2) and a degree-6 exp,
 * 5 FMAs more, which broke the bound (4.5 ULP at x = -0.0648): 0.458 ->
 * 0.341 ns per element on one Zen 4 core (AVX-512), 0.548 -> 0.377 at 256
 * bits. */
/* fmaf where the target has a fused multiply-add (x86 FMA3, aarch64, or the
 * compiler says fmaf is fast), else an unfused a * b + c (see the bounds above) */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA) || defined(__FP_FAST_FMAF)
#define FC__FMAF(a, b, c) fmaf((a), (b), (c))
#else
#define FC__FMAF(a, b, c) ((a) * (b) + (c))
#endif
/* tools/fit_math.py: P / Q = -erfcx(c / sqrt2) / 2 within 1.4e-08 (1 + 4c^2) relative,
 * 1 + r' S(r') = exp(-r' / 2) within 9.2e-08 relative */
#define FC_GELU_P3 -3.987651169e-01f
#define FC_GELU_P2 -3.079996586e+00f
#define FC_GELU_P1 -9.898755074e+00f
#define FC_GELU_P0 -1.478959465e+01f
#define FC_GELU_Q3 7.706301212e+00f
#define FC_GELU_Q2 2.599764252e+01f
#define FC_GELU_Q1 4.339825439e+01f
#define FC_GELU_Q0 2.957918930e+01f
#define FC_GELU_S4 -2.590715594e-04f
#define FC_GELU_S3 2.618626226e-03f
#define FC_GELU_S2 -2.083454654e-02f
#define FC_GELU_S1 1.249978691e-01f
#define FC_GELU_S0 -4.999998510e-01f
/* The part gelu and gelu_grad share, for c = min(|x|, 14.5): returns X = 2^k exp(-c^2 / 2)
 * (2^(n + k) e^r, zero where that leaves the normal range) and sets *e = P/Q(c) X =
 * -2^k erfc(c / sqrt2) / 2. k (a constant) moves the zeroing down k binades. */
FC_INLINE float fc__gelu_tail(float c, float *e, int k) {
    float p = FC__FMAF(c, FC_GELU_P3, FC_GELU_P2);
    p = FC__FMAF(p, c, FC_GELU_P1);
    p = FC__FMAF(p, c, FC_GELU_P0);
    float q = c + FC_GELU_Q3;
    q = FC__FMAF(q, c, FC_GELU_Q2);
    q = FC__FMAF(q, c, FC_GELU_Q1);
    q = FC__FMAF(q, c, FC_GELU_Q0);
    const float pq = p / q;                                              /* -erfcx(a) / 2 */
    const float c2 = c * c;
    const float round = 12582912.0f;       /* 1.5 * 2^23: n lands in the low bits of nb */
    const float nb = FC__FMAF(c2, -0.72134752044448170f, round);
    const float n = nb - round;
    const float rp = FC__FMAF(n, 1.38629436111989061f, c2);              /* r' = -2r */
    float s = FC__FMAF(rp, FC_GELU_S4, FC_GELU_S3);
    s = FC__FMAF(s, rp, FC_GELU_S2);
    s = FC__FMAF(s, rp, FC_GELU_S1);
    s = FC__FMAF(s, rp, FC_GELU_S0);
    const float E = FC__FMAF(s, rp, 1.0f);                               /* e^r */
    const uint32_t es = fc__f32_bits(E) + ((fc__f32_bits(nb) + (uint32_t)k) << 23);  /* e^r 2^(n+k) */
    const float X = fc__bits_f32(n >= -125.0f - (float)k ? es : 0u);    /* while normal */
    *e = pq * X;                                                         /* -2^k erfc(|x| / sqrt2) / 2 */
    return X;
}
FC_INLINE float fc_gelu_f32(float x) {
    const uint32_t ab = fc__f32_bits(x) & 0x7fffffffu;
    const float c = fc__bits_f32(ab < 0x41680000u ? ab : 0x41680000u);  /* min(|x|, 14.5) */
    const int32_t xb = (int32_t)fc__f32_bits(x);
    const int32_t mb = xb < 0x7149F2CA ? xb : 0x7149F2CA;                /* min(x, 1e30) */
    const float k = fc__bits_f32((uint32_t)mb & 0x7fffffffu);            /* |x|, finite at +inf */
    float e;
    (void)fc__gelu_tail(c, &e, 0);
    const uint32_t xb32 = fc__f32_bits(x);
    /* relu keeping the sign of zero, gelu(+-0) = +-0: -0 for every x with the sign bit set */
    return FC__FMAF(k, e, fc__bits_f32(xb32 <= 0x80000000u ? xb32 : 0x80000000u));
}

/* ---- float32 gelu_grad: d gelu / dx = Phi(x) + x phi(x) (gelu's backward) --
 * torch's decomposition computes erf(x / sqrt2) and exp(-x^2 / 2) apart: a
 * libmvec erff call and an exp per element, which made the backward kernel of
 * a GELU MLP compute-bound. gelu's tail gives both at once: with c = |x|,
 * e = -erfc(c / sqrt2) / 2 and X = exp(-c^2 / 2),
 *     Phi(x) = -e for x < 0 (= Phi(-c)), 1 + e otherwise;  phi(x) = X / sqrt(2 pi).
 * No erf, one exp. Phi keeps gelu's accuracy (relative, in the tail too);
 * near the root at x = -0.752 the sum cancels, as any float formula does.
 * X and e come scaled by 16 (k = 4), and x multiplies X before the constant
 * does (X / sqrt(2 pi) alone would be subnormal there): x phi(x) is up to
 * 5.8 X, so X must stay normal 3 binades further down than in gelu, or
 * results just above FLT_MIN come out 0 (x = -13.3: -2e-38); results below
 * FLT_MIN (x < -13.4) may be 0.
 * x = +-inf and NaN give NaN (x * 0 or NaN), as torch's decomposition. */
FC_INLINE float fc_gelu_grad_f32(float x) {
    const uint32_t xb = fc__f32_bits(x);
    const uint32_t ab = xb & 0x7fffffffu;
    const float c = fc__bits_f32(ab < 0x41680000u ? ab : 0x41680000u);  /* min(|x|, 14.5) */
    float e16;
    const float X16 = fc__gelu_tail(c, &e16, 4);
    const float e = e16 * 0.0625f;                                       /* exact */
    const float Phi = xb >> 31 ? -e : 1.0f + e;
    return FC__FMAF(x * X16, 0.398942280401432678f / 16.0f, Phi);
}

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
#undef FC__FMAF
#undef FC_EXPF_Q4
#undef FC_EXPF_Q3
#undef FC_EXPF_Q2
#undef FC_EXPF_Q1
#undef FC_EXPF_Q0
#undef FC_GELU_P3
#undef FC_GELU_P2
#undef FC_GELU_P1
#undef FC_GELU_P0
#undef FC_GELU_Q3
#undef FC_GELU_Q2
#undef FC_GELU_Q1
#undef FC_GELU_Q0
#undef FC_GELU_S4
#undef FC_GELU_S3
#undef FC_GELU_S2
#undef FC_GELU_S1
#undef FC_GELU_S0
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
