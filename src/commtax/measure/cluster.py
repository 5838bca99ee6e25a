"""An emulated multi-node cluster on one Linux host: network namespaces, a bridge, tc-shaped links.

Layout (``ctxXXXXXX`` is a random per-cluster id; nothing is created in the host namespace):

    ctxXXXXXX-sw   the "switch": bridge br0 (and br1 + a shaped uplink u0<->u1 when oversubscribed; with
                   ``leaves`` L > 2, leaf bridges br0..br<L-1>, each joined to a spine bridge sp by a veth
                   u<l> <-> s<l> shaped at the spine rate both ways)
    ctxXXXXXX-n<i> node i: lo + eth0 = 10.213.0.<i+1>/24, veth to port p<i> of the switch

Each node's link is shaped in both directions with tc tbf at the link rate (eth0 egress =
node → switch, p<i> egress = switch → node); ranks inside one node talk over loopback (the
kernel routes a node's own address through lo), so intra-node traffic is unshaped.
``run`` starts torchrun in every node namespace with gloo bound to eth0.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commtax.errors import LAUNCHED_ENV, excerpt
from commtax.measure import cgroups
from commtax.signals import terminate_as_interrupt

SUBNET = "10.213.0"  # private, and only ever configured inside our own namespaces
MASTER_PORT = 29400
LOAD_PORT = 29700  # + k for the k-th background flow (`cluster load`)
NAME_RE = re.compile(r"^ctx[0-9a-f]{6}-(sw|n\d+)$")
TBF_QUEUE_MS = 100  # default tbf queue limit expressed as latency: deep enough that TCP does not see drops
QUEUE_MS_RANGE = (0.5, 1000.0)  # `--queue-ms`: at least a few frames at the rates tc shapes here, at most 1 s
TCP_CONGESTION = ("reno", "cubic", "bbr")  # what `cluster up --tcp` may set in the node namespaces
MAX_NODES = 200  # namespaces per cluster: `up --nodes` and a cluster file's `emulated.nodes` alike
MAX_RANKS_PER_NODE = 64
DEFAULT_MTU = 9000  # jumbo frames: headers are 0.7% of a frame instead of 4.4% at 1500


def host_copy_bw_GBps(nbytes: int = 64 * 2**20, iters: int = 5) -> float:
    """Read + write bandwidth of one core copying a buffer larger than the caches (the roofline's memory term for a
    CPU rank: what ``compute.op_time`` divides memory-bound bytes by), best of ``iters``, GB/s. A slice assignment
    of a bytearray is one memmove, as a torch ``copy_`` of a contiguous tensor is."""
    a, b = bytearray(nbytes), bytearray(nbytes)
    b[:] = a  # touch the pages first
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        b[:] = a
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best / 1e9


class ClusterError(RuntimeError):
    """The host cannot build the cluster (no root, no netns, no tc); the CLI exits 2 with the message."""


def parse_rate_bit_s(text: str) -> float:
    """'300mbit', '1gbit', '2.5Gbit', '500kbit' → bits per second (tc's units, decimal)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)(bit|bps)?\s*", text.lower())
    if not m:
        raise ValueError(f"link rate {text!r}: write a number with kbit, mbit or gbit, e.g. 300mbit")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    bits = float(m.group(1)) * scale * (8 if m.group(3) == "bps" else 1)
    if not 1e5 <= bits <= 1e11:
        raise ValueError(f"link rate {text!r}: must be between 100kbit and 100gbit")
    return bits


def check_host() -> None:
    """Raise ClusterError with the reason when this process cannot create namespaces and qdiscs."""
    if sys.platform != "linux":
        raise ClusterError(f"needs Linux network namespaces; this is {sys.platform}")
    if os.geteuid() != 0:
        raise ClusterError("needs root (CAP_NET_ADMIN) to create network namespaces; run as root")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise ClusterError(f"needs the `{tool}` command (iproute2), not found on PATH")
    probe = f"ctx{secrets.token_hex(3)}-n0"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        raise ClusterError(f"`ip netns add` failed: {r.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)


def _sh(*args: str) -> str:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        raise ClusterError(f"`{' '.join(args)}` failed: {r.stderr.strip()}")
    return r.stdout


def _tbf(ns: str, dev: str, rate_bit_s: float, mtu: int, queue_ms: float = TBF_QUEUE_MS) -> None:
    """Token bucket at rate_bit_s: bucket of max(4 frames, 1 ms of traffic), queue up to ``queue_ms`` of traffic."""
    burst_bytes = int(max(4 * (mtu + 14), rate_bit_s / 8 * 1e-3))
    _sh(
        "ip",
        "netns",
        "exec",
        ns,
        "tc",
        "qdisc",
        "replace",
        "dev",
        dev,
        "root",
        "tbf",
        "rate",
        f"{int(rate_bit_s)}bit",
        "burst",
        str(burst_bytes),
        "latency",
        f"{int(round(queue_ms * 1000))}us",
    )


@dataclass
class EmulatedCluster:
    nodes: int
    ranks_per_node: int
    link_bit_s: float
    uplink_bit_s: float | None = None  # the spine: one shaped link per leaf (two leaves: the one link joining them)
    mtu: int = DEFAULT_MTU
    name: str = field(default_factory=lambda: f"ctx{secrets.token_hex(3)}")
    measured: dict = field(default_factory=dict)
    leaves: int | None = None  # None: the legacy `--uplink` form (two halves, written as uplink_Gbps)
    loads: list = field(default_factory=list)  # background flows `cluster load` started: {src, dst, rate_Gbps, …}
    probe_duplex: bool = False  # `up` also measures gloo's all_to_all duplex κ (`cluster up` does; tests may not)
    # each shaped link's queue limit, ms of traffic at its rate (tbf latency); None: the deep TBF_QUEUE_MS, which a
    # TCP window does not fill (its receive window binds first), so the fabric prices no standing queue
    queue_ms: float | None = None
    tcp: str | None = None  # TCP congestion control set in every node namespace; None: what the host gives them

    @property
    def buffer_ms(self) -> float:
        return TBF_QUEUE_MS if self.queue_ms is None else self.queue_ms

    @property
    def leaf_count(self) -> int:
        if self.leaves is not None:
            return self.leaves if self.nodes > 1 else 1
        return 2 if self.uplink_bit_s and self.nodes > 1 else 1

    # unequal nodes (``--node-speed``, a comma list of ``--link``): CPUs per rank, and a link rate per node
    node_speed: tuple[float, ...] | None = None
    node_link_bit_s: tuple[float, ...] | None = None

    def link_of(self, i: int) -> float:
        """Node i's link rate, bit/s (its own with a per-node ``--link``, else the cluster's)."""
        return self.node_link_bit_s[i] if self.node_link_bit_s else self.link_bit_s

    @property
    def unequal(self) -> bool:
        return bool(self.node_speed) or bool(self.node_link_bit_s)

    @property
    def switch_ns(self) -> str:
        return f"{self.name}-sw"

    def node_ns(self, i: int) -> str:
        return f"{self.name}-n{i}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    @property
    def namespaces(self) -> list[str]:
        return [self.switch_ns] + [self.node_ns(i) for i in range(self.nodes)]

    # ------------------------------------------------------------------ build / tear down
    def up(self, record: Callable[[EmulatedCluster], None] | None = None) -> EmulatedCluster:
        """Create namespaces, bridge, shaped veths; measure; on any failure, Ctrl-C, SIGTERM or SIGHUP remove it all.

        Ownership is recorded (``registry``) before the first namespace exists, and ``record(self)``
        (the CLI writes the cluster YAML) is called then too, so even a SIGKILL leaves a record
        that `commtax cluster down` can act on.
        """
        assert 1 <= self.nodes <= MAX_NODES and 1 <= self.ranks_per_node <= MAX_RANKS_PER_NODE
        with terminate_as_interrupt():
            try:
                register(self)
                if record is not None:
                    record(self)
                self._build()
                self.measured = self._measure()
                if self.probe_duplex and self.nodes > 1:
                    self.measured["gloo_a2a"] = self._duplex_probe()
            except BaseException:
                with _signals_blocked():  # a second Ctrl-C/SIGTERM must not stop the clean-up half-way
                    self.down()
                    self._down_stragglers()
                raise
        return self

    def _build(self) -> None:
        sw = self.switch_ns
        _sh("ip", "netns", "add", sw)
        _sh("ip", "-n", sw, "link", "set", "lo", "up")
        leaves = [f"br{i}" for i in range(self.leaf_count)]
        for br in leaves + (["sp"] if len(leaves) > 2 else []):
            _sh("ip", "-n", sw, "link", "add", br, "type", "bridge")
            _sh("ip", "-n", sw, "link", "set", br, "up")
        for i in range(len(leaves) if len(leaves) > 2 else 0):  # leaf i <-> spine, shaped both ways
            u, sp = f"u{i}", f"s{i}"
            _sh("ip", "-n", sw, "link", "add", u, "mtu", str(self.mtu), "type", "veth", "peer", "name", sp)
            _sh("ip", "-n", sw, "link", "set", sp, "mtu", str(self.mtu))
            _sh("ip", "-n", sw, "link", "set", u, "master", leaves[i], "up")
            _sh("ip", "-n", sw, "link", "set", sp, "master", "sp", "up")
            _tbf(sw, u, self.uplink_bit_s, self.mtu, self.buffer_ms)
            _tbf(sw, sp, self.uplink_bit_s, self.mtu, self.buffer_ms)
        if len(leaves) == 2:
            _sh(
                "ip",
                "-n",
                sw,
                "link",
                "add",
                "u0",
                "mtu",
                str(self.mtu),
                "type",
                "veth",
                "peer",
                "name",
                "u1",
                "mtu",
                str(self.mtu),
            )
            for dev, br in (("u0", "br0"), ("u1", "br1")):
                _sh("ip", "-n", sw, "link", "set", dev, "master", br, "up")
                _tbf(sw, dev, self.uplink_bit_s, self.mtu, self.buffer_ms)
        for i in range(self.nodes):
            ns, port = self.node_ns(i), f"p{i}"
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh(
                "ip",
                "link",
                "add",
                "eth0",
                "netns",
                ns,
                "mtu",
                str(self.mtu),
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                sw,
                "mtu",
                str(self.mtu),
            )
            _sh("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", sw, "link", "set", port, "master", leaves[self.leaf(i)], "up")
            _tbf(ns, "eth0", self.link_of(i), self.mtu, self.buffer_ms)
            _tbf(sw, port, self.link_of(i), self.mtu, self.buffer_ms)
            if self.node_speed:
                try:
                    cgroups.create(ns, self.node_speed[i], self.ranks_per_node)
                except cgroups.CgroupError as e:
                    raise ClusterError(f"--node-speed: {e}") from None
            # idle gaps between measurements must not send TCP back to slow start
            _sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0")
            if self.tcp:
                self._set_tcp(ns)

    def _set_tcp(self, ns: str) -> None:
        """The node's TCP congestion control (per namespace since Linux 4.15); a host that does not allow it in a
        namespace (``net.ipv4.tcp_allowed_congestion_control``) is one ClusterError naming what it allows."""
        key = "net.ipv4.tcp_congestion_control"
        r = subprocess.run(
            ["ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"{key}={self.tcp}"], capture_output=True, text=True
        )
        if r.returncode != 0:
            allowed = _sh("ip", "netns", "exec", ns, "sysctl", "-n", "net.ipv4.tcp_allowed_congestion_control")
            raise ClusterError(
                f"--tcp {self.tcp}: this host does not let a namespace use it (allowed: {allowed.strip()}); "
                "choose one of those"
            )

    def tcp_in_use(self) -> str:
        """The congestion control node 0's connections get (what the host default or ``--tcp`` made it)."""
        return _sh("ip", "netns", "exec", self.node_ns(0), "sysctl", "-n", "net.ipv4.tcp_congestion_control").strip()

    def leaf(self, i: int) -> int:
        """Which leaf bridge node i hangs off: legacy uplink: first half br0, second half br1; ``leaves`` L:
        nodes/L consecutive nodes per leaf."""
        if self.leaves is None:
            return 0 if not self.uplink_bit_s else int(i >= (self.nodes + 1) // 2)
        return i // max(1, self.nodes // self.leaf_count)

    def fabric(self) -> dict | None:
        """The cluster file's ``fabric:`` (``--leaves`` form): leaves of nodes/L nodes, the spine's oversubscription
        nodes_per_leaf · link / spine, and the background flows `cluster load` started."""
        if self.leaves is None:
            return None
        npl = max(1, self.nodes // self.leaf_count)
        out: dict = {"name": f"emulated-{self.leaf_count}-leaves", "topology": "tor", "nodes_per_leaf": npl}
        if self.leaf_count > 1 and self.uplink_bit_s:
            out["oversubscription"] = {"leaf": max(1.0, round(npl * self.link_bit_s / self.uplink_bit_s, 6))}
        else:
            out["topology"] = "single-switch"
        out["sharing"] = "tcp"  # gloo and the background flows are TCP connections
        if self.queue_ms is not None:
            # a loss-based TCP flow (reno, cubic) that always has more to send grows its window until its
            # bottleneck's buffer overflows (Jacobson 1988), so a shallow buffer stands full
            out["queue_ms"] = self.queue_ms
        if self.loads:
            keys = ("src", "dst", "rate_Gbps", "until_unix")  # until: `collective` stops pricing it then
            out["flows"] = [{k: f[k] for k in keys if k in f} for f in self.loads]
        out["source"] = "commtax cluster up --leaves/--spine (tc tbf rates as set); flows: commtax cluster load"
        return out

    def down(self) -> None:
        """Kill every process left in our namespaces, then delete them (their veths and bridges go too)."""
        down_namespaces(self.namespaces)
        forget(self.name)

    def _down_stragglers(self, tries: int = 5, wait_s: float = 0.1) -> None:
        """After an interrupted build: a namespace an `ip netns add` killed mid-way can appear after `down` looked;
        our names carry this cluster's random id, so anything still named ``<id>-…`` is ours to delete."""
        for _ in range(tries):
            left = [ns for ns in existing_namespaces() if ns.startswith(f"{self.name}-")]
            if not left:
                return
            down_namespaces(left)
            time.sleep(wait_s)

    # ------------------------------------------------------------------ background traffic
    def load(self, src: int, dst: int, rate_bit_s: float, seconds: float, max_bytes: int) -> dict:
        """Start one paced TCP flow src → dst (commtax.measure.loadgen), bounded by ``seconds`` and ``max_bytes``
        and by `timeout` around each end; both ends run inside our node namespaces, so `down` stops them."""
        assert 0 <= src < self.nodes and 0 <= dst < self.nodes and src != dst
        port = LOAD_PORT + len(self.loads)
        bound = str(int(seconds) + 5)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

        def start(ns: str, *args: str) -> None:
            subprocess.Popen(
                ["ip", "netns", "exec", ns, "timeout", bound, sys.executable, "-m", "commtax.measure.loadgen", *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # outlives this command; `cluster down` kills what runs in our namespaces
                env=env,
            )

        start(self.node_ns(dst), "sink", str(port), str(seconds + 2))
        time.sleep(0.3)
        start(
            self.node_ns(src), "send", self.address(dst), str(port), str(int(rate_bit_s)), str(seconds), str(max_bytes)
        )
        now = time.time()
        flow = {
            "src": src,
            "dst": dst,
            "rate_Gbps": rate_bit_s / 1e9,
            "seconds": seconds,
            "max_bytes": max_bytes,
            "started_unix": round(now, 1),
            "until_unix": round(now + seconds, 1),
        }
        self.loads.append(flow)
        return flow

    # ------------------------------------------------------------------ measure
    def _probe(self, ns: str, *args: str, timeout_s: float = 60) -> dict:
        out = _sh(
            "ip",
            "netns",
            "exec",
            ns,
            "timeout",
            str(int(timeout_s)),
            sys.executable,
            "-m",
            "commtax.measure.netprobe",
            *args,
        )
        return json.loads(out.strip().splitlines()[-1])

    def _measure(self) -> dict:
        """Loopback bandwidth and latency inside node 0; small-message latency node 0 → node 1."""
        loop = self._probe(self.node_ns(0), "loop")
        out = {
            "loopback_bw_GBps": loop["bw_GBps"],
            "loopback_latency_us": loop["latency_us"],
            "host_copy_bw_GBps": host_copy_bw_GBps(),
            "tcp_congestion_control": self.tcp_in_use(),
        }
        if self.nodes > 1:
            server = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.node_ns(1),
                    sys.executable,
                    "-m",
                    "commtax.measure.netprobe",
                    "serve",
                    "29399",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                server.stdout.readline()
                bulk = int(
                    min(self.link_of(0), self.link_of(1)) / 8 * 0.4
                )  # 0.4 s of traffic at the link rate: the tbf bucket is noise
                link = self._probe(self.node_ns(0), "client", self.address(1), "29399", str(max(bulk, 4 * 2**20)))
                out.update(link_latency_us=link["latency_us"], link_bw_GBps=link["bw_GBps"])
            finally:
                server.wait(timeout=30)
        return out

    def _duplex_probe(self, seconds_at_rate: float = 0.2, timeout_s: int = 90) -> dict:
        """gloo all_to_all's κ on a node link: ``commtax.measure.a2a_probe`` under torchrun on nodes 0 and 1 (the
        same leaf) with as many TCP connections on the link as the cluster's all_to_all puts there (every local
        rank to every remote one: rpn · (nodes − 1) · rpn, at most 4: each is a process on a node), a symmetric
        exchange of ``seconds_at_rate`` of the link rate each way (1-16 MiB), timed back to back as `bench
        collective` times (the slowest rank's median of 5, on 5 process groups of their own connections, their
        mean). A failed probe is recorded as such (the cluster still comes up; its all_to_all priced as full
        duplex)."""
        rate = min(self.link_of(0), self.link_of(1))  # unequal links: the slower of the two ends
        one_way = int(min(16 * 2**20, max(2**20, rate / 8 * seconds_at_rate)))
        lat = self.measured.get("link_latency_us", 50.0)
        with tempfile.TemporaryDirectory(prefix=f"commtax-{self.name}-a2a-") as tmp:
            os.chmod(tmp, 0o755)
            out = Path(tmp) / "probe.json"
            cmd = ["timeout", str(timeout_s), sys.executable, "-m", "commtax.measure.a2a_probe"]
            cmd += ["--bytes-one-way", str(one_way), "--link-bit-s", str(rate), "--latency-us", str(lat)]
            conns = min(4, self.ranks_per_node**2 * (self.nodes - 1))
            pair = EmulatedCluster(2, conns, rate, mtu=self.mtu, name=self.name)
            rc = pair.run([*cmd, "--out", str(out)], grace_s=5.0, log=lambda msg: print(msg, file=sys.stderr))
            if rc != 0 or not out.exists():
                return {"error": f"probe exited with code {rc}"}
            return json.loads(out.read_text())

    # ------------------------------------------------------------------ describe
    def spec(self) -> dict:
        """The cluster YAML: what estimate and collective need, plus what was built under ``emulated``.

        Unequal nodes (``node_speed``, per-node links) are written as one pool per node (spec/pools.py): a node at
        speed x is a CPU rank with x times the compute and memory rate (its cgroup's CPU share slows both), its link
        its own rate; ``emulated`` keeps the speeds and rates for ``from_spec``."""
        out = self._uniform_spec()
        if not self.unequal:
            return out
        hardware = ("gpu", "num_gpus", "gpus_per_node", "intra_node", "inter_node", "nics_per_node")
        pools = []
        for i in range(self.nodes):
            x = self.node_speed[i] if self.node_speed else 1.0
            gpu = dict(out["gpu"], name=f"cpu-gloo-x{x:g}", source=out["gpu"]["source"] + f"; node speed {x:g}")
            gpu["peak_tflops"] = {k: v * x for k, v in gpu["peak_tflops"].items()}
            gpu["mem_bw_GBps"] = round(gpu["mem_bw_GBps"] * x, 3)
            link = dict(
                out["inter_node"], name=f"veth-tbf-{self.link_of(i) / 1e6:g}mbit", bw_Gbps=self.link_of(i) / 1e9
            )
            pools.append(
                {
                    "name": f"n{i}",
                    "gpu": gpu,
                    "num_gpus": self.ranks_per_node,
                    "gpus_per_node": self.ranks_per_node,
                    "intra_node": dict(out["intra_node"]),
                    "inter_node": link,
                    "nics_per_node": 1,
                }
            )
        rest = {k: v for k, v in out.items() if k not in hardware}
        rest["emulated"] = {
            **rest["emulated"],
            "node_speed": list(self.node_speed) if self.node_speed else None,
            "node_link_Gbps": [self.link_of(i) / 1e9 for i in range(self.nodes)],
        }
        return {"pools": pools, **rest}

    def _uniform_spec(self) -> dict:
        m = self.measured
        link_Gbps = self.link_bit_s / 1e9
        return {
            "gpu": {
                "name": "cpu-gloo",
                "peak_tflops": {"fp32": 0.1, "bf16": 0.1},
                "mem_GiB": 8,
                "mem_bw_GBps": round(m.get("host_copy_bw_GBps", 10.0), 3),
                "tdp_W": 100,
                "source": "emulated: CPU rank; mem_bw_GBps = host memory copy (read + write) measured by "
                "commtax cluster up (10 if not measured); peak_tflops a placeholder: bench gemm",
            },
            "num_gpus": self.nodes * self.ranks_per_node,
            "gpus_per_node": self.ranks_per_node,
            "intra_node": {
                "name": "loopback",
                "bw_GBps": round(m.get("loopback_bw_GBps", 1.0), 4),
                "latency_us": round(m.get("loopback_latency_us", 20.0), 2),
                "efficiency": 1.0,
                "kind": "loopback",
                "source": "measured by commtax cluster up",
            },
            "inter_node": {
                "name": f"veth-tbf-{self.link_bit_s / 1e6:g}mbit",
                "bw_Gbps": link_Gbps,
                "latency_us": round(m.get("link_latency_us", 50.0), 2),
                "efficiency": 1.0,
                "source": "tc tbf rate set by commtax cluster up; latency measured (TCP ping-pong / 2)"
                + (
                    "; gloo_a2a_duplex measured by commtax cluster up: a symmetric gloo all_to_all between nodes 0 "
                    f"and 1 over {m['gloo_a2a']['connections']} connections (as many as the cluster's all_to_all "
                    f"puts on a node link), {m['gloo_a2a']['bytes_one_way']} B each way, back to back as bench "
                    "collective times (median of 5, mean of 5 process groups): "
                    f"{m['gloo_a2a']['probe_s']:.4f} s against {m['gloo_a2a']['wire_s']:.4f} s at the link rate, "
                    "κ = t · B / bytes − 1 (docs/fabric.md)"
                    if "gloo_a2a_duplex" in m.get("gloo_a2a", {})
                    else ""
                ),
                **(
                    {"gloo_a2a_duplex": m["gloo_a2a"]["gloo_a2a_duplex"]}
                    if "gloo_a2a_duplex" in m.get("gloo_a2a", {})
                    else {}
                ),
            },
            "nics_per_node": 1,
            **(
                {"uplink_Gbps": self.uplink_bit_s / 1e9}
                if self.uplink_bit_s and self.nodes > 1 and self.leaves is None
                else {}
            ),
            **({"fabric": self.fabric()} if self.leaves is not None else {}),
            "collective_library": "gloo",
            "emulated": {
                "name": self.name,
                "nodes": self.nodes,
                "ranks_per_node": self.ranks_per_node,
                "switch_namespace": self.switch_ns,
                "namespaces": [self.node_ns(i) for i in range(self.nodes)],
                "bridge": "+".join(f"br{i}" for i in range(self.leaf_count)) + ("+sp" if self.leaf_count > 2 else ""),
                "mtu": self.mtu,
                "queue_ms": self.queue_ms,
                "tcp": self.tcp,
                "addresses": {self.node_ns(i): self.address(i) for i in range(self.nodes)},
                "link_Gbps": link_Gbps,
                "uplink_Gbps": self.uplink_bit_s / 1e9 if self.uplink_bit_s else None,
                "leaves": [self.leaf(i) for i in range(self.nodes)],
                **({"leaf_count": self.leaf_count, "loads": self.loads} if self.leaves is not None else {}),
                "measured": m,
                "python": sys.executable,
            },
        }

    @classmethod
    def from_spec(cls, spec: Any) -> EmulatedCluster:
        """The cluster a YAML describes; a missing or crafted ``emulated:`` field is one ValueError line."""
        e = spec.get("emulated") if isinstance(spec, dict) else None
        if not isinstance(e, dict) or "name" not in e:
            raise ValueError("cluster file has no `emulated:` section written by `commtax cluster up`")
        name = e["name"]
        if not (isinstance(name, str) and re.fullmatch(r"ctx[0-9a-f]{6}", name)):
            raise ValueError(f"emulated.name: {excerpt(name)} is not a cluster id like ctx1a2b3c")

        def number(key: str, lo: float, hi: float, integer: bool = False, default: Any = None) -> Any:
            v = e.get(key, default)
            ok = isinstance(v, int if integer else (int, float)) and not isinstance(v, bool)
            if not ok or not (lo <= v <= hi):
                kind = "an integer" if integer else "a number"
                raise ValueError(f"emulated.{key}: expected {kind} in [{lo:g}, {hi:g}], got {excerpt(v)}")
            return v

        nodes = number("nodes", 1, MAX_NODES, True)
        ranks = number("ranks_per_node", 1, MAX_RANKS_PER_NODE, True)
        link = number("link_Gbps", 1e-4, 100.0)
        up = e.get("uplink_Gbps")
        if up is not None:
            up = number("uplink_Gbps", 1e-4, 100.0)
        measured = e.get("measured") if isinstance(e.get("measured"), dict) else {}
        leaves = number("leaf_count", 1, MAX_NODES, True) if "leaf_count" in e else None
        loads = e.get("loads") or []
        if not isinstance(loads, list) or not all(isinstance(f, dict) for f in loads):
            raise ValueError("emulated.loads: expected a list of flows written by `commtax cluster load`")
        for f in loads:
            ok = all(isinstance(f.get(k), int) and not isinstance(f.get(k), bool) for k in ("src", "dst"))
            if not ok or not isinstance(f.get("rate_Gbps"), (int, float)) or isinstance(f.get("rate_Gbps"), bool):
                raise ValueError(f"emulated.loads: {excerpt(f)} is not a flow written by `commtax cluster load`")
        speeds = _per_node(e, "node_speed", nodes, 0.01, 64.0)
        links = _per_node(e, "node_link_Gbps", nodes, 1e-4, 100.0)
        return cls(
            leaves=leaves,
            loads=loads,
            node_speed=speeds,
            node_link_bit_s=tuple(x * 1e9 for x in links) if links else None,
            nodes=nodes,
            ranks_per_node=ranks,
            link_bit_s=link * 1e9,
            uplink_bit_s=up * 1e9 if up else None,
            mtu=number("mtu", 576, 65000, True, DEFAULT_MTU),
            queue_ms=None if e.get("queue_ms") is None else number("queue_ms", *QUEUE_MS_RANGE),
            tcp=e.get("tcp") if e.get("tcp") in TCP_CONGESTION else None,
            name=name,
            measured=measured,
        )

    # ------------------------------------------------------------------ run
    def torchrun_argv(self, node: int, cmd: list[str], port: int = MASTER_PORT, tmpdir: str | None = None) -> list[str]:
        """torchrun for one node: static rendezvous at node 0's address, gloo bound to eth0.

        The nodes run this process's Python, with its folder first on PATH (``commtax`` and
        ``python`` there are the ones that launched them, also under sudo); ``tmpdir`` holds
        torchrun's log folders, removed after the run; a stopped rank is SIGKILLed 2 s after
        torchrun's SIGTERM, not 30 s.
        """
        env = [
            "env",
            "GLOO_SOCKET_IFNAME=eth0",
            "OMP_NUM_THREADS=1",
            f"COMMTAX_CLUSTER={self.name}",
            "TORCH_CPP_LOG_LEVEL=ERROR",  # no reverse-DNS warnings for our private addresses
            f"{LAUNCHED_ENV}=1",  # a commtax rank stopped by torchrun exits 130 without a line: `run` says it once
            f"PATH={launch_path()}",
            *([f"TMPDIR={tmpdir}"] if tmpdir else []),
        ]
        return [
            "ip",
            "netns",
            "exec",
            self.node_ns(node),
            *env,
            sys.executable,
            "-m",
            "commtax.measure.launch",  # torch.distributed.run, without its traceback when `run` stops it
            f"--nnodes={self.nodes}",
            f"--node-rank={node}",
            f"--nproc-per-node={self.ranks_per_node}",
            f"--master-addr={self.address(0)}",
            f"--master-port={port}",
            "--max-restarts=0",
            "--shutdown-timeout=2",
            "--no-python",
            "--",
            *resolve_command(cmd),
        ]

    def _cgroup_join(self, i: int) -> Callable[[], None] | None:
        """What the launched child runs before exec: join node i's CPU share (``--node-speed``), if it has one."""
        if not self.node_speed:
            return None
        path = cgroups.path_of(self.node_ns(i))
        return lambda: cgroups.join(path)

    def run(self, cmd: list[str], grace_s: float = 60.0, log=print) -> int:
        """Run ``cmd`` on every rank; returns 0 or the first failing node's exit code.

        A node that fails gives the others ``grace_s`` to notice and exit on their own (their
        watchdogs name the dead rank); then everything still running is killed. Ctrl-C and
        SIGTERM kill every launched process tree before returning.
        """
        cmd = resolve_command(cmd)  # raises ValueError (one line) for a program that is not there
        tmp = tempfile.mkdtemp(prefix=f"commtax-{self.name}-")
        procs: list[subprocess.Popen] = []
        first_fail: tuple[int, int] | None = None
        fail_time = 0.0
        old = signal.signal(signal.SIGTERM, _raise_interrupt)
        old_hup = signal.signal(signal.SIGHUP, _raise_interrupt)
        try:
            for i in range(self.nodes):
                into = self._cgroup_join(i)
                procs.append(
                    subprocess.Popen(self.torchrun_argv(i, cmd, tmpdir=tmp), start_new_session=True, preexec_fn=into)
                )
            while any(p.poll() is None for p in procs):
                for i, p in enumerate(procs):
                    if p.returncode not in (None, 0) and first_fail is None:
                        first_fail, fail_time = (i, p.returncode), time.monotonic()
                        log(
                            f"commtax cluster: node {i} ({self.node_ns(i)}) exited with code {p.returncode}; "
                            f"waiting up to {grace_s:g} s for the other nodes"
                        )
                if first_fail and time.monotonic() - fail_time > grace_s:
                    log(f"commtax cluster: killing the nodes still running after {grace_s:g} s")
                    break
                time.sleep(0.1)
        except KeyboardInterrupt:
            log("commtax cluster: interrupted; stopping every rank")
            first_fail = first_fail or (-1, 130)
        finally:
            with _signals_blocked():
                _kill_all(procs)
                kill_namespace_processes(
                    [self.node_ns(i) for i in range(self.nodes)]
                )  # workers torchrun left (stopped)
                shutil.rmtree(tmp, ignore_errors=True)  # torchrun's /tmp/torchelastic_* log folders
            signal.signal(signal.SIGTERM, old)
            signal.signal(signal.SIGHUP, old_hup)
        if first_fail is None:
            bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode]
            first_fail = bad[0] if bad else None
        return 0 if first_fail is None else (first_fail[1] if first_fail[1] > 0 else 1)


def _per_node(e: dict, key: str, nodes: int, lo: float, hi: float) -> tuple[float, ...] | None:
    """``emulated.<key>``: absent, or one number in [lo, hi] per node."""
    v = e.get(key)
    if v is None:
        return None
    ok = isinstance(v, list) and len(v) == nodes
    ok = ok and all(isinstance(x, (int, float)) and not isinstance(x, bool) and lo <= x <= hi for x in v)
    if not ok:
        raise ValueError(
            f"emulated.{key}: expected {nodes} numbers in [{lo:g}, {hi:g}], one per node, got {excerpt(v)}"
        )
    return tuple(float(x) for x in v)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
            time.sleep(0.05)


def existing_namespaces() -> list[str]:
    """Namespaces on this host that look like ours (``ctxXXXXXX-sw`` / ``-n<i>``)."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    names = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
    return [n for n in names if NAME_RE.match(n)]


def kill_namespace_processes(names: list[str]) -> None:
    """SIGTERM, then SIGKILL, every process still inside these namespaces (SIGKILL also ends stopped ones)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [
            int(p)
            for ns in names
            for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        ]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if pids and sig == signal.SIGTERM:
            time.sleep(0.5)


def down_namespaces(names: list[str]) -> list[str]:
    """Kill processes inside, then delete each namespace that exists; returns those removed."""
    present = set(existing_namespaces())
    ours = [ns for ns in names if ns in present]
    kill_namespace_processes(ours)
    for ns in ours:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    for ns in names:  # the nodes' CPU shares (--node-speed), if any
        cgroups.remove(ns)
    return ours


def load_cluster_file(path: Path | str) -> dict:
    """A cluster YAML (or a job file's ``cluster:``), read bounded and strict; not a mapping -> ValueError."""
    from commtax.spec import read_yaml

    data = read_yaml(Path(path))
    if isinstance(data, dict) and "cluster" in data and "emulated" not in data:
        data = data["cluster"]
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a cluster file is a mapping (written by `commtax cluster up`)")
    return data


# ---------------------------------------------------------------------- what runs on the nodes
def launch_path() -> str:
    """PATH for the nodes: this Python's folder (a venv's bin: its commtax, python, torchrun) first."""
    here = str(Path(sys.executable).parent)
    rest = [d for d in os.environ.get("PATH", os.defpath).split(os.pathsep) if d and d != here]
    return os.pathsep.join([here, *rest])


def resolve_command(cmd: list[str]) -> list[str]:
    """``cmd`` with its program made absolute as the nodes will run it: ``python``/``python3`` are this
    Python, ``commtax`` this commtax (its console script, else ``python -m commtax.cli.main``). A program not
    found is a ValueError naming it (one line, before any torchrun starts)."""
    prog, args = cmd[0], list(cmd[1:])
    if prog in ("python", "python3", Path(sys.executable).name):
        return [sys.executable, *args]
    if prog == "commtax":
        script = Path(sys.executable).parent / "commtax"
        if script.is_file() and os.access(script, os.X_OK):
            return [str(script), *args]
        return [sys.executable, "-m", "commtax.cli", *args]
    found = shutil.which(prog, path=launch_path())
    if found is None:
        where = "not an executable file" if os.sep in prog and Path(prog).exists() else "command not found"
        raise ValueError(f"cluster run: {excerpt(prog, 120, quote=False)}: {where}")
    return [os.path.abspath(found) if os.sep in prog else found, *args]


@contextlib.contextmanager
def _signals_blocked():
    """Hold Ctrl-C/SIGTERM/SIGHUP while cleaning up; they are delivered (and handled) afterwards."""
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# ---------------------------------------------------------------------- ownership
def registry_dir() -> Path:
    """Where `cluster up` records who built each cluster (root-only, like the namespaces; tmpfs: gone at boot)."""
    return Path(os.environ.get("COMMTAX_CLUSTER_REGISTRY", "/run/commtax/clusters"))


def owner_uid() -> int:
    """The user behind this command: under sudo the invoking user, else this process's user."""
    sudo = os.environ.get("SUDO_UID", "")
    return int(sudo) if sudo.isdigit() else os.getuid()


def register(cluster: EmulatedCluster, cluster_file: Path | str | None = None) -> None:
    d = registry_dir()
    d.mkdir(parents=True, exist_ok=True, mode=0o755)
    rec = {
        "name": cluster.name,
        "uid": owner_uid(),
        "pid": os.getpid(),
        "created_unix": time.time(),
        "nodes": cluster.nodes,
        "cluster_file": str(Path(cluster_file).resolve()) if cluster_file else None,
    }
    (d / f"{cluster.name}.json").write_text(json.dumps(rec) + "\n")


def set_cluster_file(name: str, cluster_file: Path | str) -> None:
    rec = owner_record(name)
    if rec is not None:
        rec["cluster_file"] = str(Path(cluster_file).resolve())
        (registry_dir() / f"{name}.json").write_text(json.dumps(rec) + "\n")


def owner_record(name: str) -> dict | None:
    try:
        rec = json.loads((registry_dir() / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def forget(name: str) -> None:
    (registry_dir() / f"{name}.json").unlink(missing_ok=True)


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clusters_on_host() -> dict[str, list[str]]:
    """Namespaces that look like ours, by cluster id."""
    out: dict[str, list[str]] = {}
    for ns in existing_namespaces():
        out.setdefault(ns.split("-")[0], []).append(ns)
    return out


def why_not_mine(name: str, names: list[str]) -> str | None:
    """None when this user's commands built cluster ``name`` and nothing runs in it; else the reason to keep it."""
    rec = owner_record(name)
    if rec is None:
        return "no record of who built it (another tool or an older commtax)"
    if rec.get("uid") != owner_uid():
        return f"built by uid {rec.get('uid')}"
    if rec.get("pid") != os.getpid() and _alive(rec.get("pid")) and _process_is_commtax(rec.get("pid")):
        return f"being built or used by process {rec.get('pid')}"
    busy = [
        ns for ns in names if subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    ]
    if busy:
        return f"processes are running in {busy[0]}"
    return None


def _process_is_commtax(pid: int) -> bool:
    try:
        return b"commtax" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # cannot tell: keep it


# ---------------------------------------------------------------------- `cluster up` as a library call
def cluster_from_options(
    nodes: int,
    ranks_per_node: int,
    link: str,
    *,
    node_speed: str | None = None,
    uplink: str | None = None,
    leaves: int | None = None,
    spine: str | None = None,
    mtu: int = DEFAULT_MTU,
    duplex_probe: bool = True,
    queue_ms: float | None = None,
    tcp: str | None = None,
) -> EmulatedCluster:
    """The cluster `cluster up`'s options describe, not built yet; what is wrong is one SpecError naming the option."""
    from commtax.errors import SpecError

    try:
        links = [parse_rate_bit_s(x) for x in link.split(",")]
        uplink_bit_s = parse_rate_bit_s(uplink) if uplink else None
    except ValueError as e:
        raise SpecError(f"--link/--uplink: {e}") from None
    if len(links) not in (1, nodes):
        raise SpecError(f"--link: {len(links)} rates for {nodes} nodes; give one rate, or one per node")
    speeds = None
    if node_speed is not None:
        try:
            speeds = tuple(float(x) for x in node_speed.split(","))
        except ValueError:
            raise SpecError(f"--node-speed: {node_speed!r} is not a comma list of numbers, e.g. 1,0.5") from None
        if len(speeds) != nodes or not all(0.01 <= x <= 64 for x in speeds):
            raise SpecError(
                f"--node-speed: give {nodes} numbers in [0.01, 64] (CPUs per rank), one per node, got {node_speed!r}"
            )
    if uplink and (leaves is not None or spine):
        raise SpecError(
            "--uplink: it is the two-leaf form of --leaves 2 --spine RATE; give --uplink or --leaves/--spine"
        )
    if spine and leaves is None:
        leaves = 2
    if leaves is not None:
        if nodes % leaves:
            raise SpecError(f"--leaves: {leaves} leaves do not split {nodes} nodes evenly; choose a divisor of --nodes")
        if leaves > 1 and not spine:
            raise SpecError(f"--spine: {leaves} leaves need the rate of their links to the spine, e.g. --spine 200mbit")
        try:
            uplink_bit_s = parse_rate_bit_s(spine) if spine and leaves > 1 else None
        except ValueError as e:
            raise SpecError(f"--spine: {e}") from None
    if queue_ms is not None and not QUEUE_MS_RANGE[0] <= queue_ms <= QUEUE_MS_RANGE[1]:  # false for nan
        raise SpecError(
            f"--queue-ms: {queue_ms:g} is outside [{QUEUE_MS_RANGE[0]:g}, {QUEUE_MS_RANGE[1]:g}] ms; give the queue "
            "each shaped link holds, as ms of traffic at its rate, e.g. 5"
        )
    if tcp is not None and tcp not in TCP_CONGESTION:
        raise SpecError(f"--tcp: {excerpt(tcp)} is not one of {', '.join(TCP_CONGESTION)}; leave it out for the host's")
    return EmulatedCluster(
        nodes,
        ranks_per_node,
        min(links),
        uplink_bit_s,
        mtu,
        leaves=leaves,
        node_speed=speeds,
        node_link_bit_s=tuple(links) if len(links) > 1 else None,
        probe_duplex=duplex_probe,
        queue_ms=queue_ms,
        tcp=tcp,
    )


def live_cluster_recorded_in(path: Path) -> EmulatedCluster | None:
    """The cluster the `cluster up` record at ``path`` names while any of its namespaces exists; None for no file,
    a file that is no cluster record (an ordinary file the user chose to replace) or a cluster that is gone."""
    if not path.is_file():
        return None
    try:
        old = EmulatedCluster.from_spec(load_cluster_file(path))
    except Exception:  # not a cluster record
        return None
    return old if set(old.namespaces) & set(existing_namespaces()) else None


def up_recorded(cluster: EmulatedCluster, out: Path, dump: Callable[[dict], str]) -> EmulatedCluster:
    """Build ``cluster`` with its record in ``out`` (``dump``: spec → file text) from before the first namespace, so
    even a SIGKILL leaves something `cluster down` acts on; an interrupted or failed build puts ``out`` back as it
    was (never deletes a file the user had), a finished one writes the measured spec."""
    from commtax.atomic import write_atomic

    prior = out.read_bytes() if out.is_file() else None
    recorded: list[bool] = []

    def record(c: EmulatedCluster) -> None:
        recorded.append(True)
        building = "building (cluster up did not finish: `commtax cluster down --cluster` this file)"
        write_atomic(out, dump({**c.spec(), "status": building}))
        set_cluster_file(c.name, out)

    try:
        check_host()
        cluster.up(record)
    except BaseException:
        if recorded:  # the cluster it recorded is gone again: the file goes back to what it was
            if prior is None:
                out.unlink(missing_ok=True)
            else:
                write_atomic(out, prior)
        raise
    write_atomic(out, dump(cluster.spec()))
    return cluster


def up_summary(c: EmulatedCluster, out: str) -> str:
    """`cluster up`'s one line: the shape built, loopback rate, gloo's κ (or why not measured), the file written."""
    links = c.node_link_bit_s or (c.link_bit_s,)
    m, a2a = c.measured, c.measured.get("gloo_a2a", {})
    kappa = (
        f"; gloo all_to_all duplex κ = {a2a['gloo_a2a_duplex']:g}"
        if "gloo_a2a_duplex" in a2a
        else f"; gloo all_to_all duplex not measured ({a2a['error']})"
        if "gloo_a2a" in m
        else ""
    )
    return (
        f"cluster {c.name}: {c.nodes} nodes × {c.ranks_per_node} ranks, links {','.join(f'{x / 1e6:g}' for x in links)}"
        f" Mbit/s{f', {c.leaf_count} leaves' if c.leaves else ''}"
        f"{', node speeds ' + ','.join(f'{x:g}' for x in c.node_speed) if c.node_speed else ''}"
        f"{f', uplink {c.uplink_bit_s / 1e6:g} Mbit/s' if c.uplink_bit_s else ''}; loopback "
        f"{m['loopback_bw_GBps']:.2f} GB/s{kappa}; wrote {out}"
    )
