/* Runtime, processes: the compiler's subprocess (posix_spawn, no shell, a scrubbed environment).
 * In: argv, the environment. Out: an exit status and the child's output in a file, within a time limit. */
#ifndef FC_SPAWN_H
#define FC_SPAWN_H

#include "../core/ir.h"

/* No Python objects here. "GIL held" marks those that read the environment
 * (os.environ writes race with getenv). Errors: 0, or -1 with errno set;
 * strings and vectors are malloc'd (fc_disk_strv_free). */

/* Absolute path of an executable: name if absolute, a relative path with a
 * slash resolved, a bare name looked up on $PATH (never the CWD). malloc'd;
 * NULL when not found or out of memory. GIL held. */
FC_INTERNAL char *fc_spawn_find_program(const char *name);
/* Runs argv[0] (absolute) with envp, no shell, stdin /dev/null, stdout and
 * stderr to out_fd, in its own process group, killed after timeout_s.
 * 0 with *status (waitpid's) and *timed_out, or -1 when it could not start. */
FC_INTERNAL int fc_spawn_wait(char *const argv[], char *const envp[], int out_fd,
                              int timeout_s, int *status, int *timed_out);
/* The child's environment: PATH, HOME, TMPDIR, LANG from ours and nothing
 * else. NULL when out of memory. GIL held. */
FC_INTERNAL char **fc_spawn_scrubbed_env(void);

#endif
