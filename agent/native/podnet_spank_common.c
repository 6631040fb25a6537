/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_common.c - what more than one context of the plugin uses
 * (podnet_spank_common.h): the requests to podnetd (docs/api.md): job_up,
 * job_get, job_pidns, job_down, each retried while podnetd says "try again"
 * (EUNAVAIL) or is briefly unreachable, until a deadline; the step's pending
 * error; the --podnet=no marker; slurmstepd's cgroup podnet-stepd.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "podnet_spank_common.h"

long long pns_mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

long long pns_deadline(const struct pns_cfg *cfg)
{
	return pns_mono_ms() + cfg->timeout_s * 1000LL;
}

int pns_call_until(const struct pns_cfg *cfg, const char *req, size_t len,
		   pn_reply_t *rep, long long deadline, char *msg, size_t msgsz)
{
	int delay = 100, rc;

	for (;;) {
		int left = (int) (deadline - pns_mono_ms());

		if (left <= 0) {
			if (!msg[0])
				snprintf(msg, msgsz, "no answer from podnetd "
					 "within %d s", cfg->timeout_s);
			return PN_CALL_E_TIMEOUT;
		}
		rc = pn_call(cfg->socket, req, len, rep, left, msg, msgsz);
		if (rc == PN_CALL_OK &&
		    (rep->ok || strcmp(rep->err_code, "EUNAVAIL") != 0))
			return rc;
		if (rc == PN_CALL_E_PROTO || rc == PN_CALL_E_USAGE)
			return rc;
		if (rc == PN_CALL_OK)
			snprintf(msg, msgsz, "%s", rep->err_msg);
		if (deadline - pns_mono_ms() <= delay)
			return rc == PN_CALL_OK ? PN_CALL_E_TIMEOUT : rc;
		(void) poll(NULL, 0, delay);
		if (delay < 2000)
			delay *= 2;
	}
}

/* user name of uid, from the job record or the passwd database */
static int user_name(uid_t uid, const char *hint, char *out, size_t outsz)
{
	struct passwd pw, *res = NULL;
	char buf[4096];

	if (hint && hint[0] && strlen(hint) < outsz) {
		snprintf(out, outsz, "%s", hint);
		return 0;
	}
	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &res) != 0 || !res ||
	    strlen(pw.pw_name) >= outsz)
		return -1;
	snprintf(out, outsz, "%s", pw.pw_name);
	return 0;
}

/*
 * The job's name, node list and user come from slurmctld (slurm_load_job),
 * not from the step's environment, which the user controls and which the
 * extern step does not have. node_index is this node's position in the job
 * (S_JOB_NODEID of the extern step) or, in other steps, our position in the
 * job's node list.
 */
int pns_job_up(const struct pns_cfg *cfg, uint32_t job_id, uid_t uid,
	       int node_index, const char *node_name, long long deadline,
	       pn_reply_t *rep, char *msg, size_t msgsz)
{
	job_info_msg_t *info = NULL;
	slurm_job_info_t *job = NULL;
	char user[256], *buf = NULL;
	pn_req_t r;
	long len;
	int rc = -1, n = 0, found = -1, i;
	uint32_t k;

	rc = pns_load_job(&info, job_id);
	if (rc != 0 || !info) {
		snprintf(msg, msgsz, "cannot read job %u from slurmctld: %s",
			 job_id, slurm_strerror(errno));
		return -1;
	}
	rc = -1;
	for (k = 0; k < info->record_count; k++)
		if (info->job_array[k].job_id == job_id)
			job = &info->job_array[k];
	if (!job || !job->nodes) {
		snprintf(msg, msgsz, "slurmctld has no node list for job %u",
			 job_id);
		goto out;
	}
	if (user_name(uid, job->user_name, user, sizeof(user)) < 0) {
		snprintf(msg, msgsz, "no user name for uid %u", (unsigned) uid);
		goto out;
	}
	buf = malloc(PN_MAX_LINE + 1);
	if (!buf) {
		snprintf(msg, msgsz, "out of memory");
		goto out;
	}
	pn_req_begin(&r, buf, PN_MAX_LINE + 1, "job_up");
	pn_req_int(&r, "job_id", job_id);
	pn_req_str(&r, "user", user);
	pn_req_int(&r, "uid", (long long) uid);
	pn_req_str(&r, "job_name", job->name ? job->name : "");
	pn_req_list_begin(&r, "nodes");
	{
		pns_hostlist_t hl = slurm_hostlist_create(job->nodes);
		char *h;

		if (!hl) {
			snprintf(msg, msgsz, "cannot parse node list '%s'",
				 job->nodes);
			goto out;
		}
		while ((h = slurm_hostlist_shift(hl))) {
			if (node_name && found < 0 && !strcmp(h, node_name))
				found = n;
			pn_req_list_str(&r, h);
			n++;
			free(h);
		}
		slurm_hostlist_destroy(hl);
	}
	pn_req_list_end(&r);
	if (node_index < 0)
		node_index = found;
	if (node_index < 0 || node_index >= n) {
		snprintf(msg, msgsz, "this node (%s) is not in job %u's node "
			 "list %s", node_name ? node_name : "?", job_id,
			 job->nodes);
		goto out;
	}
	pn_req_int(&r, "node_index", node_index);
	len = pn_req_end(&r);
	if (len < 0) {
		snprintf(msg, msgsz, "job_up request does not fit in %d bytes "
			 "(node list too long?)", PN_MAX_LINE);
		goto out;
	}
	i = pns_call_until(cfg, buf, (size_t) len, rep, deadline, msg, msgsz);
	if (i != PN_CALL_OK)
		goto out;
	if (!rep->ok) {
		snprintf(msg, msgsz, "%s (%s)", rep->err_msg, rep->err_code);
		goto out;
	}
	rc = 0;
out:
	free(buf);
	slurm_free_job_info_msg(info);
	return rc;
}

