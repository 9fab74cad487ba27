/* Kernel support, shared: the op helpers written the same for the CPU (fc_math.h) and CUDA (fc_cuda_math.h).
 * In: operands already in the op's compute type. Out: NumPy-exact results, f16/bf16 storage, UB-free float->int casts. */
#ifndef FC_MATH_COMMON_H
#define FC_MATH_COMMON_H

/* Included at the end of fc_math.h and fc_cuda_math.h, never on its own.
 * The includer defines first:
 *   FC_FN            the qualifiers of every helper (CPU: static inline,
 *                    always_inline; NVRTC: static __device__ __forceinline__)
 *   FC_BOOL_T        what a predicate returns and _b helpers take (uint8_t, bool)
 *   FC_CMP_T         what an exact comparison returns (int, bool)
 *   FC_SET_ERR(err, code)  sets the kernel's int error flag *err to code, one of
 *                    the FC__E_* below (FC_ERR_* in fc_launch.h and fc_cuda_kernel.h)
 *   FC_EXPF(x)       float32 exp (CPU: fc_math.h's inline fc__expf; CUDA: expf)
 *   FC__FMAF(a,b,c)  fmaf where the target fuses (CUDA always), else a * b + c
 *   FC__DIVF(p,q)    p / q correctly rounded, for normal p, q and p / q
 *   int8_t..uint64_t, INT*_MIN, INFINITY, fc__f32_bits, fc__bits_f32, and
 *   libm's float functions (logf, fmod, ...) under their C names. */
#if !defined(FC_FN) || !defined(FC_BOOL_T) || !defined(FC_CMP_T) || !defined(FC_SET_ERR) || !defined(FC_EXPF) || \
    !defined(FC__FMAF) || !defined(FC__DIVF)
#error "fc_math_common.h is included by fc_math.h or fc_cuda_math.h"
#endif
#define FC__E_NEGATIVE_POWER 1   /* = FC_ERR_NEGATIVE_POWER */
#define FC__E_ZERO_DIVISION 3    /* = FC_ERR_ZERO_DIVISION */

/* ---- float-only transcendentals (libm / libmvec, or CUDA's device library) */
#define FC__FLOAT1(stem, fn)                                      \
    FC_FN float fc_##stem##_f32(float x) { return fn##f(x); }    \
    FC_FN double fc_##stem##_f64(double x) { return fn(x); }
#define FC__FLOAT2(stem, fn)                                                \
    FC_FN float fc_##stem##_f32(float a, float b) { return fn##f(a, b); }  \
    FC_FN double fc_##stem##_f64(double a, double b) { return fn(a, b); }
FC_FN float fc_exp_f32(float x) { return FC_EXPF(x); }
FC_FN double fc_exp_f64(double x) { return exp(x); }
FC__FLOAT1(exp2, exp2) FC__FLOAT1(expm1, expm1)
FC__FLOAT1(log, log) FC__FLOAT1(log2, log2) FC__FLOAT1(log10, log10) FC__FLOAT1(log1p, log1p)
FC__FLOAT1(sqrt, sqrt)
FC__FLOAT1(sin, sin) FC__FLOAT1(cos, cos) FC__FLOAT1(tan, tan)
FC__FLOAT1(asin, asin) FC__FLOAT1(acos, acos) FC__FLOAT1(atan, atan)
FC__FLOAT1(sinh, sinh) FC__FLOAT1(cosh, cosh) FC__FLOAT1(tanh, tanh)
FC__FLOAT1(asinh, asinh) FC__FLOAT1(acosh, acosh) FC__FLOAT1(atanh, atanh)
FC__FLOAT1(erf, erf)
FC__FLOAT2(atan2, atan2) FC__FLOAT2(copysign, copysign)
#ifndef FC_HYPOT_F64
#define FC_HYPOT_F64(a, b) hypot(a, b)
#endif
FC_FN float fc_hypot_f32(float a, float b) { return hypotf(a, b); }
FC_FN double fc_hypot_f64(double a, double b) { return FC_HYPOT_F64(a, b); }
#undef FC__FLOAT1
#undef FC__FLOAT2

/* 1/sqrt(x) correctly rounded twice (not CUDA's rsqrtf, 2 ULP) */
FC_FN float fc_rsqrt_f32(float x) { return 1.0f / sqrtf(x); }
FC_FN double fc_rsqrt_f64(double x) { return 1.0 / sqrt(x); }

