/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_slurm.h - what the SPANK plugin uses of Slurm that differs
 * between Slurm releases, in one place: the plugin builds against the
 * libslurm-dev of the nodes' release (build-artifact.sh, one build per
 * release). Everything else of Slurm's the plugin calls is the same in every
 * release it builds for (22.05, 24.11, 26.05).
 */
#ifndef PODNET_SPANK_SLURM_H
#define PODNET_SPANK_SLURM_H

#include <stdint.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

/* the special step ids (slurm.h has them since 20.11) */
#ifndef SLURM_EXTERN_CONT
#define SLURM_EXTERN_CONT (0xfffffffc)
#endif
#ifndef SLURM_BATCH_SCRIPT
#define SLURM_BATCH_SCRIPT (0xfffffffb)
#endif
#ifndef SLURM_INTERACTIVE_STEP
#define SLURM_INTERACTIVE_STEP (0xfffffffa)
#endif

/* Slurm 22.05 ends the extern step together with the others: the pod goes in
 * the job epilog, which slurmd runs once every step has ended (the batch step
 * reports its end to slurmctld from the pod); since 24.11 the extern step's
 * exit ends it */
#define PNS_EXTERN_EXIT_ENDS_POD \
	(SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(24, 11, 0))

/* slurm_hostlist_create's handle: hostlist_t (a pointer type) up to 23.02,
 * hostlist_t * (hostlist_t the struct) since 23.11 */
typedef __typeof__(slurm_hostlist_create(NULL)) pns_hostlist_t;

/* slurmctld's record of job job_id, with details (SHOW_DETAIL): 0 or an
 * error (errno set); slurm_free_job_info_msg() frees *info */
static inline int pns_load_job(job_info_msg_t **info, uint32_t job_id)
{
#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(26, 5, 0)
	/* 26.05: slurm_load_job takes a step id (job_id set, the rest NO_VAL) */
	slurm_step_id_t sid = SLURM_STEP_ID_INITIALIZER;

	sid.job_id = job_id;
	return slurm_load_job(info, sid, SHOW_DETAIL);
#else
	return slurm_load_job(info, job_id, SHOW_DETAIL);
#endif
}

#endif /* PODNET_SPANK_SLURM_H */
