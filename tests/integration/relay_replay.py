"""relay_replay.py ADDR:PORT STREAM REPLIES HOLD: replays a recorded traced_relay byte stream
(a vector's X.to-service.bin) over TCP to an agent's relay endpoint as traced_relay sent it to
traced, waits up to 10 s for REPLIES frames back, prints one line per reply frame ("REQUEST_ID
KIND [use_shmem_emulation=0|1]"), then keeps the connection open while the file HOLD exists
(at most 60 s), so the test can look at the guest it made while its relay is connected."""
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import pbwire  # noqa: E402

addr, stream_path, replies, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
host, port = addr.rsplit(":", 1)
with open(stream_path, "rb") as f:
    stream = f.read()
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
    buf += data
    while len(buf) >= 4 and len(buf) >= 4 + struct.unpack("<I", buf[:4])[0]:
        n = struct.unpack("<I", buf[:4])[0]
        frames.append(buf[4:4 + n])
        buf = buf[4 + n:]
for fr in frames:
    rid = pbwire.first(fr, 2, 0)
    if pbwire.first(fr, 4) is not None:
        print(rid, "bind_reply", "ok" if pbwire.first(pbwire.first(fr, 4), 1, 0) else "refused")
    elif pbwire.first(fr, 6) is not None:
        r = pbwire.first(fr, 6)
        reply = pbwire.first(r, 3, b"")
        ok = "ok" if pbwire.first(r, 1, 0) else "failed"
        # InitializeConnectionResponse: 3 use_shmem_emulation
        emu = pbwire.first(reply, 3) if rid == 2 and reply else None
        print(rid, "reply", ok, "" if emu is None else "use_shmem_emulation=%d" % emu)
    else:
        print(rid, "other")
sys.stdout.flush()
end = time.monotonic() + 60
while os.path.exists(hold) and time.monotonic() < end:
    time.sleep(0.1)
s.close()
if len(frames) < replies:
    sys.exit("relay_replay: %d of %d replies from %s" % (len(frames), replies, addr))
