/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of podnet_util.c: UTF-8 sequence lengths and encoding, hex
 * digits, the bounded string buffer, pn_parse_uint. Links podnet_util.c alone.
 */
#include <stdio.h>
#include <string.h>

#include "ctest.h"
#include "podnet_util.h"

#define U(s) ((const unsigned char *) (s))

/* ---------------------------------------------------------------------- */
static void test_utf8_len(void)
{
	CHECK(pn_utf8_len(U("a"), 1) == 1, "utf8: ASCII is one byte");
	CHECK(pn_utf8_len(U("\xc3\xa9"), 2) == 2, "utf8: two bytes (e acute)");
	CHECK(pn_utf8_len(U("\xe2\x82\xac"), 3) == 3, "utf8: three bytes (euro)");
	CHECK(pn_utf8_len(U("\xf0\x9f\x98\x80"), 4) == 4, "utf8: four bytes");
	CHECK(pn_utf8_len(U("\xf4\x8f\xbf\xbf"), 4) == 4, "utf8: U+10FFFF");
	CHECK(pn_utf8_len(U("\xf4\x90\x80\x80"), 4) == 0, "utf8: beyond U+10FFFF");
	CHECK(pn_utf8_len(U("\xc0\xaf"), 2) == 0, "utf8: overlong two bytes");
	CHECK(pn_utf8_len(U("\xe0\x80\xaf"), 3) == 0, "utf8: overlong three bytes");
	CHECK(pn_utf8_len(U("\xf0\x80\x80\xaf"), 4) == 0, "utf8: overlong four bytes");
	CHECK(pn_utf8_len(U("\xed\xa0\x80"), 3) == 0, "utf8: surrogate");
	CHECK(pn_utf8_len(U("\x80"), 1) == 0, "utf8: lone continuation byte");
	CHECK(pn_utf8_len(U("\xff"), 1) == 0, "utf8: 0xff");
	CHECK(pn_utf8_len(U("\xe2\x82\xac"), 2) == 0, "utf8: cut by the length");
	CHECK(pn_utf8_len(U("\xe2\x41\xac"), 3) == 0, "utf8: bad continuation");
}

static void test_utf8_put(void)
{
	static const unsigned long cps[] = { 0x41, 0x7f, 0x80, 0x7ff, 0x800,
					     0xfffd, 0xffff, 0x10000, 0x10ffff };
	char b[4];
	size_t i, n;

	n = pn_utf8_put(0xe9, b);
	CHECK(n == 2 && !memcmp(b, "\xc3\xa9", 2), "utf8 put: U+00E9");
	n = pn_utf8_put(0x1f600, b);
	CHECK(n == 4 && !memcmp(b, "\xf0\x9f\x98\x80", 4), "utf8 put: U+1F600");
	for (i = 0; i < sizeof(cps) / sizeof(cps[0]); i++) {
		n = pn_utf8_put(cps[i], b);
		CHECK(n >= 1 && n <= 4 && pn_utf8_len(U(b), n) == n,
		      "utf8 put: U+%04lX reads back as one sequence of %zu",
		      cps[i], n);
	}
}

static void test_hexval(void)
{
	CHECK(pn_hexval('0') == 0 && pn_hexval('9') == 9, "hex: digits");
	CHECK(pn_hexval('a') == 10 && pn_hexval('F') == 15, "hex: letters");
	CHECK(pn_hexval('g') == -1 && pn_hexval(' ') == -1 &&
		      pn_hexval('\0') == -1,
	      "hex: others refused");
}

static void test_buf(void)
{
	char d[6] = "xxxxx";
	pn_buf_t b = { d, sizeof(d), 0, 0 };
	pn_buf_t sink = { NULL, 0, 0, 0 };

	pn_buf_put(&b, "ab", 2);
	pn_buf_put(&b, "cde", 3);
	CHECK(!b.overflow && b.len == 5 && !strcmp(d, "abcde"),
	      "buf: exact fit, NUL-terminated");
	pn_buf_put(&b, "f", 1);
	CHECK(b.overflow && b.len == 5 && !strcmp(d, "abcde"),
	      "buf: overflow kept out");
	pn_buf_put(&b, "", 0);
	CHECK(b.overflow && b.len == 5, "buf: nothing after an overflow");
	pn_buf_put(&sink, "abc", 3);
	CHECK(!sink.overflow && sink.len == 0, "buf: a NULL buffer is a sink");
}

static void test_uint(void)
{
	unsigned long long v = 0;

	CHECK(pn_parse_uint("42", 1, 100, &v) == 0 && v == 42, "uint: 42");
	CHECK(pn_parse_uint("0", 1, 100, &v) == -1, "uint: below min");
	CHECK(pn_parse_uint("101", 1, 100, &v) == -1, "uint: above max");
	CHECK(pn_parse_uint("-1", 0, 100, &v) == -1, "uint: sign refused");
	CHECK(pn_parse_uint(" 1", 0, 100, &v) == -1, "uint: space refused");
	CHECK(pn_parse_uint("1x", 0, 100, &v) == -1, "uint: trailing junk");
	CHECK(pn_parse_uint("", 0, 100, &v) == -1, "uint: empty");
	CHECK(pn_parse_uint("99999999999999999999999", 0, ~0ULL, &v) == -1,
	      "uint: overflow");
	CHECK(pn_parse_uint("18446744073709551615", 0, ~0ULL, &v) == 0 &&
		      v == ~0ULL,
	      "uint: max value");
}

int main(void)
{
	ctest_begin();
	test_utf8_len();
	test_utf8_put();
	test_hexval();
	test_buf();
	test_uint();
	return ctest_end();
}
