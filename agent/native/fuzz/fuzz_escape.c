/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_escape.c - fuzz target for pn_json_escape and the request builder
 * (podnet_json.c): what the SPANK plugin and pam_podnet.so send podnetd,
 * built from job names, node lists and user names that users control.
 * Properties (abort otherwise; ASan/UBSan catch the rest):
 *  - round trip: the escaped input, read back by the reply parser's string
 *    decoder, is the input with NUL and invalid UTF-8 bytes replaced by
 *    U+FFFD (fuzz_ref.h, written apart from the escaper);
 *  - the output is one line of well-formed UTF-8 with no raw control
 *    character and no unescaped quote;
 *  - with a buffer of any size the escaper writes inside it and returns
 *    either the full result or -1;
 *  - a request holding the input (as op, key, value and list item) is one
 *    JSON line the parser's grammar accepts, or a clean TOOBIG.
 * tests/unit/c/test_native.py checks the same round trip against Python's
 * json module.
 */
#include "podnet_json.c"

#include <stdint.h>
#include <stdlib.h>

#include "fuzz_ref.h"

/* the escaper's output: no raw control char, every '"' escaped */
static int well_escaped(const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		unsigned char c = (unsigned char) s[i];

		if (c < 0x20 || c == 0x7f || c == '"')
			return 0;
		if (c == '\\') {
			if (++i >= n)
				return 0;
			if (s[i] == 'u')
				i += 4;
		}
	}
	return i == n;
}

/* the request grammar: one object, valid JSON, ending in "}\n" */
static int valid_request(char *buf, size_t len)
{
	jp_t j;

	if (len < 2 || buf[len - 1] != '\n' || buf[len - 2] != '}' ||
	    memchr(buf, '\n', len - 1))
		return 0;
	memset(&j, 0, sizeof(j));
	j.start = j.p = buf;
	j.end = buf + len;
	if (jvalue(&j, J_OTHER) < 0)
		return 0;
	jws(&j);
	return j.p == j.end;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t cap = 6 * size + 1, k, rlen;
	char *out, *q, *dec, *ref, *small, *str, *req;
	long n, m;
	jp_t j;
	pn_buf_t o;
	pn_req_t r;

	out = malloc(cap);
	q = malloc(cap + 2);
	dec = malloc(3 * size + 1);
	ref = malloc(3 * size + 1);
	str = malloc(size + 1);
	if (!out || !q || !dec || !ref || !str)
		abort();

	n = pn_json_escape(out, cap, (const char *) data, size);
	if (n < 0 || (size_t) n >= cap || out[n] != '\0' ||
	    strlen(out) != (size_t) n)
		abort();
	if (!well_escaped(out, (size_t) n) || !ref_utf8_valid(out, (size_t) n))
		abort();

	/* round trip through the parser's string decoder */
	q[0] = '"';
	memcpy(q + 1, out, (size_t) n);
	q[n + 1] = '"';
	memset(&j, 0, sizeof(j));
	j.start = j.p = q;
	j.end = q + n + 2;
	o.dst = dec;
	o.sz = 3 * size + 1;
	o.len = 0;
	o.overflow = 0;
	dec[0] = '\0';
	if (jstring(&j, &o) < 0 || j.p != j.end || o.overflow)
		abort();
	rlen = ref_sanitize(data, size, ref);
	if (o.len != rlen || memcmp(dec, ref, rlen) != 0)
		abort();

	/* any buffer size: the full result or -1, never a write outside */
	k = size ? data[0] % ((size_t) n + 2) : 0;
	small = malloc(k ? k : 1);
	if (!small)
		abort();
	m = pn_json_escape(small, k, (const char *) data, size);
	if (k >= (size_t) n + 1 ? (m != n || memcmp(small, out, (size_t) n + 1))
				: m != -1)
		abort();
	free(small);

	/* the request builder with the input (up to a NUL) everywhere */
	memcpy(str, data, size);
	str[size] = '\0';
	k = 64 + (size ? (size_t) data[size - 1] * 64 : 0); /* 64..16384 */
	req = malloc(k);
	if (!req)
		abort();
	pn_req_begin(&r, req, k, str);
	pn_req_str(&r, str[0] ? str : "k", str);
	pn_req_int(&r, "n", (long long) size - 1000);
	pn_req_list_begin(&r, "l");
	pn_req_list_str(&r, str);
	pn_req_list_str(&r, "");
	pn_req_list_end(&r);
	m = pn_req_end(&r);
	if (m < 0 ? r.err != PN_REQ_E_TOOBIG
		  : (r.err || (size_t) m != r.len || !valid_request(req, (size_t) m)))
		abort();
	free(req);

	free(out);
	free(q);
	free(dec);
	free(ref);
	free(str);
	return 0;
}