/* ---- float32 gelu and gelu_grad without erfcf, CPU and CUDA alike ---------
 * libmvec's erfcf costs ~1.1 ns per element, which made gelu compute-bound
 * at 1e7 elements. On CUDA, 0.5x erfcf(-x/sqrt2) is ~50 instructions and 3
 * MUFU ops (2 reciprocals, an exp2): bfloat16 gelu was compute-bound at 65%
 * of an H100's copy bandwidth. This form is ~30 instructions there and one
 * reciprocal (the IEEE division P / Q), and with FMA its results are the
 * CPU's bit for bit.
 * On the CPU it is inline and vectorizes to 31 SIMD ops, 16 of
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
 *   for the mask), and not at all with AVX2 (the loop stayed scalar). Instead every input is made safe (the one
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
 * 5 FMAs more, which broke the bound (4.5 ULP at x = -0.0648) and was
 * slower. */
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
FC_FN float fc__gelu_tail(float c, float *e, int k) {
    float p = FC__FMAF(c, FC_GELU_P3, FC_GELU_P2);
    p = FC__FMAF(p, c, FC_GELU_P1);
    p = FC__FMAF(p, c, FC_GELU_P0);
    float q = c + FC_GELU_Q3;
    q = FC__FMAF(q, c, FC_GELU_Q2);
    q = FC__FMAF(q, c, FC_GELU_Q1);
    q = FC__FMAF(q, c, FC_GELU_Q0);
    const float pq = FC__DIVF(p, q);                                     /* -erfcx(a) / 2 */
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
FC_FN float fc_gelu_f32(float x) {
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
FC_FN float fc_gelu_grad_f32(float x) {
    const uint32_t xb = fc__f32_bits(x);
    const uint32_t ab = xb & 0x7fffffffu;
    const float c = fc__bits_f32(ab < 0x41680000u ? ab : 0x41680000u);  /* min(|x|, 14.5) */
    float e16;
    const float X16 = fc__gelu_tail(c, &e16, 4);
    const float e = e16 * 0.0625f;                                       /* exact */
    const float Phi = xb >> 31 ? -e : 1.0f + e;
    return FC__FMAF(x * X16, 0.398942280401432678f / 16.0f, Phi);
}

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
#undef FC__FMAF
#undef FC__DIVF

/* ---- activations (float32 gelu: above; float64: the includer's) ------------------------------
 * x * sigmoid(y) with one division: e = exp(-|y|) never overflows, and y < 0
 * gives x*e / (1+e), so results are accurate down to the subnormals and
 * sigmoid is exactly 0/1 in the limits (no NaN for finite y). */
FC_FN float fc__xsigmoid_f32(float x, float y) {
    float e = FC_EXPF(-fabsf(y));
    return (y >= 0.0f ? x : x * e) / (1.0f + e);
}
FC_FN double fc__xsigmoid_f64(double x, double y) {
    double e = exp(-fabs(y));
    return (y >= 0.0 ? x : x * e) / (1.0 + e);
}
FC_FN float fc_sigmoid_f32(float x) { return fc__xsigmoid_f32(1.0f, x); }
FC_FN double fc_sigmoid_f64(double x) { return fc__xsigmoid_f64(1.0, x); }
/* silu: x * sigmoid(x); silu(-inf) is NaN, as torch. */
FC_FN float fc_silu_f32(float x) { return fc__xsigmoid_f32(x, x); }
FC_FN double fc_silu_f64(double x) { return fc__xsigmoid_f64(x, x); }
/* gelu_tanh: 0.5x(1 + tanh(u)) == x * sigmoid(2u), u = sqrt(2/pi)(x + 0.044715x^3);
 * the sigmoid form has no cancellation for x << 0. */
FC_FN float fc_gelu_tanh_f32(float x) {
    return fc__xsigmoid_f32(x, 1.5957691216057308f * (x + 0.044715f * x * x * x));
}
FC_FN double fc_gelu_tanh_f64(double x) {
    return fc__xsigmoid_f64(x, 1.5957691216057308 * (x + 0.044715 * x * x * x));
}
/* softplus: torch's beta=1, threshold=20 */
FC_FN float fc_softplus_f32(float x) { return x > 20.0f ? x : log1pf(FC_EXPF(x)); }
FC_FN double fc_softplus_f64(double x) { return x > 20.0 ? x : log1p(exp(x)); }

/* ---- per-type families: generated for every integer type ----------------
 * Signed: (suffix, type, unsigned type, min, pow work type).
 * Unsigned: (suffix, type, pow work type). */
#define FC__SIGNED(X)                                        \
    X(i8, int8_t, uint8_t, INT8_MIN, uint32_t)               \
    X(i16, int16_t, uint16_t, INT16_MIN, uint32_t)           \
    X(i32, int32_t, uint32_t, INT32_MIN, uint32_t)           \
    X(i64, int64_t, uint64_t, INT64_MIN, uint64_t)
#define FC__UNSIGNED(X)                                      \
    X(u8, uint8_t, uint32_t) X(u16, uint16_t, uint32_t)     \
    X(u32, uint32_t, uint32_t) X(u64, uint64_t, uint64_t)

/* ---- abs, relu, sign, bitnot, rounding (identity for ints) --------------- */
/* abs(INT_MIN) == INT_MIN, as NumPy (wraps, computed in unsigned) */
#define FC__UNARY_S(t, T, U, TMIN, W)                                         \
    FC_FN T fc_abs_##t(T x) { return x < 0 ? (T)(0u - (U)x) : x; }           \
    FC_FN T fc_relu_##t(T x) { return x < 0 ? (T)0 : x; }                     \
    FC_FN T fc_sign_##t(T x) { return (T)((x > 0) - (x < 0)); }              \
    FC_FN T fc_bitnot_##t(T x) { return (T)~x; }                              \
    FC_FN T fc_floor_##t(T x) { return x; }                                   \
    FC_FN T fc_ceil_##t(T x) { return x; }                                    \
    FC_FN T fc_round_##t(T x) { return x; }                                   \
    FC_FN T fc_trunc_##t(T x) { return x; }
#define FC__UNARY_U(t, T, W)                                                  \
    FC_FN T fc_abs_##t(T x) { return x; }                                     \
    FC_FN T fc_relu_##t(T x) { return x; }                                    \
    FC_FN T fc_sign_##t(T x) { return (T)(x != 0); }                          \
    FC_FN T fc_bitnot_##t(T x) { return (T)~x; }                              \
    FC_FN T fc_floor_##t(T x) { return x; }                                   \
    FC_FN T fc_ceil_##t(T x) { return x; }                                    \
    FC_FN T fc_round_##t(T x) { return x; }                                   \
    FC_FN T fc_trunc_##t(T x) { return x; }
FC__SIGNED(FC__UNARY_S)
FC__UNSIGNED(FC__UNARY_U)
#undef FC__UNARY_S
#undef FC__UNARY_U

FC_FN FC_BOOL_T fc_abs_b(FC_BOOL_T x) { return x; }
FC_FN FC_BOOL_T fc_relu_b(FC_BOOL_T x) { return x; }
FC_FN FC_BOOL_T fc_bitnot_b(FC_BOOL_T x) { return (FC_BOOL_T)(x == 0); }
FC_FN FC_BOOL_T fc_floor_b(FC_BOOL_T x) { return x; }
FC_FN FC_BOOL_T fc_ceil_b(FC_BOOL_T x) { return x; }
FC_FN FC_BOOL_T fc_round_b(FC_BOOL_T x) { return x; }
FC_FN FC_BOOL_T fc_trunc_b(FC_BOOL_T x) { return x; }

FC_FN float fc_abs_f32(float x) { return fabsf(x); }
FC_FN double fc_abs_f64(double x) { return fabs(x); }
/* sign: NaN -> NaN, -0.0 -> +0.0 (NumPy) */
FC_FN float fc_sign_f32(float x) {
    return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x == 0.0f ? 0.0f : x));
}
FC_FN double fc_sign_f64(double x) {
    return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : (x == 0.0 ? 0.0 : x));
}
/* round: half to even, like np.round(x) (rint in the default rounding mode) */
FC_FN float fc_floor_f32(float x) { return floorf(x); }
FC_FN double fc_floor_f64(double x) { return floor(x); }
FC_FN float fc_ceil_f32(float x) { return ceilf(x); }
FC_FN double fc_ceil_f64(double x) { return ceil(x); }
FC_FN float fc_round_f32(float x) { return rintf(x); }
FC_FN double fc_round_f64(double x) { return rint(x); }
FC_FN float fc_trunc_f32(float x) { return truncf(x); }
FC_FN double fc_trunc_f64(double x) { return trunc(x); }

