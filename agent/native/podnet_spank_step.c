/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_step.c - slurmstepd of a step (root), in init_post_opt: the
 * extern step brings the pod up (podnet_spank_extern.c); the batch step,
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
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "podnet_pod.h"
#include "podnet_spank.h"

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
 * A step whose slurmstepd stays on the node's host network (--podnet=no, or a
 * pod it could not join): Slurm opens the step's connections to srun (IO, the
 * --pty terminal) with the user's effective uid, and srun in a login or job
 * pod is behind podnetd's host-side filter, which drops every user socket to
 * the pod network ("Slurmd could not connect IO"). The filter accepts sockets
 * created in the cgroup PN_STEPD_CGROUP (podnet_spank.h), which podnetd
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
static void stepd_cgroup_enter(struct pn_spank *st, uint32_t job_id,
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

/* slurm_spank_init_post_opt in slurmstepd */
int pns_step_post_opt(struct pn_spank *st, spank_t sp)
{
	uint32_t job_id = 0, step_id = 0;

	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS) {
		pns_set_pending(st, "podnet: cannot get the job/step id");
		return 0;
	}
	if (step_id == SLURM_EXTERN_CONT) {
		pns_extern_up(st, sp, job_id);
	} else {
		step_join(st, sp, job_id, step_id);
		export_pod_env(st, sp);
	}
	/* on the host network, srun may be in a pod (see stepd_cgroup_enter) */
	if (!st->joined && step_id != SLURM_EXTERN_CONT &&
	    step_id != SLURM_BATCH_SCRIPT)
		stepd_cgroup_enter(st, job_id, step_id);
	/* Never fail here: a failing batch step drains the node and requeues
	 * the job, and srun only prints "Plugin initialization failed".
	 * Errors are reported in task_init_privileged, where the task's
	 * stderr reaches the user. */
	if (st->pending_error[0])
		slurm_error("%s", st->pending_error);
	return 0;
}
