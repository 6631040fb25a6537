/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_util.h - internal helper of the podnetd client (podnet_json.c,
 * podnet_transport.c, podnet_pod.c). Not an API: nothing outside the client
 * includes it.
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

#endif /* PODNET_UTIL_H */
