/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_task.h - the task callbacks of a step's slurmstepd
 * (podnet_spank_task.c).
 */
#ifndef PODNET_SPANK_TASK_H
#define PODNET_SPANK_TASK_H

#include "podnet_spank_common.h"

int pns_task_init_privileged(struct pn_spank *st, spank_t sp);
int pns_task_init(struct pn_spank *st, spank_t sp);
int pns_user_init(struct pn_spank *st);
int pns_task_post_fork(struct pn_spank *st);

#endif /* PODNET_SPANK_TASK_H */
