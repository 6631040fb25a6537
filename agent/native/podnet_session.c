/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_session.c - see podnet_session.h. Used by pam_podnet.so; unit
 * tests: tests/test_session.c.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "podnet_session.h"
#include "podnet_util.h"

#define PN_MAX_GROUPS 1024

void conf_defaults(struct session_conf *c)
{
	memset(c, 0, sizeof(*c));
	c->mode = MODE_UNSET;
	c->on_error = ON_ERROR_REFUSE;
	snprintf(c->socket, sizeof(c->socket), "%s", PN_DEFAULT_SOCKET);
	snprintf(c->admin_group, sizeof(c->admin_group), "%s",
		 PN_DEFAULT_ADMIN_GROUP);
	c->timeout_s = 30;
}

static char *trim(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' ||
			 e[-1] == '\r'))
		*--e = '\0';
	return s;
}

/*
 * Parses the configuration text (one "key=value" per line). Returns 0, or -1
 * with a reason in why (the line number and problem).
 */
int conf_parse(const char *text, struct session_conf *c, char *why,
		      size_t whysz)
{
	char line[512];
	const char *p = text;
	int lineno = 0;

	while (*p) {
		const char *nl = strchr(p, '\n');
		size_t n = nl ? (size_t) (nl - p) : strlen(p);
		char *k, *v, *eq;
		unsigned long long u;

		lineno++;
		if (n >= sizeof(line)) {
			snprintf(why, whysz, "line %d too long", lineno);
			return -1;
		}
		memcpy(line, p, n);
		line[n] = '\0';
		p += n + (nl ? 1 : 0);
		k = trim(line);
		if (!*k || *k == '#')
			continue;
		eq = strchr(k, '=');
		if (!eq) {
			snprintf(why, whysz, "line %d: expected key=value",
				 lineno);
			return -1;
		}
		*eq = '\0';
		k = trim(k);
		v = trim(eq + 1);
		if (!strcmp(k, "mode")) {
			if (!strcmp(v, "login"))
				c->mode = MODE_LOGIN;
			else if (!strcmp(v, "compute"))
				c->mode = MODE_COMPUTE;
			else
				goto bad;
		} else if (!strcmp(k, "on_error")) {
			if (!strcmp(v, "refuse"))
				c->on_error = ON_ERROR_REFUSE;
			else if (!strcmp(v, "host"))
				c->on_error = ON_ERROR_HOST;
			else
				goto bad;
		} else if (!strcmp(k, "socket")) {
			if (v[0] != '/' || strlen(v) >= sizeof(c->socket))
				goto bad;
			snprintf(c->socket, sizeof(c->socket), "%s", v);
		} else if (!strcmp(k, "admin_group")) {
			if (!*v || strlen(v) >= sizeof(c->admin_group))
				goto bad;
			snprintf(c->admin_group, sizeof(c->admin_group), "%s",
				 v);
		} else if (!strcmp(k, "timeout")) {
			if (pn_parse_uint(v, 1, 3600, &u) < 0)
				goto bad;
			c->timeout_s = (int) u;
		} else {
			snprintf(why, whysz, "line %d: unknown key '%s'", lineno,
				 k);
			return -1;
		}
		continue;
bad:
		snprintf(why, whysz, "line %d: bad value for %s", lineno, k);
		return -1;
	}
	if (c->mode == MODE_UNSET) {
		snprintf(why, whysz, "mode= is missing");
		return -1;
	}
	return 0;
}

/* Reads the config file, which must be root's and closed to others. */
int conf_load(const char *path, struct session_conf *c, char *why,
		     size_t whysz)
{
	char text[8192];
	struct stat st;
	ssize_t n;
	size_t got = 0;
	int fd;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		snprintf(why, whysz, "%s: %s", path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 ||
	    (st.st_mode & (S_IWGRP | S_IWOTH))) {
		snprintf(why, whysz, "%s must be a regular file owned by root "
			 "and not writable by others", path);
		close(fd);
		return -1;
	}
	while ((n = read(fd, text + got, sizeof(text) - 1 - got)) > 0)
		got += (size_t) n;
	close(fd);
	if (n < 0 || got >= sizeof(text) - 1) {
		snprintf(why, whysz, "%s: unreadable or larger than %zu bytes",
			 path, sizeof(text) - 2);
		return -1;
	}
	text[got] = '\0';
	if (memchr(text, '\0', got)) {
		snprintf(why, whysz, "%s: NUL byte", path);
		return -1;
	}
	return conf_parse(text, c, why, whysz);
}