/* ---- isnan, isinf, isfinite (FC_BOOL_T 0/1) ------------------------------ */
#define FC__PRED_INT(t, T)                                                  \
    FC_FN FC_BOOL_T fc_isnan_##t(T x) { (void)x; return 0; }               \
    FC_FN FC_BOOL_T fc_isinf_##t(T x) { (void)x; return 0; }               \
    FC_FN FC_BOOL_T fc_isfinite_##t(T x) { (void)x; return 1; }
#define FC__PRED_S(t, T, U, TMIN, W) FC__PRED_INT(t, T)
#define FC__PRED_U(t, T, W) FC__PRED_INT(t, T)
FC__PRED_INT(b, FC_BOOL_T)
FC__SIGNED(FC__PRED_S)
FC__UNSIGNED(FC__PRED_U)
#undef FC__PRED_INT
#undef FC__PRED_S
#undef FC__PRED_U
FC_FN FC_BOOL_T fc_isnan_f32(float x) { return (FC_BOOL_T)(x != x); }
FC_FN FC_BOOL_T fc_isnan_f64(double x) { return (FC_BOOL_T)(x != x); }
FC_FN FC_BOOL_T fc_isinf_f32(float x) { return (FC_BOOL_T)(fabsf(x) == INFINITY); }
FC_FN FC_BOOL_T fc_isinf_f64(double x) { return (FC_BOOL_T)(fabs(x) == (double)INFINITY); }
FC_FN FC_BOOL_T fc_isfinite_f32(float x) { return (FC_BOOL_T)(fabsf(x) < INFINITY); }
FC_FN FC_BOOL_T fc_isfinite_f64(double x) { return (FC_BOOL_T)(fabs(x) < (double)INFINITY); }

