"""benchlib.py: what the Python benches (bench_relay, bench_flood, bench_agents) share: CPU
time and RSS of a process from /proc, the whole machine's busy CPU time, a free loopback port, waiting for a daemon's socket and
stopping a process."""
import os
import signal
import socket
import subprocess
import sys
import time

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
