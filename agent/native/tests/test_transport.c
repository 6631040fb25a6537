/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of podnet_transport.c: pn_call against a fake podnetd (tests/
 * ctest.c) that answers, answers slowly, hangs up, floods, stays silent or
 * refuses; and its argument checks.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ctest.h"
#include "podnet_transport.h"

static void test_transport(void)
{
	const char *req = "{\"v\":1,\"op\":\"job_get\",\"job_id\":42}\n";
	char msg[512], rec[160];
	pn_reply_t rep;
	pid_t pid;
	int rc;

	snprintf(rec, sizeof(rec), "%s/req", ctest_dir);

	pid = fake_server(FAKE_REPLY, ok_pod, rec);
	rc = pn_call(ctest_sock, req, strlen(req), &rep, 2000, msg, sizeof(msg));
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
	rc = pn_call(ctest_sock, req, strlen(req), &rep, 5000, msg, sizeof(msg));
	reap(pid);
	CHECK(rc == PN_CALL_OK && rep.ok, "call: reply in 1-byte pieces (%s)",
	      msg);

	pid = fake_server(FAKE_REPLY,
			  "{\"v\":1,\"ok\":false,\"error\":{\"code\":\"EPERM\","
			  "\"message\":\"not yours\"}}\n",
			  NULL);
	rc = pn_call(ctest_sock, req, strlen(req), &rep, 2000, msg, sizeof(msg));
	reap(pid);
	CHECK(rc == PN_CALL_OK && !rep.ok && !strcmp(rep.err_code, "EPERM"),
	      "call: error reply passed through");

	pid = fake_server(FAKE_REPLY, "this is not json\n", NULL);
	rc = pn_call(ctest_sock, req, strlen(req), &rep, 2000, msg, sizeof(msg));
	reap(pid);
	CHECK(rc == PN_CALL_E_PROTO && strstr(msg, "malformed"),
	      "call: garbage reply -> PROTO (%s)", msg);

	pid = fake_server(FAKE_CLOSE, NULL, NULL);
	rc = pn_call(ctest_sock, req, strlen(req), &rep, 2000, msg, sizeof(msg));
	reap(pid);
	CHECK(rc == PN_CALL_E_IO, "call: closed without reply -> IO (%s)", msg);

	pid = fake_server(FAKE_PARTIAL, ok_pod, NULL);
	rc = pn_call(ctest_sock, req, strlen(req), &rep, 2000, msg, sizeof(msg));
	reap(pid);
	CHECK(rc == PN_CALL_E_IO, "call: half a reply then EOF -> IO (%s)", msg);

	pid = fake_server(FAKE_SILENT, NULL, NULL);
	rc = pn_call(ctest_sock, req, strlen(req), &rep, 300, msg, sizeof(msg));
	reap(pid);
	CHECK(rc == PN_CALL_E_TIMEOUT, "call: silent daemon -> TIMEOUT (%s)",
	      msg);

	pid = fake_server(FAKE_FLOOD, NULL, NULL);
	rc = pn_call(ctest_sock, req, strlen(req), &rep, 2000, msg, sizeof(msg));
	reap(pid);
	CHECK(rc == PN_CALL_E_PROTO, "call: 64 KiB without newline -> PROTO (%s)",
	      msg);

	unlink(ctest_sock);
	rc = pn_call(ctest_sock, req, strlen(req), &rep, 500, msg, sizeof(msg));
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

/* podnetd answers a connection it will not serve (too many connections) and
 * hangs up without reading: the request may meet EPIPE/ECONNRESET, and the
 * refusal is still read and returned */
static void test_refusal(void)
{
	static char big[PN_MAX_LINE];
	char msg[512];
	pn_reply_t rep;
	pid_t pid;
	int rc;

	pid = fake_server(FAKE_REFUSE,
			  "{\"v\":1,\"ok\":false,\"error\":{\"code\":\"EBUSY\","
			  "\"message\":\"too many connections\"}}\n",
			  NULL);
	usleep(20000);
	/* a request as large as allowed, so that it is still being written
	 * when podnetd hangs up */
	memset(big, ' ', sizeof(big));
	memcpy(big, "{\"v\":1,\"op\":\"job_get\",\"job_id\":42}", 34);
	big[sizeof(big) - 1] = '\n';
	rc = pn_call(ctest_sock, big, sizeof(big), &rep, 2000, msg,
		     sizeof(msg));
	reap(pid);
	CHECK(rc == PN_CALL_OK && !rep.ok && !strcmp(rep.err_code, "EBUSY"),
	      "call: refusal read after the daemon hung up (%d, %s)", rc, msg);
}

int main(void)
{
	ctest_begin();
	test_transport();
	test_refusal();
	return ctest_end();
}