/* a request with job_id only */
static int job_call(const struct pns_cfg *cfg, const char *op, uint32_t job_id,
		    long long deadline, pn_reply_t *rep, char *msg,
		    size_t msgsz)
{
	char buf[256];
	pn_req_t r;
	long len;

	pn_req_begin(&r, buf, sizeof(buf), op);
	pn_req_int(&r, "job_id", job_id);
	len = pn_req_end(&r);
	if (len < 0) {
		snprintf(msg, msgsz, "internal error building %s", op);
		return PN_CALL_E_USAGE;
	}
	return pns_call_until(cfg, buf, (size_t) len, rep, deadline, msg,
			      msgsz);
}

int pns_job_get(const struct pns_cfg *cfg, uint32_t job_id, long long deadline,
		pn_reply_t *rep, char *msg, size_t msgsz)
{
	return job_call(cfg, "job_get", job_id, deadline, rep, msg, msgsz);
}

int pns_job_pidns(const struct pns_cfg *cfg, uint32_t job_id, pid_t pid,
		  pn_reply_t *rep, char *msg, size_t msgsz)
{
	char buf[256];
	pn_req_t r;
	long len;

	pn_req_begin(&r, buf, sizeof(buf), "job_pidns");
	pn_req_int(&r, "job_id", job_id);
	pn_req_int(&r, "pid", pid);
	len = pn_req_end(&r);
	if (len < 0) {
		snprintf(msg, msgsz, "internal error building job_pidns");
		return PN_CALL_E_USAGE;
	}
	return pns_call_until(cfg, buf, (size_t) len, rep, pns_deadline(cfg),
			      msg, msgsz);
}

void pns_job_down(const struct pns_cfg *cfg, uint32_t job_id)
{
	pn_reply_t rep;
	char msg[600] = "";
	int rc;

	rc = job_call(cfg, "job_down", job_id, pns_deadline(cfg), &rep, msg,
		      sizeof(msg));
	if (rc == PN_CALL_OK && (rep.ok || !strcmp(rep.err_code, "ENOENT")))
		return;
	if (rc == PN_CALL_OK)
		slurm_error("podnet: job_down %u: %s (%s)", job_id,
			    rep.err_msg, rep.err_code);
	else
		slurm_error("podnet: job_down %u: %s", job_id, msg);
}

/* ---- the step's pending error, the pod's PID namespace ---- */
void pns_set_pending(struct pn_spank *st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(st->pending_error, sizeof(st->pending_error), fmt, ap);
	va_end(ap);
}

int pns_in_pod_pidns(const struct pn_spank *st)
{
	struct stat s;

	return stat("/proc/self/ns/pid", &s) == 0 && s.st_ino == st->pidns_ino;
}

/* ---- the --podnet=no marker: the job prolog (slurmd) leaves it, the extern
 * step reads it ---- */
#define MARK_DIR "/run/podnet-spank"

static void mark_path(uint32_t job_id, char *p, size_t sz)
{
	snprintf(p, sz, MARK_DIR "/optout.%u", job_id);
}

void pns_optout_mark(uint32_t job_id)
{
	char p[64];
	struct stat s;
	int fd;

	if (mkdir(MARK_DIR, 0700) < 0 && errno != EEXIST)
		return;
	if (lstat(MARK_DIR, &s) < 0 || !S_ISDIR(s.st_mode) ||
	    s.st_uid != 0 || (s.st_mode & 077))
		return;
	mark_path(job_id, p, sizeof(p));
	fd = open(p, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd >= 0)
		close(fd);
}

int pns_optout_marked(const struct pns_cfg *cfg, uint32_t job_id)
{
	char p[64];
	struct stat s;

	if (!cfg->allow_opt_out)
		return 0;
	if (lstat(MARK_DIR, &s) < 0 || !S_ISDIR(s.st_mode) ||
	    s.st_uid != 0 || (s.st_mode & 077))
		return 0;
	mark_path(job_id, p, sizeof(p));
	return lstat(p, &s) == 0 && S_ISREG(s.st_mode) && s.st_uid == 0;
}

void pns_optout_clear(uint32_t job_id)
{
	char p[64];

	mark_path(job_id, p, sizeof(p));
	(void) unlink(p);
}

