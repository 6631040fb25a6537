/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_opts.h - the configuration and the options, shared by every
 * context (podnet_spank_opts.c): slurm_spank_init reads them (the job prolog
 * and epilog, where it is not called, read the arguments themselves); srun,
 * sbatch and salloc check the options and do nothing else.
 */
#ifndef PODNET_SPANK_OPTS_H
#define PODNET_SPANK_OPTS_H

#include "podnet_spank_common.h"

/* the dispatch's option table: --podnet, --podnet-image */
enum { PNS_OPT_PODNET, PNS_OPT_IMAGE, PNS_OPT_COUNT };

/* reads the plugstack.conf arguments into cfg; -1 (logged) on a bad one */
int pns_parse_args(struct pns_cfg *cfg, int ac, char **av);
/* slurm_spank_init, every context: the arguments, then the options */
int pns_init(struct pn_spank *st, spank_t sp, int ac, char **av,
	     struct spank_option *opts);
/* the options' callbacks: --podnet=yes|no, --podnet-image=IMAGE|none */
int pns_opt_podnet(struct pn_spank *st, const char *optarg);
int pns_opt_image(struct pn_spank *st, const char *optarg);
/* slurm_spank_init_post_opt in srun, sbatch, salloc: the Slurm forms of the
 * options pns_init set from PODNET_* go again (the tasks keep PODNET_*) */
void pns_local_post_opt(struct pn_spank *st);

#endif /* PODNET_SPANK_OPTS_H */
