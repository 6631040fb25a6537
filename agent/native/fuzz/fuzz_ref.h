/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_ref.h - reference checks for the fuzz harnesses, written apart from
 * podnet_json.c and podnet_util.c (from the Unicode standard's table of
 * well-formed UTF-8 byte sequences, Table 3-7, not from the code under test).
 */
#ifndef FUZZ_REF_H
#define FUZZ_REF_H

#include <stddef.h>
#include <string.h>

/* length of the well-formed UTF-8 sequence at s[0..n), 0 if there is none */
static inline size_t ref_utf8_len(const unsigned char *s, size_t n)
{
	static const struct {
		unsigned char lo0, hi0, lo1, hi1;
		size_t len;
	} t[] = {
		{ 0x00, 0x7f, 0, 0, 1 },       { 0xc2, 0xdf, 0x80, 0xbf, 2 },
		{ 0xe0, 0xe0, 0xa0, 0xbf, 3 }, { 0xe1, 0xec, 0x80, 0xbf, 3 },
		{ 0xed, 0xed, 0x80, 0x9f, 3 }, { 0xee, 0xef, 0x80, 0xbf, 3 },
		{ 0xf0, 0xf0, 0x90, 0xbf, 4 }, { 0xf1, 0xf3, 0x80, 0xbf, 4 },
		{ 0xf4, 0xf4, 0x80, 0x8f, 4 },
	};
	size_t i, k;

	if (!n)
		return 0;
	for (i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		if (s[0] < t[i].lo0 || s[0] > t[i].hi0)
			continue;
		if (n < t[i].len)
			return 0;
		if (t[i].len > 1 && (s[1] < t[i].lo1 || s[1] > t[i].hi1))
			return 0;
		for (k = 2; k < t[i].len; k++)
			if (s[k] < 0x80 || s[k] > 0xbf)
				return 0;
		return t[i].len;
	}
	return 0;
}

/* is s[0..n) well-formed UTF-8? */
static inline int ref_utf8_valid(const char *s, size_t n)
{
	const unsigned char *u = (const unsigned char *) s;
	size_t i = 0, k;

	while (i < n) {
		k = ref_utf8_len(u + i, n - i);
		if (!k)
			return 0;
		i += k;
	}
	return 1;
}

/*
 * What the escaper promises the reader gets back: the input with every NUL
 * and every byte that does not start a well-formed sequence replaced by
 * U+FFFD (one per byte). out needs 3 * n bytes; returns the length.
 */
static inline size_t ref_sanitize(const unsigned char *in, size_t n, char *out)
{
	size_t i = 0, o = 0, k;

	while (i < n) {
		k = ref_utf8_len(in + i, n - i);
		if (!k || in[i] == 0) {
			memcpy(out + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
			continue;
		}
		memcpy(out + o, in + i, k);
		o += k;
		i += k;
	}
	return o;
}

#endif /* FUZZ_REF_H */