/* Is the user (primary gid + supplementary groups) in group name? */
int user_in_group(const struct passwd *pw, const char *name)
{
	struct group gr, *res = NULL;
	char buf[16384];
	gid_t groups[PN_MAX_GROUPS];
	int n = PN_MAX_GROUPS, i;

	if (getgrnam_r(name, &gr, buf, sizeof(buf), &res) != 0 || !res)
		return 0;
	if (pw->pw_gid == gr.gr_gid)
		return 1;
	if (getgrouplist(pw->pw_name, pw->pw_gid, groups, &n) < 0)
		n = PN_MAX_GROUPS; /* truncated list: check what we have */
	for (i = 0; i < n; i++)
		if (groups[i] == gr.gr_gid)
			return 1;
	return 0;
}

long build_request_for(const struct session_conf *c, const char *job_env,
		       long long uid, long long pid, char *buf, size_t sz,
		       char *why, size_t whysz)
{
	pn_req_t r;
	long len;

	if (c->mode == MODE_LOGIN) {
		pn_req_begin(&r, buf, sz, "login_acquire");
		if (uid > 0)
			pn_req_int(&r, "uid", uid);
		if (pid > 0)
			pn_req_int(&r, "pid", pid);
	} else {
		pn_req_begin(&r, buf, sz, "join");
		pn_req_str(&r, "target", "job");
		if (uid > 0)
			pn_req_int(&r, "uid", uid);
		if (job_env && *job_env) {
			unsigned long long id;

			if (pn_parse_uint(job_env, 1, 0xfffffff0ULL, &id) < 0) {
				snprintf(why, whysz, "SLURM_JOB_ID='%.32s' is "
					 "not a job id", job_env);
				return -1;
			}
			pn_req_int(&r, "job_id", (long long) id);
		}
	}
	len = pn_req_end(&r);
	if (len < 0)
		snprintf(why, whysz, "request too large");
	return len;
}

long build_request(const struct session_conf *c, const char *job_env,
		   char *buf, size_t sz, char *why, size_t whysz)
{
	return build_request_for(c, job_env, 0, 0, buf, sz, why, whysz);
}

enum outcome ask_podnetd_for(const struct session_conf *c, const char *job_env,
			     long long uid, long long pid, pn_reply_t *rep,
			     char *msg, size_t msgsz)
{
	char req[256], why[256] = "";
	long len;
	int rc;

	len = build_request_for(c, job_env, uid, pid, req, sizeof(req), why,
				sizeof(why));
	if (len < 0) {
		snprintf(msg, msgsz, "%s", why);
		return OUT_REFUSE;
	}
	rc = pn_call(c->socket, req, (size_t) len, rep, c->timeout_s * 1000,
		     msg, msgsz);
	if (rc != PN_CALL_OK)
		return OUT_ERROR;
	if (rep->ok) {
		if (!rep->pod_netns[0] || !rep->pod_name[0]) {
			snprintf(msg, msgsz, "podnetd's reply has no pod");
			return OUT_ERROR;
		}
		if (uid > 0 && rep->pod_uid != uid) {
			snprintf(msg, msgsz, "podnetd returned a pod of another "
				 "user");
			return OUT_REFUSE;
		}
		return OUT_POD;
	}
	if (!strcmp(rep->err_code, "ENOENT")) {
		if (c->mode == MODE_COMPUTE)
			snprintf(msg, msgsz, "access denied: you have no "
				 "running job on this node (%s)",
				 rep->err_msg);
		else
			snprintf(msg, msgsz, "no login pod: %s", rep->err_msg);
		return OUT_REFUSE;
	}
	if (!strcmp(rep->err_code, "EPERM") ||
	    !strcmp(rep->err_code, "EINVAL")) {
		snprintf(msg, msgsz, "access denied: %s", rep->err_msg);
		return OUT_REFUSE;
	}
	/* a quota the user filled (a login pod over agent_quota_login_pods): refused,
	 * never the host network whatever on_error says; the message names the limit */
	if (!strcmp(rep->err_code, "EQUOTA")) {
		snprintf(msg, msgsz, "no login pod: %s", rep->err_msg);
		return OUT_REFUSE;
	}
	snprintf(msg, msgsz, "podnetd: %s (%s)", rep->err_msg, rep->err_code);
	return OUT_ERROR;
}

enum outcome ask_podnetd(const struct session_conf *c, const char *job_env,
			 pn_reply_t *rep, char *msg, size_t msgsz)
{
	return ask_podnetd_for(c, job_env, 0, 0, rep, msg, msgsz);
}
