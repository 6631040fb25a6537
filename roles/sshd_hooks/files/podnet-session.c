/*
 * podnet-session - sshd ForceCommand that runs an SSH session in a pod.
 *
 * Installed setuid root. sshd runs it as the logged-in user (real uid = the
 * user, effective uid = root). It
 *   1. execs the shell unchanged for root and members of the admin group
 *      (sshd's Match block already keeps them away; this is a second guard),
 *   2. asks podnetd for the pod, with the user's effective uid (podnetd
 *      authorizes by SO_PEERCRED): login_acquire on login nodes (podnetd
 *      holds the login pod while this PID, which exec keeps, is alive), join
 *      of the user's job on compute nodes (SLURM_JOB_ID if set),
 *   3. setns() into the pod's network namespace while still root,
 *   4. drops privileges for good (initgroups, setresgid, setresuid, checks
 *      that root cannot be regained),
 *   5. execs the user's shell: "-c $SSH_ORIGINAL_COMMAND" (scp, sftp, rsync,
 *      remote commands) or a login shell.
 * No shell-outs, no PATH lookups while privileged, no environment read while
 * privileged except SSH_ORIGINAL_COMMAND and SLURM_JOB_ID (parsed strictly).
 *
 * Configuration: /etc/podnet/session.conf (root-owned, not writable by
 * others), lines "key=value", '#' comments:
 *   mode=login|compute       which request to make (required)
 *   socket=PATH              podnetd socket (/run/podnet/podnetd.sock)
 *   admin_group=NAME         never captured (podnet-admins)
 *   on_error=refuse|host     podnetd unreachable/failing: refuse the login
 *                            (default) or run it on the host network
 *   timeout=SECONDS          bound for podnetd's answer (30)
 *   sftp_server=PATH         what "internal-sftp" maps to
 *                            (/usr/lib/openssh/sftp-server)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "podnet_client.h"

#ifndef PN_SESSION_CONF
#define PN_SESSION_CONF "/etc/podnet/session.conf"
#endif
#define PN_DEFAULT_ADMIN_GROUP "podnet-admins"
#define PN_DEFAULT_SFTP_SERVER "/usr/lib/openssh/sftp-server"
#define PN_MAX_GROUPS 1024

enum mode { MODE_UNSET, MODE_LOGIN, MODE_COMPUTE };
enum on_error { ON_ERROR_REFUSE, ON_ERROR_HOST };

struct session_conf {
	enum mode mode;
	enum on_error on_error;
	char socket[108];
	char admin_group[64];
	char sftp_server[256];
	int timeout_s;
};

static void conf_defaults(struct session_conf *c)
{
	memset(c, 0, sizeof(*c));
	c->mode = MODE_UNSET;
	c->on_error = ON_ERROR_REFUSE;
	snprintf(c->socket, sizeof(c->socket), "%s", PN_DEFAULT_SOCKET);
	snprintf(c->admin_group, sizeof(c->admin_group), "%s",
		 PN_DEFAULT_ADMIN_GROUP);
	snprintf(c->sftp_server, sizeof(c->sftp_server), "%s",
		 PN_DEFAULT_SFTP_SERVER);
	c->timeout_s = 30;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void say(const char *fmt, ...)
{
	va_list ap;

	fputs("podnet: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	fflush(stderr);
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
static int conf_parse(const char *text, struct session_conf *c, char *why,
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
		} else if (!strcmp(k, "sftp_server")) {
			if (v[0] != '/' || strlen(v) >= sizeof(c->sftp_server))
				goto bad;
			snprintf(c->sftp_server, sizeof(c->sftp_server), "%s",
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
static int conf_load(const char *path, struct session_conf *c, char *why,
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
static int user_in_group(const struct passwd *pw, const char *name)
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

/* Builds the request for this node's mode. Returns its length or -1. */
static long build_request(const struct session_conf *c, const char *job_env,
			  char *buf, size_t sz, char *why, size_t whysz)
{
	pn_req_t r;
	long len;

	if (c->mode == MODE_LOGIN) {
		pn_req_begin(&r, buf, sz, "login_acquire");
	} else {
		pn_req_begin(&r, buf, sz, "join");
		pn_req_str(&r, "target", "job");
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

enum outcome {
	OUT_POD,     /* rep has the pod */
	OUT_REFUSE,  /* no pod for this user: always refuse */
	OUT_ERROR,   /* podnetd unreachable/failing: on_error decides */
};

/* Asks podnetd; fills rep and a user-readable message. */
static enum outcome ask_podnetd(const struct session_conf *c,
				const char *job_env, pn_reply_t *rep,
				char *msg, size_t msgsz)
{
	char req[256], why[256] = "";
	long len;
	int rc;

	len = build_request(c, job_env, req, sizeof(req), why, sizeof(why));
	if (len < 0) {
		snprintf(msg, msgsz, "%s", why);
		return OUT_REFUSE;
	}
	rc = pn_call(c->socket, req, (size_t) len, rep, c->timeout_s * 1000,
		     msg, msgsz);
	if (rc != PN_CALL_OK)
		return OUT_ERROR;
	if (rep->ok) {
		if (!rep->pod_netns[0]) {
			snprintf(msg, msgsz, "podnetd's reply has no pod.netns");
			return OUT_ERROR;
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
	snprintf(msg, msgsz, "podnetd: %s (%s)", rep->err_msg, rep->err_code);
	return OUT_ERROR;
}

/* Effective ids of the user (saved set-user-ID stays root), and back. */
static int as_user(const struct passwd *pw)
{
	if (setresgid((gid_t) -1, pw->pw_gid, (gid_t) -1) < 0)
		return -1;
	return setresuid((uid_t) -1, pw->pw_uid, (uid_t) -1);
}

static int as_root(void)
{
	if (setresuid((uid_t) -1, 0, (uid_t) -1) < 0)
		return -1;
	return setresgid((gid_t) -1, 0, (gid_t) -1);
}

/* Drops root for good; returns 0 or -1 (never leaves a half-dropped state
 * in use: the caller exits on -1). */
static int drop_privileges(const struct passwd *pw)
{
	uid_t r, e, s;
	gid_t rg, eg, sg;

	if (initgroups(pw->pw_name, pw->pw_gid) < 0)
		return -1;
	if (setresgid(pw->pw_gid, pw->pw_gid, pw->pw_gid) < 0)
		return -1;
	if (setresuid(pw->pw_uid, pw->pw_uid, pw->pw_uid) < 0)
		return -1;
	if (getresuid(&r, &e, &s) < 0 || r != pw->pw_uid || e != pw->pw_uid ||
	    s != pw->pw_uid)
		return -1;
	if (getresgid(&rg, &eg, &sg) < 0 || rg != pw->pw_gid ||
	    eg != pw->pw_gid || sg != pw->pw_gid)
		return -1;
	if (pw->pw_uid != 0) {
		/* regaining root must be impossible now */
		if (setuid(0) == 0 || seteuid(0) == 0)
			return -1;
		if (pw->pw_gid != 0 && (setgid(0) == 0 || setegid(0) == 0))
			return -1;
	}
	return 0;
}

/* Removes variables that only matter to privileged or dynamic-loader code;
 * glibc already strips them in setuid mode, this makes it explicit. */
static void clean_env(void)
{
	static const char *const bad_prefix[] = { "LD_", "GCONV_PATH=",
		"GETCONF_DIR=", "HOSTALIASES=", "LOCALDOMAIN=", "LOCPATH=",
		"MALLOC_", "NIS_PATH=", "NLSPATH=", "RESOLV_HOST_CONF=",
		"RES_OPTIONS=", "TZDIR=", "GLIBC_TUNABLES=", NULL };
	extern char **environ;
	size_t i, j, k;

	for (i = 0, j = 0; environ && environ[i]; i++) {
		int bad = 0;

		for (k = 0; bad_prefix[k]; k++)
			if (!strncmp(environ[i], bad_prefix[k],
				     strlen(bad_prefix[k])))
				bad = 1;
		if (!bad)
			environ[j++] = environ[i];
	}
	if (environ)
		environ[j] = NULL;
}

/*
 * Fills argv for the user's shell. cmd is SSH_ORIGINAL_COMMAND (or NULL);
 * "internal-sftp" (sshd's in-process server, which a ForceCommand cannot
 * run) becomes the external sftp server.
 */
static void shell_argv(const struct passwd *pw, const struct session_conf *c,
		       const char *cmd, char *argv0, size_t argv0sz,
		       const char **argv, const char **path)
{
	const char *shell = (pw->pw_shell && pw->pw_shell[0]) ? pw->pw_shell
							      : "/bin/sh";
	const char *base = strrchr(shell, '/');

	base = base ? base + 1 : shell;
	*path = shell;
	if (cmd && (!strcmp(cmd, "internal-sftp") ||
		    !strncmp(cmd, "internal-sftp ", 14))) {
		*path = c->sftp_server;
		snprintf(argv0, argv0sz, "%s", "sftp-server");
		argv[0] = argv0;
		argv[1] = NULL;
		return;
	}
	if (cmd) {
		snprintf(argv0, argv0sz, "%s", base);
		argv[0] = argv0;
		argv[1] = "-c";
		argv[2] = cmd;
		argv[3] = NULL;
		return;
	}
	snprintf(argv0, argv0sz, "-%s", base);
	argv[0] = argv0;
	argv[1] = NULL;
}

static void exec_shell(const struct passwd *pw, const struct session_conf *c,
		       const char *cmd)
{
	char argv0[256];
	const char *argv[4];
	const char *path;

	shell_argv(pw, c, cmd, argv0, sizeof(argv0), argv, &path);
	execv(path, (char *const *) argv);
	say("cannot run %s: %s", path, strerror(errno));
	_exit(1);
}

#ifndef PN_SESSION_NO_MAIN
int main(void)
{
	struct session_conf conf;
	struct passwd pw, *res = NULL;
	char pwbuf[16384], msg[768] = "", why[512] = "", cmdbuf[65536];
	const char *cmd = NULL, *job_env;
	uid_t uid = getuid();
	pn_reply_t rep;
	enum outcome out;
	int fd, conf_ok;

	if (getpwuid_r(uid, &pw, pwbuf, sizeof(pwbuf), &res) != 0 || !res) {
		say("unknown user id %u", (unsigned) uid);
		return 1;
	}
	/* copy what we need from the environment before anything else */
	if (getenv("SSH_ORIGINAL_COMMAND")) {
		const char *c = getenv("SSH_ORIGINAL_COMMAND");

		if (strlen(c) >= sizeof(cmdbuf)) {
			say("command longer than %zu bytes", sizeof(cmdbuf) - 1);
			return 1;
		}
		memcpy(cmdbuf, c, strlen(c) + 1);
		cmd = cmdbuf;
	}
	job_env = getenv("SLURM_JOB_ID");

	conf_defaults(&conf);
	conf_ok = conf_load(PN_SESSION_CONF, &conf, why, sizeof(why)) == 0;

	/* root and admins are never captured, even with a broken config */
	if (uid == 0 || user_in_group(&pw, conf.admin_group)) {
		if (drop_privileges(&pw) < 0) {
			say("cannot drop privileges: %s", strerror(errno));
			return 1;
		}
		clean_env();
		exec_shell(&pw, &conf, cmd);
	}
	if (geteuid() != 0) {
		say("podnet-session must be installed setuid root");
		return 1;
	}
	if (!conf_ok) {
		snprintf(msg, sizeof(msg), "configuration error: %s", why);
		out = OUT_ERROR;
		conf.on_error = ON_ERROR_REFUSE;
	} else if (as_user(&pw) < 0) {
		snprintf(msg, sizeof(msg), "cannot switch to uid %u: %s",
			 (unsigned) pw.pw_uid, strerror(errno));
		out = OUT_ERROR;
	} else {
		/* podnetd authorizes by SO_PEERCRED, which records the
		 * effective ids at connect(): talk to it as the user */
		out = ask_podnetd(&conf, job_env, &rep, msg, sizeof(msg));
		if (as_root() < 0) {
			say("cannot regain root for setns: %s", strerror(errno));
			return 1;
		}
	}

	if (out == OUT_POD) {
		fd = pn_open_netns(rep.pod_netns, why, sizeof(why));
		if (fd < 0) {
			snprintf(msg, sizeof(msg), "bad pod from podnetd: %s",
				 why);
			out = OUT_ERROR;
		} else if (rep.pod_uid >= 0 &&
			   rep.pod_uid != (long long) pw.pw_uid) {
			snprintf(msg, sizeof(msg), "podnetd returned a pod of "
				 "another user");
			close(fd);
			out = OUT_REFUSE;
		} else if (setns(fd, CLONE_NEWNET) < 0) {
			snprintf(msg, sizeof(msg), "setns(%s): %s",
				 rep.pod_netns, strerror(errno));
			close(fd);
			out = OUT_ERROR;
		} else {
			close(fd);
			/* the pod's resolver (search: user, admin domains) */
			if (pn_enter_pod_resolver(rep.pod_name, why,
						  sizeof(why)) < 0)
				say("%s (keeping the node's resolv.conf)",
				    why);
		}
	}
	if (out == OUT_REFUSE ||
	    (out == OUT_ERROR && conf.on_error == ON_ERROR_REFUSE)) {
		say("%s", msg);
		say("login refused (ask your administrator if this persists)");
		return 1;
	}
	if (out == OUT_ERROR)
		say("%s; continuing on the host network", msg);

	if (drop_privileges(&pw) < 0) {
		say("cannot drop privileges: %s", strerror(errno));
		return 1;
	}
	clean_env();
	exec_shell(&pw, &conf, cmd);
	return 1;
}
#endif
