/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_podnetd.c - the plugin's requests to podnetd (docs/api.md):
 * job_up, job_get, job_pidns, job_down, each retried while podnetd says "try
 * again" (EUNAVAIL) or is briefly unreachable, until a deadline.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <poll.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "podnet_spank.h"

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
