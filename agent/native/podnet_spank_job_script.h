/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_job_script.h - the job prolog and epilog, slurmd's job_script
 * context (podnet_spank_job_script.c).
 */
#ifndef PODNET_SPANK_JOB_SCRIPT_H
#define PODNET_SPANK_JOB_SCRIPT_H

#include "podnet_spank_common.h"

int pns_job_prolog(struct pn_spank *st, spank_t sp, int ac, char **av,
		   struct spank_option *podnet_opt);
int pns_job_epilog(struct pn_spank *st, spank_t sp, int ac, char **av);

#endif /* PODNET_SPANK_JOB_SCRIPT_H */
