/* Runtime, files: the disk cache's file operations.
 * In: paths, bytes. Out: files written/published/checked, string vectors, the clock. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "disk.h"
#include "sha256.h"

/* ---------------------------------------------------------------------------
 * String vectors and the clock.
 * ------------------------------------------------------------------------- */

void
fc_disk_strv_free(char **v)
{
    if (v != NULL) {
        for (char **p = v; *p; p++) {
            free(*p);
        }
        free(v);
    }
}

size_t
fc_disk_strv_len(char *const *v)
{
    size_t n = 0;
    while (v && v[n]) {
        n++;
    }
    return n;
}

/* Appends a copy of s to *v (NULL-terminated). Returns 0, or -1 when out of memory. */
int
fc_disk_strv_push(char ***v, const char *s)
{
    size_t n = fc_disk_strv_len(*v);
    char *copy = strdup(s);
    char **grown = copy ? realloc(*v, (n + 2) * sizeof(char *)) : NULL;
    if (grown == NULL) {
        free(copy);
        return -1;
    }
    grown[n] = copy;
    grown[n + 1] = NULL;
    *v = grown;
    return 0;
}

double
fc_disk_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void
fc_disk_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* ---------------------------------------------------------------------------
 * Files: read whole, write new or atomically, hash, publish without replacing.
 * ------------------------------------------------------------------------- */

/* "<pid>.<16 random hex>": unique temp-name part, same folder as the target. */
void
fc_disk_temp_suffix(char out[FC_DISK_SUFFIX])
{
    uint64_t r = 0;
    if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ (uint64_t)(uintptr_t)&ts;
    }
    snprintf(out, FC_DISK_SUFFIX, "%ld.%016llx", (long)getpid(), (unsigned long long)r);
}

/* open path for reading: a regular file, never through a symlink. Returns
 * the fd with *st filled, or -1 with errno (EINVAL: not a regular file). */
static int
open_regular(const char *path, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    if (fstat(fd, st) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    return fd;
}

/* Reads a whole regular file (never through a symlink) into a malloc'd,
 * NUL-terminated buffer. Returns 0, or -1 with errno (EFBIG past max). */
int
fc_disk_read_all(const char *path, size_t max, char **out, size_t *n)
{
    char *p = NULL;
    struct stat st;
    size_t len = 0;
    int fd = open_regular(path, &st);
    if (fd < 0) {
        return -1;
    }
    if ((size_t)st.st_size > max) {
        errno = EFBIG;
        goto error;
    }
    p = malloc((size_t)st.st_size + 1);
    if (p == NULL) {
        errno = ENOMEM;
        goto error;
    }
    while (len < (size_t)st.st_size) {
        ssize_t r = read(fd, p + len, (size_t)st.st_size - len);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            goto error;
        }
        if (r == 0) {
            break;   /* shrank under us: the caller's checksum will say so */
        }
        len += (size_t)r;
    }
    p[len] = '\0';
    close(fd);
    *out = p;
    *n = len;
    return 0;
error:;
    int saved = errno;
    free(p);
    close(fd);
    errno = saved;
    return -1;
}

/* The first max bytes of fd's file (pread: the offset is left alone),
 * malloc'd and NUL-terminated, with `more` appended when the file is longer.
 * A read error reads as no text. NULL when out of memory. */
char *
fc_disk_read_head(int fd, size_t max, const char *more)
{
    off_t len = lseek(fd, 0, SEEK_END);
    size_t n = len < 0 ? 0 : (size_t)len > max ? max : (size_t)len;
    char *text = calloc(1, n + strlen(more) + 1);
    if (text == NULL) {
        return NULL;
    }
    ssize_t r = n ? pread(fd, text, n, 0) : 0;
    if (r < 0) {
        r = 0;
    }
    text[r] = '\0';
    if ((off_t)n < len) {
        strcat(text, more);
    }
    return text;
}

static int
write_fd_all(int fd, const void *data, size_t n)
{
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w < 0) {
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Creates `path` (which must not exist), writes data, fsyncs. On failure the
 * file is removed. Returns 0, or -1 with errno. */
int
fc_disk_write_new(const char *path, const void *data, size_t n, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) {
        return -1;
    }
    if (write_fd_all(fd, data, n) < 0 || fsync(fd) < 0) {
        int saved = errno;
        close(fd);
        unlink(path);
        errno = saved;
        return -1;
    }
    return close(fd);
}

/* Writes data to `path` via a temp file beside it and rename(2): readers see
 * the old or the new file, never a half-written one. Returns 0 or -1 with errno. */
int
fc_disk_write_atomic(const char *path, const void *data, size_t n, mode_t mode)
{
    char sfx[FC_DISK_SUFFIX], *tmp;
    fc_disk_temp_suffix(sfx);
    if (asprintf(&tmp, "%s.%s.tmp", path, sfx) < 0) {
        errno = ENOMEM;
        return -1;
    }
    int rc = fc_disk_write_new(tmp, data, n, mode);
    if (rc == 0 && rename(tmp, path) < 0) {
        int saved = errno;
        unlink(tmp);
        errno = saved;
        rc = -1;
    }
    free(tmp);
    return rc;
}

