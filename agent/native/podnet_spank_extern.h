/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_extern.h - slurmstepd of the job's extern step
 * (podnet_spank_extern.c): the pod up in init_post_opt, down at exit.
 */
#ifndef PODNET_SPANK_EXTERN_H
#define PODNET_SPANK_EXTERN_H

#include "podnet_spank_common.h"

void pns_extern_up(struct pn_spank *st, spank_t sp, uint32_t job_id);
int pns_extern_exit(struct pn_spank *st, spank_t sp);

#endif /* PODNET_SPANK_EXTERN_H */
