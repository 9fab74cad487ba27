"""Derive the constants of float32 gelu (python/fastcompile/include/fc_math_common.h, CPU and
CUDA) and exp (fc_math.h, CPU).

    python3 tools/fit_math.py          # prints the two #define blocks those headers hold

gelu:

gelu(x) = relu(x) + |x| * e, with c = min(|x|, 14.5) and
    e = -erfc(c / sqrt2) / 2 = P(c) / Q(c) * exp(-c^2 / 2).

* P / Q is a rational fit of -erfcx(c / sqrt2) / 2 (erfcx(a) = exp(a^2) erfc(a)),
  P of degree 3, Q monic of degree 4, on c in [0, 14.5]. Its relative error is
  weighted by 1 / (1 + 4c^2): smallest at c = 0, where rounding alone takes most
  of the tests' tolerance of 4 + 2x^2 ULP, and let grow with c, 8 times as fast
  as that tolerance. (1 / (1 + 2c^2) put the unfused, no-FMA form over the bound
  at x = -1.31; 1 / (1 + c^2 / 2), the tolerance's own shape, at small x.)
* exp(-c^2 / 2) = 2^n e^r with r' = -2r in [-ln2, ln2]: e^r = 1 + r' S(r'), S of
  degree 4, a relative fit.

exp (fc__expf): e^r = 1 + r + r^2 Q(r) for |r| <= ln2 / 2, Q of degree 4, a
relative fit.

All three fits are near-minimax: 400 steps of Lawson's iteration on a linearised
least-squares problem (for the rational one: P - f Q, divided by f and the
previous Q); the last hundred steps move the coefficients by about 4e-6. Only
NumPy and the math module are needed. The printed errors are those of the
double-precision fits, before the constants are rounded to float; the kernel's
own error is checked on every float by tests/test_fc_math.py's sweep.
"""

import math

import numpy as np

C_MAX = 14.5  # fc_gelu_f32 clamps |x| there (0x41680000)
P_DEG, Q_DEG, S_DEG = 3, 4, 4
EXP_DEG = 4  # Q of fc__expf


def erfcx(a):
    """exp(a^2) erfc(a) in double, for 0 <= a <= 11 (erfc(11) is 1e-54: no underflow)."""
    return np.array([math.exp(v * v) * math.erfc(v) for v in a])


def lawson(design, rhs, row_scale, residual, shape, iters):
    """Minimax of the weighted relative error shape * residual(x) by Lawson's
    reweighting of least squares on (design @ x - rhs) * row_scale, where
    residual(x) returns (relative error, the next row_scale). Returns
    (best x, its weighted error)."""
    w = np.full(len(rhs), 1.0 / len(rhs))
    best = None
    for _ in range(iters):
        s = np.sqrt(w) * row_scale * shape
        x = np.linalg.lstsq(design * s[:, None], rhs * s, rcond=None)[0]
        err, row_scale = residual(x)
        err = err * shape
        worst = float(np.max(np.abs(err)))
        if best is None or worst < best[1]:
            best = (x, worst)
        w = w * np.abs(err) + 1e-300
        w /= w.sum()
    return best


def fit_rational(iters=400):
    c = np.unique(
        np.concatenate([np.linspace(0, C_MAX, 40001), C_MAX * (1 - np.cos(np.linspace(0, np.pi / 2, 40001)))])
    )
    f = erfcx(c / math.sqrt(2))
    s = c / C_MAX  # fit in [0, 1] for conditioning
    vp = np.vander(s, P_DEG + 1, increasing=True)
    vq = np.vander(s, Q_DEG + 1, increasing=True)
    design = np.hstack([vp, -f[:, None] * vq[:, 1:]])  # q0 = 1
    shape = 1 / (1 + 4 * c * c)

    def residual(x):
        qv = vq @ np.concatenate([[1.0], x[P_DEG + 1 :]])
        return (vp @ x[: P_DEG + 1]) / qv / f - 1, 1 / (f * np.abs(qv))

    x, worst = lawson(design, f, 1 / f, residual, shape, iters)
    p = x[: P_DEG + 1] / C_MAX ** np.arange(P_DEG + 1)
    q = np.concatenate([[1.0], x[P_DEG + 1 :]]) / C_MAX ** np.arange(Q_DEG + 1)
    p, q = -0.5 * p / q[-1], q / q[-1]  # Q monic; the -1/2 into P
    return p, q, worst


def fit_exp_tail(scale, half, low, deg, iters=400):
    """exp(scale r) on |r| <= half as its Taylor terms below r^low, fixed, plus
    r^low (c0 + c1 r + ... + c_deg r^deg), a relative fit; returns (c, error)."""
    r = np.linspace(-half, half, 20001)
    y = np.exp(scale * r)
    fixed = sum((scale * r) ** j / math.factorial(j) for j in range(low))
    design = np.vander(r, deg + 1, increasing=True) * (r**low)[:, None]

    def residual(x):
        return (fixed + design @ x) / y - 1, 1 / y

    return lawson(design, y - fixed, 1 / y, residual, np.ones_like(r), iters)


def main():
    p, q, err_pq = fit_rational()
    # gelu's e^r = exp(-r' / 2) = 1 + r' S(r'), r' = -2r reaching ln2 plus rounding
    sx, err_s = fit_exp_tail(-0.5, math.log(2) * 1.0002, 1, S_DEG)
    f32 = lambda v: "%.9ef" % float(np.float32(v))
    print("/* tools/fit_math.py: P / Q = -erfcx(c / sqrt2) / 2 within %.2g (1 + 4c^2) relative," % err_pq)
    print(" * 1 + r' S(r') = exp(-r' / 2) within %.2g relative */" % err_s)
    for i in range(P_DEG, -1, -1):
        print("#define FC_GELU_P%d %s" % (i, f32(p[i])))
    for i in range(Q_DEG - 1, -1, -1):
        print("#define FC_GELU_Q%d %s" % (i, f32(q[i])))
    for i in range(S_DEG, -1, -1):
        print("#define FC_GELU_S%d %s" % (i, f32(sx[i])))
    # fc__expf's e^r = 1 + r + r^2 Q(r), |r| reaching ln2 / 2 plus rounding
    qx, err_q = fit_exp_tail(1.0, math.log(2) / 2 * 1.002, 2, EXP_DEG)
    print("/* tools/fit_math.py: e^r = 1 + r + r^2 Q(r) within %.2g relative */" % err_q)
    for i in range(EXP_DEG, -1, -1):
        print("#define FC_EXPF_Q%d %s" % (i, f32(qx[i])))


if __name__ == "__main__":
    main()
