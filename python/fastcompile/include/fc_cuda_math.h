/* Kernel support, CUDA: per-type op helpers for generated CUDA C (fc_<stem>_<suffix>, as ops.def's templates).
 * In: operands already in the op's compute type. Out: the same NumPy-exact results as fc_math.h, on the device. */
#ifndef FC_CUDA_MATH_H
#define FC_CUDA_MATH_H

/* The device twin of fc_math.h: same names, same semantics (NaN/inf as
 * NumPy, integer division by zero is 0, exact int64/uint64 comparisons,
 * float->int casts with x86-64's results, f16/bf16 storage rounded to
 * nearest even), written for NVRTC: no system headers, no libm, CUDA's
 * device math library (available in NVRTC without includes) instead.
 * Differences from the CPU header are noted where they exist. */

#define FC_DEV static __device__ __forceinline__

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

/* ---- float-only transcendentals (CUDA's device math library) ------------- */
#define FC__FLOAT1(stem, fn)                                      \
    FC_DEV float fc_##stem##_f32(float x) { return fn##f(x); }   \
    FC_DEV double fc_##stem##_f64(double x) { return fn(x); }
#define FC__FLOAT2(stem, fn)                                                \
    FC_DEV float fc_##stem##_f32(float a, float b) { return fn##f(a, b); } \
    FC_DEV double fc_##stem##_f64(double a, double b) { return fn(a, b); }
FC__FLOAT1(exp, exp) FC__FLOAT1(exp2, exp2) FC__FLOAT1(expm1, expm1)
FC__FLOAT1(log, log) FC__FLOAT1(log2, log2) FC__FLOAT1(log10, log10) FC__FLOAT1(log1p, log1p)
FC__FLOAT1(sqrt, sqrt)
FC__FLOAT1(sin, sin) FC__FLOAT1(cos, cos) FC__FLOAT1(tan, tan)
FC__FLOAT1(asin, asin) FC__FLOAT1(acos, acos) FC__FLOAT1(atan, atan)
FC__FLOAT1(sinh, sinh) FC__FLOAT1(cosh, cosh) FC__FLOAT1(tanh, tanh)
FC__FLOAT1(asinh, asinh) FC__FLOAT1(acosh, acosh) FC__FLOAT1(atanh, atanh)
FC__FLOAT1(erf, erf)
FC__FLOAT2(atan2, atan2) FC__FLOAT2(hypot, hypot) FC__FLOAT2(copysign, copysign)
#undef FC__FLOAT1
#undef FC__FLOAT2

/* 1/sqrt(x) correctly rounded twice, as the CPU side (not rsqrtf's 2 ULP) */
FC_DEV float fc_rsqrt_f32(float x) { return 1.0f / sqrtf(x); }
FC_DEV double fc_rsqrt_f64(double x) { return 1.0 / sqrt(x); }

/* ---- activations ----------------------------------------------------------
 * x * sigmoid(y) with one division; e = exp(-|y|) never overflows (see fc_math.h). */
FC_DEV float fc__xsigmoid_f32(float x, float y) {
    float e = expf(-fabsf(y));
    return (y >= 0.0f ? x : x * e) / (1.0f + e);
}
FC_DEV double fc__xsigmoid_f64(double x, double y) {
    double e = exp(-fabs(y));
    return (y >= 0.0 ? x : x * e) / (1.0 + e);
}
FC_DEV float fc_sigmoid_f32(float x) { return fc__xsigmoid_f32(1.0f, x); }
FC_DEV double fc_sigmoid_f64(double x) { return fc__xsigmoid_f64(1.0, x); }
FC_DEV float fc_silu_f32(float x) { return fc__xsigmoid_f32(x, x); }
FC_DEV double fc_silu_f64(double x) { return fc__xsigmoid_f64(x, x); }
/* gelu: 0.5x * erfc(-x/sqrt2), no cancellation for x << 0. The CPU header
 * has its own polynomial because libm's erfcf is slow there; CUDA's erfcf
 * is a few FMAs. gelu(-inf) is NaN, as torch. */
