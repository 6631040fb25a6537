/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank.c - SPANK plugin: every Slurm job gets a network pod per node.
 * This file is the dispatch: Slurm's entry points, each handed with the
 * plugin's one state (struct pn_spank, podnet_spank_common.h) to its
 * context's file, through that context's header.
 *
 *   srun, sbatch, salloc  init: --podnet=yes|no, --podnet-image,
 *                         their environment forms PODNET=,
 *                         PODNET_IMAGE=                           _opts.c
 *   extern step           init_post_opt: job_up; exit: job_down
 *                         (Slurm >= 24.11)                        _extern.c
 *   batch step, step 0..N init_post_opt: job_get (job_up if the
 *                         pod is missing), setns() before the MPI
 *                         plugin's threads and the task forks;
 *                         PODNET_POD_NAME, PODNET_POD_IP,
 *                         PODNET_JOB_DOMAIN for the tasks;
 *                         on the host network (--podnet=no, or no
 *                         pod): slurmstepd in the cgroup
 *                         podnet-stepd until user_init            _step.c
 *   the tasks             user_init: out of podnet-stepd; with
 *                         task_post_fork: the PID namespace;
 *                         task_init_privileged: in the pod (not
 *                         in podnet-stepd) or fail; task_init:
 *                         the image                               _task.c
 *   slurmd                job_prolog: the --podnet=no marker;
 *                         job_epilog: job_down (safety net; the
 *                         pod's end before Slurm 24.11)           _job_script.c
 *
 * docs/roles/spank.md says why each step is where it is (measured on Slurm
 * 24.11). Built with hidden visibility: only what this file marks (the
 * plugin's name and version, the slurm_spank_* entry points) is exported.
 */
#include "podnet_spank_extern.h"
#include "podnet_spank_job_script.h"
#include "podnet_spank_opts.h"
#include "podnet_spank_step.h"
#include "podnet_spank_task.h"

/* the plugin's one state: each process that loads the plugin has its own */
static struct pn_spank st = PNS_INIT;

static int podnet_opt_cb(int val, const char *optarg, int remote)
{
	(void) val;
	(void) remote;
	return pns_opt_podnet(&st, optarg);
}

static int image_opt_cb(int val, const char *optarg, int remote)
{
	(void) val;
	(void) remote;
	return pns_opt_image(&st, optarg);
}

/* not const: spank_option_register() takes them so (never written) */
static struct spank_option options[PNS_OPT_COUNT] = {
	[PNS_OPT_PODNET] = {
		"podnet", "yes|no",
		"Run the job in its private network pod (yes, the default) or "
		"on the host network (no; only where the site allows it).",
		1, 0, podnet_opt_cb
	},
	[PNS_OPT_IMAGE] = {
		"podnet-image", "IMAGE|none",
		"Run the tasks in a container image inside the job's pod, with "
		"Apptainer: IMAGE is the absolute path of a SIF file or of an "
		"unpacked directory on the compute nodes; none: no image, not even "
		"the site's default.",
		1, 0, image_opt_cb
	},
};

/* slurm_spank_init_post_opt in slurmstepd: the extern step's, or another
 * step's */
static int stepd_post_opt(spank_t sp)
{
	uint32_t job_id = 0, step_id = 0;

	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS) {
		pns_set_pending(&st, "podnet: cannot get the job/step id");
		return 0;
	}
	if (step_id == SLURM_EXTERN_CONT)
		pns_extern_up(&st, sp, job_id);
	else
		pns_step_post_opt(&st, sp, job_id, step_id);
	/* Never fail here: a failing batch step drains the node and requeues
	 * the job, and srun only prints "Plugin initialization failed".
	 * Errors are reported in task_init_privileged, where the task's
	 * stderr reaches the user. */
	if (st.pending_error[0])
		slurm_error("%s", st.pending_error);
	return 0;
}

#pragma GCC visibility push(default)

SPANK_PLUGIN(podnet, 1);

/* every context that calls it: srun, sbatch, salloc, slurmd, slurmstepd */
int slurm_spank_init(spank_t sp, int ac, char **av)
{
	return pns_init(&st, sp, ac, av, options);
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();

	(void) ac;
	(void) av;
	if (ctx == S_CTX_REMOTE)
		return stepd_post_opt(sp);
	if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR)
		pns_local_post_opt(&st);
	return 0;
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	return spank_context() == S_CTX_REMOTE ?
		pns_task_init_privileged(&st, sp) : 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	return spank_context() == S_CTX_REMOTE ? pns_task_init(&st, sp) : 0;
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void) sp;
	(void) ac;
	(void) av;
	return spank_context() == S_CTX_REMOTE ? pns_user_init(&st) : 0;
}

int slurm_spank_task_post_fork(spank_t sp, int ac, char **av)
{
	(void) sp;
	(void) ac;
	(void) av;
	return spank_context() == S_CTX_REMOTE ? pns_task_post_fork(&st) : 0;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void) av;
	(void) ac;
	if (spank_context() != S_CTX_REMOTE)
		return 0;
	pns_step_exit(&st);
	return pns_extern_exit(&st, sp);
}

/* the job_script context (slurmd), where slurm_spank_init is not called */
int slurm_spank_job_prolog(spank_t sp, int ac, char **av)
{
	return pns_job_prolog(&st, sp, ac, av, &options[PNS_OPT_PODNET]);
}

int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	return pns_job_epilog(&st, sp, ac, av);
}

#pragma GCC visibility pop
