/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_step.h - slurmstepd of the batch, interactive and srun steps
 * (podnet_spank_step.c): into the pod in init_post_opt, out at exit.
 */
#ifndef PODNET_SPANK_STEP_H
#define PODNET_SPANK_STEP_H

#include "podnet_spank_common.h"

/* init_post_opt of step step_id of job job_id (not the extern step); never
 * fails: what goes wrong is in st->pending_error */
void pns_step_post_opt(struct pn_spank *st, spank_t sp, uint32_t job_id,
		       uint32_t step_id);
void pns_step_exit(struct pn_spank *st);

#endif /* PODNET_SPANK_STEP_H */
