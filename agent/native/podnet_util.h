/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_util.h - the general helpers of agent/native (podnet_util.c): the
 * reason-buffer formatter, UTF-8 (validation, encoding), hex digits, a bounded
 * string buffer, unsigned integers. Pure functions over caller buffers: no
 * I/O, no allocation, no global state. Not an API: only agent/native's own
 * files include it (the podnetd client, the SPANK plugin, the PAM module).
 */
#ifndef PODNET_UTIL_H
#define PODNET_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

/* snprintf into an optional reason buffer (buf may be NULL or sz 0) */
static inline void pn_fmt(char *buf, size_t sz, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static inline void pn_fmt(char *buf, size_t sz, const char *fmt, ...)
{
	va_list ap;

	if (!buf || !sz)
		return;
	va_start(ap, fmt);
	(void) vsnprintf(buf, sz, fmt, ap);
	va_end(ap);
}

/*
 * Length (1..4) of the well-formed UTF-8 sequence at s[0..n), or 0: a
 * continuation or invalid lead byte, a truncated sequence, an overlong form, a
 * surrogate, a code point beyond U+10FFFF. n must be at least 1.
 */
size_t pn_utf8_len(const unsigned char *s, size_t n);

/* Writes the code point cp (at most U+10FFFF) as UTF-8 into b[0..4); returns
 * its length (1..4). */
size_t pn_utf8_put(unsigned long cp, char *b);

/* The value of the hex digit c (0-9, a-f, A-F), or -1. */
int pn_hexval(char c);

/*
 * A bounded string buffer: pn_buf_put() appends n bytes and keeps dst
 * NUL-terminated; what does not fit (with its NUL) sets overflow, and every
 * later put is dropped. dst NULL: a sink, puts are dropped silently.
 */
typedef struct {
	char *dst;
	size_t sz;    /* capacity of dst, its NUL included */
	size_t len;
	int overflow;
} pn_buf_t;

void pn_buf_put(pn_buf_t *b, const char *s, size_t n);

/* Parses a base-10 unsigned integer in [min, max] (digits only, no sign, no
 * space, at most 20 digits); 0 ok, -1 bad. */
int pn_parse_uint(const char *s, unsigned long long min, unsigned long long max,
		  unsigned long long *out);

#endif /* PODNET_UTIL_H */
