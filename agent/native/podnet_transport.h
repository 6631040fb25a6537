/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_transport.h - one exchange with podnetd over its UNIX socket:
 * connect, send one request line (podnet_json.h builds it), read one reply
 * line, parse it. No global state, no signals (MSG_NOSIGNAL), no threads; the
 * only allocation is the bounded reply buffer, freed before pn_call returns.
 */
#ifndef PODNET_TRANSPORT_H
#define PODNET_TRANSPORT_H

#include <stddef.h>

#include "podnet_json.h"

#define PN_DEFAULT_SOCKET "/run/podnet/podnetd.sock"

/*
 * pn_call(): connect to the UNIX socket, send one request line, read one reply
 * line, parse it. timeout_ms bounds the whole exchange (connect + write +
 * read). The socket is close-on-exec and closed before returning.
 */
enum {
	PN_CALL_OK = 0,         /* reply parsed: look at rep->ok */
	PN_CALL_E_CONNECT = 1,  /* socket missing / refused: daemon not running */
	PN_CALL_E_TIMEOUT = 2,  /* no complete reply in time */
	PN_CALL_E_IO = 3,       /* connection reset, short reply, EOF */
	PN_CALL_E_PROTO = 4,    /* reply is not valid (see msg) */
	PN_CALL_E_USAGE = 5,    /* bad arguments (path too long, ...) */
};

int pn_call(const char *sock_path, const char *req, size_t reqlen,
	    pn_reply_t *rep, int timeout_ms, char *msg, size_t msgsz);

#endif /* PODNET_TRANSPORT_H */
