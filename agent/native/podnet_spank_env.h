/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_env.h - the SPANK plugin's environment, both ways:
 *   - what a task and the batch script are told of their pod:
 *     PODNET_POD_NAME (the pod's name under the job id, always unique),
 *     PODNET_POD_IP, PODNET_JOB_DOMAIN (the job's names domain, by job id),
 *     from podnetd's reply (docs/api.md, the pod object's fqdn, ip, domain);
 *   - the environment forms of the plugin's options, read by srun, sbatch and
 *     salloc: PODNET=yes|no for --podnet, PODNET_IMAGE=IMAGE|none for
 *     --podnet-image (the option's name in capitals, '-' as '_').
 * No Slurm symbol and no global state: the plugin's files call it
 * (podnet_spank_opts.c, podnet_spank_step.c), tests/test_spank_env.c tests it
 * alone.
 */
#ifndef PODNET_SPANK_ENV_H
#define PODNET_SPANK_ENV_H

#include <stddef.h>

#include "podnet_json.h"

#define PNS_ENV_POD_NAME "PODNET_POD_NAME"
#define PNS_ENV_POD_IP "PODNET_POD_IP"
#define PNS_ENV_JOB_DOMAIN "PODNET_JOB_DOMAIN"

/* what a task sees of its pod */
struct pns_pod_env {
	char name[256];   /* pod<n>.<jobid>.<user>.<cluster> */
	char ip[64];      /* dotted quad */
	char domain[256]; /* <jobid>.<user>.<cluster> */
};

/*
 * The values of a job pod from podnetd's reply (job_get, job_up): 0 with out
 * filled, or -1 with a reason in why when one is missing or not well formed
 * (a podnetd older than these fields: the task then gets none of them).
 * name and domain: characters [A-Za-z0-9._-], no empty label, at most 253
 * bytes; domain is name without its first label; ip: an IPv4 address.
 */
int pns_pod_env(const pn_reply_t *rep, struct pns_pod_env *out, char *why,
		size_t whysz);

/* an option with an environment form */
struct pns_env_form {
	const char *env;    /* PODNET_IMAGE */
	const char *option; /* podnet-image */
};

#define PNS_ENV_FORMS 2
extern const struct pns_env_form pns_env_forms[PNS_ENV_FORMS];

/*
 * Slurm's own environment form of a plugin's option, which srun, sbatch and
 * salloc read after the plugin's init and before the command line:
 * SLURM_SPANK__SLURM_SPANK_OPTION_<plugin>_<option>, every byte of plugin and
 * option that is not a letter or digit as '_'. 0, or -1 when out is too small.
 */
int pns_slurm_option_env(const char *plugin, const char *option, char *out,
			 size_t outsz);

/*
 * srun, sbatch, salloc (slurm_spank_init, their own environment): each
 * PODNET_* form that is set, whose Slurm form is not, is copied to the Slurm
 * form, so that Slurm hands it to the option's callback (checked like the
 * option: --podnet=no only where allowed) and forwards it like the option;
 * the command line (and #SBATCH lines) come later and win. Returns a bit per
 * form it set (bit i: pns_env_forms[i]), for pns_env_forms_clear.
 */
unsigned pns_env_forms_apply(const char *plugin);
/* after Slurm read them (init_post_opt): the Slurm forms this process set go,
 * so that the tasks inherit the PODNET_* forms only */
void pns_env_forms_clear(const char *plugin, unsigned set);

#endif /* PODNET_SPANK_ENV_H */
