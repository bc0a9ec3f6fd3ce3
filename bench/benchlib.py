"""benchlib.py: what the Python benches (bench_relay, bench_flood, bench_agents, bench_tiers)
share: CPU time, system calls (perf stat, or read/write calls from /proc) and RSS of a process,
the whole machine's busy CPU time, a free loopback port, waiting for a daemon's socket or a log line, stopping a
process, the hosts of `tracerelay status`, and a service's /metrics histograms."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid, tid=None):
    """utime + stime of a process (and its threads), or of its thread tid (its main thread: tid =
    pid), in seconds; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # fields 14 and 15 of stat(5)
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0.0


def stime_s(pid):
    """The kernel's CPU time for a process (its system calls), in seconds; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[12]) / TICK  # field 15 of stat(5)
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0.0


def rw_syscalls(pid):
    """The read and write system calls of a process (all its threads) so far: syscr + syscw of
    /proc/PID/io (read, readv, write, writev and their kin; not epoll_wait); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/io") as f:
            fields = dict(line.split(":") for line in f)
        return int(fields["syscr"]) + int(fields["syscw"])
    except (FileNotFoundError, ProcessLookupError, KeyError):
        return 0


class SyscallCount:
    """The system calls a process makes from its construction until stop(): in all and by name
    (SYSCALL_NAMES), counted by `perf stat` on the syscall tracepoints (needs perf and the right
    to attach to the process: root, or perf_event_paranoid <= 1 for one's own); where perf cannot,
    only the read and write calls (syscr + syscw, which do not count recvmsg and sendmsg)."""
    NAMES = ("epoll_wait", "read", "write", "readv", "writev", "recvmsg", "sendmsg")

    def __init__(self, pid, out_path):
        self.pid, self.path, self.rw0, self.perf = pid, out_path, rw_syscalls(pid), None
        if shutil.which("perf"):
            events = ["raw_syscalls:sys_enter"] + [f"syscalls:sys_enter_{n}" for n in self.NAMES]
            self.perf = subprocess.Popen(
                ["perf", "stat", "-x,", "-o", out_path, "-p", str(pid)]
                + sum((["-e", e] for e in events), []),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self):
        """{"all": calls or None without perf, each name: calls, "rw": syscr + syscw}."""
        out = {"all": None, "rw": rw_syscalls(self.pid) - self.rw0}
        if self.perf is None or self.perf.poll() is not None:  # none, or it could not attach
            return out
        self.perf.send_signal(signal.SIGINT)
        self.perf.wait(10)
        with open(self.path) as f:  # "count,unit,event,..." ("<not counted>": it never ran)
            for fields in (line.strip().split(",") for line in f):
                if len(fields) > 2 and fields[2].startswith(("raw_syscalls:", "syscalls:")):
                    name = fields[2].split("sys_enter")[1].lstrip("_") or "all"
                    out[name] = int(fields[0]) if fields[0].isdigit() else 0
        return out


def machine_busy_s():
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    return (sum(v) - idle) / TICK, sum(v) / TICK


def rss_kib(pid):
    """Resident set size of a process in KiB; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(path, proc, what, prog):
    """Waits up to 10 s for proc to create path; exits naming prog and what otherwise."""
    for _ in range(100):
        if os.path.exists(path):
            return
        if proc.poll() is not None:
            sys.exit(f"{prog}: {what} exited ({proc.returncode}) before creating {path}")
        time.sleep(0.1)
    sys.exit(f"{prog}: {what} did not create {path} in 10 s")


def stop(proc, timeout=10):
    """SIGTERM, then SIGKILL after timeout seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def status_hosts(bin_dir, consumer):
    """The hosts of `tracerelay status --json` at the consumer socket; [] if it does not answer."""
    r = subprocess.run([f"{bin_dir}/tracerelay", "status", "--socket", consumer, "--json"],
                       capture_output=True, text=True)
    return json.loads(r.stdout).get("hosts", []) if r.returncode == 0 else []


def connected(bin_dir, consumer):
    """How many hosts the service shows connected."""
    return sum(1 for h in status_hosts(bin_dir, consumer) if h.get("connected"))


def all_started(bin_dir, consumer, n):
    """Every one of the n hosts has a session whose data source instances all started."""
    done = sum(1 for h in status_hosts(bin_dir, consumer)
               if any(s["instances"] and s["instances_started"] == s["instances"]
                      for s in h.get("sessions", [])))
    return done == n


def scrape_page(port, timeout=60, host_series=False):
    """A daemon's /metrics page; without the per-host series unless asked (a 10,000-host root's
    full page is 19 MB; builds before `?hosts=none` serve the whole page either way)."""
    query = "" if host_series else "?hosts=none"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics{query}", timeout=timeout) as r:
        return r.read().decode()


def scrape_histogram(port, name, timeout=10):
    """(upper bound, cumulative count) pairs of a histogram on a /metrics page."""
    out = []
    for line in scrape_page(port, timeout).splitlines():
        if line.startswith(name + "_bucket{le=\""):
            le = line.split('"')[1]
            out.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
    return out


def scrape_value(port, name, timeout=60):
    """The value of an unlabelled sample on a /metrics page, or None if it is not there."""
    for line in scrape_page(port, timeout).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def scrape_sum(port, name, timeout=60):
    """The sum of every sample of a family (all label sets) on the whole /metrics page."""
    text = scrape_page(port, timeout, host_series=True)
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def histogram_count(buckets):
    """How many observations a histogram's cumulative (upper bound, count) buckets hold."""
    return buckets[-1][1] if buckets else 0


def quantile(q, buckets):
    """Prometheus' histogram_quantile: linear within the bucket that holds rank q * count."""
    total = histogram_count(buckets)
    if total == 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for le, cum in buckets:
        if cum >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / max(cum - below, 1)
        lower, below = le, cum
    return lower


def within(buckets, bound):
    """The share of a histogram's observations at most bound (a bucket's upper bound: exact),
    or None if it has none."""
    total = histogram_count(buckets)
    below = [cum for le, cum in buckets if le == bound]
    return below[0] / total if total and below else None


def wait_for_line(path, text, limit):
    """Waits up to limit seconds for a line containing text in the file at path."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        with open(path) as f:
            if any(text in line for line in f):
                return True
        time.sleep(0.05)
    return False
