/* STREAM-style triad: a[i] = b[i] + q*c[i], the CPU bandwidth ceiling that
 * benchmarks/pointwise.py compares fastcompile against.
 *
 * Follows jeffhammond/STREAM stream.c: double arrays, parallel first-touch
 * initialisation, one untimed warm-up pass, best of NTIMES timed passes.
 * Bandwidth counts 24 bytes per iteration (read b, read c, write a), as
 * STREAM does; the 32-byte figure adds the write-allocate read of a that
 * ordinary (non-streaming) stores really cause.
 *
 * Build: cc -O3 -march=native -fopenmp triad.c -o triad
 * Run:   OMP_PROC_BIND=spread OMP_PLACES=cores ./triad N_ELEMENTS [NTIMES]
 * Prints one line of key=value pairs for the driver to parse.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int
main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s N_ELEMENTS [NTIMES]\n", argv[0]);
        return 2;
    }
    const long n = strtol(argv[1], NULL, 10);
    const int ntimes = argc > 2 ? atoi(argv[2]) : 10;
    if (n <= 0 || ntimes < 2) {
        fprintf(stderr, "triad: need N_ELEMENTS > 0 and NTIMES >= 2\n");
        return 2;
    }
    double *a = NULL, *b = NULL, *c = NULL;
    if (posix_memalign((void **)&a, 64, n * sizeof(double)) ||
        posix_memalign((void **)&b, 64, n * sizeof(double)) ||
        posix_memalign((void **)&c, 64, n * sizeof(double))) {
        fprintf(stderr, "triad: cannot allocate 3 x %ld doubles\n", n);
        return 1;
    }
    /* first touch in parallel, same static schedule as the timed loop */
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        a[i] = 1.0;
        b[i] = 2.0;
        c[i] = 0.5;
    }
    const double q = 3.0;
    double best = 1e30, worst = 0.0, sum = 0.0;
    int nthreads = 1;
    #pragma omp parallel
    {
        #pragma omp single
        nthreads = omp_get_num_threads();
    }
    for (int k = 0; k < ntimes; k++) {
        const double t0 = omp_get_wtime();
        #pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) {
            a[i] = b[i] + q * c[i];
        }
        const double t = omp_get_wtime() - t0;
        if (k == 0) {
            continue;                       /* warm-up pass, not counted */
        }
        best = t < best ? t : best;
        worst = t > worst ? t : worst;
        sum += t;
    }
    /* check, so the loop cannot be dropped */
    long bad = 0;
    #pragma omp parallel for reduction(+:bad)
    for (long i = 0; i < n; i++) {
        bad += a[i] != 2.0 + q * 0.5;
    }
    const double bytes24 = 24.0 * (double)n, bytes32 = 32.0 * (double)n;
    printf("n=%ld ntimes=%d threads=%d best_s=%.9f avg_s=%.9f worst_s=%.9f "
           "gbs24=%.3f gbs32=%.3f gbs24_avg=%.3f bad=%ld\n",
           n, ntimes, nthreads, best, sum / (ntimes - 1), worst,
           bytes24 / best / 1e9, bytes32 / best / 1e9, bytes24 / (sum / (ntimes - 1)) / 1e9, bad);
    free(a);
    free(b);
    free(c);
    return bad != 0;
}
