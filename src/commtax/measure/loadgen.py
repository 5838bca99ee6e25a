"""Background traffic for ``commtax cluster load``: one paced TCP flow between two nodes of an emulated cluster.

``sink PORT SECONDS`` (in the destination node) reads and discards; ``send HOST PORT RATE_BIT_S SECONDS MAX_BYTES``
(in the source node) sends at no more than RATE_BIT_S on average, and stops after SECONDS or MAX_BYTES, whichever
comes first. Both are bounded in time whatever the peer does; HOST must be an address of the emulated cluster's
private subnet, so the generator only ever talks to our own namespaces. Standard library only.
"""

from __future__ import annotations

import socket
import sys
import time

from commtax.measure.cluster import SUBNET

CHUNK_BYTES = 64 * 2**10


def sink(port: int, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    with socket.socket() as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("0.0.0.0", port))
        ls.listen(1)
        ls.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            conn, _ = ls.accept()
        except TimeoutError:
            return 1
        with conn:
            while (left := deadline - time.monotonic()) > 0:
                conn.settimeout(left)
                try:
                    if not conn.recv(1 << 20):
                        break
                except TimeoutError:
                    break
    return 0


def send(host: str, port: int, rate_bit_s: float, seconds: float, max_bytes: int) -> int:
    if not host.startswith(SUBNET + "."):
        print(f"loadgen: {host} is not an address of the emulated cluster ({SUBNET}.x)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    deadline = t0 + seconds
    while True:  # the sink may still be starting
        try:
            s = socket.create_connection((host, port), timeout=1)
            break
        except OSError:
            if time.monotonic() > min(deadline, t0 + 10):
                return 1
            time.sleep(0.1)
    chunk = b"\0" * CHUNK_BYTES
    sent = 0
    with s:
        start = time.monotonic()
        while sent < max_bytes and (now := time.monotonic()) < deadline:
            due = start + sent * 8 / rate_bit_s  # pace: never ahead of the rate on average
            if due > now:
                time.sleep(min(due - now, deadline - now))
                continue
            s.settimeout(max(0.01, deadline - now))
            try:
                s.sendall(chunk[: max_bytes - sent])
            except (TimeoutError, OSError):
                break
            sent += min(CHUNK_BYTES, max_bytes - sent)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["sink"] and len(argv) == 3:
        return sink(int(argv[1]), float(argv[2]))
    if argv[:1] == ["send"] and len(argv) == 6:
        return send(argv[1], int(argv[2]), float(argv[3]), float(argv[4]), int(argv[5]))
    print("usage: loadgen sink PORT SECONDS | send HOST PORT RATE_BIT_S SECONDS MAX_BYTES", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
