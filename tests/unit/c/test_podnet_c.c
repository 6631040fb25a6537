/*
 * Unit tests for podnet_client.c (JSON escaper, request builder, reply
 * parser, transport) and podnet_session.c of pam_podnet.so (config parser,
 * request choice). Built and run by test_c_units.py.
 *
 * Prints "ok"/"not ok" lines and, for the Python side to check with a real
 * JSON parser, "REQ <line>" for every request the builder produced.
 * Exit status: number of failures (0 = all passed).
 */
#include "podnet_session.c"

#include <stdlib.h>

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

static int failures, checks;

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		checks++;                                                  \
		if (cond) {                                                \
			printf("ok %d - ", checks);                        \
		} else {                                                   \
			failures++;                                        \
			printf("not ok %d - (%s:%d) ", checks, __FILE__,   \
			       __LINE__);                                  \
		}                                                          \
		printf(__VA_ARGS__);                                       \
		printf("\n");                                              \
	} while (0)

static void emit_req(const char *buf, long len)
{
	if (len > 0)
		printf("REQ %.*s", (int) len, buf); /* ends with '\n' */
}

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
		      !strcmp(rep.pod_user, "alice") && rep.pod_uid == 1001,
	      "reply: api.md pod example (%s)", why);

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

/* ---------------------------------------------------------------------- */
/* fake podnetd: one connection, behaviour chosen per test                 */

enum fake_mode {
	FAKE_REPLY,        /* read a line, send reply */
	FAKE_REPLY_SLOWLY, /* send the reply in 1-byte pieces */
	FAKE_CLOSE,        /* read a line, close */
	FAKE_PARTIAL,      /* send half a reply, close */
	FAKE_SILENT,       /* read a line, never answer */
	FAKE_FLOOD,        /* send > 64 KiB without newline */
};

static char sockdir[] = "/tmp/pn-ctest-XXXXXX";
static char sockpath[108];

static pid_t fake_server(enum fake_mode mode, const char *reply,
			 const char *record)
{
	struct sockaddr_un sa;
	int lfd, ready[2];
	pid_t pid;
	char c;

	unlink(sockpath);
	lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sockpath);
	if (lfd < 0 || bind(lfd, (struct sockaddr *) &sa, sizeof(sa)) < 0 ||
	    listen(lfd, 4) < 0 || pipe(ready) < 0) {
		perror("fake server");
		exit(99);
	}
	pid = fork();
	if (pid == 0) {
		char line[PN_MAX_LINE + 1];
		size_t got = 0;
		ssize_t n;
		int fd;

		close(ready[0]);
		if (write(ready[1], "x", 1) != 1)
			_exit(98);
		fd = accept(lfd, NULL, NULL);
		if (fd < 0)
			_exit(97);
		while (got < sizeof(line) - 1 &&
		       (n = read(fd, line + got, sizeof(line) - 1 - got)) > 0) {
			got += (size_t) n;
			if (memchr(line, '\n', got))
				break;
		}
		line[got] = '\0';
		if (record) {
			FILE *f = fopen(record, "w");
			if (f) {
				fputs(line, f);
				fclose(f);
			}
		}
		switch (mode) {
		case FAKE_REPLY:
			if (write(fd, reply, strlen(reply)) < 0)
				_exit(96);
			break;
		case FAKE_REPLY_SLOWLY:
			for (n = 0; reply[n]; n++) {
				if (write(fd, reply + n, 1) < 0)
					_exit(96);
				usleep(1000);
			}
			break;
		case FAKE_PARTIAL:
			if (write(fd, reply, strlen(reply) / 2) < 0)
				_exit(96);
			break;
		case FAKE_CLOSE:
			break;
		case FAKE_SILENT:
			sleep(5);
			break;
		case FAKE_FLOOD: {
			static char blob[PN_MAX_LINE + 100];
			memset(blob, 'a', sizeof(blob));
			if (write(fd, blob, sizeof(blob)) < 0)
				_exit(0); /* client hung up: fine */
			break;
		}
		}
		close(fd);
		_exit(0);
	}
	close(ready[1]);
	close(lfd);
	if (read(ready[0], &c, 1) != 1) {
		fprintf(stderr, "fake server did not start\n");
		exit(99);
	}
	close(ready[0]);
	return pid;
}