/* sha256 of a regular file's bytes (fsync'd first when `sync`). 0 or -1 with errno. */
int
fc_disk_hash_file(const char *path, int sync, char hex[65], off_t *size)
{
    struct stat st;
    FcSha256 s;
    uint8_t digest[32];
    char chunk[65536];
    int fd = open_regular(path, &st);
    if (fd < 0) {
        return -1;
    }
    if (sync && fsync(fd) < 0) {
        goto error;
    }
    fc_sha256_init(&s);
    for (;;) {
        ssize_t r = read(fd, chunk, sizeof(chunk));
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            goto error;
        }
        if (r == 0) {
            break;
        }
        fc_sha256_update(&s, chunk, (size_t)r);
    }
    close(fd);
    fc_sha256_final(&s, digest);
    fc_sha256_hex(digest, hex);
    if (size) {
        *size = st.st_size;
    }
    return 0;
error:;
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

void
fc_disk_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);   /* durability only: a failure here loses nothing that is checked */
        close(fd);
    }
}

/* Moves `from` to `to` only if `to` does not exist (EEXIST otherwise): a
 * published file is never overwritten, so a process that has it mapped never
 * sees it change (cppimport#67's SIGBUS). Returns 0 or -1 with errno. */
int
fc_disk_move_noreplace(const char *from, const char *to)
{
#ifdef RENAME_NOREPLACE
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) {
        return 0;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
        return -1;
    }
#endif
    if (link(from, to) < 0) {
        return -1;
    }
    unlink(from);
    return 0;
}

/* mkdir -p with mode 0700 for every folder it creates. 0 or -1 with errno. */
int
fc_disk_mkdir_p(const char *path, mode_t mode)
{
    char *p = strdup(path);
    int rc = 0;
    if (p == NULL) {
        errno = ENOMEM;
        return -1;
    }
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            if (mkdir(p, mode) < 0 && errno != EEXIST) {
                rc = -1;
                break;
            }
            *s = c;
            if (c == '\0') {
                break;
            }
        }
    }
    int saved = errno;
    free(p);
    errno = saved;
    return rc;
}

/* ---------------------------------------------------------------------------
 * Private folders: the cache is trusted only while it is ours alone.
 * ------------------------------------------------------------------------- */

/* Is dir safe to load code from? 0, or -1 with why filled in. Checks the leaf
 * (not a symlink, a directory, owned by us, not group/world-writable) and every
 * ancestor (not writable by others unless sticky, like /tmp: otherwise anyone
 * could rename our leaf away and put theirs in its place). */
int
fc_disk_check_private(const char *dir, char *why, size_t whylen)
{
    struct stat st;
    if (lstat(dir, &st) < 0) {
        snprintf(why, whylen, "cannot stat it: %s", strerror(errno));
        return -1;
    }
    if (S_ISLNK(st.st_mode)) {
        snprintf(why, whylen, "it is a symlink");
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(why, whylen, "it is not a directory");
        return -1;
    }
    if (st.st_uid != geteuid()) {
        snprintf(why, whylen, "it is owned by uid %ld, not by us (uid %ld)", (long)st.st_uid,
                 (long)geteuid());
        return -1;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(why, whylen, "it is group- or world-writable (mode %03o)",
                 (unsigned)(st.st_mode & 0777));
        return -1;
    }
    char *up = strdup(dir);
    if (up == NULL) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    int rc = 0;
    for (char *slash = strrchr(up, '/'); slash != NULL; slash = strrchr(up, '/')) {
        if (slash == up) {
            slash[1] = '\0';   /* "/" itself */
        }
        else {
            *slash = '\0';
        }
        if (stat(up, &st) == 0 && (st.st_mode & (S_IWGRP | S_IWOTH))
            && !(st.st_mode & S_ISVTX)) {
            snprintf(why, whylen, "its parent %s is writable by others without the sticky bit",
                     up);
            rc = -1;
            break;
        }
        if (slash == up) {
            break;
        }
    }
    free(up);
    return rc;
}

/* Deletes what this runtime writes under dir: in each two-hex-digit shard,
 * the files named <64 hex>.<anything> (published and temp .so/.c/.meta/.log),
 * then the shard if empty; at the top, compiler-*.id files. Symlinks and
 * other names are left alone. With remove_root, rmdir dir too. GIL-free. */
/* Empties and removes top/<name>, a precompiled header's folder: its .gch
 * files and their temps. 0, or -1 when a file stayed. */
