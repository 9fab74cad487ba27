/* Kernel support: the fixed loop skeletons every generated CPU kernel uses.
 * In: an fc_launch from the runtime. Out: index helpers and thread splitting;
 * per-type math lives in fc_math.h. Shipped with the package; its bytes are
 * part of the disk cache key, so editing it recompiles every kernel. */
#ifndef FC_KERNEL_H
#define FC_KERNEL_H

#include <math.h>
#include <stdint.h>
#include <omp.h>

#include "fc_launch.h"
#include "fc_math.h"

#define FC_EXPORT __attribute__((visibility("default")))
#define FC_MAX_THREADS 256     /* the runtime never asks for more */

/* Reduction lanes (gen_c.c, sweep_lanes_wide): one vector register of float32,
 * from the vector width the runtime builds kernels for (FC_VECTOR_BITS:
 * fc_ckey_vector_width_flags in runtime/ckey.c passes it with -mprefer-vector-width).
 * -DFC_LANES=8 or 16 in FASTCOMPILE_CFLAGS sets it directly (tests do). */
#ifndef FC_VECTOR_BITS
#define FC_VECTOR_BITS 256
#endif
#ifndef FC_LANES
#if FC_VECTOR_BITS >= 512
#define FC_LANES 16
#else
#define FC_LANES 8
#endif
#endif
#if FC_LANES != 8 && FC_LANES != 16
#error "FC_LANES must be 8 or 16 (gen_c.c folds the lanes from 16 at most)"
#endif

/* Software prefetch for flat kernels heavy in arithmetic (gen_c.c,
 * flat_is_heavy): the loop walks blocks of FC_PF_BLOCK elements and, before
 * each, touches every cache line of input p that lies FC_PF_BYTES further on
 * (never past hi). It helps a cold input; it changes nothing when the input
 * is cached, nor for memory-bound kernels (which never use it).
 * Prefetching the outputs for writing too (prefetchw) was measured slower,
 * and so were 16 KB and 1024-element blocks. Both sizes can
 * be set through FASTCOMPILE_CFLAGS (-DFC_PF_BYTES=...) for experiments. */
#ifndef FC_PF_BLOCK
#define FC_PF_BLOCK 256
#endif
#ifndef FC_PF_BYTES
#define FC_PF_BYTES 4096
#endif
#define FC_PREFETCH_BLOCK(p, i0, hi)                                                \
    do {                                                                           \
        const int64_t ahead_ = (int64_t)(FC_PF_BYTES / sizeof(*(p)));                \
        const int64_t end_ = (i0) + ahead_ + FC_PF_BLOCK < (hi) ? (i0) + ahead_ + FC_PF_BLOCK : (hi); \
        for (int64_t k_ = (i0) + ahead_; k_ < end_; k_ += (int64_t)(64 / sizeof(*(p)))) { \
            __builtin_prefetch((const void *)((p) + k_), 0, 3);                    \
        }                                                                          \
    } while (0)

/* Non-temporal stores for the same heavy flat kernels when the launch's
 * outputs are large (FC_NT_BYTES or more): each block is computed into a
 * 64-byte aligned buffer on the stack, then streamed to memory with
 * movntdq, which skips the read-for-ownership a normal store of a line not
 * in cache makes (12 -> 8 bytes of traffic per float32 GELU element).
 * Smaller outputs keep normal stores, so a consumer finds them in cache.
 * GCC's builtins (the ones behind _mm512_stream_si512 and _mm_sfence), not
 * immintrin.h: that header alone would add tens of ms to every compile. */
#ifndef FC_NT_BYTES
#define FC_NT_BYTES (16 << 20)
#endif
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__AVX512F__)
typedef long long fc__v8di __attribute__((vector_size(64)));
#define FC_HAVE_NT 1
static inline void
fc_stream_store(void *dst, const void *src, int64_t n)
{
    char *d = (char *)dst;
    const char *s = (const char *)src;
    int64_t head = (int64_t)((64 - ((uintptr_t)d & 63)) & 63);
    head = head < n ? head : n;
    memcpy(d, s, (size_t)head);
    d += head, s += head, n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        fc__v8di v;
        memcpy(&v, s, 64);
        __builtin_ia32_movntdq512((fc__v8di *)(void *)d, v);
    }
    memcpy(d, s, (size_t)n);
}
#define FC_STREAM_FENCE() __builtin_ia32_sfence()
#else
#define FC_HAVE_NT 0
#define fc_stream_store(d, s, n) memcpy((d), (s), (size_t)(n))
#define FC_STREAM_FENCE() ((void)0)
#endif

/* The index helpers run once per run of the innermost dim, not per element:
 * kept out of line, each is compiled once per kernel file instead of at every
 * call site (reduction kernels: about 30% fewer compiler instructions).
 * fc_unravel's one-dim case (the runtime collapses contiguous dims, so most
 * launches are 1-d) is inline: its two 64-bit divisions per sweep were 6% of
 * a softmax over rows of 128 (single-threaded), for 2% more to compile.
 * Inlining fc_offset's and fc_advance's too gained 4% more and cost 7% more
 * to compile. */
