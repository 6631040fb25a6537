// SPDX-License-Identifier: Apache-2.0

package privacy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"
)

// The kernel's sock_diag interface (linux/inet_diag.h): one exact lookup of a socket
// by its addresses, answered with the socket's owner uid. It is what `ss -e` reads.
const (
	netlinkSockDiag  = 4  // NETLINK_SOCK_DIAG
	sockDiagByFamily = 20 // SOCK_DIAG_BY_FAMILY
	nlmsgHdrLen      = 16
	diagReqLen       = 56 // struct inet_diag_req_v2
	diagMsgUIDOffset = 64 // idiag_uid in struct inet_diag_msg
	diagMsgMinLen    = 72
)

var errNoSocket = errors.New("no such socket")

// socketUID is the uid owning the local socket `client` that sent a query to `server`
// (both addresses of this host): the socket the kernel delivers the answer to, found
// the way the kernel finds it. IPv4 only.
func socketUID(network string, client, server netip.AddrPort) (uint32, error) {
	if !client.Addr().Is4() || !server.Addr().Is4() {
		return 0, errors.New("IPv4 only")
	}
	var proto byte
	// The lookup's "src" and "dst": for TCP the socket's own address and its peer; for
	// UDP the other way round (the kernel looks UDP sockets up as for a datagram from
	// src to dst, "swapped for historical reasons" in net/ipv4/udp_diag.c).
	var src, dst netip.AddrPort
	switch network {
	case "tcp":
		proto, src, dst = syscall.IPPROTO_TCP, client, server
	case "udp":
		proto, src, dst = syscall.IPPROTO_UDP, server, client
	default:
		return 0, fmt.Errorf("network %q", network)
	}
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, netlinkSockDiag)
	if err != nil {
		return 0, err
	}
	defer syscall.Close(fd)
	tv := syscall.NsecToTimeval(int64(200 * time.Millisecond))
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		return 0, err
	}

	req := make([]byte, nlmsgHdrLen+diagReqLen)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], sockDiagByFamily)
	ne.PutUint16(req[6:], syscall.NLM_F_REQUEST)
	ne.PutUint32(req[8:], 1) // sequence
	b := req[nlmsgHdrLen:]
	b[0] = syscall.AF_INET
	b[1] = proto
	ne.PutUint32(b[4:], ^uint32(0)) // every state
	id := b[8:]                     // struct inet_diag_sockid
	binary.BigEndian.PutUint16(id[0:], src.Port())
	binary.BigEndian.PutUint16(id[2:], dst.Port())
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	copy(id[4:8], s4[:])
	copy(id[20:24], d4[:])
	ne.PutUint32(id[40:], ^uint32(0)) // INET_DIAG_NOCOOKIE
	ne.PutUint32(id[44:], ^uint32(0))
	if err := syscall.Sendto(fd, req, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return 0, err
	}

	buf := make([]byte, 4096)
	n, _, err := syscall.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, err
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		switch m.Header.Type {
		case syscall.NLMSG_ERROR:
			if len(m.Data) >= 4 {
				if errno := int32(ne.Uint32(m.Data)); errno < 0 {
					if syscall.Errno(-errno) == syscall.ENOENT {
						return 0, errNoSocket
					}
					return 0, syscall.Errno(-errno)
				}
			}
			return 0, errNoSocket
		case sockDiagByFamily:
			d := m.Data
			if len(d) < diagMsgMinLen {
				return 0, errors.New("short sock_diag answer")
			}
			// the socket found must be the client's: its own port is the client's port
			if binary.BigEndian.Uint16(d[4:]) != client.Port() {
				return 0, errNoSocket
			}
			return ne.Uint32(d[diagMsgUIDOffset:]), nil
		}
	}
	return 0, errNoSocket
}
