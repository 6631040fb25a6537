/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_util.c - see podnet_util.h: UTF-8, hex digits, the bounded string
 * buffer and unsigned integers, for the wire format (podnet_json.c) and the
 * configuration readers (podnet_spank_opts.c, podnet_session.c). Unit tests:
 * tests/test_util.c.
 */
#include "podnet_util.h"

#include <limits.h>
#include <string.h>

size_t pn_utf8_len(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	size_t need, i;
	unsigned long cp;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf) {
		need = 2;
		cp = c & 0x1f;
	} else if (c >= 0xe0 && c <= 0xef) {
		need = 3;
		cp = c & 0x0f;
	} else if (c >= 0xf0 && c <= 0xf4) {
		need = 4;
		cp = c & 0x07;
	} else {
		return 0;
	}
	if (n < need)
		return 0;
	for (i = 1; i < need; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	/* overlong forms, surrogates, beyond U+10FFFF */
	if ((need == 3 && cp < 0x800) || (need == 4 && cp < 0x10000) ||
	    (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
		return 0;
	return need;
}

size_t pn_utf8_put(unsigned long cp, char *b)
{
	if (cp < 0x80) {
		b[0] = (char) cp;
		return 1;
	}
	if (cp < 0x800) {
		b[0] = (char) (0xc0 | (cp >> 6));
		b[1] = (char) (0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		b[0] = (char) (0xe0 | (cp >> 12));
		b[1] = (char) (0x80 | ((cp >> 6) & 0x3f));
		b[2] = (char) (0x80 | (cp & 0x3f));
		return 3;
	}
	b[0] = (char) (0xf0 | (cp >> 18));
	b[1] = (char) (0x80 | ((cp >> 12) & 0x3f));
	b[2] = (char) (0x80 | ((cp >> 6) & 0x3f));
	b[3] = (char) (0x80 | (cp & 0x3f));
	return 4;
}

int pn_hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

void pn_buf_put(pn_buf_t *b, const char *s, size_t n)
{
	if (!b->dst)
		return;
	if (b->overflow || b->len + n + 1 > b->sz) {
		b->overflow = 1;
		return;
	}
	memcpy(b->dst + b->len, s, n);
	b->len += n;
	b->dst[b->len] = '\0';
}

int pn_parse_uint(const char *s, unsigned long long min, unsigned long long max,
		  unsigned long long *out)
{
	unsigned long long v = 0;
	size_t i;

	if (!s || !*s || strlen(s) > 20)
		return -1;
	for (i = 0; s[i]; i++) {
		unsigned d;

		if (s[i] < '0' || s[i] > '9')
			return -1;
		d = (unsigned) (s[i] - '0');
		if (v > (ULLONG_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	if (v < min || v > max)
		return -1;
	*out = v;
	return 0;
}
