/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of podnet_json.c: the JSON escaper, the request builder, the
 * reply parser (well-formed and malformed replies). Links podnet_json.c and
 * podnet_util.c alone: the wire format needs no I/O.
 * Prints "REQ <line>" for every request built (tests/unit/c checks them with
 * Python's JSON parser).
 */
#include <stdio.h>
#include <string.h>

#include "ctest.h"
#include "podnet_json.h"

/* ---------------------------------------------------------------------- */
static void test_escape(void)
{
	char out[64];
	long n;

	n = pn_json_escape(out, sizeof(out), "plain", 5);
	CHECK(n == 5 && !strcmp(out, "plain"), "escape: plain text unchanged");
	n = pn_json_escape(out, sizeof(out), "a\"b\\c", 5);
	CHECK(n == 7 && !strcmp(out, "a\\\"b\\\\c"), "escape: quote, backslash");
	n = pn_json_escape(out, sizeof(out), "\n\r\t\x01\x1f\x7f", 6);
	CHECK(!strcmp(out, "\\n\\r\\t\\u0001\\u001f\\u007f"),
	      "escape: control characters (%s)", out);
	n = pn_json_escape(out, sizeof(out), "a\0b", 3);
	CHECK(!strcmp(out, "a\\ufffdb"), "escape: NUL becomes U+FFFD");
	n = pn_json_escape(out, sizeof(out), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
			   14);
	CHECK(n == 14 && !memcmp(out, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 15),
	      "escape: valid UTF-8 passes through");
	n = pn_json_escape(out, sizeof(out), "x\xff\xc3y", 4);
	CHECK(!strcmp(out, "x\\ufffd\\ufffdy"), "escape: invalid UTF-8 replaced");
	n = pn_json_escape(out, sizeof(out), "\xc0\xaf", 2);
	CHECK(!strcmp(out, "\\ufffd\\ufffd"), "escape: overlong form replaced");
	n = pn_json_escape(out, sizeof(out), "\xed\xa0\x80", 3);
	CHECK(!strcmp(out, "\\ufffd\\ufffd\\ufffd"),
	      "escape: UTF-8 surrogate replaced");
	n = pn_json_escape(out, sizeof(out), "\xe2\x82", 2);
	CHECK(!strcmp(out, "\\ufffd\\ufffd"), "escape: truncated sequence");
	n = pn_json_escape(out, 4, "abcd", 4);
	CHECK(n == -1, "escape: too small buffer -> -1 (no NUL room)");
	n = pn_json_escape(out, 5, "abcd", 4);
	CHECK(n == 4 && !strcmp(out, "abcd"), "escape: exact fit");
	n = pn_json_escape(out, 6, "\"\"\"", 3);
	CHECK(n == -1, "escape: escapes counted against the size");
	n = pn_json_escape(out, sizeof(out), "", 0);
	CHECK(n == 0 && out[0] == '\0', "escape: empty string");
	n = pn_json_escape(out, sizeof(out), NULL, 3);
	CHECK(n == -1, "escape: NULL input refused");
}

static void test_request(void)
{
	char buf[512], small[40];
	pn_req_t r;
	long len;
	const char *nodes[] = { "c1", "c\"2", "c\\3", "c\n4" };
	size_t i;

	pn_req_begin(&r, buf, sizeof(buf), "job_up");
	pn_req_int(&r, "job_id", 42);
	pn_req_str(&r, "user", "alice");
	pn_req_int(&r, "uid", 2001);
	pn_req_str(&r, "job_name", "we ird\"name\t\xff");
	pn_req_list_begin(&r, "nodes");
	for (i = 0; i < 4; i++)
		pn_req_list_str(&r, nodes[i]);
	pn_req_list_end(&r);
	pn_req_int(&r, "node_index", 1);
	len = pn_req_end(&r);
	CHECK(len > 0 && buf[len - 1] == '\n' && !memchr(buf, '\n', len - 1),
	      "request: one line ending in newline");
	emit_req(buf, len);

	pn_req_begin(&r, buf, sizeof(buf), "job_up");
	pn_req_list_begin(&r, "nodes");
	pn_req_list_end(&r);
	pn_req_int(&r, "neg", -9223372036854775807LL - 1);
	len = pn_req_end(&r);
	CHECK(len > 0, "request: empty list and LLONG_MIN");
	emit_req(buf, len);

	pn_req_begin(&r, small, sizeof(small), "job_up");
	pn_req_str(&r, "user", "a-very-long-user-name-that-does-not-fit");
	len = pn_req_end(&r);
	CHECK(len == -1 && r.err == PN_REQ_E_TOOBIG, "request: overflow detected");

	pn_req_begin(&r, buf, sizeof(buf), "x");
	pn_req_list_begin(&r, "l");
	pn_req_str(&r, "k", "v");
	len = pn_req_end(&r);
	CHECK(len == -1 && r.err == PN_REQ_E_USAGE, "request: key inside list refused");

	pn_req_begin(&r, buf, sizeof(buf), "x");
	pn_req_list_begin(&r, "l");
	len = pn_req_end(&r);
	CHECK(len == -1 && r.err == PN_REQ_E_USAGE, "request: unclosed list refused");

	pn_req_begin(&r, buf, sizeof(buf), "x");
	pn_req_list_str(&r, "v");
	len = pn_req_end(&r);
	CHECK(len == -1 && r.err == PN_REQ_E_USAGE, "request: list item outside list");

	pn_req_begin(&r, buf, sizeof(buf), "x");
	pn_req_str(&r, "k", NULL);
	len = pn_req_end(&r);
	CHECK(len == -1, "request: NULL value refused");

	pn_req_begin(&r, NULL, 0, "x");
	CHECK(pn_req_end(&r) == -1, "request: NULL buffer refused");
}

/* ---------------------------------------------------------------------- */
static int parse(const char *s, pn_reply_t *rep, char *why, size_t whysz)
{
	return pn_parse_reply(s, strlen(s), rep, why, whysz);
}

static void test_reply_ok(void)
{
	pn_reply_t rep;
	char why[256];
	int rc;

	rc = parse("{\"v\": 1, \"ok\": true, \"pod\": {\"kind\": \"job\", "
		   "\"name\": \"pn-j42\", \"netns\": \"/run/netns/pn-j42\", "
		   "\"ip\": \"198.18.0.5\", \"prefix\": 15, \"user\": \"alice\", "
		   "\"uid\": 1001, \"job_id\": 42, \"index\": 0, \"names\": "
		   "[\"pod0.train.alice.lab\", \"pod0.42.alice.lab\"]}}\n",
		   &rep, why, sizeof(why));
	CHECK(rc == 0 && rep.ok == 1 && !strcmp(rep.pod_name, "pn-j42") &&
		      !strcmp(rep.pod_netns, "/run/netns/pn-j42") &&
		      !strcmp(rep.pod_ip, "198.18.0.5") &&
		      !strcmp(rep.pod_user, "alice") && rep.pod_uid == 1001 &&
		      rep.pod_fqdn[0] == '\0' && rep.pod_domain[0] == '\0',
	      "reply: api.md pod example (%s)", why);

	rc = parse("{\"v\":1,\"ok\":true,\"pod\":{\"kind\":\"job\","
		   "\"name\":\"pn-j42\",\"ip\":\"198.18.0.5\","
		   "\"names\":[\"pod0.train.alice.lab\",\"pod0.42.alice.lab\"],"
		   "\"fqdn\":\"pod0.42.alice.lab\",\"domain\":\"42.alice.lab\"}}",
		   &rep, why, sizeof(why));
	CHECK(rc == 0 && !strcmp(rep.pod_fqdn, "pod0.42.alice.lab") &&
		      !strcmp(rep.pod_domain, "42.alice.lab"),
	      "reply: the pod's fqdn and job domain (%s)", why);

	rc = parse("{\"v\":1,\"ok\":true,\"pod\":{\"fqdn\":\"a\",\"fqdn\":\"b\"}}",
		   &rep, why, sizeof(why));
	CHECK(rc < 0 && strstr(why, "duplicate member \"fqdn\""),
	      "reply: fqdn twice is malformed (%s)", why);

	rc = parse("{\"v\":1,\"ok\":true,\"pod\":{\"domain\":7}}", &rep, why,
		   sizeof(why));
	CHECK(rc < 0 && strstr(why, "\"domain\" is not a string"),
	      "reply: a domain that is not a string is malformed (%s)", why);

	rc = parse("{\"v\":1,\"ok\":false,\"error\":{\"code\":\"ENOENT\","
		   "\"message\":\"no pod for job 7\"}}", &rep, why, sizeof(why));
	CHECK(rc == 0 && rep.ok == 0 && !strcmp(rep.err_code, "ENOENT") &&
		      !strcmp(rep.err_msg, "no pod for job 7"),
	      "reply: error reply (%s)", why);

	rc = parse("{\"ok\":true,\"released\":false,\"v\":1}\r\n", &rep, why,
		   sizeof(why));
	CHECK(rc == 0 && rep.released == 0 && rep.pod_netns[0] == '\0',
	      "reply: released, any member order, CRLF (%s)", why);

	rc = parse(" \t{\"v\":1,\"ok\":true,\"extra\":{\"a\":[1,2.5e-3,-0,true,"
		   "false,null,{\"b\":\"\\u00e9\\ud83d\\ude00\"}]},"
		   "\"pod\":{\"netns\":\"\\/run\\/netns\\/pn-l2001\"}} ",
		   &rep, why, sizeof(why));
	CHECK(rc == 0 && !strcmp(rep.pod_netns, "/run/netns/pn-l2001"),
	      "reply: unknown members skipped, escapes decoded (%s)", why);

	rc = parse("{\"v\":1,\"ok\":true,\"pod\":{\"user\":\"caf\\u00e9\"}}", &rep,
		   why, sizeof(why));
	CHECK(rc == 0 && !strcmp(rep.pod_user, "caf\xc3\xa9"),
	      "reply: \\u escape to UTF-8");

	rc = parse("{\"v\":1,\"ok\":false,\"error\":{\"code\":\"EPERM\"}}", &rep,
		   why, sizeof(why));
	CHECK(rc == 0 && !strcmp(rep.err_msg, "EPERM"),
	      "reply: error without message uses the code");

	/* found by fuzz_reply: the empty key "" left the key buffer as the
	 * previous member's key ("ok" here), so "":1 was read as "ok":1 */
	rc = parse("{\"v\":1,\"ok\":true}", &rep, why, sizeof(why));
	rc = parse("{\"\":1,\"v\":1,\"ok\":true,\"\":\"x\"}", &rep, why,
		   sizeof(why));
	CHECK(rc == 0 && rep.ok == 1,
	      "reply: empty key is an unknown member (%s)", why);
	rc = parse("{\"v\":1,\"ok\":true,\"pod\":{\"\":7,\"uid\":5,\"\":8}}", &rep,
		   why, sizeof(why));
	CHECK(rc == 0 && rep.pod_uid == 5,
	      "reply: empty keys next to a known one (%s)", why);
}

static void test_reply_bad(void)
{
	static const struct {
		const char *text;
		const char *what;
	} bad[] = {
		{ "", "empty" },
		{ "   \n", "only whitespace" },
		{ "[1,2]", "top level array" },
		{ "\"str\"", "top level string" },
		{ "{\"v\":1,\"ok\":true", "truncated object" },
		{ "{\"v\":1,\"ok\":true}x", "trailing garbage" },
		{ "{\"v\":1,\"ok\":true}{}", "two objects" },
		{ "{\"v\":1,\"ok\":true,}", "trailing comma" },
		{ "{\"v\":1 \"ok\":true}", "missing comma" },
		{ "{v:1,\"ok\":true}", "unquoted key" },
		{ "{'v':1,'ok':true}", "single quotes" },
		{ "{\"ok\":true}", "no version" },
		{ "{\"v\":2,\"ok\":true}", "version 2" },
		{ "{\"v\":\"1\",\"ok\":true}", "version as string" },
		{ "{\"v\":1.0,\"ok\":true}", "version as float" },
		{ "{\"v\":1}", "no ok" },
		{ "{\"v\":1,\"ok\":1}", "ok not boolean" },
		{ "{\"v\":1,\"ok\":\"true\"}", "ok as string" },
		{ "{\"v\":1,\"ok\":tru}", "bad literal" },
		{ "{\"v\":1,\"ok\":false}", "error reply without error" },
		{ "{\"v\":1,\"ok\":false,\"error\":\"x\"}", "error not object" },
		{ "{\"v\":1,\"ok\":false,\"error\":{\"message\":\"m\"}}", "error without code" },
		{ "{\"v\":1,\"ok\":false,\"error\":{\"code\":5}}", "code not string" },
		{ "{\"v\":1,\"ok\":true,\"pod\":[]}", "pod not object" },
		{ "{\"v\":1,\"ok\":true,\"pod\":{\"netns\":7}}", "netns not string" },
		{ "{\"v\":1,\"ok\":true,\"pod\":{\"uid\":\"1\"}}", "uid not integer" },
		{ "{\"v\":1,\"ok\":true,\"pod\":{\"uid\":1e3}}", "uid float" },
		{ "{\"v\":1,\"ok\":true,\"pod\":{\"uid\":99999999999999999999}}", "uid overflow" },
		{ "{\"v\":1,\"ok\":true,\"ok\":false}", "duplicate ok" },
		{ "{\"v\":1,\"v\":1,\"ok\":true}", "duplicate v" },
		{ "{\"v\":1,\"ok\":true,\"pod\":{\"netns\":\"/a\",\"netns\":\"/b\"}}", "duplicate netns" },
		{ "{\"v\":1,\"ok\":true,\"x\":\"a\\qb\"}", "invalid escape" },
		{ "{\"v\":1,\"ok\":true,\"x\":\"\\u12\"}", "short \\u" },
		{ "{\"v\":1,\"ok\":true,\"x\":\"\\ud800\"}", "lone high surrogate" },
		{ "{\"v\":1,\"ok\":true,\"x\":\"\\udc00\"}", "lone low surrogate" },
		{ "{\"v\":1,\"ok\":true,\"x\":\"\\ud800\\u0041\"}", "bad surrogate pair" },
		{ "{\"v\":1,\"ok\":true,\"pod\":{\"netns\":\"/run/netns/a\\u0000b\"}}", "NUL in extracted string" },
		{ "{\"v\":1,\"ok\":true,\"x\":\"tab\there\"}", "raw control char" },
		{ "{\"v\":1,\"ok\":true,\"x\":\"\xff\"}", "invalid UTF-8" },
		{ "{\"v\":1,\"ok\":true,\"x\":\"\xc0\x80\"}", "overlong UTF-8" },
		{ "{\"v\":1,\"ok\":true,\"x\":01}", "leading zero" },
		{ "{\"v\":1,\"ok\":true,\"x\":-}", "bare minus" },
		{ "{\"v\":1,\"ok\":true,\"x\":1.}", "bad fraction" },
		{ "{\"v\":1,\"ok\":true,\"x\":1e}", "bad exponent" },
		{ "{\"v\":1,\"ok\":true,\"x\":+1}", "plus sign" },
		{ "{\"v\":1,\"ok\":true,\"x\":NaN}", "NaN" },
		{ "{\"v\":1,\"ok\":true,\"x\":\"unterminated}", "unterminated string" },
		{ "{\"v\":1,\"ok\":true,\"x\":[1,2}", "unbalanced array" },
	};
	pn_reply_t rep;
	char why[256];
	size_t i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = parse(bad[i].text, &rep, why, sizeof(why));
		CHECK(rc == -1 && why[0], "malformed reply refused: %s (%s)",
		      bad[i].what, why);
	}

	/* extracted string longer than its field */
	{
		static char longns[600];
		int n = sprintf(longns, "{\"v\":1,\"ok\":true,\"pod\":"
					"{\"netns\":\"/run/netns/");
		memset(longns + n, 'x', 300);
		strcpy(longns + n + 300, "\"}}");
		CHECK(parse(longns, &rep, why, sizeof(why)) == -1 &&
			      strstr(why, "too long"),
		      "malformed reply refused: netns longer than its field (%s)",
		      why);
	}

	/* embedded NUL byte in the raw line */
	CHECK(pn_parse_reply("{\"v\":1,\0\"ok\":true}", 19, &rep, why,
			     sizeof(why)) == -1,
	      "malformed reply refused: raw NUL byte (%s)", why);

	/* nesting bomb */
	{
		static char deep[4096];
		size_t k, n = 0;

		n += (size_t) sprintf(deep, "{\"v\":1,\"ok\":true,\"x\":");
		for (k = 0; k < 1000; k++)
			deep[n++] = '[';
		for (k = 0; k < 1000; k++)
			deep[n++] = ']';
		deep[n++] = '}';
		deep[n] = '\0';
		CHECK(parse(deep, &rep, why, sizeof(why)) == -1 &&
			      strstr(why, "deep"),
		      "malformed reply refused: 1000 nested arrays (%s)", why);
	}

	/* long error message is shortened, not refused */
	{
		static char longmsg[3000];
		int n = sprintf(longmsg, "{\"v\":1,\"ok\":false,\"error\":"
					 "{\"code\":\"EINTERNAL\",\"message\":\"");
		memset(longmsg + n, 'm', 2000);
		strcpy(longmsg + n + 2000, "\"}}");
		CHECK(parse(longmsg, &rep, why, sizeof(why)) == 0 &&
			      strlen(rep.err_msg) == sizeof(rep.err_msg) - 1 &&
			      !strcmp(rep.err_msg + strlen(rep.err_msg) - 3, "..."),
		      "long error message shortened with ... (%s)", why);
	}

	/* oversize line */
	{
		static char huge[PN_MAX_LINE + 10];
		memset(huge, ' ', sizeof(huge));
		CHECK(pn_parse_reply(huge, sizeof(huge), &rep, why,
				     sizeof(why)) == -1,
		      "reply over 64 KiB refused (%s)", why);
	}
	CHECK(pn_parse_reply(NULL, 0, &rep, why, sizeof(why)) == -1,
	      "NULL reply refused");
}

int main(void)
{
	ctest_begin();
	test_escape();
	test_request();
	test_reply_ok();
	test_reply_bad();
	return ctest_end();
}
