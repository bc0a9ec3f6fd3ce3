#!/usr/bin/env python3
"""delay_proxy.py: a TCP forwarder that delays each direction on its own, for the timeline's
asymmetric-path scenarios (tests/integration/test_timeline.sh, TR_TIMELINE_SCENARIO=asym|jitter).

Usage: delay_proxy.py LISTEN_HOST:PORT TARGET_HOST:PORT UP_US DOWN_US [JITTER_US]
Every byte read from the client (the agent) reaches the target (the service) UP_US
microseconds later, every byte back DOWN_US later, plus a uniform random 0..JITTER_US drawn
per read in each direction; order within a direction is kept (a read is never sent before the
one ahead of it). Delays are slept with nanosleep, not polled, so the proxy costs little CPU.
Serves connections one after another until killed; a test kills it by PID."""
import collections
import random
import socket
import sys
import threading
import time


def hostport(s):
    host, port = s.rsplit(":", 1)
    return host, int(port)


def pump(src, dst, delay_ns, jitter_ns):
    """Reads src; a second thread writes each piece to dst once its time has come."""
    queue = collections.deque()
    cond = threading.Condition()
    done = []

    def sender():
        while True:
            with cond:
                while not queue and not done:
                    cond.wait()
                if not queue:
                    break
                due, data = queue.popleft()
            wait = due - time.monotonic_ns()
            if wait > 0:
                time.sleep(wait / 1e9)
            try:
                dst.sendall(data)
            except OSError:
                break
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    t = threading.Thread(target=sender, daemon=True)
    t.start()
    last_due = 0
    while True:
        try:
            data = src.recv(65536)
        except OSError:
            data = b""
        if not data:
            break
        due = time.monotonic_ns() + delay_ns + (random.randint(0, jitter_ns) if jitter_ns else 0)
        last_due = max(due, last_due)  # never overtake the piece ahead
        with cond:
            queue.append((last_due, data))
            cond.notify()
    with cond:
        done.append(True)
        cond.notify()
    t.join()


def serve(client, target, up_ns, down_ns, jitter_ns):
    upstream = socket.create_connection(target)
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    a = threading.Thread(target=pump, args=(client, upstream, up_ns, jitter_ns), daemon=True)
    b = threading.Thread(target=pump, args=(upstream, client, down_ns, jitter_ns), daemon=True)
    a.start()
    b.start()
    a.join()
    b.join()
    client.close()
    upstream.close()


def main():
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    listen, target = hostport(sys.argv[1]), hostport(sys.argv[2])
    up_ns, down_ns = int(float(sys.argv[3]) * 1000), int(float(sys.argv[4]) * 1000)
    jitter_ns = int(float(sys.argv[5]) * 1000) if len(sys.argv) == 6 else 0
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(listen)
    srv.listen(4)
    while True:
        client, _ = srv.accept()
        threading.Thread(target=serve, args=(client, target, up_ns, down_ns, jitter_ns),
                         daemon=True).start()


if __name__ == "__main__":
    main()
