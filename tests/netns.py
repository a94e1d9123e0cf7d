"""Hosts in network namespaces for partition tests (root only): every host is a namespace with a service link to
one bridge on this machine, and a link of its own to each peer, so that any pair can be cut and healed alone.

Addresses, all on private test subnets that exist only on this machine:
- the bridge has ``SERVICE.1`` on the machine's side; services the hosts share (Kafka, MinIO) listen there;
- host ``i`` has ``SERVICE.(10+i)`` on its service link and its own address ``HOSTS.(1+i)``, on its loopback;
- a pair link joins two hosts through a bridge of its own (two veth pairs); each host routes the other's own
  address over it, and nothing else does (no default route, no forwarding on this machine), so a cut pair link
  is a partition between those two hosts and nothing more.

A cut sets the machine's ends of the link's veth pairs down: the hosts' ends lose their carrier and drop what they
send, as a pulled cable or a failed switch port does (``tc netem`` is not available here). The machine itself (the
test process, Kafka, MinIO) reaches every host over the service bridge.

Everything is named with one prefix and removed by ``close`` (and by ``sweep`` after a run that died: ``python -m
tests.netns --sweep``).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from dataclasses import dataclass, field

PREFIX = "shp"
SERVICE = "10.231.7"
HOSTS = "10.231.8"


def ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def sweep(prefix: str = PREFIX) -> list[str]:
    """Remove every namespace and link named with ``prefix`` (what a killed run left); return their names."""
    removed = []
    for line in ip("netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(prefix):
            ip("netns", "delete", name, check=False)
            removed.append(name)
    for line in ip("-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(prefix):
            ip("link", "delete", name, check=False)  # a veth's peer goes with it
            removed.append(name)
    return removed


@dataclass
class Network:
    """``names`` hosts (namespaces ``<prefix>-<name>``), fully meshed but for the pairs in ``apart`` (never
    linked), and a service bridge to this machine."""

    names: list[str]
    apart: set[frozenset[str]] = field(default_factory=set)
    prefix: str = PREFIX
    cut_links: set[frozenset[str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("network namespaces need root")
        self.index = {n: i for i, n in enumerate(self.names)}
        self.bridge = f"{self.prefix}br"
        self.pairs = [frozenset(p) for p in itertools.combinations(self.names, 2) if frozenset(p) not in self.apart]

    @property
    def service_address(self) -> str:
        """This machine's address on the service bridge (what shared services listen on)."""
        return f"{SERVICE}.1"

    def address(self, name: str) -> str:
        """Host ``name``'s own address (what its peers and this machine reach it at)."""
        return f"{HOSTS}.{1 + self.index[name]}"

    def namespace(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def wrap(self, name: str) -> list[str]:
        """The command prefix that runs a program inside host ``name``."""
        return ["ip", "netns", "exec", self.namespace(name)]

    def _ports(self, pair: frozenset[str]) -> list[str]:
        """The machine's ends of a pair link's two veth pairs."""
        a, b = sorted(pair, key=self.index.__getitem__)
        i, j = self.index[a], self.index[b]
        return [f"{self.prefix}{i}{j}a", f"{self.prefix}{i}{j}b"]

    def start(self) -> Network:
        sweep(self.prefix)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.service_address}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for name, i in self.index.items():
            ns = self.namespace(name)
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "addr", "add", f"{self.address(name)}/32", "dev", "lo")
            port = f"{self.prefix}s{i}"
            ip("link", "add", port, "type", "veth", "peer", "name", "svc", "netns", ns)
            ip("link", "set", port, "master", self.bridge)
            ip("link", "set", port, "up")
            ip("-n", ns, "addr", "add", f"{SERVICE}.{10 + i}/24", "dev", "svc")
            ip("-n", ns, "link", "set", "svc", "up")
            ip("route", "add", f"{self.address(name)}/32", "via", f"{SERVICE}.{10 + i}")
        for pair in self.pairs:
            a, b = sorted(pair, key=self.index.__getitem__)
            bridge = f"{self.prefix}b{self.index[a]}{self.index[b]}"
            ip("link", "add", bridge, "type", "bridge")
            ip("link", "set", bridge, "up")
            for (me, other), port in zip([(a, b), (b, a)], self._ports(pair), strict=True):
                inside = f"to{self.index[other]}"
                ip("link", "add", port, "type", "veth", "peer", "name", inside, "netns", self.namespace(me))
                ip("link", "set", port, "master", bridge)
                ip("link", "set", port, "up")
                ns = self.namespace(me)
                ip("-n", ns, "link", "set", inside, "up")
                ip("-n", ns, "route", "add", f"{self.address(other)}/32", "dev", inside, "src", self.address(me))

    def cut(self, a: str, b: str) -> None:
        """Partition hosts ``a`` and ``b`` (each still reaches the others and this machine)."""
        pair = frozenset((a, b))
        for port in self._ports(pair):
            ip("link", "set", port, "down")
        self.cut_links.add(pair)

    def heal(self, a: str, b: str) -> None:
        pair = frozenset((a, b))
        for port in self._ports(pair):
            ip("link", "set", port, "up")
        for me, other in ((a, b), (b, a)):  # forget the failed address resolutions of the cut
            ip("-n", self.namespace(me), "neigh", "flush", "dev", f"to{self.index[other]}")
        self.cut_links.discard(pair)

    def reaches(self, source: str, address: str, port: int, timeout: float = 1.0) -> bool:
        """Whether a TCP connection from inside host ``source`` to ``address:port`` opens within ``timeout``."""
        probe = f"import socket; socket.create_connection(({address!r}, {port}), timeout={timeout})"
        return subprocess.run([*self.wrap(source), sys.executable, "-c", probe], capture_output=True,
                              check=False, timeout=timeout + 30).returncode == 0

    def across(self, side: set[str]) -> list[tuple[str, str]]:
        """The pair links between ``side`` and the other hosts (what a partition of ``side`` cuts)."""
        return [(a, b) for a in sorted(side) for b in self.names if b not in side and frozenset((a, b)) in self.pairs]

    def heal_all(self) -> None:
        for pair in list(self.cut_links):
            self.heal(*sorted(pair))

    def close(self) -> None:
        """Remove every namespace and link this network made (processes inside must have been stopped)."""
        sweep(self.prefix)


if __name__ == "__main__":
    if sys.argv[1:] == ["--sweep"]:
        print("\n".join(sweep()) or "nothing to remove")
    else:
        sys.exit("usage: python -m tests.netns --sweep")
