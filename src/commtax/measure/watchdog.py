"""Never hang: name the rank that died or stalled, and exit non-zero within the timeout.

Every rank publishes, through the rendezvous store, a heartbeat counter (a background thread
bumps it every ``HEARTBEAT_S``) and the index of the measurement it is in. The main thread
arms a deadline per measurement; if it passes, or a collective raises (gloo reports a
vanished peer as "Connection reset/closed"), ``diagnose`` looks for ranks whose heartbeat
stopped (dead, killed, stopped) or that are behind (hung elsewhere) and the process exits
with ``EXIT_PEER_FAILED`` after one line naming them.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from datetime import timedelta

EXIT_PEER_FAILED = 3
HEARTBEAT_S = 0.5
STALE_S = 2.5  # a heartbeat that has not moved for this long is a dead or stopped rank
PREFIX = "commtax/"


class Watchdog:
    def __init__(self, store, rank: int, world_size: int, timeout_s: float, where: str):
        self.store, self.rank, self.world, self.timeout_s = store, rank, world_size, timeout_s
        self.deadline = float("inf")
        self.what = "start-up"
        self._beats = 0
        self._stop = threading.Event()
        self.store.set(f"{PREFIX}where/{rank}", where)
        self._beat()
        threading.Thread(target=self._heartbeat, daemon=True, name="commtax-heartbeat").start()
        threading.Thread(target=self._watch, daemon=True, name="commtax-watchdog").start()

    def _beat(self) -> None:
        self._beats += 1
        self.store.set(f"{PREFIX}hb/{self.rank}", str(self._beats))

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._beat()
            except Exception:  # store gone: the watchdog reports it
                return

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            if time.monotonic() > self.deadline:
                self.fail(f"no progress in {self.what} within --timeout {self.timeout_s:g} s")

    def step(self, index: int, what: str) -> None:
        """Entering measurement ``index``: publish it and arm the deadline."""
        self.what = what
        try:
            self.store.set(f"{PREFIX}step/{self.rank}", str(index))
        except Exception as e:  # noqa: BLE001 - the store's host (torchrun agent of node 0) is gone: say so, once
            self.fail(f"before {what}: the rendezvous store is unreachable ({type(e).__name__})")
        self.deadline = time.monotonic() + self.timeout_s

    def disarm(self) -> None:
        self.deadline = float("inf")

    def stop(self) -> None:
        self._stop.set()

    def _read(self, kind: str) -> dict[int, str]:
        keys = [f"{PREFIX}{kind}/{r}" for r in range(self.world)]
        out = {}
        for r, k in enumerate(keys):
            if self.store.check([k]):
                out[r] = self.store.get(k).decode()
        return out

    def culprits(self) -> list[str]:
        """Ranks whose heartbeat stopped, else ranks behind this one; each with where it runs."""
        first = self._read("hb")
        time.sleep(STALE_S)
        second = self._read("hb")
        steps = self._read("step")
        where = self._read("where")
        mine = int(steps.get(self.rank, "-1"))
        dead = [r for r in range(self.world) if r != self.rank and first.get(r) == second.get(r)]
        if dead:
            for r in dead:
                kill_if_stopped(where.get(r, ""))
            return [f"rank {r} ({where.get(r, '?')}) died or stopped: no heartbeat for {STALE_S:g} s" for r in dead]
        behind = [r for r in range(self.world) if int(steps.get(r, "-1")) < mine]
        return [f"rank {r} ({where.get(r, '?')}) is hung before measurement {mine}" for r in behind]

    def fail(self, reason: str) -> None:
        """Print one line naming the failed ranks and exit the whole process now."""
        self.disarm()
        if threading.current_thread() is threading.main_thread():
            # torchrun SIGTERMs the survivors as soon as one rank dies: finish naming it first (≤ 2.5 s)
            for sig in (signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
        try:
            self.store.set_timeout(timedelta(seconds=5))
            names = self.culprits() or ["no peer looks dead: a network partition or a slow link?"]
        except Exception as e:  # the store lives with the rendezvous host: it is gone too
            names = [f"lost the rendezvous store ({type(e).__name__}): the node running rank 0 / the launcher died"]
        # one write per line: ranks share the launcher's stderr, and print() writes the text and the newline apart
        os.write(sys.stderr.fileno(), f"commtax bench: rank {self.rank}: {reason}; {'; '.join(names)}\n".encode())
        os._exit(EXIT_PEER_FAILED)


def kill_if_stopped(where: str) -> bool:
    """SIGKILL a SIGSTOPped rank on this host (``where`` names host and pid): torchrun would wait 30 s for it
    to honour its SIGTERM (a stopped process cannot) before the job ends. Only a stopped process is touched."""
    import re
    import socket

    m = re.search(r", (\S+) pid (\d+)$", where)
    if not m or m.group(1) != socket.gethostname():
        return False
    pid = int(m.group(2))
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        if state in ("T", "t"):
            os.kill(pid, signal.SIGKILL)
            return True
    except (OSError, IndexError):
        pass
    return False
