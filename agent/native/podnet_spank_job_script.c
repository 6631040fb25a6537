/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_job_script.c - the job prolog and epilog (slurmd's
 * job_script context, root), and the --podnet=no marker the prolog leaves
 * for the extern step. slurm_spank_init is not called in this context: each
 * callback reads the plugstack arguments itself. Neither ever fails: a
 * failing prolog or epilog drains the node.
 *
 * The extern step never sees user options (measured on 24.11), but the job
 * prolog does (spank_option_getopt) and runs before it on every node: the
 * prolog leaves a root-only marker that the extern step reads. slurmd runs
 * the prolog's callback only if the plugin was in its plugstack when slurmd
 * started.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "podnet_spank_job_script.h"
#include "podnet_spank_opts.h"

int pns_job_prolog(struct pn_spank *st, spank_t sp, int ac, char **av,
		   struct spank_option *podnet_opt)
{
	uint32_t job_id = 0;
	char *arg = NULL;

	if (pns_parse_args(&st->cfg, ac, av) < 0 || !st->cfg.allow_opt_out ||
	    spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS || !job_id)
		return 0;
	if (spank_option_getopt(sp, podnet_opt, &arg) == ESPANK_SUCCESS &&
	    arg && !strcmp(arg, "no"))
		pns_optout_mark(job_id);
	return 0;
}

int pns_job_epilog(struct pn_spank *st, spank_t sp, int ac, char **av)
{
	uint32_t job_id = 0;

	/* bad arguments: the defaults serve */
	(void) pns_parse_args(&st->cfg, ac, av);
	if (spank_get_item(sp, S_JOB_ID, &job_id) == ESPANK_SUCCESS && job_id) {
		pns_job_down(&st->cfg, job_id);
		pns_optout_clear(job_id);
	}
	return 0;
}
