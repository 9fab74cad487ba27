/* Common, strings: a growable string for the renderers, dumps and runtime messages (no Python objects).
 * In: printf-style pieces. Out: one NUL-terminated string, freed with fc_str_release. */
#ifndef FC_STRBUF_H
#define FC_STRBUF_H

#include <stdarg.h>
#include <stddef.h>

#include <stdint.h>

#ifndef FC_INTERNAL
#define FC_INTERNAL __attribute__((visibility("hidden")))
#endif

/* Start with FcStr b = {0}. The buffer is PyMem_RawMalloc memory, so everything
 * here runs without the GIL except the two functions that raise (fc_str_take,
 * fc_str_replace), which need it. A failed allocation sets `failed`, later
 * appends do nothing, and the take reports it. */
typedef struct {
    char *s;
    size_t len, cap;
    int failed;          /* an allocation failed; the text is incomplete */
} FcStr;

FC_INTERNAL void fc_str_printf(FcStr *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
FC_INTERNAL void fc_str_puts(FcStr *b, const char *text);
FC_INTERNAL void fc_str_indent(FcStr *b, int depth);
/* Hands the text to the caller (free it with fc_str_release) and empties b.
 * GIL held: NULL + MemoryError if anything failed (b is emptied either way). */
FC_INTERNAL char *fc_str_take(FcStr *b);
/* fc_str_take without the GIL: NULL and no exception if anything failed. */
FC_INTERNAL char *fc_str_take_raw(FcStr *b);
/* Frees a string from fc_str_take, fc_str_take_raw or fc_str_replace (NULL is
 * fine), and only those: it is PyMem_RawFree, never PyMem_Free or free. GIL-free. */
FC_INTERNAL void fc_str_release(char *text);
/* Drops b's text without handing it out. GIL-free. */
FC_INTERNAL void fc_str_free(FcStr *b);
/* A new string with every `from` replaced by `to` (fc_str_release it).
 * GIL held: NULL + MemoryError. */
FC_INTERNAL char *fc_str_replace(const char *text, const char *from, const char *to);
FC_INTERNAL uint64_t fc_fnv1a(const char *text);

#endif
