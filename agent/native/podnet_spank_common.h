/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_common.h - inside the SPANK plugin podnet_spank.so: its one
 * state, struct pn_spank (the dispatch podnet_spank.c owns the only instance
 * and passes it to the other files), and the helpers more than one context
 * uses (podnet_spank_common.c). One header per context, as pyxis does; the
 * includes go down this list only, never up nor between two contexts
 * (tests/unit/c/test_spank_includes.py):
 *
 *   podnet_spank.c             the dispatch: the slurm_spank_* entry points,
 *                              per context, and the option table; includes
 *                              the contexts' headers
 * the contexts, each a .c and its header:
 *   podnet_spank_extern.[ch]   slurmstepd of the extern step: the pod up at
 *                              the job's start, down at its end
 *   podnet_spank_step.[ch]     slurmstepd of the batch, interactive and srun
 *                              steps: into the pod before any thread or task;
 *                              on the host network, in the cgroup
 *                              podnet-stepd until the tasks fork
 *   podnet_spank_task.[ch]     the task callbacks: the tasks' PID namespace,
 *                              the check that a task is in its pod, the image
 *   podnet_spank_job_script.[ch]  the job prolog and epilog (slurmd)
 * what they share:
 *   podnet_spank_opts.[ch]     the configuration (plugstack.conf arguments)
 *                              and the options, --podnet and --podnet-image:
 *                              every context's start, and all that srun,
 *                              sbatch and salloc do
 *   podnet_spank_common.[ch]   this: the state; the requests to podnetd,
 *                              retried until a deadline; the step's pending
 *                              error; the --podnet=no marker the job prolog
 *                              leaves for the extern step; slurmstepd's
 *                              cgroup podnet-stepd (the step enters it, the
 *                              task callbacks leave it)
 *   podnet_spank_env.[ch]      the environment: PODNET_POD_NAME,
 *                              PODNET_POD_IP, PODNET_JOB_DOMAIN for the
 *                              tasks; PODNET=, PODNET_IMAGE= for the options
 *   podnet_spank_slurm.h       what differs between Slurm releases
 *
 * Each slurmstepd, srun, sbatch, salloc and slurmd loads the plugin afresh:
 * the state is per process.
 */
#ifndef PODNET_SPANK_COMMON_H
#define PODNET_SPANK_COMMON_H

#include <limits.h>
#include <stdint.h>
#include <sys/types.h>

#include "podnet_json.h"
#include "podnet_spank_env.h"
#include "podnet_spank_slurm.h"
#include "podnet_transport.h"

enum pns_policy { PNS_POLICY_FAIL, PNS_POLICY_WARN };

/* plugstack.conf arguments (podnet_spank_opts.c) */
struct pns_cfg {
	char socket[108];          /* podnetd's socket */
	int timeout_s;             /* bound for getting a pod */
	int allow_opt_out;         /* accept --podnet=no */
	enum pns_policy policy;
	char image[PATH_MAX];      /* the site's image ("": none) */
	char apptainer[PATH_MAX];
	char image_exec[PATH_MAX];
};

struct pn_spank {
	struct pns_cfg cfg;
	/* the options */
	int opt_out;                 /* --podnet=no given (and allowed) */
	char user_image[PATH_MAX];   /* --podnet-image ("none": no image) */
	unsigned env_forms_set;      /* srun/sbatch/salloc: Slurm forms set from
					PODNET_* (podnet_spank_env.h) */
	/* slurmstepd: the step's pod */
	int joined;                  /* main thread is in the pod */
	int host_netns_fd;           /* its own netns, to return to at exit */
	dev_t pod_dev;               /* identity of the pod's netns */
	ino_t pod_ino;
	char pod_name[64];
	struct pns_pod_env pod_env;  /* PODNET_POD_* for the tasks */
	int pod_env_ok;              /* pod_env is the joined pod's */
	char pending_error[768];     /* reported to the user in the task */
	int pidns_fd;                /* the pod's PID namespace (none: -1) */
	int host_pidns_fd;           /* slurmstepd's own, to return to */
	ino_t pidns_ino;
	int pid_moved;               /* tasks fork into the pod's PID namespace */
	int pid_native;              /* slurmstepd is in it already (namespace/linux) */
	/* slurmstepd of a step on the host network: in the cgroup
	 * podnet-stepd from init_post_opt to user_init (podnet_spank_step.c) */
	const char *cg_mnt;          /* cgroup2 mount holding podnet-stepd */
	char cg_home[PATH_MAX];      /* slurmstepd's own cgroup (under cg_mnt) */
	pid_t cg_pid;                /* slurmstepd, to move back */
	int cg_moved;
};