/* ---- maximum, minimum, fmax, fmin, clamp of ints (floats: the includer's) */
#define FC__MINMAX(t, T)                                                       \
    FC_FN T fc_maximum_##t(T a, T b) { return a > b ? a : b; }                \
    FC_FN T fc_minimum_##t(T a, T b) { return a < b ? a : b; }                \
    FC_FN T fc_fmax_##t(T a, T b) { return a > b ? a : b; }                   \
    FC_FN T fc_fmin_##t(T a, T b) { return a < b ? a : b; }                   \
    FC_FN T fc_clamp_##t(T x, T lo, T hi) { return fc_minimum_##t(fc_maximum_##t(x, lo), hi); }
#define FC__MINMAX_S(t, T, U, TMIN, W) FC__MINMAX(t, T)
#define FC__MINMAX_U(t, T, W) FC__MINMAX(t, T)
FC__MINMAX(b, FC_BOOL_T)
FC__SIGNED(FC__MINMAX_S)
FC__UNSIGNED(FC__MINMAX_U)
#undef FC__MINMAX
#undef FC__MINMAX_S
#undef FC__MINMAX_U

/* ---- safe float -> int casts ----------------------------------------------
 * C leaves out-of-range conversions undefined (and PTX's cvt.rzi saturates);
 * these give what NumPy's astype gives on x86-64 (cvttsd2si) and never trap
 * or trip -fsanitize=float-cast-overflow:
 *   i64: NaN / out of range -> INT64_MIN.    i32: -> INT32_MIN.
 *   i8 i16 u8 u16: through i32, then the low bits (NaN, |x| >= 2^31 -> 0).
 *   u32: through i64, then the low 32 bits (NumPy's scalar path; its SIMD
 *        path differs for out-of-range values, so there is no one answer).
 *   u64: x < 2^63 (or NaN) through i64, else i64(x - 2^63) ^ 2^63 (so NaN and
 *        x < -2^63 -> 2^63; x >= 2^64 and +inf -> 0), exactly gcc's and NumPy's. */