static void reap(pid_t pid)
{
	int st;

	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
}

static const char *ok_pod =
	"{\"v\":1,\"ok\":true,\"pod\":{\"kind\":\"job\",\"name\":\"pn-j42\","
	"\"netns\":\"/run/netns/pn-j42\",\"ip\":\"198.18.0.5\",\"prefix\":15,"
	"\"user\":\"alice\",\"uid\":2001,\"job_id\":42,\"index\":0,"
	"\"names\":[]}}\n";

static void test_transport(void)
{
	const char *req = "{\"v\":1,\"op\":\"job_get\",\"job_id\":42}\n";
	char msg[512], rec[160];
	pn_reply_t rep;
	pid_t pid;
	int rc;

	snprintf(rec, sizeof(rec), "%s/req", sockdir);

	pid = fake_server(FAKE_REPLY, ok_pod, rec);
	rc = pn_call(sockpath, req, strlen(req), &rep, 2000, msg, sizeof(msg));
	reap(pid);
	CHECK(rc == PN_CALL_OK && rep.ok && !strcmp(rep.pod_netns,
						    "/run/netns/pn-j42"),
	      "call: pod reply (%s)", msg);
	{
		char got[256] = "";
		FILE *f = fopen(rec, "r");
		if (f) {
			if (!fgets(got, sizeof(got), f))
				got[0] = '\0';
			fclose(f);
		}
		CHECK(!strcmp(got, req), "call: server received the request line");
	}

	pid = fake_server(FAKE_REPLY_SLOWLY, ok_pod, NULL);
	rc = pn_call(sockpath, req, strlen(req), &rep, 5000, msg, sizeof(msg));
	reap(pid);
	CHECK(rc == PN_CALL_OK && rep.ok, "call: reply in 1-byte pieces (%s)",
	      msg);

	pid = fake_server(FAKE_REPLY,
			  "{\"v\":1,\"ok\":false,\"error\":{\"code\":\"EPERM\","
			  "\"message\":\"not yours\"}}\n",
			  NULL);
	rc = pn_call(sockpath, req, strlen(req), &rep, 2000, msg, sizeof(msg));
	reap(pid);
	CHECK(rc == PN_CALL_OK && !rep.ok && !strcmp(rep.err_code, "EPERM"),
	      "call: error reply passed through");

	pid = fake_server(FAKE_REPLY, "this is not json\n", NULL);
	rc = pn_call(sockpath, req, strlen(req), &rep, 2000, msg, sizeof(msg));
	reap(pid);
	CHECK(rc == PN_CALL_E_PROTO && strstr(msg, "malformed"),
	      "call: garbage reply -> PROTO (%s)", msg);

	pid = fake_server(FAKE_CLOSE, NULL, NULL);
	rc = pn_call(sockpath, req, strlen(req), &rep, 2000, msg, sizeof(msg));
	reap(pid);
	CHECK(rc == PN_CALL_E_IO, "call: closed without reply -> IO (%s)", msg);

	pid = fake_server(FAKE_PARTIAL, ok_pod, NULL);
	rc = pn_call(sockpath, req, strlen(req), &rep, 2000, msg, sizeof(msg));
	reap(pid);
	CHECK(rc == PN_CALL_E_IO, "call: half a reply then EOF -> IO (%s)", msg);

	pid = fake_server(FAKE_SILENT, NULL, NULL);
	rc = pn_call(sockpath, req, strlen(req), &rep, 300, msg, sizeof(msg));
	reap(pid);
	CHECK(rc == PN_CALL_E_TIMEOUT, "call: silent daemon -> TIMEOUT (%s)",
	      msg);

	pid = fake_server(FAKE_FLOOD, NULL, NULL);
	rc = pn_call(sockpath, req, strlen(req), &rep, 2000, msg, sizeof(msg));
	reap(pid);
	CHECK(rc == PN_CALL_E_PROTO, "call: 64 KiB without newline -> PROTO (%s)",
	      msg);

	unlink(sockpath);
	rc = pn_call(sockpath, req, strlen(req), &rep, 500, msg, sizeof(msg));
	CHECK(rc == PN_CALL_E_CONNECT, "call: no socket -> CONNECT (%s)", msg);

	rc = pn_call("/tmp/x", req, 0, &rep, 500, msg, sizeof(msg));
	CHECK(rc == PN_CALL_E_USAGE, "call: empty request refused");
	{
		char longpath[200];
		memset(longpath, 'a', sizeof(longpath));
		longpath[0] = '/';
		longpath[sizeof(longpath) - 1] = '\0';
		rc = pn_call(longpath, req, strlen(req), &rep, 500, msg,
			     sizeof(msg));
		CHECK(rc == PN_CALL_E_USAGE, "call: socket path too long refused");
	}
}

