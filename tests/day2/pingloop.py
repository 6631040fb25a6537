# SPDX-License-Identifier: Apache-2.0
"""A TCP ping loop between two pods of a job (tests/day2): `server PORT` echoes lines;
`client HOST PORT LOG` sends one every 0.2 s on one connection and logs each attempt
(`<time> ok`, `<time> connect`, `<time> fail <error>`; reconnects after a failure)."""

import socket
import sys
import threading
import time


def serve(port: int) -> None:
    srv = socket.create_server(("0.0.0.0", port), reuse_port=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=echo, args=(conn,), daemon=True).start()


def echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(64):
            conn.sendall(data)


def client(host: str, port: int, log: str) -> None:
    addr = None
    while addr is None:
        try:
            addr = socket.getaddrinfo(host, port, socket.AF_INET)[0][4][0]
        except OSError:
            time.sleep(0.5)
    s = None
    with open(log, "a", buffering=1) as f:
        while True:
            t = time.time()
            try:
                if s is None:
                    s = socket.create_connection((addr, port), timeout=1)
                    f.write(f"{t:.2f} connect\n")
                s.sendall(b"ping\n")
                if not s.recv(16):
                    raise OSError("closed")
                f.write(f"{t:.2f} ok\n")
            except OSError as e:
                f.write(f"{t:.2f} fail {e}\n")
                if s is not None:
                    s.close()
                s = None
            time.sleep(max(0.0, 0.2 - (time.time() - t)))


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(int(sys.argv[2]))
    else:
        client(sys.argv[2], int(sys.argv[3]), sys.argv[4])