FC_FN int64_t fc_f2i64(double x) {
    return (x >= -0x1p63 && x < 0x1p63) ? (int64_t)x : INT64_MIN;
}
FC_FN int32_t fc_f2i32(double x) {
    return (x > -2147483649.0 && x < 2147483648.0) ? (int32_t)x : INT32_MIN;
}
FC_FN int16_t fc_f2i16(double x) { return (int16_t)(uint16_t)(uint32_t)fc_f2i32(x); }
FC_FN int8_t fc_f2i8(double x) { return (int8_t)(uint8_t)(uint32_t)fc_f2i32(x); }
FC_FN uint16_t fc_f2u16(double x) { return (uint16_t)(uint32_t)fc_f2i32(x); }
FC_FN uint8_t fc_f2u8(double x) { return (uint8_t)(uint32_t)fc_f2i32(x); }
FC_FN uint32_t fc_f2u32(double x) { return (uint32_t)(uint64_t)fc_f2i64(x); }
FC_FN uint64_t fc_f2u64(double x) {
    return x >= 0x1p63 ? ((uint64_t)fc_f2i64(x - 0x1p63) ^ 0x8000000000000000ull)
                       : (uint64_t)fc_f2i64(x);
}

/* ---- reciprocal -----------------------------------------------------------
 * Ints: NumPy computes 1.0/x in double and casts, so 1/0 is inf cast to the
 * type: INT_MIN for i32/i64, 0 for the rest; otherwise integer 1/x. */
#define FC__RECIP_S(t, T, U, TMIN, W)                                   \
    FC_FN T fc_reciprocal_##t(T x) {                                     \
        T r = (x == 1 || x == -1) ? x : (T)0;                            \
        return x == 0 ? (T)(sizeof(T) >= 4 ? TMIN : 0) : r;              \
    }
#define FC__RECIP_U(t, T, W) \
    FC_FN T fc_reciprocal_##t(T x) { return (T)(x == 1); }
FC__SIGNED(FC__RECIP_S)
FC__UNSIGNED(FC__RECIP_U)
#undef FC__RECIP_S
#undef FC__RECIP_U
FC_FN float fc_reciprocal_f32(float x) { return 1.0f / x; }
FC_FN double fc_reciprocal_f64(double x) { return 1.0 / x; }

/* ---- floordiv, remainder ---------------------------------------------------
 * Ints: Python rounding (remainder has the divisor's sign). x // 0 and x % 0
 * are 0 (NumPy warns); INT_MIN // -1 is INT_MIN and INT_MIN % -1 is 0, never SIGFPE. */
#define FC__DIVMOD_S(t, T, U, TMIN, W)                                          \
    FC_FN T fc_floordiv_##t(T a, T b) {                                          \
        if (b == 0) return 0;                                                    \
        if (b == -1) return (T)(0u - (U)a);                                      \
        T q = (T)(a / b);                                                        \
        return (T)(((a % b) != 0 && ((a < 0) != (b < 0))) ? q - 1 : q);         \
    }                                                                            \
    FC_FN T fc_remainder_##t(T a, T b) {                                         \
        if (b == 0 || b == -1) return 0;                                         \
        T r = (T)(a % b);                                                        \
        return (T)((r != 0 && ((r < 0) != (b < 0))) ? r + b : r);               \
    }
#define FC__DIVMOD_U(t, T, W)                                                              \
    FC_FN T fc_floordiv_##t(T a, T b) { return b == 0 ? (T)0 : (T)(a / b); }              \
    FC_FN T fc_remainder_##t(T a, T b) { return b == 0 ? (T)0 : (T)(a % b); }
FC__SIGNED(FC__DIVMOD_S)
FC__UNSIGNED(FC__DIVMOD_U)
#undef FC__DIVMOD_S
#undef FC__DIVMOD_U

/* check_divisor: x itself; an integer x of 0 sets the kernel's error flag
 * (FC__E_ZERO_DIVISION: torch's RuntimeError "ZeroDivisionError"). The torch
 * routes put it on the divisor of an integer floordiv or remainder, where
 * torch raises and NumPy gives 0. Floats and bool pass unchanged. */
#define FC__CHECKDIV_S(t, T, U, TMIN, W)                                        \
    FC_FN T fc_check_divisor_##t(T x, int *err) {                               \
        if (x == 0) FC_SET_ERR(err, FC__E_ZERO_DIVISION);                       \
        return x;                                                               \
    }
#define FC__CHECKDIV_U(t, T, W) FC__CHECKDIV_S(t, T, T, 0, W)
FC__SIGNED(FC__CHECKDIV_S)
FC__UNSIGNED(FC__CHECKDIV_U)
#undef FC__CHECKDIV_S
#undef FC__CHECKDIV_U
FC_FN FC_BOOL_T fc_check_divisor_b(FC_BOOL_T x, int *err) { (void)err; return x; }
FC_FN float fc_check_divisor_f32(float x, int *err) { (void)err; return x; }
FC_FN double fc_check_divisor_f64(double x, int *err) { (void)err; return x; }