/* ---- slurmstepd's cgroup podnet-stepd: the step enters it, the task
 * callbacks leave it and check it ---- */
/*
 * A step whose slurmstepd stays on the node's host network (--podnet=no, or a
 * pod it could not join): Slurm opens the step's connections to srun (IO, the
 * --pty terminal) with the user's effective uid, and srun in a login or job
 * pod is behind podnetd's host-side filter, which drops every user socket to
 * the pod network ("Slurmd could not connect IO"). The filter accepts sockets
 * created in the cgroup PN_STEPD_CGROUP (podnet_spank_common.h), which podnetd
 * creates and only root can join: slurmstepd is in it from init_post_opt
 * (before Slurm opens those connections) to user_init (before it forks the
 * tasks). The tasks are born in slurmstepd's own cgroup and stay filtered
 * (task_init_privileged checks).
 */
static const char *const cg_mounts[] = { "/sys/fs/cgroup",
					 "/sys/fs/cgroup/unified" };

/* the caller's cgroup v2 path ("0::/path" in /proc/self/cgroup) */
static int own_cgroup(char *out, size_t sz)
{
	char line[PATH_MAX + 8];
	FILE *f = fopen("/proc/self/cgroup", "re");
	int rc = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		size_t l = strlen(line);

		if (strncmp(line, "0::", 3) != 0)
			continue;
		while (l && line[l - 1] == '\n')
			line[--l] = '\0';
		if (strlen(line + 3) < sz) {
			snprintf(out, sz, "%s", line + 3);
			rc = 0;
		}
		break;
	}
	fclose(f);
	return rc;
}

static int cg_write_pid(const char *dir, pid_t pid, char *why, size_t whysz)
{
	char path[PATH_MAX + 32];
	int fd, rc = 0;

	if (snprintf(path, sizeof(path), "%s/cgroup.procs", dir) >=
	    (int) sizeof(path)) {
		snprintf(why, whysz, "%s: path too long", dir);
		return -1;
	}
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || dprintf(fd, "%d\n", (int) pid) < 0) {
		snprintf(why, whysz, "%s: %s", path, strerror(errno));
		rc = -1;
	}
	if (fd >= 0 && close(fd) < 0 && !rc) {
		snprintf(why, whysz, "%s: %s", path, strerror(errno));
		rc = -1;
	}
	return rc;
}

/* slurmstepd (root) into PN_STEPD_CGROUP; without it (podnetd made none: no
 * cgroup v2) the step runs as before, and srun in a pod gets no IO */
void pns_stepd_cgroup_enter(struct pn_spank *st, uint32_t job_id,
			    uint32_t step_id)
{
	char dir[PATH_MAX], why[PATH_MAX + 64];
	size_t i;

	if (own_cgroup(st->cg_home, sizeof(st->cg_home)) < 0)
		return;
	for (i = 0; i < sizeof(cg_mounts) / sizeof(cg_mounts[0]); i++) {
		struct stat s;

		snprintf(dir, sizeof(dir), "%s/" PN_STEPD_CGROUP, cg_mounts[i]);
		if (stat(dir, &s) == 0 && S_ISDIR(s.st_mode)) {
			st->cg_mnt = cg_mounts[i];
			break;
		}
	}
	if (!st->cg_mnt) {
		slurm_info("podnet: job %u step %u: no cgroup " PN_STEPD_CGROUP
			   " (podnetd: no cgroup v2): srun in a pod cannot "
			   "reach this step", job_id, step_id);
		return;
	}
	st->cg_pid = getpid();
	if (cg_write_pid(dir, st->cg_pid, why, sizeof(why)) < 0) {
		slurm_error("podnet: job %u step %u: %s", job_id, step_id, why);
		return;
	}
	st->cg_moved = 1;
}

int pns_stepd_cgroup_leave(struct pn_spank *st)
{
	char dir[2 * PATH_MAX], why[2 * PATH_MAX + 64];
	uid_t euid = geteuid();
	int rc;

	if (!st->cg_moved)
		return 0;
	snprintf(dir, sizeof(dir), "%s%s", st->cg_mnt, st->cg_home);
	if (euid != 0 && seteuid(0) < 0) {
		slurm_error("podnet: seteuid(0): %s", strerror(errno));
		return -1;
	}
	rc = cg_write_pid(dir, st->cg_pid, why, sizeof(why));
	if (euid != 0 && seteuid(euid) < 0) {
		slurm_error("podnet: seteuid(%u): %s", (unsigned) euid,
			    strerror(errno));
		return -1; /* never go on as root */
	}
	if (rc < 0) {
		slurm_error("podnet: cannot return slurmstepd to its cgroup: "
			    "%s", why);
		return -1;
	}
	st->cg_moved = 0;
	return 0;
}

int pns_in_stepd_cgroup(void)
{
	char cg[PATH_MAX];
	size_t n = strlen("/" PN_STEPD_CGROUP);

	return own_cgroup(cg, sizeof(cg)) == 0 &&
	       !strncmp(cg, "/" PN_STEPD_CGROUP, n) &&
	       (cg[n] == '\0' || cg[n] == '/');
}
