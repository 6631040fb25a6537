/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_step.c - slurmstepd of a step (root), in init_post_opt (the
 * extern step's is podnet_spank_extern.c): the batch step,
 * salloc's interactive step and every srun step put slurmstepd's main thread
 * into the pod (job_get, job_up if the pod is missing, setns) BEFORE the MPI
 * plugin starts its threads and before the tasks fork, and open the pod's PID
 * namespace for the task forks (podnet_spank_task.c), and tell the tasks
 * their pod (PODNET_POD_NAME, PODNET_POD_IP, PODNET_JOB_DOMAIN). A step left
 * on the host network keeps slurmstepd in the cgroup podnet-stepd until
 * user_init.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "podnet_pod.h"
#include "podnet_spank_step.h"

/*
 * The pod's PID namespace, for user_init to fork the tasks into. setns() of a
 * PID namespace changes only where the caller's future children go, and a
 * thread created meanwhile would fail (EINVAL): the window is kept to the
 * task forks, user_init to task_post_fork (docs/agent.md, "PID namespace").
 */
static void open_pidns(struct pn_spank *st)
{
	char why[512];
	struct stat s;

	st->pidns_fd = pn_open_pidns(st->pod_name, why, sizeof(why));
	if (st->pidns_fd == -2) {
		st->pidns_fd = -1; /* podnetd gives pods no PID namespace */
		return;
	}
	if (st->pidns_fd < 0 || fstat(st->pidns_fd, &s) < 0) {
		pns_set_pending(st, "podnet: cannot open the pod's PID "
				"namespace: %s", why);
		return;
	}
	st->pidns_ino = s.st_ino;
	if (pns_in_pod_pidns(st)) {
		/* Slurm's namespace/linux started this slurmstepd in the
		 * job's PID namespace, which podnetd adopted as the pod's:
		 * the tasks are born in it, nothing to move */
		st->pid_native = 1;
		return;
	}
	st->host_pidns_fd = open("/proc/self/ns/pid", O_RDONLY | O_CLOEXEC);
	if (st->host_pidns_fd < 0) {
		pns_set_pending(st, "podnet: /proc/self/ns/pid: %s",
				strerror(errno));
		close(st->pidns_fd);
		st->pidns_fd = -1;
	}
}

/*
 * Is this slurmstepd inside the job's namespaces of Slurm's namespace/linux?
 * There /proc is the job's: PID 1 is "slurmstepd: [<job>:namespace]".
 */
static int in_slurm_job_ns(void)
{
	char buf[128] = "";
	ssize_t n;
	int fd = open("/proc/1/cmdline", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	return !strncmp(buf, "slurmstepd: [", 13) && strstr(buf, ":namespace]");
}

/* Puts the calling thread (slurmstepd's main thread) into the pod. */
static void step_join(struct pn_spank *st, spank_t sp, uint32_t job_id,
		      uint32_t step_id)
{
	char msg[600] = "", why[512], node[256] = "", fallback[64];
	const char *netns = NULL;
	long long deadline = pns_deadline(&st->cfg);
	pn_reply_t rep;
	struct stat s;
	uid_t uid;
	int rc, fd;

	if (st->opt_out) {
		slurm_info("podnet: job %u step %u: --podnet=no, host network",
			   job_id, step_id);
		return;
	}
	if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS) {
		pns_set_pending(st, "podnet: cannot get the job's uid");
		return;
	}
	rc = pns_job_get(&st->cfg, job_id, deadline, &rep, msg, sizeof(msg));
	if (rc == PN_CALL_OK && !rep.ok && !strcmp(rep.err_code, "ENOENT")) {
		/* no pod (extern step failed or opted out): build it now */
		int idx = -1;
		if (step_id == SLURM_BATCH_SCRIPT)
			idx = 0; /* the batch host is the job's first node */
		else if (spank_getenv(sp, "SLURMD_NODENAME", node,
				      sizeof(node)) != ESPANK_SUCCESS)
			(void) gethostname(node, sizeof(node) - 1);
		msg[0] = '\0';
		rc = pns_job_up(&st->cfg, job_id, uid, idx, node, deadline,
				&rep, msg, sizeof(msg));
		rc = rc == 0 ? PN_CALL_OK : -1;
	} else if (rc == PN_CALL_OK && !rep.ok) {
		snprintf(msg, sizeof(msg), "%s (%s)", rep.err_msg,
			 rep.err_code);
		rc = -1;
	}
	if (rc == PN_CALL_OK) {
		netns = rep.pod_netns;
		snprintf(st->pod_name, sizeof(st->pod_name), "%s", rep.pod_name);
		if (rep.pod_uid >= 0 && rep.pod_uid != (long long) uid) {
			pns_set_pending(st, "podnet: podnetd returned a pod of "
					"another user; refusing it");
			return;
		}
		st->pod_env_ok = pns_pod_env(&rep, &st->pod_env, why,
					     sizeof(why)) == 0;
		if (!st->pod_env_ok)
			slurm_info("podnet: job %u step %u: no PODNET_POD_* "
				   "for the tasks: %s", job_id, step_id, why);
	} else if (rc == PN_CALL_E_CONNECT) {
		/* daemon down (restarting?): the pod may still exist */
		snprintf(fallback, sizeof(fallback), PN_NETNS_DIR "pn-j%u",
			 job_id);
		fd = pn_open_netns(fallback, why, sizeof(why));
		if (fd < 0) {
			pns_set_pending(st, "podnet: cannot join the job's "
					"network pod: %s; %s", msg, why);
			return;
		}
		close(fd);
		slurm_error("podnet: %s; using %s", msg, fallback);
		netns = fallback;
		snprintf(st->pod_name, sizeof(st->pod_name), "pn-j%u", job_id);
	} else {
		pns_set_pending(st, "podnet: cannot join the job's network pod: "
				"%s", msg);
		return;
	}

	fd = pn_open_netns(netns, why, sizeof(why));
	if (fd < 0) {
		pns_set_pending(st, "podnet: cannot join the job's network pod: "
				"%s%s", why, in_slurm_job_ns() ?
				" (Slurm's namespace/linux: namespace.yaml "
				"needs shared: true)" : "");
		return;
	}
	/* the node's network, for slurmstepd's last RPCs (pns_step_exit) */
	st->host_netns_fd = open("/proc/thread-self/ns/net",
				 O_RDONLY | O_CLOEXEC);
	if (fstat(fd, &s) < 0 || setns(fd, CLONE_NEWNET) < 0) {
		int err = errno;

		snprintf(why, sizeof(why), "setns(%s): %s", netns,
			 strerror(err));
		close(fd);
		if (st->host_netns_fd >= 0)
			close(st->host_netns_fd);
		st->host_netns_fd = -1;
		pns_set_pending(st, "podnet: cannot join the job's network pod: "
				"%s%s", why, err == EPERM && in_slurm_job_ns() ?
				" (Slurm's namespace/linux: CLONE_NEWUSER is "
				"not supported)" : "");
		return;
	}
	close(fd);
	st->pod_dev = s.st_dev;
	st->pod_ino = s.st_ino;
	st->joined = 1;
	slurm_info("podnet: job %u step %u joined pod %s", job_id, step_id,
		   st->pod_name);
	open_pidns(st);
}

/*
 * slurm_spank_exit in slurmstepd of a step that joined its pod: the tasks are
 * done; the main thread goes back to the node's network before Slurm sends
 * the step's completion to slurmctld. A job cancelled while a task ignores
 * SIGTERM (Apptainer's starter at its start does) ends its extern step, and
 * with it the pod, before that task's KillWait: a slurmstepd still in the
 * removed pod's network could reach no slurmctld, retried forever, and the
 * node was drained "Kill task failed" with the job stuck completing.
 */
void pns_step_exit(struct pn_spank *st)
{
	if (!st->joined || st->host_netns_fd < 0)
		return;
	if (setns(st->host_netns_fd, CLONE_NEWNET) < 0)
		slurm_error("podnet: setns back to the node's network: %s",
			    strerror(errno));
	else
		st->joined = 0;
	close(st->host_netns_fd);
	st->host_netns_fd = -1;
}

/*
 * The tasks' and the batch script's PODNET_POD_NAME, PODNET_POD_IP and
 * PODNET_JOB_DOMAIN (podnet_spank_env.h): the joined pod's, or none at all (a
 * step on the host network, a pod podnetd did not describe): a value the
 * user's environment brought along never passes for the pod's.
 */
static void export_pod_env(struct pn_spank *st, spank_t sp)
{
	const char *const vars[] = { PNS_ENV_POD_NAME, PNS_ENV_POD_IP,
				     PNS_ENV_JOB_DOMAIN };
	const char *vals[] = { st->pod_env.name, st->pod_env.ip,
			       st->pod_env.domain };
	int i, ok = st->joined && st->pod_env_ok;

	for (i = 0; ok && i < 3; i++)
		if (spank_setenv(sp, vars[i], vals[i], 1) != ESPANK_SUCCESS) {
			slurm_error("podnet: cannot set %s for the tasks",
				    vars[i]);
			ok = 0;
		}
	if (!ok)
		for (i = 0; i < 3; i++)
			(void) spank_unsetenv(sp, vars[i]);
}

/* slurm_spank_init_post_opt in slurmstepd of a step other than the extern
 * step (the dispatch reports st->pending_error afterwards) */
void pns_step_post_opt(struct pn_spank *st, spank_t sp, uint32_t job_id,
		       uint32_t step_id)
{
	step_join(st, sp, job_id, step_id);
	export_pod_env(st, sp);
	/* on the host network, srun may be in a pod (see pns_stepd_cgroup_enter) */
	if (!st->joined && step_id != SLURM_BATCH_SCRIPT)
		pns_stepd_cgroup_enter(st, job_id, step_id);
}