#define FC_OUTLINE static __attribute__((noinline, unused))

/* first error wins; kernels return it to the runtime, which raises */
static inline void
fc_report(int *err, int e)
{
    if (e) {
        __atomic_store_n(err, e, __ATOMIC_RELAXED);
    }
}

/* thread tid's share [lo, hi) of n items, in steps of gran items: 16 for
 * elements (whole cache lines of float32 for dense outputs), 1 for a
 * reduction's rows (rows in steps of 16 left 2 threads 64 and 33 of 97
 * rows). */
FC_OUTLINE void
fc_thread_range(int64_t n, int64_t gran, int tid, int nth, int64_t *lo, int64_t *hi)
{
    int64_t chunk = (n + nth - 1) / nth;
    chunk = (chunk + gran - 1) / gran * gran;
    *lo = (int64_t)tid * chunk < n ? (int64_t)tid * chunk : n;
    *hi = *lo + chunk < n ? *lo + chunk : n;
}

/* C-order multi-index of flat position lin */
FC_OUTLINE void
fc_unravel_nd(int64_t lin, int nd, const int64_t *shape, int64_t *idx)
{
    for (int d = nd - 1; d >= 0; d--) {
        int64_t s = shape[d] > 0 ? shape[d] : 1;
        idx[d] = lin % s;
        lin /= s;
    }
}

/* element offset of idx under stride (fc_offset: the 1-d and 2-d cases inline) */
FC_OUTLINE int64_t
fc_offset_nd(int nd, const int64_t *idx, const int64_t *stride)
{
    int64_t off = 0;
    for (int d = 0; d < nd; d++) {
        off += idx[d] * stride[d];
    }
    return off;
}

/* element offsets of idx under each of the first nops operands' strides:
 * every pointer of a strided run at once (one call per operand and run made
 * short runs, channels_last's C = 16, cost 2x eager's) */
FC_OUTLINE void
fc_offsets_nd(int nd, const int64_t *idx, const int64_t (*stride)[FC_LAUNCH_MAXDIM], int nops, int64_t *off)
{
    for (int q = 0; q < nops; q++) {
        int64_t o = 0;
        for (int d = 0; d < nd; d++) {
            o += idx[d] * stride[q][d];
        }
        off[q] = o;
    }
}

/* fc_offsets for a pointwise kernel's runs, with the 2-d space (most strided
 * launches collapse to it) inline: a channels_last scale-and-add of C = 16
 * went from 82 to 58 us. The 3-d space too: a transformer's q/k/v split
 * (bias add into (3, 1024, 256) from a (1024, 768) matmul result, runs of
 * 256) paid an out-of-line call a run, 0.93-0.95 -> 0.97-0.98 of Inductor's
 * call (interleaved). Reductions' row runs keep the call for more than one
 * dim (fc_offsets): inline, their three sweeps compiled 12% slower. */
static inline void
fc_offsets_run(int nd, const int64_t *idx, const int64_t (*stride)[FC_LAUNCH_MAXDIM], int nops, int64_t *off)
{
    if (nd == 2) {
        for (int q = 0; q < nops; q++) {
            off[q] = idx[0] * stride[q][0] + idx[1] * stride[q][1];
        }
        return;
    }
    if (nd == 3) {
        for (int q = 0; q < nops; q++) {
            off[q] = idx[0] * stride[q][0] + idx[1] * stride[q][1] + idx[2] * stride[q][2];
        }
        return;
    }
    fc_offsets_nd(nd, idx, stride, nops, off);
}

/* elements left in the innermost dim from idx, at most `left` */
static inline int64_t
fc_run_length(int nd, const int64_t *shape, const int64_t *idx, int64_t left)
{
    int64_t run = shape[nd - 1] - idx[nd - 1];
    return run < left ? run : left;
}

/* move idx forward by n (n never crosses more than the innermost dim's end;
 * fc_advance: the 1-d and 2-d cases inline) */
FC_OUTLINE void
fc_advance_nd(int nd, const int64_t *shape, int64_t *idx, int64_t n)
{
    idx[nd - 1] += n;
    for (int d = nd - 1; d > 0 && idx[d] >= shape[d]; d--) {
        idx[d] = 0;
        idx[d - 1]++;
    }
}

/* The 1-d cases of fc_offset, fc_offsets and fc_advance inline (and the 2-d
 * ones of fc_offset and fc_advance, the outer space of a row reduction over a
 * transposed operand), the rest out of line: a reduction over rows calls them
 * once a row and sweep (layernorm, and a row reduction whose operand is read
 * transposed, run faster so). */
