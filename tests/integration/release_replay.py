#!/usr/bin/env python3
"""release_replay.py PRODUCER_SOCKET CONSUMER_SOCKET DIR: replays one Perfetto release's recorded
SDK producer and perfetto CLI (tests/vectors/releases/VERSION/, recorded against that release's
own traced by tools/ipc-record.py) against a running agent (PRODUCER_SOCKET) and service
(CONSUMER_SOCKET), and checks that the service's trace holds what the release's traced held.

Producer: every recorded frame is sent in order, with the recorded request ids and arguments;
what names a session's state (method ids, data source instance ids, target buffers) is mapped
to what our agent gave, by method and data source name. Before each CommitData, the chunks it
names are written into our shared memory from the recorded page snapshots, as the SDK wrote
them; the next ones wait until the agent has taken them (chunk state Free). Recorded flush acks
are dropped: our flushes are acked as they come. NotifyDataSourceStopped waits for our stop.
Consumer: the CLI's frames in order, method ids mapped; each waits for the previous request's
last reply (ObserveEvents streams, so it does not), EnableTracing's reply at the session's end.

Checked, failing with a message: every method both clients call is bound; every request the
recorded traced answered with success gets success; every whole packet in the committed chunks
is in traced's trace (the vector is sound) and in ours, and every producer packet of traced's
trace is in ours (fields the services add, 3 10 42 79 98, left out of the comparison). Prints one
summary line. TR_REPLAY_DEBUG=1 prints each wait to stderr."""
import collections
import mmap
import os
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from pbwire import all_of, fb, fields, first, fv, read_varint, split_frames, varint  # noqa: E402

TIMEOUT_S = 30
SERVICE_ADDED_FIELDS = {3, 10, 42, 79, 98}
CHUNKS_PER_LAYOUT = {1: 1, 2: 2, 3: 4, 4: 7, 5: 14}


class ReplayError(Exception):
    pass


def read_frames(path):
    return split_frames(open(path, "rb").read())[0]


def frame(payload):
    return struct.pack("<I", len(payload)) + payload


def encode(fields_list):
    """Re-encodes (field, wiretype, value) triples, in their order."""
    out = b""
    for f, wt, v in fields_list:
        if wt == 0:
            out += fv(f, v)
        elif wt == 2:
            out += fb(f, v)
        else:  # fixed32, fixed64: v holds the bytes
            out += varint(f << 3 | wt) + v
    return out


def replace(msg, field, value):
    """msg with every occurrence of a varint or bytes field set to value (the field's order kept)."""
    return encode([(f, wt, value if f == field else v) for f, wt, v in fields(msg)])


def method_names(bind_reply):
    return {first(m, 1, 0): first(m, 2, b"").decode() for m in all_of(bind_reply, 3)}


def recorded_replies(path):
    """request_id -> list of (success, reply_proto) the recorded service sent."""
    replies = collections.defaultdict(list)
    for payload in read_frames(path):
        reply = first(payload, 6)
        if reply is not None:
            replies[first(payload, 2, 0)].append((bool(first(reply, 1, 0)), first(reply, 3, b"")))
    return replies