/* ---------------------------------------------------------------------- */
static void test_netns_checks(void)
{
	char why[256];

	CHECK(pn_open_netns("/tmp/x", why, sizeof(why)) == -1,
	      "netns: outside /run/netns refused (%s)", why);
	CHECK(pn_open_netns("/run/netns/../../etc/shadow", why, sizeof(why)) == -1,
	      "netns: .. refused (%s)", why);
	CHECK(pn_open_netns("/run/netns/a/b", why, sizeof(why)) == -1,
	      "netns: subdirectory refused (%s)", why);
	CHECK(pn_open_netns("/run/netns/", why, sizeof(why)) == -1,
	      "netns: empty name refused (%s)", why);
	CHECK(pn_open_netns("/run/netns/..", why, sizeof(why)) == -1,
	      "netns: '..' name refused (%s)", why);
	CHECK(pn_open_netns("/run/netns/pn j", why, sizeof(why)) == -1,
	      "netns: space refused (%s)", why);
	CHECK(pn_open_netns("/run/netns/pn-does-not-exist-ctest", why,
			    sizeof(why)) == -1,
	      "netns: missing file refused (%s)", why);
	CHECK(pn_open_netns(NULL, why, sizeof(why)) == -1, "netns: NULL refused");
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

/* ---------------------------------------------------------------------- */
/* podnet_session.c (pam_podnet.so)                                              */

static void test_session_conf(void)
{
	struct session_conf c;
	char why[256];

	conf_defaults(&c);
	CHECK(conf_parse("# comment\n\nmode=login\n socket = /run/x.sock \n"
			 "admin_group=wheel\non_error=host\ntimeout=5", &c,
			 why, sizeof(why)) == 0 &&
		      c.mode == MODE_LOGIN && !strcmp(c.socket, "/run/x.sock") &&
		      !strcmp(c.admin_group, "wheel") &&
		      c.on_error == ON_ERROR_HOST && c.timeout_s == 5,
	      "session conf: all keys (%s)", why);
	conf_defaults(&c);
	CHECK(conf_parse("mode=compute\n", &c, why, sizeof(why)) == 0 &&
		      c.mode == MODE_COMPUTE && c.on_error == ON_ERROR_REFUSE &&
		      !strcmp(c.admin_group, "podnet-admins") &&
		      !strcmp(c.socket, "/run/podnet/podnetd.sock"),
	      "session conf: defaults");
	conf_defaults(&c);
	CHECK(conf_parse("socket=/x\n", &c, why, sizeof(why)) == -1,
	      "session conf: mode required (%s)", why);
	conf_defaults(&c);
	CHECK(conf_parse("mode=both\n", &c, why, sizeof(why)) == -1,
	      "session conf: bad mode (%s)", why);
	conf_defaults(&c);
	CHECK(conf_parse("mode=login\nsocket=relative\n", &c, why,
			 sizeof(why)) == -1,
	      "session conf: relative socket (%s)", why);
	conf_defaults(&c);
	CHECK(conf_parse("mode=login\nfoo=bar\n", &c, why, sizeof(why)) == -1,
	      "session conf: unknown key (%s)", why);
	conf_defaults(&c);
	CHECK(conf_parse("mode=login\njunk\n", &c, why, sizeof(why)) == -1,
	      "session conf: line without = (%s)", why);
	conf_defaults(&c);
	CHECK(conf_parse("mode=login\ntimeout=0\n", &c, why, sizeof(why)) == -1,
	      "session conf: timeout 0 (%s)", why);
	conf_defaults(&c);
	CHECK(conf_parse("mode=login\non_error=maybe\n", &c, why,
			 sizeof(why)) == -1,
	      "session conf: bad on_error (%s)", why);
	conf_defaults(&c);
	CHECK(conf_parse("mode=login\nsftp_server=/x\n", &c, why,
			 sizeof(why)) == -1,
	      "session conf: the helper's sftp_server is gone (%s)", why);
	conf_defaults(&c);
	CHECK(conf_parse("admin_group=wheel\nmode=login\ntimeout=1x\n", &c,
			 why, sizeof(why)) == -1 &&
		      !strcmp(c.admin_group, "wheel"),
	      "session conf: keys before a bad line stay (%s)", why);
	conf_defaults(&c);
	CHECK(conf_parse("mode=login\ntimeout=3601\n", &c, why,
			 sizeof(why)) == -1,
	      "session conf: timeout above 3600 (%s)", why);
}

static void test_session_request(void)
{
	struct session_conf c;
	char buf[256], why[256];
	long len;

	conf_defaults(&c);
	c.mode = MODE_LOGIN;
	len = build_request(&c, "77", buf, sizeof(buf), why, sizeof(why));
	CHECK(len > 0 && strstr(buf, "\"login_acquire\"") &&
		      !strstr(buf, "job_id"),
	      "session request: login ignores SLURM_JOB_ID");
	emit_req(buf, len);
	c.mode = MODE_COMPUTE;
	len = build_request(&c, NULL, buf, sizeof(buf), why, sizeof(why));
	CHECK(len > 0 && strstr(buf, "\"join\"") && strstr(buf, "\"target\":\"job\"") &&
		      !strstr(buf, "job_id"),
	      "session request: compute join without job id");
	emit_req(buf, len);
	len = build_request(&c, "77", buf, sizeof(buf), why, sizeof(why));
	CHECK(len > 0 && strstr(buf, "\"job_id\":77"),
	      "session request: compute join with SLURM_JOB_ID");
	emit_req(buf, len);
	len = build_request(&c, "77; rm -rf /", buf, sizeof(buf), why,
			    sizeof(why));
	CHECK(len == -1, "session request: bad SLURM_JOB_ID refused (%s)", why);
	len = build_request(&c, "-1", buf, sizeof(buf), why, sizeof(why));
	CHECK(len == -1, "session request: negative SLURM_JOB_ID refused");
	/* root (pam_podnet.so) asking for a user */
	len = build_request_for(&c, "77", 2001, 4242, buf, sizeof(buf), why,
				sizeof(why));
	CHECK(len > 0 &&
		      !strcmp(buf, "{\"v\":1,\"op\":\"join\",\"target\":"
				   "\"job\",\"uid\":2001,\"job_id\":77}\n"),
	      "session request: root joins for uid, no pid (%s)", buf);
	c.mode = MODE_LOGIN;
	len = build_request_for(&c, NULL, 2001, 4242, buf, sizeof(buf), why,
				sizeof(why));
	CHECK(len > 0 &&
		      !strcmp(buf, "{\"v\":1,\"op\":\"login_acquire\","
				   "\"uid\":2001,\"pid\":4242}\n"),
	      "session request: root login_acquire with uid and pid (%s)",
	      buf);
}

static void test_session_ask(void)
{
	struct session_conf c;
	char msg[512];
	pn_reply_t rep;
	enum outcome out;
	pid_t pid;

	conf_defaults(&c);
	snprintf(c.socket, sizeof(c.socket), "%s", sockpath);
	c.timeout_s = 2;
	c.mode = MODE_COMPUTE;

	pid = fake_server(FAKE_REPLY, ok_pod, NULL);
	out = ask_podnetd(&c, "42", &rep, msg, sizeof(msg));
	reap(pid);
	CHECK(out == OUT_POD && !strcmp(rep.pod_netns, "/run/netns/pn-j42"),
	      "session ask: pod");

	pid = fake_server(FAKE_REPLY,
			  "{\"v\":1,\"ok\":false,\"error\":{\"code\":\"ENOENT\","
			  "\"message\":\"no job of yours here\"}}\n", NULL);
	out = ask_podnetd(&c, NULL, &rep, msg, sizeof(msg));
	reap(pid);
	CHECK(out == OUT_REFUSE && strstr(msg, "no running job"),
	      "session ask: no job on compute node refuses (%s)", msg);

	pid = fake_server(FAKE_REPLY,
			  "{\"v\":1,\"ok\":false,\"error\":{\"code\":\"EUNAVAIL\","
			  "\"message\":\"etcd down\"}}\n", NULL);
	out = ask_podnetd(&c, NULL, &rep, msg, sizeof(msg));
	reap(pid);
	CHECK(out == OUT_ERROR && strstr(msg, "etcd down"),
	      "session ask: EUNAVAIL is an error for on_error (%s)", msg);

	pid = fake_server(FAKE_REPLY, "{\"v\":1,\"ok\":true}\n", NULL);
	out = ask_podnetd(&c, NULL, &rep, msg, sizeof(msg));
	reap(pid);
	CHECK(out == OUT_ERROR, "session ask: ok without pod is an error (%s)",
	      msg);

	unlink(sockpath);
	c.mode = MODE_LOGIN;
	out = ask_podnetd(&c, NULL, &rep, msg, sizeof(msg));
	CHECK(out == OUT_ERROR && strstr(msg, "cannot connect"),
	      "session ask: daemon down is an error (%s)", msg);
}

static void test_session_files(void)
{
	struct session_conf c;
	struct passwd *pw = getpwuid(0);
	char path[160], why[256];
	FILE *f;

	CHECK(pw && user_in_group(pw, "root"), "session: root is in group root");
	CHECK(pw && !user_in_group(pw, "pn-no-such-group-ctest"),
	      "session: unknown admin group matches nobody");

	snprintf(path, sizeof(path), "%s/session.conf", sockdir);
	f = fopen(path, "w");
	if (f) {
		fputs("mode=compute\non_error=host\n", f);
		fclose(f);
	}
	chmod(path, 0644);
	conf_defaults(&c);
	if (geteuid() == 0) {
		CHECK(conf_load(path, &c, why, sizeof(why)) == 0 &&
			      c.mode == MODE_COMPUTE && c.on_error == ON_ERROR_HOST,
		      "session conf file: root-owned 0644 accepted (%s)", why);
		chmod(path, 0666);
		CHECK(conf_load(path, &c, why, sizeof(why)) == -1,
		      "session conf file: world-writable refused (%s)", why);
	} else {
		CHECK(conf_load(path, &c, why, sizeof(why)) == -1,
		      "session conf file: not root-owned refused (%s)", why);
	}
	unlink(path);
	CHECK(conf_load(path, &c, why, sizeof(why)) == -1,
	      "session conf file: missing file refused (%s)", why);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!mkdtemp(sockdir)) {
		perror("mkdtemp");
		return 99;
	}
	snprintf(sockpath, sizeof(sockpath), "%s/podnetd.sock", sockdir);

	test_escape();
	test_request();
	test_reply_ok();
	test_reply_bad();
	test_transport();
	test_netns_checks();
	test_uint();
	test_session_conf();
	test_session_request();
	test_session_ask();
	test_session_files();

	{
		char rec[160];
		snprintf(rec, sizeof(rec), "%s/req", sockdir);
		unlink(rec);
		unlink(sockpath);
		rmdir(sockdir);
	}
	printf("# %d checks, %d failed\n", checks, failures);
	return failures > 100 ? 100 : failures;
}
