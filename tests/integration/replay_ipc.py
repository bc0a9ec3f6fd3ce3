"""replay_ipc.py SOCKET STREAM REPLIES: sends a recorded client byte stream (a vector's
X.to-service.bin: length-prefixed IPC frames) to a UNIX socket as the real client sent it, then
waits up to 10 s for REPLIES frames back before closing, as the client did once answered."""
import socket
import struct
import sys
import time

sock_path, stream_path, replies = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(stream_path, "rb") as f:
    stream = f.read()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sock_path)
s.sendall(stream)
buf, frames, deadline = b"", 0, time.monotonic() + 10
s.settimeout(1)
while frames < replies and time.monotonic() < deadline:
    try:
        data = s.recv(65536)
    except socket.timeout:
        continue
    if not data:
        break
    buf += data
    while len(buf) >= 4 and len(buf) >= 4 + struct.unpack("<I", buf[:4])[0]:
        buf = buf[4 + struct.unpack("<I", buf[:4])[0]:]
        frames += 1
s.close()
if frames < replies:
    sys.exit("replay_ipc: %d of %d replies from %s" % (frames, replies, sock_path))