FC_DEV float fc_gelu_f32(float x) { return 0.5f * x * erfcf(-0.70710678118654752f * x); }
FC_DEV double fc_gelu_f64(double x) { return 0.5 * x * erfc(-0.70710678118654752 * x); }
FC_DEV float fc_gelu_tanh_f32(float x) {
    return fc__xsigmoid_f32(x, 1.5957691216057308f * (x + 0.044715f * x * x * x));
}
FC_DEV double fc_gelu_tanh_f64(double x) {
    return fc__xsigmoid_f64(x, 1.5957691216057308 * (x + 0.044715 * x * x * x));
}
FC_DEV float fc_softplus_f32(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
FC_DEV double fc_softplus_f64(double x) { return x > 20.0 ? x : log1p(exp(x)); }

/* ---- per-type families ---------------------------------------------------- */
#define FC__SIGNED(X)                                        \
    X(i8, int8_t, uint8_t, INT8_MIN, uint32_t)               \
    X(i16, int16_t, uint16_t, INT16_MIN, uint32_t)           \
    X(i32, int32_t, uint32_t, INT32_MIN, uint32_t)           \
    X(i64, int64_t, uint64_t, INT64_MIN, uint64_t)
#define FC__UNSIGNED(X)                                      \
    X(u8, uint8_t, uint32_t) X(u16, uint16_t, uint32_t)     \
    X(u32, uint32_t, uint32_t) X(u64, uint64_t, uint64_t)

#define FC__UNARY_S(t, T, U, TMIN, W)                                         \
    FC_DEV T fc_abs_##t(T x) { return x < 0 ? (T)(0u - (U)x) : x; }          \
    FC_DEV T fc_relu_##t(T x) { return x < 0 ? (T)0 : x; }                    \
    FC_DEV T fc_sign_##t(T x) { return (T)((x > 0) - (x < 0)); }             \
    FC_DEV T fc_bitnot_##t(T x) { return (T)~x; }                             \
    FC_DEV T fc_floor_##t(T x) { return x; }                                  \
    FC_DEV T fc_ceil_##t(T x) { return x; }                                   \
    FC_DEV T fc_round_##t(T x) { return x; }                                  \
    FC_DEV T fc_trunc_##t(T x) { return x; }
#define FC__UNARY_U(t, T, W)                                                  \
    FC_DEV T fc_abs_##t(T x) { return x; }                                    \
    FC_DEV T fc_relu_##t(T x) { return x; }                                   \
    FC_DEV T fc_sign_##t(T x) { return (T)(x != 0); }                         \
    FC_DEV T fc_bitnot_##t(T x) { return (T)~x; }                             \
    FC_DEV T fc_floor_##t(T x) { return x; }                                  \
    FC_DEV T fc_ceil_##t(T x) { return x; }                                   \
    FC_DEV T fc_round_##t(T x) { return x; }                                  \
    FC_DEV T fc_trunc_##t(T x) { return x; }
FC__SIGNED(FC__UNARY_S)
FC__UNSIGNED(FC__UNARY_U)
#undef FC__UNARY_S
#undef FC__UNARY_U

FC_DEV bool fc_abs_b(bool x) { return x; }
FC_DEV bool fc_bitnot_b(bool x) { return !x; }
FC_DEV bool fc_floor_b(bool x) { return x; }
FC_DEV bool fc_ceil_b(bool x) { return x; }
FC_DEV bool fc_round_b(bool x) { return x; }
FC_DEV bool fc_trunc_b(bool x) { return x; }

FC_DEV float fc_abs_f32(float x) { return fabsf(x); }
FC_DEV double fc_abs_f64(double x) { return fabs(x); }
FC_DEV float fc_sign_f32(float x) {
    return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x == 0.0f ? 0.0f : x));
}
FC_DEV double fc_sign_f64(double x) {
    return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : (x == 0.0 ? 0.0 : x));
}
FC_DEV float fc_floor_f32(float x) { return floorf(x); }
FC_DEV double fc_floor_f64(double x) { return floor(x); }
FC_DEV float fc_ceil_f32(float x) { return ceilf(x); }
FC_DEV double fc_ceil_f64(double x) { return ceil(x); }
FC_DEV float fc_round_f32(float x) { return rintf(x); }
FC_DEV double fc_round_f64(double x) { return rint(x); }
FC_DEV float fc_trunc_f32(float x) { return truncf(x); }
FC_DEV double fc_trunc_f64(double x) { return trunc(x); }

