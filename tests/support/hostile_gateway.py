"""A process of another user standing in for the gateway, for tests/integration/test_trust.py.

    python -m tests.support.hostile_gateway SOCKET_PATH UID

Started as root, it binds SOCKET_PATH, becomes UID (setuid), then listens: the kernel reports
the listener's credentials as they were at listen(), so a client sees UID behind the socket.
For every connection it prints one line, ``received <bytes> bytes and <fds> fds``, of whatever
the client sent within a second; a plugin that trusts it sends its hello (and, with shared L1,
an fd of LMCache's L1). It stops on SIGTERM.
"""

from __future__ import annotations

import os
import socket
import sys


def main() -> int:
    path, uid = sys.argv[1], int(sys.argv[2])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o666)
    os.setgid(uid)
    os.setuid(uid)
    listener.listen(16)
    print(f"listening on {path} as uid {os.getuid()}", flush=True)
    while True:
        conn, _ = listener.accept()
        conn.settimeout(1.0)
        received, fds = 0, 0
        try:
            while True:
                data, new_fds, _, _ = socket.recv_fds(conn, 65536, 4)
                received += len(data)
                fds += len(new_fds)
                for fd in new_fds:
                    os.close(fd)
                if not data:
                    break
        except OSError:
            pass
        print(f"received {received} bytes and {fds} fds", flush=True)
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
