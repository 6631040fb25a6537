/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_extern.c - slurmstepd of the job's extern step (root), on
 * every node of the job before any other step: the pod up (job_up) in
 * init_post_opt, down (job_down) at exit (Slurm >= 24.11; before, the job
 * epilog takes it down). With Slurm's namespace/linux the
 * job's PID namespace becomes the pod's.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "podnet_spank_extern.h"

/*
 * Slurm's namespace/linux (>= 25.11, clone_ns_flags CLONE_NEWPID) gives the
 * job a PID namespace before the extern step's SPANK callbacks run: its PID 1,
 * "slurmstepd: [<job>:namespace]", is a child of this slurmstepd, and slurmd
 * starts every other step's slurmstepd inside it. Returns that child's PID (0:
 * none, the site does not run it).
 */
static pid_t slurm_job_pidns_init(void)
{
	char path[64], line[256], self_ns[64] = "", ns[64];
	FILE *f;
	long pid;
	ssize_t n;

	n = readlink("/proc/self/ns/pid", self_ns, sizeof(self_ns) - 1);
	if (n <= 0)
		return 0;
	self_ns[n] = '\0';
	snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int) getpid(),
		 (int) getpid());
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fscanf(f, "%ld", &pid) == 1) {
		FILE *st;
		int init = 0;

		snprintf(path, sizeof(path), "/proc/%ld/ns/pid", pid);
		n = readlink(path, ns, sizeof(ns) - 1);
		if (n <= 0)
			continue;
		ns[n] = '\0';
		if (!strcmp(ns, self_ns))
			continue;
		snprintf(path, sizeof(path), "/proc/%ld/status", pid);
		st = fopen(path, "re");
		if (!st)
			continue;
		while (fgets(line, sizeof(line), st)) {
			size_t l;

			if (strncmp(line, "NSpid:", 6) != 0)
				continue;
			l = strlen(line);
			while (l && (line[l - 1] == '\n' || line[l - 1] == ' '))
				line[--l] = '\0';
			/* the last field is its PID in its own namespace */
			init = l >= 2 && line[l - 1] == '1' &&
			       (line[l - 2] == '\t' || line[l - 2] == ' ');
			break;
		}
		fclose(st);
		if (init) {
			fclose(f);
			return (pid_t) pid;
		}
	}
	fclose(f);
	return 0;
}

/* The pod's PID namespace becomes the job's own (Slurm's): podnetd pins it. */
static void adopt_slurm_pidns(const struct pns_cfg *cfg, uint32_t job_id)
{
	char msg[600] = "";
	pn_reply_t rep;
	pid_t pid = slurm_job_pidns_init();
	int rc;

	if (pid <= 0)
		return;
	rc = pns_job_pidns(cfg, job_id, pid, &rep, msg, sizeof(msg));
	if (rc == PN_CALL_OK && rep.ok)
		slurm_info("podnet: job %u: the pod's PID namespace is the "
			   "job's (Slurm namespace/linux, PID 1 is %d)",
			   job_id, (int) pid);
	else
		slurm_error("podnet: job %u: cannot adopt Slurm's PID namespace "
			    "of the job (PID 1 is %d): %s", job_id, (int) pid,
			    rc == PN_CALL_OK ? rep.err_msg : msg);
}

void pns_extern_up(struct pn_spank *st, spank_t sp, uint32_t job_id)
{
	uint32_t nodeid = 0;
	uid_t uid;
	pn_reply_t rep;
	char msg[600] = "";
	long long t0 = pns_mono_ms();
	int rc;

	if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_NODEID, &nodeid) != ESPANK_SUCCESS) {
		slurm_error("podnet: job %u: cannot get uid/node id", job_id);
		return;
	}
	if (pns_optout_marked(&st->cfg, job_id)) {
		slurm_info("podnet: job %u opted out (--podnet=no): no pod",
			   job_id);
		return;
	}
	rc = pns_job_up(&st->cfg, job_id, uid, (int) nodeid, NULL,
			t0 + st->cfg.timeout_s * 1000LL, &rep, msg, sizeof(msg));
	if (rc == 0) {
		slurm_info("podnet: job %u: pod %s (%s) ready in %lld ms",
			   job_id, rep.pod_name, rep.pod_ip, pns_mono_ms() - t0);
		adopt_slurm_pidns(&st->cfg, job_id);
	} else {
		/*
		 * Do not fail the extern step: Slurm then requeues the job and
		 * holds it (launch_failed_requeued_held) while its batch script
		 * may already run elsewhere, and the user never sees why. The
		 * steps retry job_up and fail with this message instead.
		 */
		slurm_error("podnet: job %u: no pod on this node yet: %s "
			    "(steps will retry)", job_id, msg);
	}
}

/* slurm_spank_exit in slurmstepd: only the extern step's ends the pod (before
 * 24.11 none: the job epilog does, podnet_spank_slurm.h) */
int pns_extern_exit(struct pn_spank *st, spank_t sp)
{
	uint32_t job_id = 0, step_id = 0;

	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS)
		return 0;
	if (step_id == SLURM_EXTERN_CONT && PNS_EXTERN_EXIT_ENDS_POD) {
		pns_job_down(&st->cfg, job_id);
		pns_optout_clear(job_id);
	}
	return 0;
}