/* Floats: NumPy's npy_divmod (CPython's float divmod): fmod, moved to the
 * divisor's sign, quotient (a - mod) / b snapped to an integer; signed zeros
 * as NumPy. b == 0: floordiv is a / b (+-inf or NaN), remainder fmod (NaN). */
#define FC__DIVMOD_F(t, T, sfx)                                                 \
    FC_FN T fc__divmod_##t(T a, T b, T *modulus) {                              \
        T mod = fmod##sfx(a, b);                                                \
        T div = (a - mod) / b;                                                  \
        if (mod != 0) {                                                         \
            if ((b < 0) != (mod < 0)) { mod += b; div -= (T)1; }                \
        } else {                                                                \
            mod = copysign##sfx((T)0, b);                                       \
        }                                                                       \
        T fdiv;                                                                 \
        if (div != 0) {                                                         \
            fdiv = floor##sfx(div);                                             \
            if (div - fdiv > (T)0.5) fdiv += (T)1;                              \
        } else {                                                                \
            fdiv = copysign##sfx((T)0, a / b);                                  \
        }                                                                       \
        *modulus = mod;                                                         \
        return fdiv;                                                            \
    }                                                                           \
    FC_FN T fc_floordiv_##t(T a, T b) {                                         \
        T mod;                                                                  \
        return b == 0 ? a / b : fc__divmod_##t(a, b, &mod);                     \
    }                                                                           \
    FC_FN T fc_remainder_##t(T a, T b) {                                        \
        T mod;                                                                  \
        if (b == 0) return fmod##sfx(a, b);                                     \
        (void)fc__divmod_##t(a, b, &mod);                                       \
        return mod;                                                             \
    }
FC__DIVMOD_F(f32, float, f)
FC__DIVMOD_F(f64, double, )
#undef FC__DIVMOD_F

/* ---- pow --------------------------------------------------------------------
 * Ints: exponentiation by squaring in unsigned arithmetic (wraps like NumPy).
 * A negative exponent sets the kernel's error flag (FC_ERR_NEGATIVE_POWER:
 * NumPy's ValueError) and yields 0. bool ** bool is promoted to int8 by the
 * rules (SAMEI8); nothing needs a _b pow. */
#define FC__POW_S(t, T, U, TMIN, W)                                             \
    FC_FN T fc_pow_##t(T a, T b, int *err) {                                    \
        if (b < 0) { FC_SET_ERR(err, FC__E_NEGATIVE_POWER); return 0; }         \
        W base = (W)a, r = 1;                                                   \
        for (U e = (U)b; e != 0; e >>= 1) {                                     \
            if (e & 1u) r *= base;                                              \
            base *= base;                                                       \
        }                                                                       \
        return (T)(U)r;                                                         \
    }
#define FC__POW_U(t, T, W)                                                      \
    FC_FN T fc_pow_##t(T a, T b, int *err) {                                    \
        (void)err;                                                              \
        W base = a, r = 1;                                                      \
        for (T e = b; e != 0; e >>= 1) {                                        \
            if (e & 1u) r *= base;                                              \
            base *= base;                                                       \
        }                                                                       \
        return (T)r;                                                            \
    }
FC__SIGNED(FC__POW_S)
FC__UNSIGNED(FC__POW_U)
#undef FC__POW_S
#undef FC__POW_U
FC_FN float fc_pow_f32(float a, float b, int *err) { (void)err; return powf(a, b); }
FC_FN double fc_pow_f64(double a, double b, int *err) { (void)err; return pow(a, b); }

#undef FC__SIGNED
#undef FC__UNSIGNED

/* ---- float16 storage --------------------------------------------------------
 * Round to nearest even; inf, NaN (made quiet, payload's top bits kept, as
 * x86 F16C) and subnormals exact. Integer code with selects, so loops
 * vectorize (gcc 12 does not vectorize _Float16 conversions, even with F16C;
 * CUDA needs no cuda_fp16.h) and no float arithmetic meets a subnormal unless
 * the input is one (assists). */
