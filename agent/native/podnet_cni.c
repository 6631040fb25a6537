/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet-cni - the podnet CNI plugin (CNI spec 1.0 and 1.1; installed as
 * `podnet` in Apptainer's CNI plugin directory, docs/hpk.md). A relay: it
 * hands the runtime's request (CNI_* variables and the network configuration
 * from stdin) to podnetd as one `cni` request over podnetd's socket and prints what
 * podnetd answers, with its exit status. podnetd parses and checks the request
 * (podnet/cni.py, the same code as the Python plugin `python -m podnet.cni`)
 * and takes the container's owner from the kernel and from this process's
 * SO_PEERCRED, never from CNI_ARGS. A small C program because a CNI runtime
 * starts the plugin once per container: an interpreter's start-up cost more
 * than podnetd's work (make bench-cni). Not setuid; runs as its caller.
 *
 * PODNET_SOCKET overrides the socket (tests, benchmarks).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "podnet_json.h"
#include "podnet_transport.h"

#define MAX_CONFIG 32768
#define TIMEOUT_MS 60000

/* CNI spec error codes */
#define E_INVALID_ENV 4
#define E_IO 5
#define E_INVALID_CONFIG 7
#define E_TRY_AGAIN 11
#define E_NOT_AVAILABLE 50 /* STATUS: cannot serve ADD now */
#define E_PODNETD 100

static int cni_error(int code, const char *msg)
{
	char esc[1024];

	if (pn_json_escape(esc, sizeof(esc), msg, strlen(msg)) < 0)
		snprintf(esc, sizeof(esc), "podnet: error message too long");
	printf("{\"cniVersion\":\"1.0.0\",\"code\":%d,\"msg\":\"%s\"}\n", code,
	       esc);
	return 1;
}

static const char *env(const char *name)
{
	const char *v = getenv(name);

	return v ? v : "";
}

int main(void)
{
	static char config[MAX_CONFIG + 1], req[PN_MAX_LINE];
	static pn_reply_t rep;
	const char *command = env("CNI_COMMAND"), *sock = env("PODNET_SOCKET");
	char msg[512] = "";
	size_t got = 0;
	ssize_t n;
	pn_req_t r;
	long len;
	int rc;

	if (!strcmp(command, "VERSION")) {
		printf("{\"cniVersion\":\"1.0.0\",\"supportedVersions\":"
		       "[\"0.4.0\",\"1.0.0\",\"1.1.0\"]}\n");
		return 0;
	}
	if (!*command)
		return cni_error(E_INVALID_ENV, "CNI_COMMAND is not set");
	while (got < sizeof(config) &&
	       (n = read(0, config + got, sizeof(config) - got)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return cni_error(E_IO, "cannot read the configuration");
		}
		got += (size_t) n;
	}
	if (got > MAX_CONFIG)
		return cni_error(E_INVALID_CONFIG,
				 "network configuration over 32768 bytes");
	config[got] = '\0';
	if (memchr(config, '\0', got))
		return cni_error(E_INVALID_CONFIG, "NUL byte in the configuration");

	pn_req_begin(&r, req, sizeof(req), "cni");
	pn_req_str(&r, "command", command);
	pn_req_str(&r, "container_id", env("CNI_CONTAINERID"));
	pn_req_str(&r, "netns", env("CNI_NETNS"));
	pn_req_str(&r, "ifname", env("CNI_IFNAME"));
	pn_req_str(&r, "args", env("CNI_ARGS"));
	pn_req_str(&r, "path", env("CNI_PATH"));
	pn_req_str(&r, "config", config);
	len = pn_req_end(&r);
	if (len < 0)
		return cni_error(E_INVALID_CONFIG, "request too large");
	rc = pn_call(*sock ? sock : PN_DEFAULT_SOCKET, req, (size_t) len, &rep,
		     TIMEOUT_MS, msg, sizeof(msg));
	if (rc != PN_CALL_OK) {
		char text[600];

		snprintf(text, sizeof(text), "podnetd: %s", msg);
		return cni_error(strcmp(command, "STATUS") ? E_TRY_AGAIN :
				 E_NOT_AVAILABLE, text);
	}
	if (!rep.ok) {
		char text[600];

		snprintf(text, sizeof(text), "podnetd refused (%s): %.500s",
			 rep.err_code, rep.err_msg);
		return cni_error(!strcmp(rep.err_code, "EUNAVAIL") ? E_TRY_AGAIN :
				 E_PODNETD, text);
	}
	if (rep.cni_rc < 0 || rep.cni_rc > 255)
		return cni_error(E_PODNETD, "podnetd's reply has no CNI result");
	if (rep.cni_out[0]) {
		fputs(rep.cni_out, stdout);
		if (rep.cni_out[strlen(rep.cni_out) - 1] != '\n')
			fputc('\n', stdout);
	}
	return (int) rep.cni_rc;
}
