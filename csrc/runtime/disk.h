/* Runtime, files: the disk cache's file operations.
 * In: paths, bytes. Out: files written/published/checked, string vectors, the clock. */
#ifndef FC_DISK_H
#define FC_DISK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../core/ir.h"

/* No Python objects here, and everything runs without the GIL.
 * Errors: 0, or -1 with errno set; strings and vectors are malloc'd (free()). */

#define FC_DISK_SUFFIX 48   /* room for fc_disk_temp_suffix's text */

/* NULL-terminated vectors of malloc'd strings (argv, envp, flag lists). */
FC_INTERNAL void fc_disk_strv_free(char **v);
FC_INTERNAL size_t fc_disk_strv_len(char *const *v);
/* Appends a copy of s to *v. 0, or -1 when out of memory. */
FC_INTERNAL int fc_disk_strv_push(char ***v, const char *s);

/* Monotonic clock in ms; a sleep that resumes after signals. */
FC_INTERNAL double fc_disk_now_ms(void);
FC_INTERNAL void fc_disk_sleep_ms(int ms);

/* "<pid>.<16 random hex>": the unique part of a temp name beside its target. */
FC_INTERNAL void fc_disk_temp_suffix(char out[FC_DISK_SUFFIX]);
/* A whole regular file (never through a symlink), NUL-terminated in *out
 * (free()), its length in *n. EFBIG past max bytes. */
FC_INTERNAL int fc_disk_read_all(const char *path, size_t max, char **out, size_t *n);
/* The first max bytes of fd's file, NUL-terminated (free()), with `more`
 * appended when it is longer; a read error reads as "". NULL when out of memory. */
FC_INTERNAL char *fc_disk_read_head(int fd, size_t max, const char *more);
/* Creates path (which must not exist), writes, fsyncs; removed again on failure. */
FC_INTERNAL int fc_disk_write_new(const char *path, const void *data, size_t n, mode_t mode);
/* Replaces path through a temp file and rename(2): readers see old or new, never half. */
FC_INTERNAL int fc_disk_write_atomic(const char *path, const void *data, size_t n, mode_t mode);
/* Hex sha256 of a regular file's bytes (fsync'd first when sync); its size in *size. */
FC_INTERNAL int fc_disk_hash_file(const char *path, int sync, char hex[65], off_t *size);
/* fsync a folder, best effort (durability of renames in it). */
FC_INTERNAL void fc_disk_fsync_dir(const char *dir);
/* Publishes from as to unless to exists (EEXIST): a published file is never replaced. */
FC_INTERNAL int fc_disk_move_noreplace(const char *from, const char *to);
/* mkdir -p, every folder it creates with mode. */
FC_INTERNAL int fc_disk_mkdir_p(const char *path, mode_t mode);

/* Is dir safe to load code from (ours, 0700-ish, no symlink, no ancestor that
 * others may write without the sticky bit)? 0, or -1 with why filled in. */
FC_INTERNAL int fc_disk_check_private(const char *dir, char *why, size_t whylen);
/* Deletes the CPU runtime's files under dir (shards of <64 hex>.* files,
 * compiler-*.id, pch-<16 hex> folders of .gch files), nothing else; with
 * remove_root, dir too. */
FC_INTERNAL int fc_disk_clear_dir(const char *dir, int remove_root);

/* A cache entry is <key>.so plus a <key>.meta sidecar naming the key, the
 * .so's sha256 and the version. The sidecar's text (free()); NULL when out of memory. */
FC_INTERNAL char *fc_disk_meta_text(const char *key, const char *so_hex, const char *version);
/* Does meta_path vouch for so's bytes under key and version? Waits up to
 * wait_ms for a publisher between its link of the .so and its rename of the
 * .meta. 0 if so, else -1 with why filled in. */
FC_INTERNAL int fc_disk_check_entry(const char *so, const char *meta_path, const char *key,
                                    const char *version, int wait_ms, char *why, size_t whylen);

#endif
