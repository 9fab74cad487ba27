/* Runtime, processes: the compiler's subprocess.
 * In: argv, the environment. Out: an exit status and the child's output in a file, within a time limit. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "disk.h"
#include "spawn.h"

#define FC_DEFAULT_PATH "PATH=/usr/local/bin:/usr/bin:/bin"

/* ---------------------------------------------------------------------------
 * Processes: posix_spawn with argv (no shell), a scrubbed environment,
 * output to a file, a time limit.
 * ------------------------------------------------------------------------- */

/* Absolute path of an executable, searching PATH for a bare name. NULL
 * when not found or out of memory; GIL held (getenv). */
char *
fc_spawn_find_program(const char *cc)
{
    if (cc[0] == '/') {
        return access(cc, X_OK) == 0 ? strdup(cc) : NULL;
    }
    if (strchr(cc, '/') != NULL) {
        char *abs = realpath(cc, NULL);
        if (abs && access(abs, X_OK) != 0) {
            free(abs);
            abs = NULL;
        }
        return abs;
    }
    const char *path = getenv("PATH");
    char *dirs = strdup(path && path[0] ? path : "/usr/local/bin:/usr/bin:/bin");
    char *found = NULL, *save = NULL;
    for (char *d = dirs ? strtok_r(dirs, ":", &save) : NULL; d && !found;
         d = strtok_r(NULL, ":", &save)) {
        if (d[0] != '/') {
            continue;   /* a relative PATH entry would be the CWD */
        }
        char *cand;
        if (asprintf(&cand, "%s/%s", d, cc) < 0) {
            cand = NULL;
        }
        if (cand && access(cand, X_OK) == 0) {
            found = cand;
        }
        else {
            free(cand);
        }
    }
    free(dirs);
    return found;
}

/* Runs argv[0] (an absolute path) with envp, stdin from /dev/null, stdout and
 * stderr to out_fd, in its own process group (so a timeout kills cc1, as and
 * ld too). Returns 0 with *status (a waitpid status) and *timed_out, or -1
 * with errno when it could not be started. */
int
fc_spawn_wait(char *const argv[], char *const envp[], int out_fd, int timeout_s,
                   int *status, int *timed_out)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    sigset_t none, dflt;
    pid_t pid;
    int rc;

    *timed_out = 0;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 34)
    posix_spawn_file_actions_addclosefrom_np(&fa, 3);   /* fds leaked by other libraries */
#endif
    posix_spawnattr_init(&attr);
    sigemptyset(&none);
    sigemptyset(&dflt);
    sigaddset(&dflt, SIGPIPE);   /* Python ignores these; ignored dispositions survive exec */
    sigaddset(&dflt, SIGXFSZ);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &dflt);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF
                                        | POSIX_SPAWN_SETPGROUP);
    rc = posix_spawn(&pid, argv[0], &fa, &attr, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
        errno = rc;
        return -1;
    }

    double deadline = fc_disk_now_ms() + 1e3 * timeout_s;
    int nap = 1;
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid) {
            return 0;
        }
        if (r < 0 && errno != EINTR) {
            return -1;   /* ECHILD: someone set SIGCHLD to SIG_IGN */
        }
        if (fc_disk_now_ms() > deadline) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            while (waitpid(pid, status, 0) < 0 && errno == EINTR) {
            }
            *timed_out = 1;
            return 0;
        }
        fc_disk_sleep_ms(nap);
        nap = nap < 8 ? nap * 2 : 8;
    }
}

/* The compiler's environment: PATH, HOME, TMPDIR, LANG from ours, nothing
 * else (no CFLAGS, LD_PRELOAD, GCC_EXEC_PREFIX, COMPILER_PATH, ...). GIL held
 * (getenv races with os.environ writes otherwise). NULL when out of memory. */
char **
fc_spawn_scrubbed_env(void)
{
    static const char *const keep[] = {"PATH", "HOME", "TMPDIR", "LANG"};
    char **env = NULL;
    int have_path = 0;
    for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++) {
        const char *v = getenv(keep[i]);
        if (v == NULL) {
            continue;
        }
        char *kv;
        if (asprintf(&kv, "%s=%s", keep[i], v) < 0) {
            kv = NULL;
        }
        int rc = kv ? fc_disk_strv_push(&env, kv) : -1;
        free(kv);
        if (rc < 0) {
            goto error;
        }
        have_path |= strcmp(keep[i], "PATH") == 0;
    }
    if (!have_path && fc_disk_strv_push(&env, FC_DEFAULT_PATH) < 0) {
        goto error;
    }
    if (env == NULL) {
        env = calloc(1, sizeof(char *));
    }
    return env;
error:
    fc_disk_strv_free(env);
    return NULL;
}
