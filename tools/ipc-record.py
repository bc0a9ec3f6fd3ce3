#!/usr/bin/env python3
"""ipc-record.py: records a Perfetto IPC conversation between a real client (an SDK app, the
perfetto CLI) and a real traced, for tests/vectors/. It listens on a UNIX socket, connects each
client to traced's socket and passes every frame on unchanged, file descriptors included
(SCM_RIGHTS, attached to the frame they came with). For connection N it writes:

  PREFIX.N.to-service.bin   client -> traced bytes (uint32 LE length + IPCFrame, repeated)
  PREFIX.N.to-client.bin    traced -> client bytes
  PREFIX.N.pages.bin        for a producer on shared memory: before each CommitData reaches
                            traced, the shared-memory pages it names, as the client wrote them:
                            records of uint32 LE frame_index (of to-service.bin), page,
                            page_size, then page_size bytes

Frames are parsed only to find CommitData, the SMB's page size (setup_tracing) and its fd; the
bytes are never changed. Stops after --connections clients have come and gone, or on SIGTERM."""
import argparse
import mmap
import os
import socket
import struct
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pbwire  # noqa: E402

MAX_FRAME = 131072


class Conversation:
    """One client connection and what was learnt of it (method names, the SMB)."""

    def __init__(self, prefix, index):
        self.prefix = "%s.%d" % (prefix, index)
        self.lock = threading.Lock()
        self.bind_requests = {}  # request_id -> service name
        self.methods = {}        # (service_id, method_id) -> method name
        self.smb = None
        self.page_size = 4096
        self.to_service_frames = 0
        self.pages = open(self.prefix + ".pages.bin", "wb")

    def map_smb(self, fd):
        size = os.fstat(fd).st_size
        if size > 0 and self.smb is None:
            self.smb = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)

    def client_frame(self, payload, fds):
        """Called for each client -> traced frame before it is passed on."""
        with self.lock:
            index = self.to_service_frames
            self.to_service_frames += 1
            request_id = pbwire.first(payload, 2, 0)
            bind = pbwire.first(payload, 3)
            if bind is not None:
                self.bind_requests[request_id] = pbwire.first(bind, 1, b"").decode()
            invoke = pbwire.first(payload, 5)
            if invoke is None:
                return
            name = self.methods.get((pbwire.first(invoke, 1, 0), pbwire.first(invoke, 2, 0)))
            args = pbwire.first(invoke, 3, b"")
            if name == "InitializeConnection" and fds and pbwire.first(args, 6, 0):
                self.map_smb(fds[0])
            if name == "CommitData" and self.smb is not None:
                self.record_pages(index, args)

    def record_pages(self, index, args):
        seen = set()
        for move in pbwire.all_of(args, 1):
            if pbwire.first(move, 4) is not None:
                continue  # emulated: the chunk travels in the frame
            page = pbwire.first(move, 1, 0)
            start = page * self.page_size
            if page in seen or start + self.page_size > len(self.smb):
                continue
            seen.add(page)
            self.pages.write(struct.pack("<III", index, page, self.page_size))
            self.pages.write(self.smb[start:start + self.page_size])

    def service_frame(self, payload, fds):
        """Called for each traced -> client frame before it is passed on."""
        with self.lock:
            request_id = pbwire.first(payload, 2, 0)
            reply = pbwire.first(payload, 4)
            if reply is not None and request_id in self.bind_requests:
                service_id = pbwire.first(reply, 2, 0)
                for method in pbwire.all_of(reply, 3):
                    key = (service_id, pbwire.first(method, 1, 0))
                    self.methods[key] = pbwire.first(method, 2, b"").decode()
            invoke_reply = pbwire.first(payload, 6)
            if invoke_reply is None or not fds:
                return
            setup = pbwire.first(pbwire.first(invoke_reply, 3, b""), 3)
            if setup is not None:
                page_kb = pbwire.first(setup, 1, 0)
                if page_kb:
                    self.page_size = page_kb * 1024
                self.map_smb(fds[0])


def pump(src, dst, out, on_frame):
    """Passes whole frames from src to dst, each with the fds that arrived with its first byte."""
    buf = bytearray()
    pending_fds = []  # (offset in the stream where the recv began, fd)
    consumed = 0      # stream offset of buf[0]
    try:
        while True:
            data, fds, _, _ = socket.recv_fds(src, 65536, 4)
            if not data:
                break
            pending_fds += [(consumed + len(buf), fd) for fd in fds]
            buf += data
            while len(buf) >= 4:
                (length,) = struct.unpack_from("<I", buf)
                if length + 4 > MAX_FRAME:
                    raise ValueError("frame of %d bytes" % length)
                if len(buf) < 4 + length:
                    break
                frame = bytes(buf[:4 + length])
                frame_fds = [fd for off, fd in pending_fds if off <= consumed]
                pending_fds = [(off, fd) for off, fd in pending_fds if off > consumed]
                on_frame(frame[4:], frame_fds)
                out.write(frame)
                sent = socket.send_fds(dst, [frame], frame_fds) if frame_fds else 0
                dst.sendall(frame[sent:])
                for fd in frame_fds:
                    os.close(fd)
                del buf[:4 + length]
                consumed += 4 + length
    except (OSError, ValueError) as e:
        print("ipc-record: %s" % e, file=sys.stderr)
    finally:
        out.flush()
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def serve(conn, upstream, conversation):
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    up.connect(upstream)
    with open(conversation.prefix + ".to-service.bin", "wb") as to_service, \
            open(conversation.prefix + ".to-client.bin", "wb") as to_client:
        back = threading.Thread(target=pump, args=(up, conn, to_client, conversation.service_frame))
        back.start()
        pump(conn, up, to_service, conversation.client_frame)
        back.join()
    conversation.pages.close()
    conn.close()
    up.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", required=True, help="UNIX socket path the client connects to")
    ap.add_argument("--upstream", required=True, help="traced's socket path")
    ap.add_argument("--out", required=True, help="prefix of the files written")
    ap.add_argument("--connections", type=int, default=1,
                    help="exit after this many connections ended (default 1)")
    args = ap.parse_args()
    if os.path.exists(args.listen):
        os.unlink(args.listen)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.listen)
    listener.listen(8)
    threads = []
    for index in range(args.connections):
        conn, _ = listener.accept()
        t = threading.Thread(target=serve, args=(conn, args.upstream,
                                                 Conversation(args.out, index)))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    listener.close()
    os.unlink(args.listen)


if __name__ == "__main__":
    main()
