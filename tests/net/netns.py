"""Hosts on one machine: one network namespace per host, each with one link (a veth pair) to a
bridge in a hub namespace of its own, so nothing is added to the machine's own network stack.

  hub namespace:  bridge br0 <- v0, v1, ... (the hosts' far ends)
  host i:         eth0 = ADDR_i/24 (SUBNET.(10 + i)), lo

A link's rate is limited with `tc ... tbf` on both of its ends (each direction at the rate, as a
full-duplex link is), and a link is cut with `ip link set ... down` on the host's end. Needs
root and iproute2; every namespace goes in remove(), which also runs on failure.
"""
import os
import shutil
import subprocess

# One tbf "burst" must hold at least what the link sends in one timer tick; a few milliseconds
# of the rate, and never less than a 64 KiB GSO super-packet, which tbf would otherwise refuse.
BURST_S = 0.004
MIN_BURST = 65536


def ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


class Hosts:
    """names: the hosts, in address order. Namespaces are PREFIX-hub and PREFIX-NAME, with a
    prefix unique to this process so that runs side by side do not meet."""

    def __init__(self, names, subnet="10.231.0"):
        self.prefix = f"adjsh{os.getpid()}"
        self.names = list(names)
        self.subnet = subnet
        self.hub = f"{self.prefix}-hub"
        self.made = []
        self.rates = {}

    def ns(self, name):
        return f"{self.prefix}-{name}"

    def addr(self, name):
        return f"{self.subnet}.{10 + self.names.index(name)}"

    def _far(self, name):
        return f"v{self.names.index(name)}"

    def create(self):
        ip("netns", "add", self.hub)
        self.made.append(self.hub)
        ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        ip("-n", self.hub, "link", "set", "br0", "up")
        ip("-n", self.hub, "link", "set", "lo", "up")
        for name in self.names:
            ns, far = self.ns(name), self._far(name)
            ip("netns", "add", ns)
            self.made.append(ns)
            ip("-n", self.hub, "link", "add", far, "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            ip("-n", self.hub, "link", "set", far, "master", "br0")
            ip("-n", self.hub, "link", "set", far, "up")
            ip("-n", ns, "addr", "add", f"{self.addr(name)}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")

    def exec_prefix(self, name):
        """The command prefix that runs a program on host `name` (ip netns exec execs it: the
        process is the program itself)."""
        return ["ip", "netns", "exec", self.ns(name)]

    def _tc(self, ns, dev, rate_bps):
        subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"],
                       capture_output=True, timeout=30)
        if rate_bps is None:
            return
        burst = max(MIN_BURST, int(rate_bps / 8 * BURST_S))
        r = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                            f"{int(rate_bps)}bit", "burst", str(burst), "latency", "200ms"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"tc tbf on {ns} {dev}: {r.stderr.strip()}")

    def limit(self, name, rate_bps):
        """The link of host `name` at rate_bps each way (None: unlimited)."""
        self._tc(self.ns(name), "eth0", rate_bps)
        self._tc(self.hub, self._far(name), rate_bps)
        self.rates[name] = rate_bps

    def limit_all(self, rate_bps):
        for name in self.names:
            self.limit(name, rate_bps)

    def cut(self, name):
        ip("-n", self.ns(name), "link", "set", "eth0", "down")

    def restore(self, name):
        ip("-n", self.ns(name), "link", "set", "eth0", "up")  # its address stayed on it

    def remove(self):
        """Deletes every namespace made (their links with them); returns those that stayed."""
        left = []
        for ns in reversed(self.made):
            if ip("netns", "del", ns, check=False).returncode != 0:
                left.append(ns)
        self.made = []
        return left


def missing_tools():
    if os.geteuid() != 0:
        return "not root (network namespaces need it)"
    for tool in ["ip", "tc"]:
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2)"
    return None
