"""Network partitions for the nemesis run: one network namespace per node, on one bridge.

Topology of a run (``Network(run_id, nodes)``), all of it on this machine::

    root namespace                                node namespaces
    bridge mqn<run>-br  10.213.X.1/24 (gateway)   mqn<run>-0: mqn<run>-0n 10.213.X.10/24
                        10.213.X.2/32 (stores)    mqn<run>-1: mqn<run>-1n 10.213.X.11/24   ...
       | veth mqn<run>-0h, mqn<run>-1h ...

Each node namespace has a veth pair whose root end is a port of the run's bridge; the stores
(PostgreSQL, Redis) listen on ``store_host``, an address of the bridge, which the root namespace
(the run's clients) reaches as a local address and every node reaches over the bridge. Nodes
reach each other over the bridge too, so nothing is routed and the root namespace's
``ip_forward`` is left as it is. The third octet X is the first one no address of the root
namespace uses, taken under a lock, so that runs side by side get subnets of their own.

A cut is made inside the cut node's namespace (and, for peers, inside the peers' namespaces
too, so that both directions are cut); the run's clients in the root namespace still reach
every node. Two kinds (measured with a TCP echo server on ``store_host``, a client in a node
namespace):

- ``"drop"`` (the default, a real partition): the namespace's neighbour entry for the address
  is replaced by a permanent one with a MAC address nobody has, so frames leave and are lost.
  A new ``connect()`` hangs until its timeout (then the kernel's SYN retries, about two
  minutes); an established connection hangs (a read with a 4 s timeout times out). After a
  heal a new connection works at once; an established one resumes at the next TCP
  retransmission, whose back-off grew during the cut (a cut of 10 s: not within the next 4 s).
- ``"reject"``: an ``unreachable`` route; a new ``connect()`` fails at once with
  ``EHOSTUNREACH`` (errno 113), an established connection hangs as above and resumes at once
  after the heal. (A ``blackhole`` route is the same but fails a new ``connect()`` with
  ``EINVAL``, errno 22.)

Every name the run makes starts with ``mqn`` and the run's id; the bridge's alias records the
process that made it, and :func:`remove_leftovers` removes what a process that died left.
Everything here needs root and ``ip`` (iproute2); ``Network.available()`` says whether this
machine can.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal

#: What every name this module makes starts with.
PREFIX = "mqn"
#: The /16 that runs' subnets come from (a private range nothing else on these machines uses).
NETWORK = ipaddress.IPv4Network("10.213.0.0/16")
#: A MAC address no interface has: a cut node's frames to a cut address go there and are lost.
NOWHERE_MAC = "02:00:00:00:00:01"
#: Serializes the choice of a subnet between runs on this machine.
LOCK_PATH = Path("/run/lock/mqn-netns.lock")

#: At most this many nodes (their index is part of an interface name).
MAX_NODES = 99
_RUN_ID = re.compile(r"^[a-z0-9]{1,8}$")
Cut = Literal["drop", "reject"]


class NetworkError(RuntimeError):
    """An ``ip`` command failed (its arguments and its error output are in the message)."""


def _ip(*args: str, check: bool = True) -> str:
    ip = shutil.which("ip")
    if ip is None:
        raise NetworkError("no `ip` command (iproute2)")
    # our own arguments: names and addresses this module made
    done = subprocess.run([ip, *args], capture_output=True, text=True, timeout=30)  # noqa: S603
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _links() -> dict[str, str]:
    """Every link of the root namespace by name, with its alias ('' when none)."""
    found: dict[str, str] = {}
    for line in _ip("-o", "link", "show").splitlines():
        # "7: mqnab0h@if2: <BROADCAST,...> ... \    alias pid=123"
        parts = line.split(": ", 2)
        if len(parts) < 3:
            continue
        name = parts[1].split("@")[0]
        alias = re.search(r"\balias (.*)$", parts[2])
        found[name] = alias.group(1).strip() if alias else ""
    return found


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Network:
    """One run's namespaces (one per node), their bridge and the stores' address.

    A context manager: ``__enter__`` makes everything, ``__exit__`` (or :meth:`close`) removes
    it, also after a failure halfway through making it. ``run_id``: 1 to 8 of ``[a-z0-9]``
    (interface names are at most 15 characters); ``nodes``: the nodes' names, in order.
    ``cut``: what a cut does (see the module's docstring).
    """

    def __init__(self, run_id: str, nodes: list[str], *, cut: Cut = "drop") -> None:
        if not _RUN_ID.match(run_id):
            raise ValueError(f"run_id must be 1 to 8 of [a-z0-9], not {run_id!r}")
        if not 1 <= len(nodes) <= MAX_NODES or len(set(nodes)) != len(nodes):
            raise ValueError(f"nodes must be 1 to {MAX_NODES} distinct names, not {nodes!r}")
        if cut not in ("drop", "reject"):
            raise ValueError(f"cut must be 'drop' or 'reject', not {cut!r}")
        self.run_id, self.nodes, self.cut = run_id, list(nodes), cut
        self.bridge = f"{PREFIX}{run_id}-br"
        self._subnet: ipaddress.IPv4Network | None = None
        #: (namespace, address) pairs currently cut, by the node whose cut made them.
        self._cuts: dict[str, set[tuple[str, str]]] = {n: set() for n in nodes}
        self._made = False

    # ------------------------------------------------------------------ names and addresses

    def namespace(self, name: str) -> str:
        """The network namespace of node ``name``."""
        return f"{PREFIX}{self.run_id}-{self._index(name)}"

    def _index(self, name: str) -> int:
        try:
            return self.nodes.index(name)
        except ValueError:
            raise KeyError(f"no node {name!r} in this network ({self.nodes})") from None

    def _iface(self, name: str) -> str:
        """The node's end of its veth pair (inside its namespace)."""
        return f"{PREFIX}{self.run_id}-{self._index(name)}n"

    def _host_iface(self, i: int) -> str:
        return f"{PREFIX}{self.run_id}-{i}h"

    def _addr(self, host: int) -> str:
        if self._subnet is None:
            raise NetworkError("the network is not made yet (use it as a context manager)")
        return str(self._subnet.network_address + host)

    @property
    def gateway(self) -> str:
        """The bridge's own address: the source of the root namespace's traffic to the nodes."""
        return self._addr(1)

    @property
    def store_host(self) -> str:
        """The address the stores listen on: reachable from the root namespace and every node."""
        return self._addr(2)

    def node_host(self, name: str) -> str:
        """The address node ``name`` binds and advertises: reachable from the root namespace and
        from the other nodes' namespaces."""
        return self._addr(10 + self._index(name))

    def wrap(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside node ``name``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(name), *argv]

    # ------------------------------------------------------------------ making and removing

    def __enter__(self) -> Network:
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _make(self) -> None:
        if self._made:
            raise NetworkError(f"network {self.run_id} is made already")
        self._made = True
        with open(LOCK_PATH, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.bridge in _links():
                raise NetworkError(f"{self.bridge} exists: another run uses the id {self.run_id!r}")
            self._subnet = self._free_subnet()
            # the bridge holds the subnet from here on: the next run's choice sees it
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "alias", f"pid={os.getpid()}")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("addr", "add", f"{self.store_host}/32", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self.nodes):
            ns, inner, outer = self.namespace(name), self._iface(name), self._host_iface(i)
            _ip("netns", "add", ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns)
            _ip("link", "set", outer, "master", self.bridge, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{self.node_host(name)}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")

    def _free_subnet(self) -> ipaddress.IPv4Network:
        used = set()
        for line in _ip("-o", "-4", "addr", "show").splitlines():
            m = re.search(r"\binet (\d+\.\d+\.\d+\.\d+)", line)
            if m and ipaddress.IPv4Address(m.group(1)) in NETWORK:
                used.add(int(m.group(1).split(".")[2]))
        for third in range(1, 255):
            if third not in used:
                return ipaddress.IPv4Network(f"{NETWORK.network_address + third * 256}/24")
        raise NetworkError(f"every /24 of {NETWORK} is in use")

    def close(self) -> None:
        """Remove every namespace, link and address of this run (the veth pairs go with their
        namespaces, the addresses with the bridge). Safe to call twice."""
        for ns in _namespaces():
            if ns.startswith(f"{PREFIX}{self.run_id}-"):
                _ip("netns", "del", ns, check=False)
        for link in _links():
            if re.fullmatch(rf"{PREFIX}{self.run_id}-(\d+h|br)", link):
                _ip("link", "del", link, check=False)
        self._cuts = {n: set() for n in self.nodes}

    # ------------------------------------------------------------------ faults

    def _cut(self, by: str, ns_node: str, address: str) -> None:
        ns = self.namespace(ns_node)
        if (ns, address) in self._cuts[by]:
            return
        if self.cut == "drop":
            _ip(
                "-n",
                ns,
                "neigh",
                "replace",
                address,
                "lladdr",
                NOWHERE_MAC,
                "dev",
                self._iface(ns_node),
                "nud",
                "permanent",
            )
        else:
            _ip("-n", ns, "route", "add", "unreachable", f"{address}/32")
        self._cuts[by].add((ns, address))

    def cut_from_stores(self, name: str) -> None:
        """Node ``name`` can no longer reach ``store_host`` (its connections there hang)."""
        self._cut(name, name, self.store_host)

    def cut_from_peers(self, name: str) -> None:
        """Node ``name`` and every other node can no longer reach each other (both directions);
        the stores and the root namespace's clients still reach all of them."""
        for peer in self.nodes:
            if peer != name:
                self._cut(name, name, self.node_host(peer))
                self._cut(name, peer, self.node_host(name))

    def heal(self, name: str) -> None:
        """Undo every cut made by ``cut_from_stores(name)`` and ``cut_from_peers(name)``."""
        for ns, address in sorted(self._cuts[name]):
            node = self.nodes[int(ns.rsplit("-", 1)[1])]
            if self.cut == "drop":
                _ip("-n", ns, "neigh", "del", address, "dev", self._iface(node), check=False)
            else:
                _ip("-n", ns, "route", "del", "unreachable", f"{address}/32", check=False)
        self._cuts[name] = set()

    # ------------------------------------------------------------------ this machine

    @staticmethod
    def available() -> tuple[bool, str]:
        """Whether this machine can make a network (root, ``ip``, namespaces, veth pairs and a
        bridge), and why not when it cannot: it makes a small one and removes it."""
        if os.geteuid() != 0:
            return False, "network namespaces need root"
        if shutil.which("ip") is None:
            return False, "no `ip` command (iproute2)"
        probe = Network(f"p{os.getpid() % 10_000_000}", ["probe"])
        try:
            with probe:
                pass
        except (NetworkError, OSError, subprocess.SubprocessError) as e:
            return False, f"cannot make a network namespace with a veth pair on a bridge: {e}"
        return True, "root, ip netns, veth and bridge work"


def remove_leftovers(prefix: str = PREFIX) -> list[str]:
    """Remove the namespaces and links of runs whose process is gone (a run that was killed):
    every link named ``<prefix>...`` and namespace ``<prefix>...-N`` whose run's bridge records
    a process that no longer exists, or has no bridge. Runs still going are left alone. Returns
    the names removed."""
    links = _links()
    alive: set[str] = set()
    for link, alias in links.items():
        m = re.fullmatch(rf"{re.escape(prefix)}([a-z0-9]+)-br", link)
        pid = re.fullmatch(r"pid=(\d+)", alias)
        if m and pid and pid_alive(int(pid.group(1))):
            alive.add(m.group(1))
    removed: list[str] = []
    for ns in _namespaces():
        m = re.fullmatch(rf"{re.escape(prefix)}([a-z0-9]+)-\d+", ns)
        if m and m.group(1) not in alive:
            _ip("netns", "del", ns, check=False)
            removed.append(ns)
    for link in _links():
        m = re.fullmatch(rf"{re.escape(prefix)}([a-z0-9]+)-(\d+h|br)", link)
        if m and m.group(1) not in alive:
            _ip("link", "del", link, check=False)
            removed.append(link)
    return removed
