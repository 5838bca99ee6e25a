"""Tiny TCP probe for ``commtax cluster up``: one-way latency (ping-pong / 2) and bulk bandwidth.

``python -m commtax.measure.netprobe loop`` measures loopback inside one namespace;
``serve PORT`` + ``client HOST PORT`` measure between two. Prints one JSON line:
{"latency_us": …, "bw_GBps": …}. Standard library only: it runs in each namespace in well
under a second.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

PINGS = 200
BULK_BYTES = 64 * 2**20
BLOCK_BYTES = 1 * 2**20


def _serve_one(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with conn:
        for _ in range(PINGS):
            conn.sendall(conn.recv(1))
        while conn.recv(BLOCK_BYTES):
            pass
        conn.sendall(b"k")


def _client(host: str, port: int, bulk_bytes: int) -> dict:
    with socket.create_connection((host, port), timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        for _ in range(PINGS):
            s.sendall(b"p")
            s.recv(1)
        rtt_s = (time.perf_counter() - t0) / PINGS
        block = b"\0" * BLOCK_BYTES
        blocks = max(1, bulk_bytes // BLOCK_BYTES)
        bulk_bytes = blocks * BLOCK_BYTES  # what is actually sent
        t0 = time.perf_counter()
        for _ in range(blocks):
            s.sendall(block)
        s.shutdown(socket.SHUT_WR)
        s.recv(1)
        bulk_s = time.perf_counter() - t0
    return {"latency_us": rtt_s / 2 * 1e6, "bw_GBps": bulk_bytes / bulk_s / 1e9}


def _listener(host: str, port: int) -> socket.socket:
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, port))
    ls.listen(1)
    return ls


def main(argv: list[str]) -> None:
    if argv[0] == "loop":
        ls = _listener("127.0.0.1", 0)
        threading.Thread(target=_serve_one, args=(ls,), daemon=True).start()
        print(json.dumps(_client("127.0.0.1", ls.getsockname()[1], BULK_BYTES)))
    elif argv[0] == "serve":
        ls = _listener("0.0.0.0", int(argv[1]))
        print("ready", flush=True)
        _serve_one(ls)
    else:  # client HOST PORT BULK_BYTES
        print(json.dumps(_client(argv[1], int(argv[2]), int(argv[3]))))


if __name__ == "__main__":
    main(sys.argv[1:])