static inline int64_t
fc_offset(int nd, const int64_t *idx, const int64_t *stride)
{
    if (nd == 1) {
        return idx[0] * stride[0];
    }
    if (nd == 2) {
        return idx[0] * stride[0] + idx[1] * stride[1];
    }
    return fc_offset_nd(nd, idx, stride);
}

static inline void
fc_offsets(int nd, const int64_t *idx, const int64_t (*stride)[FC_LAUNCH_MAXDIM], int nops, int64_t *off)
{
    if (nd == 1) {
        for (int q = 0; q < nops; q++) {
            off[q] = idx[0] * stride[q][0];
        }
        return;
    }
    fc_offsets_nd(nd, idx, stride, nops, off);
}

static inline void
fc_advance(int nd, const int64_t *shape, int64_t *idx, int64_t n)
{
    if (nd == 1) {
        idx[0] += n;
        return;
    }
    if (nd == 2) {
        idx[1] += n;
        if (idx[1] >= shape[1]) {
            idx[1] = 0;
            idx[0]++;
        }
        return;
    }
    fc_advance_nd(nd, shape, idx, n);
}

/* fc_advance for a pointwise kernel's runs: the 3-d space inline too */
static inline void
fc_advance_run(int nd, const int64_t *shape, int64_t *idx, int64_t n)
{
    if (nd == 3) {
        idx[2] += n;
        if (idx[2] >= shape[2]) {
            idx[2] = 0;
            if (++idx[1] >= shape[1]) {
                idx[1] = 0;
                idx[0]++;
            }
        }
        return;
    }
    fc_advance(nd, shape, idx, n);
}

static inline void
fc_unravel(int64_t lin, int nd, const int64_t *shape, int64_t *idx)
{
    if (nd == 1) {
        idx[0] = lin;       /* lin <= shape[0]: at the end, no run follows */
        return;
    }
    fc_unravel_nd(lin, nd, shape, idx);
}

/* few, long rows: threads share each row instead of owning rows */
static inline int
fc_use_split(const fc_launch *L)
{
    return L->nthreads > 1 && L->n_outer < 2 * (int64_t)L->nthreads &&
           L->n_outer * L->n_inner >= L->serial_below;
}

/* reduced with a stride while outer neighbours are adjacent (sum over
 * axis 0 of a C-ordered array): walk blocks of FC_COLS outer elements.
 * zero: the operands the kernel reads as broadcast along the block (bit o:
 * outer stride 0 there); every other one must be adjacent (stride 1). */
#define FC_COLS 64
#ifndef FC_COLS_AHEAD
#define FC_COLS_AHEAD 4     /* rows prefetched ahead of the one a block computes */
#endif
static inline int
fc_use_cols(const fc_launch *L, uint64_t zero)
{
    int lo = L->nd_outer - 1, li = L->nd_inner - 1, strided = 0;
    if (L->oshape[lo] < 8 || L->n_inner < 2) {
        return 0;
    }
    for (int o = 0; o < L->nops; o++) {
        if (L->ostride[o][lo] != ((zero >> o) & 1 ? 0 : 1)) {
            return 0;
        }
        strided |= L->istride[o][li] > 1 || L->istride[o][li] < -1;
    }
    return strided;
}

/* few columns, many rows (a BatchNorm's statistics over 32 channels_last
 * channels): the threads share each column block's rows instead of owning
 * columns (a share of 16 columns is one vector per row, and neighbouring
 * threads' columns share cache lines), publishing partials per column in
 * FC_COLS_SPLIT_THREADS x FC_COLS arrays on the caller's stack */
#define FC_COLS_SPLIT_THREADS 16
static inline int
fc_use_cols_split(const fc_launch *L)
{
    return L->nthreads > 1 && L->nthreads <= FC_COLS_SPLIT_THREADS &&
           2 * L->n_outer <= (int64_t)FC_COLS * L->nthreads && L->n_inner >= 64 * (int64_t)L->nthreads &&
           L->n_outer * L->n_inner >= L->serial_below;
}

/* fn(L, lo, hi, err) over [0, n) in shares of gran-item steps (fc_thread_range),
 * on one thread below the serial threshold */
#define FC_RUN_RANGES(L, n, gran, fn, errp)                                        \
    do {                                                                           \
        const int64_t n_ = (n);                                                    \
        if ((L)->nthreads <= 1 || n_ < 2 || n_ * (L)->n_inner < (L)->serial_below) { \
            fn((L), 0, n_, (errp));                                                \
        }                                                                          \
        else {                                                                     \
            _Pragma("omp parallel num_threads(L->nthreads)")                       \
            {                                                                      \
                int64_t lo_, hi_;                                                  \
                fc_thread_range(n_, (gran), omp_get_thread_num(),                  \
                                omp_get_num_threads(), &lo_, &hi_);                \
                if (lo_ < hi_) {                                                   \
                    fn((L), lo_, hi_, (errp));                                     \
                }                                                                  \
            }                                                                      \
        }                                                                          \
    } while (0)

#endif