#define PNS_INIT                                                             \
	{                                                                    \
		.cfg = { PN_DEFAULT_SOCKET, 30, 0, PNS_POLICY_FAIL, "",      \
			 "/usr/bin/apptainer",                               \
			 "/usr/local/lib/podnet/podnet-image-exec" },        \
		.pidns_fd = -1, .host_pidns_fd = -1, .host_netns_fd = -1,   \
	}

/* ---- the requests to podnetd ---- */
long long pns_mono_ms(void);
/* the deadline of a request started now: cfg's timeout from now */
long long pns_deadline(const struct pns_cfg *cfg);
/* one request, retried while podnetd says EUNAVAIL or is briefly
 * unreachable, until deadline; a PN_CALL_* code */
int pns_call_until(const struct pns_cfg *cfg, const char *req, size_t len,
		   pn_reply_t *rep, long long deadline, char *msg, size_t msgsz);
/* job_up for this node (job record from slurmctld); 0 with *rep filled, -1
 * with msg set. node_index: this node's position in the job, or -1 to find
 * node_name in the job's node list */
int pns_job_up(const struct pns_cfg *cfg, uint32_t job_id, uid_t uid,
	       int node_index, const char *node_name, long long deadline,
	       pn_reply_t *rep, char *msg, size_t msgsz);
/* job_get: a PN_CALL_* code */
int pns_job_get(const struct pns_cfg *cfg, uint32_t job_id, long long deadline,
		pn_reply_t *rep, char *msg, size_t msgsz);
/* job_pidns: the pod's PID namespace is the one of pid (PID 1 of the job's);
 * a PN_CALL_* code */
int pns_job_pidns(const struct pns_cfg *cfg, uint32_t job_id, pid_t pid,
		  pn_reply_t *rep, char *msg, size_t msgsz);
/* job_down (a missing pod is fine); failures logged */
void pns_job_down(const struct pns_cfg *cfg, uint32_t job_id);

/* ---- the step's pending error, the pod's PID namespace ---- */
/* st->pending_error: what the task reports (podnet_spank_task.c) */
void pns_set_pending(struct pn_spank *st, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Is the calling process in the pod's PID namespace? */
int pns_in_pod_pidns(const struct pn_spank *st);

/* ---- the --podnet=no marker (root only, /run/podnet-spank) ---- */
/* the job prolog's, for the extern step (which never sees user options) */
void pns_optout_mark(uint32_t job_id);
int pns_optout_marked(const struct pns_cfg *cfg, uint32_t job_id);
void pns_optout_clear(uint32_t job_id);

/* ---- slurmstepd's cgroup podnet-stepd ---- */
/* the cgroup whose sockets podnetd's host-side filter lets reach pods (it
 * makes it, only root can join): slurmstepd of a step on the host network */
#define PN_STEPD_CGROUP "podnet-stepd"
/* slurmstepd (root) into it, from init_post_opt; without it (podnetd made
 * none: no cgroup v2) the step runs as before */
void pns_stepd_cgroup_enter(struct pn_spank *st, uint32_t job_id,
			    uint32_t step_id);
/* slurmstepd back from the cgroup podnet-stepd to its own, before the tasks
 * fork (user_init); -1 (logged): it could not, the step must start no task */
int pns_stepd_cgroup_leave(struct pn_spank *st);
/* Is the calling process in the cgroup podnet-stepd (or below it)? */
int pns_in_stepd_cgroup(void);

#endif /* PODNET_SPANK_COMMON_H */
