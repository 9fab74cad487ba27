/* A growable string for the renderers and dumps (no Python objects).
 * In: printf-style pieces. Out: one malloc'd NUL-terminated string. */
#ifndef FC_STRBUF_H
#define FC_STRBUF_H

#include <stdarg.h>
#include <stddef.h>

#include "ir.h"

typedef struct {
    char *s;
    size_t len, cap;
    int failed;          /* an allocation failed; the text is incomplete */
} FcStr;

FC_INTERNAL void fc_str_printf(FcStr *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
FC_INTERNAL void fc_str_puts(FcStr *b, const char *text);
FC_INTERNAL void fc_str_indent(FcStr *b, int depth);
/* Hands the text to the caller (PyMem_Free it); NULL + MemoryError if anything failed. */
FC_INTERNAL char *fc_str_take(FcStr *b);
FC_INTERNAL void fc_str_free(FcStr *b);
/* a new string with every `from` replaced by `to` (PyMem_Malloc'd), NULL + MemoryError */
FC_INTERNAL char *fc_str_replace(const char *text, const char *from, const char *to);
FC_INTERNAL uint64_t fc_fnv1a(const char *text);

#endif