class Connection:
    """A client connection: sends frames, a reader thread collects replies by request id."""

    def __init__(self, path, on_reply=None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.send_lock = threading.Lock()
        self.cond = threading.Condition()
        self.replies = collections.defaultdict(list)  # request_id -> [(success, has_more, proto)]
        self.bind_replies = {}
        self.closed = False
        self.on_reply = on_reply
        self.reader = threading.Thread(target=self.read_loop, daemon=True)
        self.reader.start()

    def send(self, payload):
        with self.send_lock:
            self.sock.sendall(frame(payload))

    def read_loop(self):
        buf = b""
        try:
            while True:
                data, fds, _, _ = socket.recv_fds(self.sock, 131072, 4)
                if not data:
                    break
                frames, buf = split_frames(buf + data)
                for payload in frames:
                    self.dispatch(payload, fds)
                    fds = []
        except OSError:
            pass
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def dispatch(self, payload, fds):
        request_id = first(payload, 2, 0)
        bind = first(payload, 4)
        reply = first(payload, 6)
        with self.cond:
            if bind is not None:
                self.bind_replies[request_id] = bind
            elif reply is not None:
                entry = (bool(first(reply, 1, 0)), bool(first(reply, 2, 0)), first(reply, 3, b""))
                self.replies[request_id].append(entry)
            self.cond.notify_all()
        if reply is not None and self.on_reply:
            self.on_reply(request_id, first(reply, 3, b""), fds)
        else:
            for fd in fds:
                os.close(fd)

    def wait(self, what, condition):
        if os.environ.get("TR_REPLAY_DEBUG"):
            print("%.3f wait %s" % (time.monotonic(), what), file=sys.stderr)
        deadline = time.monotonic() + TIMEOUT_S
        with self.cond:
            while not condition():
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    raise ReplayError("%s: %s" % (what, "connection closed" if self.closed
                                                  else "no answer in %d s" % TIMEOUT_S))
                self.cond.wait(min(left, 0.005))  # shared memory changes wake no one

    def bind(self, bind_frame):
        request_id = first(bind_frame, 2, 0)
        self.send(bind_frame)
        self.wait("BindService", lambda: request_id in self.bind_replies)
        reply = self.bind_replies[request_id]
        if not first(reply, 1, 0):
            raise ReplayError("BindService refused")
        return first(reply, 2, 0), {v: k for k, v in method_names(reply).items()}

    def wait_final(self, request_id, what):
        self.wait(what, lambda: any(not more for _, more, _ in self.replies[request_id]))


def whole_packets(chunk):
    """The packets wholly inside a chunk (not continued from or into another chunk)."""
    header = struct.unpack_from("<IHH", chunk)
    count, flags = header[2] & 0x3FF, header[2] >> 10
    i, out = 8, []
    for k in range(count):
        size = shift = 0
        while i < len(chunk):
            c = chunk[i]
            i += 1
            size |= (c & 0x7F) << shift
            shift += 7
            if not c & 0x80:
                break
        if size == 0x0FFFFFFF or i + size > len(chunk):
            break
        continued = (k == 0 and flags & 1) or (k == count - 1 and flags & 2)
        if size and not continued:
            out.append(chunk[i:i + size])
        i += size
    return out


class ProducerReplay:
    def __init__(self, path, vec):
        self.frames = read_frames(os.path.join(vec, "producer.to-service.bin"))
        recorded = read_frames(os.path.join(vec, "producer.to-producer.bin"))
        self.recorded_names = method_names(first(recorded[0], 4))
        self.recorded_ok = recorded_replies(os.path.join(vec, "producer.to-producer.bin"))
        self.pages = self.load_pages(os.path.join(vec, "producer.pages.bin"))
        calls = {first(f, 2, 0): self.recorded_names.get(first(first(f, 5, b""), 2, 0))
                 for f in self.frames}
        # What the recorded traced named: instance id and target buffer -> data source name.
        self.rec_instance, self.rec_buffer = {}, {}
        for payload in recorded:
            if calls.get(first(payload, 2, 0)) != "GetAsyncCommand":
                continue
            for cmd_field in (6, 1):  # setup_data_source, start_data_source
                cmd = first(first(first(payload, 6, b""), 3, b""), cmd_field)
                if cmd is not None:
                    config = first(cmd, 2, b"")
                    name = first(config, 1, b"").decode()
                    self.rec_instance[first(cmd, 1, 0)] = name
                    self.rec_buffer[first(config, 2, 0)] = name
        self.register_requests = [r for r, name in calls.items() if name == "RegisterDataSource"]
        self.instance, self.buffer = {}, {}  # data source name -> ours
        self.started, self.stopped = set(), set()
        self.smb, self.page_size = None, 4096
        self.async_request = None
        self.flushes, self.flushes_acked, self.idle = [], 0, False
        self.committed_packets = []
        self.conn = Connection(path, self.on_reply)

    @staticmethod
    def load_pages(path):
        pages = collections.defaultdict(list)  # frame index -> [(page, page bytes)]
        data = open(path, "rb").read()
        i = 0
        while i < len(data):
            index, page, size = struct.unpack_from("<III", data, i)
            pages[index].append((page, data[i + 12:i + 12 + size]))
            i += 12 + size
        return pages

    def on_reply(self, request_id, proto, fds):
        setup = first(proto, 3) if request_id == self.async_request else None
        if setup is not None:
            if first(setup, 1, 0):
                self.page_size = first(setup, 1) * 1024
            if fds:
                self.smb = mmap.mmap(fds[0], os.fstat(fds[0]).st_size)
        for fd in fds:
            os.close(fd)  # the mapping stays
        if request_id != self.async_request:
            return
        for cmd_field in (6, 1):
            cmd = first(proto, cmd_field)
            if cmd is not None:
                config = first(cmd, 2, b"")
                name = first(config, 1, b"").decode()
                self.instance[name] = first(cmd, 1, 0)
                self.buffer[name] = first(config, 2, 0)
                if cmd_field == 1:
                    self.started.add(name)
        stop = first(proto, 2)
        if stop is not None:
            self.stopped.update(n for n, i in self.instance.items() if i == first(stop, 1, 0))
        flush = first(proto, 5)
        with self.conn.cond:
            if flush is not None:
                self.flushes.append(first(flush, 2, 0))
            if self.idle:
                self.ack_flushes()
            self.conn.cond.notify_all()

    def ack_flushes(self):
        """Acks the flushes asked so far (called with conn.cond held, once every chunk before
        them is committed), with request ids of its own, above the recorded ones."""
        for flush_id in self.flushes:
            call = (fv(1, self.service_id) + fv(2, self.invoke_ids["CommitData"]) +
                    fb(3, fv(3, flush_id)) + fv(4, 1))
            self.conn.send(fv(2, 1000000 + self.flushes_acked) + fb(5, call))
            self.flushes_acked += 1
        self.flushes = []

    def set_idle(self, idle):
        with self.conn.cond:
            self.idle = idle
            if idle:
                self.ack_flushes()

    def map_name(self, rec_map, ours, rec_value, what):
        name = rec_map.get(rec_value)
        self.conn.wait("our %s of %s" % (what, name), lambda: name in ours)
        return ours[name]

    def write_chunk(self, page, index, page_bytes):
        if len(page_bytes) != self.page_size:
            raise ReplayError("recorded page size %d, ours %d" % (len(page_bytes), self.page_size))
        layout = struct.unpack_from("<I", page_bytes)[0] >> 28 & 7
        size = ((self.page_size - 8) // CHUNKS_PER_LAYOUT[layout]) & ~3
        start, base = 8 + index * size, page * self.page_size
        if base + self.page_size > len(self.smb):
            raise ReplayError("page %d is beyond our %d-byte SMB" % (page, len(self.smb)))
        word = struct.unpack_from("<I", self.smb, base)[0]
        if word and (word >> 28 & 7) != layout:
            raise ReplayError("page %d is partitioned differently in our SMB" % page)
        chunk = page_bytes[start:start + size]
        self.committed_packets += whole_packets(chunk)
        self.smb[base + start:base + start + size] = chunk
        word = (word or layout << 28) | 3 << (2 * index)
        struct.pack_into("<I", self.smb, base, word)
        return base, index

    def chunk_taken(self, base, index):
        return (struct.unpack_from("<I", self.smb, base)[0] >> (2 * index) & 3) == 0

    def rewrite(self, name, args, frame_index):
        """args mapped to our session, or None to leave the call out."""
        if name in ("NotifyDataSourceStarted", "NotifyDataSourceStopped"):
            ds = self.rec_instance.get(first(args, 1, 0))
            want = self.started if name == "NotifyDataSourceStarted" else self.stopped
            self.set_idle(True)
            self.conn.wait("our %s of %s" % (name[16:].lower(), ds), lambda: ds in want)
            self.set_idle(False)
            return replace(args, 1, self.instance[ds])
        if name == "RegisterTraceWriter":
            return replace(args, 2, self.map_name(self.rec_buffer, self.buffer, first(args, 2, 0),
                                                  "target buffer"))
        if name != "CommitData":
            return args
        self.conn.wait("our shared memory", lambda: self.smb is not None)
        written, out = [], b""
        snapshots = dict(self.pages.get(frame_index, []))
        for move in all_of(args, 1):
            buf = self.map_name(self.rec_buffer, self.buffer, first(move, 3, 0), "target buffer")
            if first(move, 4) is None:
                page = first(move, 1, 0)
                if page not in snapshots:
                    raise ReplayError("no snapshot of page %d for frame %d" % (page, frame_index))
                written.append(self.write_chunk(page, first(move, 2, 0), snapshots[page]))
            out += fb(1, replace(move, 3, buf))
        for patch in all_of(args, 2):
            buf = self.map_name(self.rec_buffer, self.buffer, first(patch, 1, 0), "target buffer")
            out += fb(2, replace(patch, 1, buf))
        self.pending_taken = written
        return out or None

    def run(self):
        self.service_id, self.invoke_ids = self.conn.bind(self.frames[0])
        for frame_index, payload in enumerate(self.frames[1:], start=1):
            invoke = first(payload, 5)
            if invoke is None:
                raise ReplayError("producer frame %d is not a method call" % frame_index)
            name = self.recorded_names.get(first(invoke, 2, 0))
            if name not in self.invoke_ids:
                raise ReplayError("the agent does not bind %s, which this SDK calls" % name)
            request_id = first(payload, 2, 0)
            if name == "GetAsyncCommand":
                self.async_request = request_id
            self.pending_taken = []
            args = self.rewrite(name, first(invoke, 3, b""), frame_index)
            if args is None:
                continue
            call = fv(1, self.service_id) + fv(2, self.invoke_ids[name]) + fb(3, args)
            if first(invoke, 4, 0):
                call += fv(4, 1)
            self.conn.send(fv(2, request_id) + fb(5, call))
            for base, index in self.pending_taken:
                self.conn.wait("the agent taking chunk %d of page %d" % (index, base //
                               self.page_size), lambda: self.chunk_taken(base, index))
        self.set_idle(True)
        self.check_replies()

    def check_replies(self):
        for request_id, recorded in self.recorded_ok.items():
            if request_id == self.async_request or not all(ok for ok, _ in recorded):
                continue
            self.conn.wait_final(request_id, "reply to producer request %d" % request_id)
            if not all(ok for ok, _, _ in self.conn.replies[request_id]):
                raise ReplayError("producer request %d failed; traced's succeeded" % request_id)


def consumer_replay(path, vec):
    frames = read_frames(os.path.join(vec, "consumer.to-service.bin"))
    recorded = read_frames(os.path.join(vec, "consumer.to-consumer.bin"))
    recorded_names = method_names(first(recorded[0], 4))
    recorded_ok = recorded_replies(os.path.join(vec, "consumer.to-consumer.bin"))
    conn = Connection(path)
    service_id, ids = conn.bind(frames[0])
    slices = []
    for payload in frames[1:]:
        invoke = first(payload, 5)
        name = recorded_names.get(first(invoke, 2, 0))
        if name not in ids:
            raise ReplayError("the service does not bind %s, which this CLI calls" % name)
        request_id = first(payload, 2, 0)
        call = fv(1, service_id) + fv(2, ids[name]) + fb(3, first(invoke, 3, b""))
        if first(invoke, 4, 0):
            call += fv(4, 1)
        conn.send(fv(2, request_id) + fb(5, call))
        if name == "ObserveEvents" or first(invoke, 4, 0):
            continue
        conn.wait_final(request_id, name)
        replies = conn.replies[request_id]
        if all(ok for ok, _ in recorded_ok.get(request_id, [])) and \
                not all(ok for ok, _, _ in replies):
            raise ReplayError("%s failed; traced's succeeded" % name)
        if name == "EnableTracing":
            error = first(replies[-1][2], 3)
            if error:
                raise ReplayError("EnableTracing: %s" % error.decode())
        if name == "ReadBuffers":
            for _, _, proto in replies:
                slices += [(first(s, 1, b""), first(s, 2, 0)) for s in all_of(proto, 2)]
    conn.sock.close()
    packets, current = [], b""
    for data, last in slices:
        current += data
        if last:
            packets.append(current)
            current = b""
    return packets


def trace_packets(path):
    return [v for f, _, v in fields(open(path, "rb").read()) if f == 1]


def without_service_fields(packet):
    """The packet's own bytes, less the fields a service appends (kept byte for byte: the SDK
    writes some lengths as padded varints, which re-encoding would change)."""
    out, i = b"", 0
    while i < len(packet):
        start = i
        key, i = read_varint(packet, i)
        if key & 7 == 0:
            _, i = read_varint(packet, i)
        elif key & 7 == 2:
            n, i = read_varint(packet, i)
            i += n
        else:
            i += 8 if key & 7 == 1 else 4
        if key >> 3 not in SERVICE_ADDED_FIELDS:
            out += packet[start:i]
    return out


def producer_packets(packets):
    """Packets of producer sequences (trusted_packet_sequence_id > 1), service fields left out."""
    return collections.Counter(without_service_fields(p) for p in packets
                               if first(p, 10, 0) > 1)


def main():
    producer_socket, consumer_socket, vec = sys.argv[1:4]
    release = os.path.basename(os.path.normpath(vec))
    try:
        producer = ProducerReplay(producer_socket, vec)
        result = {}

        def run_producer():
            try:
                producer.run()
            except ReplayError as e:
                result["error"] = e

        thread = threading.Thread(target=run_producer, daemon=True)
        thread.start()
        for request_id in producer.register_requests:
            producer.conn.wait_final(request_id, "RegisterDataSource")
        ours = consumer_replay(consumer_socket, vec)
        thread.join(TIMEOUT_S)
        if "error" in result:
            raise result["error"]
        if thread.is_alive():
            raise ReplayError("the producer replay did not finish")
        producer.conn.sock.close()
        theirs = producer_packets(trace_packets(os.path.join(vec, "trace.pftrace")))
        mine = producer_packets(ours)
        committed = collections.Counter(producer.committed_packets)
        if committed - theirs:
            raise ReplayError("%d committed packets are not in traced's trace: bad vector"
                              % sum((committed - theirs).values()))
        if committed - mine:
            raise ReplayError("%d of %d committed packets are missing from our trace"
                              % (sum((committed - mine).values()), sum(committed.values())))
        if theirs - mine:
            raise ReplayError("%d of traced's %d producer packets are missing from ours"
                              % (sum((theirs - mine).values()), sum(theirs.values())))
        print("%s: OK, %d committed packets and all %d producer packets of traced's trace in "
              "ours (%d packets), %d flushes acked" % (release, sum(committed.values()),
                                                       sum(theirs.values()), len(ours),
                                                       producer.flushes_acked))
    except (ReplayError, OSError) as e:
        print("%s: FAIL: %s" % (release, e))
        sys.exit(1)


if __name__ == "__main__":
    main()