static int
clear_pch_dir(int top, const char *name)
{
    int fd = openat(top, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *de;
    int rc = 0;
    if (d == NULL) {
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    while ((de = readdir(d)) != NULL) {
        struct stat st;
        if (strstr(de->d_name, ".gch") && fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0
            && S_ISREG(st.st_mode) && unlinkat(fd, de->d_name, 0) < 0 && errno != ENOENT) {
            rc = -1;
        }
    }
    closedir(d);
    unlinkat(top, name, AT_REMOVEDIR);   /* fails harmlessly if others' files remain */
    return rc;
}

int
fc_disk_clear_dir(const char *dir, int remove_root)
{
    int top = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = top >= 0 ? fdopendir(top) : NULL;
    struct dirent *de;
    int rc = 0;
    if (d == NULL) {
        int saved = errno;
        if (top >= 0) {
            close(top);
        }
        errno = saved;
        return saved == ENOENT ? 0 : -1;
    }
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        struct stat st;
        if (fstatat(top, n, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            continue;
        }
        if (S_ISREG(st.st_mode) && strncmp(n, "compiler-", 9) == 0) {
            unlinkat(top, n, 0);
            continue;
        }
        if (S_ISDIR(st.st_mode) && strncmp(n, "pch-", 4) == 0 && strlen(n) == 20
            && strspn(n + 4, "0123456789abcdef") == 16) {
            if (clear_pch_dir(top, n) < 0) {
                rc = -1;
            }
            continue;
        }
        if (!S_ISDIR(st.st_mode) || strlen(n) != 2 || strspn(n, "0123456789abcdef") != 2) {
            continue;
        }
        int sfd = openat(top, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        DIR *sd = sfd >= 0 ? fdopendir(sfd) : NULL;
        if (sd == NULL) {
            if (sfd >= 0) {
                close(sfd);
            }
            rc = -1;
            continue;
        }
        struct dirent *fe;
        while ((fe = readdir(sd)) != NULL) {
            const char *f = fe->d_name;
            struct stat fst;
            if (strspn(f, "0123456789abcdef") == 64 && f[64] == '.'
                && fstatat(sfd, f, &fst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(fst.st_mode)
                && unlinkat(sfd, f, 0) < 0 && errno != ENOENT) {
                rc = -1;
            }
        }
        closedir(sd);
        unlinkat(top, n, AT_REMOVEDIR);   /* fails harmlessly if others' files remain */
    }
    closedir(d);
    if (remove_root && rmdir(dir) < 0 && errno != ENOENT) {
        rc = -1;
    }
    return rc;
}

/* ---------------------------------------------------------------------------
 * Cache entries: <key>.so and the <key>.meta sidecar that vouches for its bytes.
 * ------------------------------------------------------------------------- */

/* The sidecar: which key, which .so bytes, which fastcompile wrote it. */
char *
fc_disk_meta_text(const char *key, const char *so_hex, const char *version)
{
    char *s;
    if (asprintf(&s, "fastcompile-cpu-cache 1\nkey %s\nso_sha256 %s\nversion %s\n", key, so_hex,
                 version) < 0) {
        return NULL;
    }
    return s;
}

enum { FC_OK, FC_META_MISSING, FC_META_STALE, FC_BAD };

/* One look at so + meta_path. FC_OK, or why filled in and FC_META_* (which
 * may heal within moments: another process is between its two renames) or FC_BAD. */
static int
check_entry_once(const char *so, const char *meta_path, const char *key, const char *version,
                 char *why, size_t whylen)
{
    char *meta = NULL, *want = NULL, hex[65];
    size_t n;
    off_t size = 0;
    int rc = FC_BAD;
    if (fc_disk_read_all(meta_path, 4096, &meta, &n) < 0) {
        snprintf(why, whylen, "%s .meta sidecar: %s", errno == ENOENT ? "missing" : "unreadable",
                 strerror(errno));
        rc = errno == ENOENT ? FC_META_MISSING : FC_BAD;
        goto cleanup;
    }
    if (fc_disk_hash_file(so, 0, hex, &size) < 0) {
        snprintf(why, whylen, "cannot read the .so: %s", strerror(errno));
        goto cleanup;
    }
    want = fc_disk_meta_text(key, hex, version);
    if (want == NULL) {
        snprintf(why, whylen, "out of memory");
        goto cleanup;
    }
    if (strcmp(meta, want) == 0) {
        rc = FC_OK;
        goto cleanup;
    }
    const char *said = strstr(meta, "\nso_sha256 ");
    if (said && strncmp(said + 11, hex, 64) != 0) {
        snprintf(why, whylen, "checksum mismatch: the %lld-byte .so hashes to %.12s..., the "
                 ".meta says %.12s...", (long long)size, hex, said + 11);
        rc = FC_META_STALE;
    }
    else {
        snprintf(why, whylen, ".meta does not match this key and version");
    }
cleanup:
    free(meta);
    free(want);
    return rc;
}

/* Checks an entry, giving a publisher that is between its link of the .so
 * and its rename of the .meta up to wait_ms to finish. 0 if good, else -1
 * with why. */
int
fc_disk_check_entry(const char *so, const char *meta_path, const char *key, const char *version,
                    int wait_ms, char *why, size_t whylen)
{
    for (int waited = 0;; waited += 10) {
        int rc = check_entry_once(so, meta_path, key, version, why, whylen);
        if (rc == FC_OK) {
            return 0;
        }
        if (waited >= wait_ms || rc == FC_BAD) {
            return -1;
        }
        fc_disk_sleep_ms(10);
    }
}
