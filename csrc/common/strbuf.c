/* Common, strings: a growable string for the renderers, dumps and runtime messages.
 * In: printf-style pieces. Out: one NUL-terminated PyMem_Raw string (fc_str_release). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <string.h>

#include "strbuf.h"

static int
reserve(FcStr *b, size_t extra)
{
    size_t cap;
    char *p;
    if (b->failed) {
        return -1;
    }
    if (b->len + extra + 1 <= b->cap) {
        return 0;
    }
    cap = b->cap ? b->cap : 1024;
    while (cap < b->len + extra + 1) {
        cap *= 2;
    }
    p = PyMem_RawRealloc(b->s, cap);   /* GIL-free, unlike PyMem_Realloc */
    if (p == NULL) {
        b->failed = 1;
        return -1;
    }
    b->s = p;
    b->cap = cap;
    return 0;
}

void
fc_str_printf(FcStr *b, const char *fmt, ...)
{
    va_list ap;
    int need;
    va_start(ap, fmt);
    need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (need < 0 || reserve(b, (size_t)need) < 0) {
        b->failed = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)need;
}

void
fc_str_puts(FcStr *b, const char *text)
{
    size_t n = strlen(text);
    if (reserve(b, n) < 0) {
        return;
    }
    memcpy(b->s + b->len, text, n + 1);
    b->len += n;
}

void
fc_str_indent(FcStr *b, int depth)
{
    for (int i = 0; i < depth; i++) {
        fc_str_puts(b, "    ");
    }
}

char *
fc_str_take_raw(FcStr *b)
{
    char *s;
    if (b->failed || reserve(b, 0) < 0) {
        fc_str_free(b);
        return NULL;
    }
    if (b->len == 0) {
        b->s[0] = 0;
    }
    s = b->s;
    b->s = NULL;
    b->len = b->cap = 0;
    return s;
}

char *
fc_str_take(FcStr *b)
{
    char *s = fc_str_take_raw(b);
    if (s == NULL) {
        PyErr_NoMemory();
    }
    return s;
}

void
fc_str_release(char *text)
{
    PyMem_RawFree(text);
}

void
fc_str_free(FcStr *b)
{
    PyMem_RawFree(b->s);
    b->s = NULL;
    b->len = b->cap = 0;
    b->failed = 0;
}

char *
fc_str_replace(const char *text, const char *from, const char *to)
{
    FcStr b = {0};
    size_t nf = strlen(from);
    const char *p = text, *q;
    while ((q = strstr(p, from)) != NULL) {
        fc_str_printf(&b, "%.*s%s", (int)(q - p), p, to);
        p = q + nf;
    }
    fc_str_puts(&b, p);
    return fc_str_take(&b);
}

uint64_t
fc_fnv1a(const char *text)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        h ^= *p;
        h *= 1099511628211ull;
    }
    return h;
}
