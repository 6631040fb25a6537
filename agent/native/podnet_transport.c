/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_transport.c - see podnet_transport.h: one request/reply exchange
 * with podnetd over its UNIX socket, bounded by a deadline.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "podnet_transport.h"
#include "podnet_util.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int remaining_ms(long long deadline)
{
	long long left = deadline - now_ms();

	if (left <= 0)
		return 0;
	return left > INT_MAX ? INT_MAX : (int) left;
}

/* Waits for events on fd until the deadline: 1 ready, 0 timeout, -1 error. */
static int wait_fd(int fd, short events, long long deadline)
{
	for (;;) {
		struct pollfd pfd = { fd, events, 0 };
		int left = remaining_ms(deadline);
		int rc;

		if (!left)
			return 0;
		rc = poll(&pfd, 1, left);
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc < 0)
			return -1;
		if (rc == 0)
			return 0;
		return 1;
	}
}

int pn_call(const char *sock_path, const char *req, size_t reqlen,
	    pn_reply_t *rep, int timeout_ms, char *msg, size_t msgsz)
{
	struct sockaddr_un sa;
	long long deadline;
	size_t off = 0, got = 0;
	char *buf = NULL, *nl = NULL;
	char why[256];
	int fd = -1, rc = PN_CALL_E_IO, saved;

	if (msg && msgsz)
		msg[0] = '\0';
	if (!sock_path || !req || !reqlen || !rep || timeout_ms <= 0) {
		pn_fmt(msg, msgsz, "invalid arguments");
		return PN_CALL_E_USAGE;
	}
	if (strlen(sock_path) >= sizeof(sa.sun_path)) {
		pn_fmt(msg, msgsz, "socket path too long: %s", sock_path);
		return PN_CALL_E_USAGE;
	}
	if (reqlen > PN_MAX_LINE) {
		pn_fmt(msg, msgsz, "request longer than %d bytes", PN_MAX_LINE);
		return PN_CALL_E_USAGE;
	}
	deadline = now_ms() + timeout_ms;

	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, sock_path, strlen(sock_path) + 1);

	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		pn_fmt(msg, msgsz, "socket: %s", strerror(errno));
		return PN_CALL_E_IO;
	}
	/* A non-blocking AF_UNIX connect either completes, fails, or reports
	 * EAGAIN when the listen backlog is full: retry that until the
	 * deadline. */
	for (;;) {
		if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) == 0)
			break;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN && remaining_ms(deadline) > 0) {
			(void) poll(NULL, 0, 10);
			continue;
		}
		saved = errno;
		if (saved == EAGAIN) {
			pn_fmt(msg, msgsz, "podnetd at %s is not accepting "
			       "connections (timeout)", sock_path);
			rc = PN_CALL_E_TIMEOUT;
		} else {
			pn_fmt(msg, msgsz, "cannot connect to podnetd at %s: %s",
			       sock_path, strerror(saved));
			rc = (saved == ENOENT || saved == ECONNREFUSED ||
			      saved == ENOTDIR)
				     ? PN_CALL_E_CONNECT
				     : PN_CALL_E_IO;
		}
		close(fd);
		return rc;
	}

	while (off < reqlen) {
		ssize_t n = send(fd, req + off, reqlen - off, MSG_NOSIGNAL);

		if (n > 0) {
			off += (size_t) n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		/* podnetd answered and hung up (a refusal, e.g. too many
		 * connections): its reply is still there to read */
		if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
			break;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			int w = wait_fd(fd, POLLOUT, deadline);
			if (w == 1)
				continue;
			if (w == 0) {
				pn_fmt(msg, msgsz, "timed out sending to podnetd "
				       "after %d ms", timeout_ms);
				rc = PN_CALL_E_TIMEOUT;
				goto out;
			}
		}
		pn_fmt(msg, msgsz, "sending to podnetd: %s", strerror(errno));
		rc = PN_CALL_E_IO;
		goto out;
	}

	buf = malloc(PN_MAX_LINE + 1);
	if (!buf) {
		pn_fmt(msg, msgsz, "out of memory");
		rc = PN_CALL_E_IO;
		goto out;
	}
	while (!nl) {
		ssize_t n;

		if (got >= PN_MAX_LINE) {
			pn_fmt(msg, msgsz, "malformed reply from podnetd: no "
			       "newline within %d bytes", PN_MAX_LINE);
			rc = PN_CALL_E_PROTO;
			goto out;
		}
		n = recv(fd, buf + got, PN_MAX_LINE - got, 0);
		if (n > 0) {
			nl = memchr(buf + got, '\n', (size_t) n);
			got += (size_t) n;
			continue;
		}
		if (n == 0) {
			pn_fmt(msg, msgsz, "podnetd closed the connection "
			       "without a complete reply");
			rc = PN_CALL_E_IO;
			goto out;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			int w = wait_fd(fd, POLLIN, deadline);
			if (w == 1)
				continue;
			if (w == 0) {
				pn_fmt(msg, msgsz, "no reply from podnetd "
				       "within %d ms", timeout_ms);
				rc = PN_CALL_E_TIMEOUT;
				goto out;
			}
		}
		pn_fmt(msg, msgsz, "reading from podnetd: %s", strerror(errno));
		rc = PN_CALL_E_IO;
		goto out;
	}
	if (pn_parse_reply(buf, (size_t) (nl - buf + 1), rep, why,
			   sizeof(why)) < 0) {
		pn_fmt(msg, msgsz, "malformed reply from podnetd: %s", why);
		rc = PN_CALL_E_PROTO;
		goto out;
	}
	rc = PN_CALL_OK;
out:
	free(buf);
	close(fd);
	return rc;
}
