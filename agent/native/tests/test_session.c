/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of podnet_session.c (pam_podnet.so): the session.conf parser,
 * the request for this node's mode, the outcome of podnetd's answers (with a
 * fake podnetd, tests/ctest.c), the pod-owner check and the admin group.
 */
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctest.h"
#include "podnet_session.h"

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
	snprintf(c.socket, sizeof(c.socket), "%s", ctest_sock);
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

	/* a filled quota refuses (never the host network, whatever on_error
	 * says), with podnetd's words; the error's "quota" object is skipped */
	c.mode = MODE_LOGIN;
	pid = fake_server(FAKE_REPLY,
			  "{\"v\":1,\"ok\":false,\"error\":{\"code\":\"EQUOTA\","
			  "\"message\":\"over quota: login pods per user is 2, "
			  "and alice holds 2\",\"quota\":{\"limit\":\"logins\","
			  "\"value\":2,\"held\":2}}}\n", NULL);
	out = ask_podnetd(&c, NULL, &rep, msg, sizeof(msg));
	reap(pid);
	CHECK(out == OUT_REFUSE && strstr(msg, "login pods per user is 2, and "
					      "alice holds 2"),
	      "session ask: EQUOTA refuses with the limit (%s)", msg);
	c.mode = MODE_COMPUTE;

	pid = fake_server(FAKE_REPLY, "{\"v\":1,\"ok\":true}\n", NULL);
	out = ask_podnetd(&c, NULL, &rep, msg, sizeof(msg));
	reap(pid);
	CHECK(out == OUT_ERROR, "session ask: ok without pod is an error (%s)",
	      msg);

	unlink(ctest_sock);
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

	snprintf(path, sizeof(path), "%s/session.conf", ctest_dir);
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

/* ask_podnetd_for with a uid: a pod that is not that user's is refused (both
 * PAM stages rely on this one check) */
static void test_session_owner(void)
{
	struct session_conf c;
	char msg[512];
	pn_reply_t rep;
	enum outcome out;
	pid_t pid;

	conf_defaults(&c);
	snprintf(c.socket, sizeof(c.socket), "%s", ctest_sock);
	c.timeout_s = 2;
	c.mode = MODE_COMPUTE;

	pid = fake_server(FAKE_REPLY, ok_pod, NULL);
	out = ask_podnetd_for(&c, "42", 2001, 0, &rep, msg, sizeof(msg));
	reap(pid);
	CHECK(out == OUT_POD && rep.pod_uid == 2001,
	      "session owner: the user's own pod (%s)", msg);

	pid = fake_server(FAKE_REPLY, ok_pod, NULL);
	out = ask_podnetd_for(&c, "42", 2002, 0, &rep, msg, sizeof(msg));
	reap(pid);
	CHECK(out == OUT_REFUSE && strstr(msg, "another user"),
	      "session owner: another user's pod refused (%s)", msg);

	pid = fake_server(FAKE_REPLY,
			  "{\"v\":1,\"ok\":true,\"pod\":{\"name\":\"pn-j42\","
			  "\"netns\":\"/run/netns/pn-j42\"}}\n", NULL);
	out = ask_podnetd_for(&c, "42", 2001, 0, &rep, msg, sizeof(msg));
	reap(pid);
	CHECK(out == OUT_REFUSE && strstr(msg, "another user"),
	      "session owner: a pod without uid refused (%s)", msg);

	c.mode = MODE_LOGIN;
	pid = fake_server(FAKE_REPLY, ok_pod, NULL);
	out = ask_podnetd_for(&c, NULL, 3003, 4242, &rep, msg, sizeof(msg));
	reap(pid);
	CHECK(out == OUT_REFUSE, "session owner: login pod of another user "
				 "refused (%s)", msg);
}

int main(void)
{
	ctest_begin();
	test_session_conf();
	test_session_request();
	test_session_ask();
	test_session_files();
	test_session_owner();
	return ctest_end();
}