/* ---- isnan, isinf, isfinite ------------------------------------------------ */
#define FC__PRED_INT(t, T)                                       \
    FC_DEV bool fc_isnan_##t(T x) { (void)x; return false; }    \
    FC_DEV bool fc_isinf_##t(T x) { (void)x; return false; }    \
    FC_DEV bool fc_isfinite_##t(T x) { (void)x; return true; }
#define FC__PRED_S(t, T, U, TMIN, W) FC__PRED_INT(t, T)
#define FC__PRED_U(t, T, W) FC__PRED_INT(t, T)
FC__PRED_INT(b, bool)
FC__SIGNED(FC__PRED_S)
FC__UNSIGNED(FC__PRED_U)
#undef FC__PRED_INT
#undef FC__PRED_S
#undef FC__PRED_U
FC_DEV bool fc_isnan_f32(float x) { return x != x; }
FC_DEV bool fc_isnan_f64(double x) { return x != x; }
FC_DEV bool fc_isinf_f32(float x) { return fabsf(x) == INFINITY; }
FC_DEV bool fc_isinf_f64(double x) { return fabs(x) == (double)INFINITY; }
FC_DEV bool fc_isfinite_f32(float x) { return fabsf(x) < INFINITY; }
FC_DEV bool fc_isfinite_f64(double x) { return fabs(x) < (double)INFINITY; }

/* ---- maximum, minimum, fmax, fmin, clamp (NaN rules as fc_math.h) --------- */
#define FC__MINMAX(t, T)                                                       \
    FC_DEV T fc_maximum_##t(T a, T b) { return a > b ? a : b; }               \
    FC_DEV T fc_minimum_##t(T a, T b) { return a < b ? a : b; }               \
    FC_DEV T fc_fmax_##t(T a, T b) { return a > b ? a : b; }                  \
    FC_DEV T fc_fmin_##t(T a, T b) { return a < b ? a : b; }                  \
    FC_DEV T fc_clamp_##t(T x, T lo, T hi) { return fc_minimum_##t(fc_maximum_##t(x, lo), hi); }
#define FC__MINMAX_S(t, T, U, TMIN, W) FC__MINMAX(t, T)
#define FC__MINMAX_U(t, T, W) FC__MINMAX(t, T)
FC__MINMAX(b, bool)
FC__SIGNED(FC__MINMAX_S)
FC__UNSIGNED(FC__MINMAX_U)
#undef FC__MINMAX
#undef FC__MINMAX_S
#undef FC__MINMAX_U
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
FC_DEV bool fc_relu_b(bool x) { return x; }
FC_DEV float fc_relu_f32(float x) { return fc_maximum_f32(x, 0.0f); }
FC_DEV double fc_relu_f64(double x) { return fc_maximum_f64(x, 0.0); }

/* ---- safe float -> int casts: x86-64's (NumPy's) results, see fc_math.h.
 * PTX's cvt.rzi saturates instead, so the ranges are checked first. */
FC_DEV int64_t fc_f2i64(double x) {
    return (x >= -0x1p63 && x < 0x1p63) ? (int64_t)x : INT64_MIN;
}
FC_DEV int32_t fc_f2i32(double x) {
    return (x > -2147483649.0 && x < 2147483648.0) ? (int32_t)x : INT32_MIN;
}
FC_DEV int16_t fc_f2i16(double x) { return (int16_t)(uint16_t)(uint32_t)fc_f2i32(x); }
FC_DEV int8_t fc_f2i8(double x) { return (int8_t)(uint8_t)(uint32_t)fc_f2i32(x); }
FC_DEV uint16_t fc_f2u16(double x) { return (uint16_t)(uint32_t)fc_f2i32(x); }
FC_DEV uint8_t fc_f2u8(double x) { return (uint8_t)(uint32_t)fc_f2i32(x); }
FC_DEV uint32_t fc_f2u32(double x) { return (uint32_t)(uint64_t)fc_f2i64(x); }
FC_DEV uint64_t fc_f2u64(double x) {
    return x >= 0x1p63 ? ((uint64_t)fc_f2i64(x - 0x1p63) ^ 0x8000000000000000ull)
                       : (uint64_t)fc_f2i64(x);
}

