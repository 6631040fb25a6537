/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_task.c - the task callbacks of a step's slurmstepd:
 *   user_init            (slurmstepd, before the task forks) out of the
 *                        cgroup podnet-stepd; into the pod's PID namespace,
 *                        so that the tasks are born in it
 *   task_post_fork       (slurmstepd, after them) back to its own
 *   task_init_privileged (the task, root) the task is in the pod (and not
 *                        in the cgroup podnet-stepd), or it fails with a
 *                        readable message; the pod's resolver
 *                        and /proc
 *   task_init            (the task, as the user) --podnet-image: the task's
 *                        program runs in the image
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "podnet_pod.h"
#include "podnet_spank_task.h"

/* Is the calling thread in the pod's network namespace? */
static int in_pod(const struct pn_spank *st)
{
	struct stat s;

	if (stat("/proc/thread-self/ns/net", &s) < 0)
		return 0;
	return s.st_dev == st->pod_dev && s.st_ino == st->pod_ino;
}

int pns_task_init_privileged(struct pn_spank *st, spank_t sp)
{
	int task = -1;

	if (pns_in_stepd_cgroup()) {
		/* a task there would reach pods from the host network */
		slurm_error("podnet: task in cgroup " PN_STEPD_CGROUP
			    " (slurmstepd did not leave it); not started");
		return -1;
	}
	if (st->opt_out)
		return 0;
	(void) spank_get_item(sp, S_TASK_ID, &task);
	if (st->pending_error[0]) {
		if (st->cfg.policy == PNS_POLICY_WARN) {
			if (task == 0)
				slurm_error("%s (warning: running on the host "
					    "network)", st->pending_error);
			return 0;
		}
		slurm_error("%s", st->pending_error);
		return -1;
	}
	if (st->joined && !in_pod(st)) {
		slurm_error("podnet: task is not in the network pod %s",
			    st->pod_name);
		return st->cfg.policy == PNS_POLICY_WARN ? 0 : -1;
	}
	if (st->pidns_fd >= 0 && !pns_in_pod_pidns(st)) {
		slurm_error("podnet: task is not in the PID namespace of pod %s%s",
			    st->pod_name, st->pid_native ? "" :
			    " (Slurm's namespace/linux without podnet's extern "
			    "step adopting it? see docs/agent.md)");
		return st->cfg.policy == PNS_POLICY_WARN ? 0 : -1;
	}
	if (st->joined) {
		char why[256];

		/* names resolve with the pod's search path (job, user, admin) */
		if (pn_enter_pod_resolver(st->pod_name, why, sizeof(why)) < 0) {
			if (task == 0)
				slurm_error("podnet: %s (the task keeps the "
					    "node's resolv.conf)", why);
		} else if (st->pidns_fd >= 0 &&
			   pn_mount_pod_proc(why, sizeof(why)) < 0) {
			slurm_error("podnet: %s", why);
			return st->cfg.policy == PNS_POLICY_WARN ? 0 : -1;
		}
	}
	return 0;
}

/*
 * In the task, as the user, before Slurm runs the task prologs and execs the
 * task: with an image, the task's program becomes podnet-image-exec, which
 * execs `apptainer exec IMAGE PROGRAM ARGS` (podnet_image_exec.c). Slurm
 * still runs the prologs, sets the limits and execs with the job's
 * environment: the task process (its pid, cgroup, signals, exit status)
 * becomes the container's. A missing or unreadable image fails the task
 * here, with its path and the reason in the job's output. The batch script
 * and salloc's interactive step run in the pod without the image: they call
 * srun, which needs the node's Slurm and munge; their srun steps inherit the
 * option (Slurm passes sbatch's SPANK options on to them).
 */
int pns_task_init(struct pn_spank *st, spank_t sp)
{
	const char *image = st->user_image[0] ? st->user_image : st->cfg.image;
	uint32_t step_id = 0;
	struct stat s;
	char **argv = NULL, *exe;
	int argc = 0;

	if (!image[0] || !strcmp(image, "none"))
		return 0;
	if (spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS ||
	    step_id == SLURM_BATCH_SCRIPT || step_id == SLURM_INTERACTIVE_STEP ||
	    step_id == SLURM_EXTERN_CONT)
		return 0;
	if (stat(image, &s) < 0 ||
	    access(image, S_ISDIR(s.st_mode) ? R_OK | X_OK : R_OK) < 0) {
		slurm_error("podnet: --podnet-image=%s: %s", image,
			    strerror(errno));
		return -1;
	}
	if (!S_ISDIR(s.st_mode) && !S_ISREG(s.st_mode)) {
		slurm_error("podnet: --podnet-image=%s: not a SIF file or an "
			    "image directory", image);
		return -1;
	}
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS ||
	    argc < 1 || !argv || !argv[0]) {
		slurm_error("podnet: --podnet-image: the task has no program");
		return -1;
	}
	exe = strdup(st->cfg.image_exec);
	if (!exe ||
	    spank_setenv(sp, "PODNET_IMAGE", image, 1) != ESPANK_SUCCESS ||
	    spank_setenv(sp, "PODNET_IMAGE_ARGV0", argv[0], 1) !=
		    ESPANK_SUCCESS ||
	    spank_setenv(sp, "PODNET_APPTAINER", st->cfg.apptainer, 1) !=
		    ESPANK_SUCCESS) {
		slurm_error("podnet: --podnet-image: cannot set up the task");
		free(exe);
		return -1;
	}
	argv[0] = exe; /* this task's copy of the step's argv */
	return 0;
}

/*
 * slurmstepd's main thread, as the user (euid), right before it forks the
 * tasks: out of the cgroup podnet-stepd if a step on the host network put it
 * there (podnet_spank_step.c); from here its children are born in the pod's
 * PID namespace.
 * setns() needs CAP_SYS_ADMIN: the saved uid is root, so the effective uid
 * goes back to root for the call only.
 */
int pns_user_init(struct pn_spank *st)
{
	uid_t euid = geteuid();
	int rc, err;

	if (pns_stepd_cgroup_leave(st) < 0)
		return -1;
	if (st->pidns_fd < 0 || st->pid_moved || st->pid_native)
		return 0;
	if (euid != 0 && seteuid(0) < 0) {
		pns_set_pending(st, "podnet: cannot enter the pod's PID "
				"namespace: seteuid: %s", strerror(errno));
		return 0;
	}
	rc = setns(st->pidns_fd, CLONE_NEWPID);
	err = errno;
	if (euid != 0 && seteuid(euid) < 0) {
		slurm_error("podnet: seteuid(%u): %s", (unsigned) euid,
			    strerror(errno));
		return -1; /* never go on as root */
	}
	if (rc < 0) {
		pns_set_pending(st, "podnet: cannot enter the pod's PID "
				"namespace: %s", strerror(err));
		return 0;
	}
	st->pid_moved = 1;
	return 0;
}

/* In slurmstepd (root) once every task is forked: back to its own PID
 * namespace, so the threads it starts later can be created. */
int pns_task_post_fork(struct pn_spank *st)
{
	if (!st->pid_moved)
		return 0;
	if (setns(st->host_pidns_fd, CLONE_NEWPID) < 0) {
		slurm_error("podnet: setns back to slurmstepd's PID "
			    "namespace: %s", strerror(errno));
		return -1;
	}
	st->pid_moved = 0;
	return 0;
}
