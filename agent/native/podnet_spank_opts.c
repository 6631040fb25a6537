/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_opts.c - the plugin's configuration and options, in every
 * context: srun, sbatch and salloc (local and allocator contexts) do nothing
 * else than check them; slurmd, slurmstepd and the job prolog read them.
 *
 * plugstack.conf arguments:
 *   socket=PATH       podnetd socket (default /run/podnet/podnetd.sock)
 *   timeout=SECONDS   bound for getting a pod (default 30, 1..3600)
 *   allow_opt_out=0|1 accept --podnet=no (default 0)
 *   policy=fail|warn  a step that cannot join its pod fails (default) or runs
 *                     on the host network with a warning
 *   image=PATH|none   the site's image for every step without --podnet-image
 *                     (default none)
 *   apptainer=PATH    Apptainer (default /usr/bin/apptainer)
 *   image_exec=PATH   podnet-image-exec (default
 *                     /usr/local/lib/podnet/podnet-image-exec)
 * Options: --podnet=yes|no (no only with allow_opt_out=1),
 * --podnet-image=IMAGE|none; in srun, sbatch and salloc also from the
 * environment, PODNET=yes|no and PODNET_IMAGE=IMAGE|none, through Slurm's own
 * environment form of a SPANK option (podnet_spank_env.h): the same callbacks
 * check them, and the command line wins.
 */
#include <stdio.h>
#include <string.h>

#include "podnet_spank_opts.h"
#include "podnet_util.h"

/* an absolute path of at most PATH_MAX - 1 bytes, or "none" */
static int image_arg_ok(const char *v)
{
	return v && (!strcmp(v, "none") ||
		     (v[0] == '/' && strlen(v) < PATH_MAX));
}

int pns_parse_args(struct pns_cfg *cfg, int ac, char **av)
{
	int i;

	for (i = 0; i < ac; i++) {
		const char *a = av[i];
		unsigned long long v;

		if (!strncmp(a, "socket=", 7)) {
			const char *p = a + 7;
			if (p[0] != '/' || strlen(p) >= sizeof(cfg->socket)) {
				slurm_error("podnet: plugstack argument '%s': "
					    "need an absolute path shorter "
					    "than %zu bytes", a,
					    sizeof(cfg->socket));
				return -1;
			}
			snprintf(cfg->socket, sizeof(cfg->socket), "%s", p);
		} else if (!strncmp(a, "timeout=", 8)) {
			if (pn_parse_uint(a + 8, 1, 3600, &v) < 0) {
				slurm_error("podnet: plugstack argument '%s': "
					    "need seconds in 1..3600", a);
				return -1;
			}
			cfg->timeout_s = (int) v;
		} else if (!strncmp(a, "allow_opt_out=", 14)) {
			if (pn_parse_uint(a + 14, 0, 1, &v) < 0) {
				slurm_error("podnet: plugstack argument '%s': "
					    "need 0 or 1", a);
				return -1;
			}
			cfg->allow_opt_out = (int) v;
		} else if (!strncmp(a, "image=", 6)) {
			if (!image_arg_ok(a + 6)) {
				slurm_error("podnet: plugstack argument '%s': "
					    "need an absolute path or none", a);
				return -1;
			}
			snprintf(cfg->image, sizeof(cfg->image), "%s",
				 strcmp(a + 6, "none") ? a + 6 : "");
		} else if (!strncmp(a, "apptainer=", 10) ||
			   !strncmp(a, "image_exec=", 11)) {
			int app = a[0] == 'a';
			const char *p = strchr(a, '=') + 1;

			if (p[0] != '/' || strlen(p) >= PATH_MAX) {
				slurm_error("podnet: plugstack argument '%s': "
					    "need an absolute path", a);
				return -1;
			}
			snprintf(app ? cfg->apptainer : cfg->image_exec,
				 PATH_MAX, "%s", p);
		} else if (!strcmp(a, "policy=fail")) {
			cfg->policy = PNS_POLICY_FAIL;
		} else if (!strcmp(a, "policy=warn")) {
			cfg->policy = PNS_POLICY_WARN;
		} else {
			slurm_error("podnet: unknown plugstack argument '%s' "
				    "(known: socket= timeout= allow_opt_out= "
				    "policy=fail|warn image= apptainer= "
				    "image_exec=)", a);
			return -1;
		}
	}
	return 0;
}

int pns_init(struct pn_spank *st, spank_t sp, int ac, char **av,
	     struct spank_option *opts)
{
	spank_context_t ctx = spank_context();

	if (pns_parse_args(&st->cfg, ac, av) < 0)
		return -1;
	/* before srun, sbatch or salloc read their environment and arguments:
	 * the user's process, the user's environment (never slurmd's or
	 * slurmstepd's: there the job's options come from Slurm) */
	if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR)
		st->env_forms_set = pns_env_forms_apply("podnet");
	if (spank_option_register(sp, &opts[PNS_OPT_PODNET]) != ESPANK_SUCCESS ||
	    spank_option_register(sp, &opts[PNS_OPT_IMAGE]) != ESPANK_SUCCESS) {
		slurm_error("podnet: cannot register --podnet/--podnet-image");
		return -1;
	}
	return 0;
}

void pns_local_post_opt(struct pn_spank *st)
{
	pns_env_forms_clear("podnet", st->env_forms_set);
	st->env_forms_set = 0;
}

int pns_opt_podnet(struct pn_spank *st, const char *optarg)
{
	if (!optarg || !strcmp(optarg, "yes")) {
		st->opt_out = 0;
		return 0;
	}
	if (strcmp(optarg, "no") != 0) {
		slurm_error("podnet: --podnet=%s (or PODNET=%s): use yes or "
			    "no", optarg, optarg);
		return -1;
	}
	if (!st->cfg.allow_opt_out) {
		slurm_error("podnet: --podnet=no is not allowed on this "
			    "cluster: every job runs in its network pod");
		return -1;
	}
	st->opt_out = 1;
	return 0;
}

int pns_opt_image(struct pn_spank *st, const char *optarg)
{
	if (!image_arg_ok(optarg)) {
		slurm_error("podnet: --podnet-image=%s (or PODNET_IMAGE): give "
			    "the absolute path of a SIF file or of an image "
			    "directory on the compute nodes, or none",
			    optarg ? optarg : "");
		return -1;
	}
	snprintf(st->user_image, sizeof(st->user_image), "%s", optarg);
	return 0;
}