/* ---- reciprocal ------------------------------------------------------------ */
#define FC__RECIP_S(t, T, U, TMIN, W)                                   \
    FC_DEV T fc_reciprocal_##t(T x) {                                    \
        T r = (x == 1 || x == -1) ? x : (T)0;                            \
        return x == 0 ? (T)(sizeof(T) >= 4 ? TMIN : 0) : r;              \
    }
#define FC__RECIP_U(t, T, W) \
    FC_DEV T fc_reciprocal_##t(T x) { return (T)(x == 1); }
FC__SIGNED(FC__RECIP_S)
FC__UNSIGNED(FC__RECIP_U)
#undef FC__RECIP_S
#undef FC__RECIP_U
FC_DEV float fc_reciprocal_f32(float x) { return 1.0f / x; }
FC_DEV double fc_reciprocal_f64(double x) { return 1.0 / x; }

/* ---- floordiv, remainder (x // 0 and x % 0 are 0; INT_MIN // -1 wraps) ----- */
#define FC__DIVMOD_S(t, T, U, TMIN, W)                                          \
    FC_DEV T fc_floordiv_##t(T a, T b) {                                         \
        if (b == 0) return 0;                                                    \
        if (b == -1) return (T)(0u - (U)a);                                      \
        T q = (T)(a / b);                                                        \
        return (T)(((a % b) != 0 && ((a < 0) != (b < 0))) ? q - 1 : q);         \
    }                                                                            \
    FC_DEV T fc_remainder_##t(T a, T b) {                                        \
        if (b == 0 || b == -1) return 0;                                         \
        T r = (T)(a % b);                                                        \
        return (T)((r != 0 && ((r < 0) != (b < 0))) ? r + b : r);               \
    }
#define FC__DIVMOD_U(t, T, W)                                                             \
    FC_DEV T fc_floordiv_##t(T a, T b) { return b == 0 ? (T)0 : (T)(a / b); }            \
    FC_DEV T fc_remainder_##t(T a, T b) { return b == 0 ? (T)0 : (T)(a % b); }
FC__SIGNED(FC__DIVMOD_S)
FC__UNSIGNED(FC__DIVMOD_U)
#undef FC__DIVMOD_S
#undef FC__DIVMOD_U
#define FC__DIVMOD_F(t, T, sfx)                                                 \
    FC_DEV T fc__divmod_##t(T a, T b, T *modulus) {                             \
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
    FC_DEV T fc_floordiv_##t(T a, T b) {                                        \
        T mod;                                                                  \
        return b == 0 ? a / b : fc__divmod_##t(a, b, &mod);                     \
    }                                                                           \
    FC_DEV T fc_remainder_##t(T a, T b) {                                       \
        T mod;                                                                  \
        if (b == 0) return fmod##sfx(a, b);                                     \
        (void)fc__divmod_##t(a, b, &mod);                                       \
        return mod;                                                             \
    }
FC__DIVMOD_F(f32, float, f)
FC__DIVMOD_F(f64, double, )
#undef FC__DIVMOD_F

/* ---- pow: a negative integer exponent sets *err (the kernel's local flag) -- */
#define FC__POW_S(t, T, U, TMIN, W)                                             \
    FC_DEV T fc_pow_##t(T a, T b, int *err) {                                   \
        if (b < 0) { *err = 1; return 0; }                                      \
        W base = (W)a, r = 1;                                                   \
        for (U e = (U)b; e != 0; e >>= 1) {                                     \
            if (e & 1u) r *= base;                                              \
            base *= base;                                                       \
        }                                                                       \
        return (T)(U)r;                                                         \
    }
