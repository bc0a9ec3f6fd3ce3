"""replay_ipc.py SOCKET STREAM REPLIES [HOLD]: sends a recorded client byte stream (a vector's
X.to-service.bin: length-prefixed IPC frames) to SOCKET, a UNIX socket path or ADDR:PORT (TCP:
a traced_relay's stream to a relay endpoint), as the real client sent it, then waits up to 10 s
for REPLIES frames back before closing, as the client did once answered. With HOLD, it prints
one line per reply frame ("REQUEST_ID bind_reply ok|refused" or "REQUEST_ID reply ok|failed
[use_shmem_emulation=0|1]") and keeps the connection open while the file HOLD exists (at most
60 s), so a test can look at what the connection made while it lasts."""
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import pbwire  # noqa: E402

target, stream_path, replies = sys.argv[1], sys.argv[2], int(sys.argv[3])
hold = sys.argv[4] if len(sys.argv) > 4 else None
with open(stream_path, "rb") as f:
    stream = f.read()
if os.path.sep in target or ":" not in target:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(target)
else:
    host, port = target.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
s.sendall(stream)
buf, frames, deadline = b"", [], time.monotonic() + 10
s.settimeout(1)
while len(frames) < replies and time.monotonic() < deadline:
    try:
        data = s.recv(65536)
    except socket.timeout:
        continue
    if not data:
        break
    more, buf = pbwire.split_frames(buf + data)
    frames += more


def describe(frame):
    rid = pbwire.first(frame, 2, 0)
    bound = pbwire.first(frame, 4)
    if bound is not None:
        return "%d bind_reply %s" % (rid, "ok" if pbwire.first(bound, 1, 0) else "refused")
    r = pbwire.first(frame, 6)
    if r is None:
        return "%d other" % rid
    reply = pbwire.first(r, 3, b"")
    # request 2 of a producer is InitializeConnection: its field 3 is use_shmem_emulation
    emu = pbwire.first(reply, 3) if rid == 2 and reply else None
    return "%d reply %s %s" % (rid, "ok" if pbwire.first(r, 1, 0) else "failed",
                               "" if emu is None else "use_shmem_emulation=%d" % emu)


if hold is not None:
    for fr in frames:
        print(describe(fr))
    sys.stdout.flush()
    end = time.monotonic() + 60
    while os.path.exists(hold) and time.monotonic() < end:
        time.sleep(0.1)
s.close()
if len(frames) < replies:
    sys.exit("replay_ipc: %d of %d replies from %s" % (len(frames), replies, target))