FC_FN float fc_load_f16(uint16_t h) {
    uint32_t em = h & 0x7fffu, e = em & 0x7c00u;
    uint32_t o = (em << 13) + 0x38000000u;                     /* rebias 15 -> 127 */
    float sub = fc__bits_f32(o + 0x00800000u) - 0x1p-14f;       /* m * 2^-24, exact */
    uint32_t bits = e == 0x7c00u ? o + 0x38000000u : (e == 0 ? fc__f32_bits(sub) : o);
    return fc__bits_f32(bits | ((uint32_t)(h & 0x8000u) << 16));
}
FC_FN uint16_t fc_store_f16(float x) {
    uint32_t f = fc__f32_bits(x), sign = (f >> 16) & 0x8000u;
    f &= 0x7fffffffu;
    /* half subnormals: adding 0.5f rounds at 2^-24 (RNE by the FPU) */
    uint32_t sub = fc__f32_bits(fc__bits_f32(f) + 0.5f) - 0x3f000000u;
    /* normals: rebias the exponent and round the 13 dropped bits to even;
     * a carry out of 65504 lands on the inf encoding */
    uint32_t nrm = (f + 0xc8000fffu + ((f >> 13) & 1u)) >> 13;
    uint32_t big = f > 0x7f800000u ? (0x7e00u | ((f >> 13) & 0x3ffu)) : 0x7c00u;
    uint32_t h = f >= 0x47800000u ? big : (f < 0x38800000u ? sub : nrm);
    return (uint16_t)(h | sign);
}

/* ---- bfloat16 storage -------------------------------------------------------
 * The top half of a float32; stores round to nearest even (overflow -> inf);
 * NaN keeps its sign and top payload bits and is made quiet. */
FC_FN float fc_load_bf16(uint16_t h) { return fc__bits_f32((uint32_t)h << 16); }
FC_FN uint16_t fc_store_bf16(float x) {
    uint32_t u = fc__f32_bits(x);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(x != x ? ((u >> 16) | 0x40u) : r);
}

/* float64 -> float32 rounding to odd: a later round to nearest even into
 * float16/bfloat16 then gives the correctly rounded result (float32 keeps
 * more than two extra bits), where (float)x would round twice. */
FC_FN float fc_f64_to_f32_odd(double x) {
    float f = (float)x;
    if ((double)f != x && f == f && f - f == 0.0f) {
        if (fabs((double)f) > fabs(x)) {
            f = nextafterf(f, 0.0f);
        }
        f = fc__bits_f32(fc__f32_bits(f) | 1u);
    }
    return f;
}

/* ---- exact comparisons of a signed int with a uint64 ------------------------
 * NumPy 2 compares int64 with uint64 (and Python ints with any int) exactly;
 * going through their promoted float64 would make 2**62 + 1 == 2**62.
 * _iu: a signed, b unsigned; _ui: a unsigned, b signed. */
FC_FN FC_CMP_T fc_eq_iu(int64_t a, uint64_t b) { return a >= 0 && (uint64_t)a == b; }
FC_FN FC_CMP_T fc_lt_iu(int64_t a, uint64_t b) { return a < 0 || (uint64_t)a < b; }
FC_FN FC_CMP_T fc_gt_iu(int64_t a, uint64_t b) { return a >= 0 && (uint64_t)a > b; }
FC_FN FC_CMP_T fc_ne_iu(int64_t a, uint64_t b) { return !fc_eq_iu(a, b); }
FC_FN FC_CMP_T fc_le_iu(int64_t a, uint64_t b) { return !fc_gt_iu(a, b); }
FC_FN FC_CMP_T fc_ge_iu(int64_t a, uint64_t b) { return !fc_lt_iu(a, b); }
FC_FN FC_CMP_T fc_eq_ui(uint64_t a, int64_t b) { return fc_eq_iu(b, a); }
FC_FN FC_CMP_T fc_ne_ui(uint64_t a, int64_t b) { return fc_ne_iu(b, a); }
FC_FN FC_CMP_T fc_lt_ui(uint64_t a, int64_t b) { return fc_gt_iu(b, a); }
FC_FN FC_CMP_T fc_le_ui(uint64_t a, int64_t b) { return fc_ge_iu(b, a); }
FC_FN FC_CMP_T fc_gt_ui(uint64_t a, int64_t b) { return fc_lt_iu(b, a); }
FC_FN FC_CMP_T fc_ge_ui(uint64_t a, int64_t b) { return fc_le_iu(b, a); }

#endif /* FC_MATH_COMMON_H */