#define FC__POW_U(t, T, W)                                                      \
    FC_DEV T fc_pow_##t(T a, T b, int *err) {                                   \
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
FC_DEV float fc_pow_f32(float a, float b, int *err) { (void)err; return powf(a, b); }
FC_DEV double fc_pow_f64(double a, double b, int *err) { (void)err; return pow(a, b); }
/* bool ** bool is promoted to int8 by the rules (SAMEI8); nothing else needs _b */

#undef FC__SIGNED
#undef FC__UNSIGNED

/* ---- float16 / bfloat16 storage: bit-exact with fc_math.h (RNE, NaN kept
 * quiet with its top payload bits); integer code, no cuda_fp16.h needed. -- */
FC_DEV float fc_load_f16(uint16_t h) {
    uint32_t em = h & 0x7fffu, e = em & 0x7c00u;
    uint32_t o = (em << 13) + 0x38000000u;
    float sub = fc__bits_f32(o + 0x00800000u) - 0x1p-14f;
    uint32_t bits = e == 0x7c00u ? o + 0x38000000u : (e == 0 ? fc__f32_bits(sub) : o);
    return fc__bits_f32(bits | ((uint32_t)(h & 0x8000u) << 16));
}
FC_DEV uint16_t fc_store_f16(float x) {
    uint32_t f = fc__f32_bits(x), sign = (f >> 16) & 0x8000u;
    f &= 0x7fffffffu;
    uint32_t sub = fc__f32_bits(fc__bits_f32(f) + 0.5f) - 0x3f000000u;
    uint32_t nrm = (f + 0xc8000fffu + ((f >> 13) & 1u)) >> 13;
    uint32_t big = f > 0x7f800000u ? (0x7e00u | ((f >> 13) & 0x3ffu)) : 0x7c00u;
    uint32_t h = f >= 0x47800000u ? big : (f < 0x38800000u ? sub : nrm);
    return (uint16_t)(h | sign);
}
FC_DEV float fc_load_bf16(uint16_t h) { return fc__bits_f32((uint32_t)h << 16); }
FC_DEV uint16_t fc_store_bf16(float x) {
    uint32_t u = fc__f32_bits(x);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(x != x ? ((u >> 16) | 0x40u) : r);
}

/* ---- exact comparisons of a signed int with a uint64 ----------------------- */
FC_DEV bool fc_eq_iu(int64_t a, uint64_t b) { return a >= 0 && (uint64_t)a == b; }
FC_DEV bool fc_lt_iu(int64_t a, uint64_t b) { return a < 0 || (uint64_t)a < b; }
FC_DEV bool fc_gt_iu(int64_t a, uint64_t b) { return a >= 0 && (uint64_t)a > b; }
FC_DEV bool fc_ne_iu(int64_t a, uint64_t b) { return !fc_eq_iu(a, b); }
FC_DEV bool fc_le_iu(int64_t a, uint64_t b) { return !fc_gt_iu(a, b); }
FC_DEV bool fc_ge_iu(int64_t a, uint64_t b) { return !fc_lt_iu(a, b); }
FC_DEV bool fc_eq_ui(uint64_t a, int64_t b) { return fc_eq_iu(b, a); }
FC_DEV bool fc_ne_ui(uint64_t a, int64_t b) { return fc_ne_iu(b, a); }
FC_DEV bool fc_lt_ui(uint64_t a, int64_t b) { return fc_gt_iu(b, a); }
FC_DEV bool fc_le_ui(uint64_t a, int64_t b) { return fc_ge_iu(b, a); }
FC_DEV bool fc_gt_ui(uint64_t a, int64_t b) { return fc_lt_iu(b, a); }
FC_DEV bool fc_ge_ui(uint64_t a, int64_t b) { return fc_le_iu(b, a); }

/* float64 -> float32 rounding to odd (one rounding into f16/bf16, see fc_math.h) */
FC_DEV float fc_f64_to_f32_odd(double x) {
    float f = (float)x;
    if ((double)f != x && f == f && f - f == 0.0f) {
        if (fabs((double)f) > fabs(x)) {
            f = nextafterf(f, 0.0f);
        }
        f = fc__bits_f32(fc__f32_bits(f) | 1u);
    }
    return f;
}

#endif /* FC_CUDA_MATH_H */
