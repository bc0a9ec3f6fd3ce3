#!/usr/bin/env python3
"""make_seeds.py: rebuilds the seed corpora of fuzz targets from the recorded Perfetto traffic in
tests/vectors/ (see fuzz/CMakeLists.txt for the input layout each target expects).

    fuzz/make_seeds.py            (from anywhere; writes into fuzz/corpus/<target>/)

Seeds are cut from real bytes: IPC requests of the real SDK/CLI producers, the chunks and patches
they committed, packets of the recorded traces. Relay frames (our own protocol, never recorded)
are assembled from those same chunks, patches and descriptors, shaped as the agent sends them.
Files whose names start with "crash-" are inputs that once crashed a target: never regenerated,
never deleted. Every seed is kept under 64 KiB. Needs only python3 (and zstd for one seed)."""
import hashlib, os, struct, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from pbwire import varint, read_varint, fields, first, all_of, fv, fb, ff64, ff32  # noqa: E402
VEC = os.path.join(ROOT, "tests", "vectors")
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
MAX_SEED = 60000

# ---- framing ------------------------------------------------------------------------------

def frames_of(path):
    """Payloads of a `uint32 LE length + payload` stream file."""
    b = open(path, "rb").read()
    i, out = 0, []
    while i + 4 <= len(b):
        n = struct.unpack_from("<I", b, i)[0]
        out.append(b[i + 4:i + 4 + n]); i += 4 + n
    return out

def le_frame(payload):
    return struct.pack("<I", len(payload)) + payload

# ---- output ------------------------------------------------------------------------------

def reset(target):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    for name in os.listdir(d):
        if not name.startswith("crash-"):
            os.remove(os.path.join(d, name))
    return d

def write(d, name, data):
    if len(data) > MAX_SEED:
        return
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

# ---- the recorded IPC traffic ------------------------------------------------------------

PRODUCER_METHODS = ["InitializeConnection", "RegisterDataSource", "UnregisterDataSource",
                    "CommitData", "GetAsyncCommand", "RegisterTraceWriter",
                    "UnregisterTraceWriter", "NotifyDataSourceStarted",
                    "NotifyDataSourceStopped", "ActivateTriggers", "Sync", "UpdateDataSource"]

def producer_requests():
    """(method name, args) of every ProducerPort request in the producer recordings."""
    out = []
    ipc = os.path.join(VEC, "ipc")
    for name in sorted(os.listdir(ipc)):
        if not name.startswith("producer-") or not (name.endswith(".to-service.bin") or
                                                     name.endswith(".to-relay.bin")):
            continue
        stem = name.split(".")[0]
        methods = {}
        for p in frames_of(os.path.join(ipc, stem + ".to-producer.bin")):
            reply = first(p, 4)
            if reply is None:
                continue
            sid = first(reply, 2, 0)
            for m in all_of(reply, 3):
                methods[(sid, first(m, 1, 0))] = first(m, 2, b"").decode()
        for p in frames_of(os.path.join(ipc, name)):
            inv = first(p, 5)
            if inv is None:
                continue
            key = (first(inv, 1, 0), first(inv, 2, 0))
            if methods.get(key) in PRODUCER_METHODS:
                out.append((stem, methods[key], first(inv, 3, b"")))
    return out

def commits():
    return [(stem, args) for stem, m, args in producer_requests() if m == "CommitData"]

def moved_chunks():
    """(target_buffer, full chunk bytes incl. 8-byte header, incomplete) of emulated commits."""
    out = []
    for _, args in commits():
        for mv in all_of(args, 1):
            data = first(mv, 4)
            if data and len(data) >= 8:
                out.append((first(mv, 3, 0), bytes(data), bool(first(mv, 5, 0))))
    return out

def patches():
    """(target_buffer, writer_id, chunk_id, [(offset, 4 bytes)], has_more) of the commits."""
    out = []
    for _, args in commits():
        for cp in all_of(args, 2):
            entries = [(first(p, 1, 0), bytes(first(p, 2, b""))) for p in all_of(cp, 4)]
            out.append((first(cp, 1, 0), first(cp, 2, 0), first(cp, 3, 0), entries,
                        bool(first(cp, 5, 0))))
    return out

def chunk_header(c):
    chunk_id, writer_id, packets = struct.unpack_from("<IHH", c, 0)
    return chunk_id, writer_id, packets & 0x3FF, packets >> 10

# ---- producer_port: [method byte][request length LE16][request][SMB bytes] ----------------

def seeds_producer_port():
    d = reset("producer_port")
    smb = open(os.path.join(CORPUS, "smb_chunk", "smb-div1-div2"), "rb").read()[1:]
    seen = set()
    per_method = {}
    for stem, m, args in producer_requests():
        h = hashlib.sha1(m.encode() + args).hexdigest()[:8]
        if h in seen or per_method.get((stem, m), 0) >= 2 or len(args) > 0xFFFF:
            continue
        seen.add(h)
        per_method[(stem, m)] = per_method.get((stem, m), 0) + 1
        body = bytes([PRODUCER_METHODS.index(m)]) + struct.pack("<H", len(args)) + args
        if m == "CommitData" and "emulated" not in stem:
            body += smb  # a real SMB image for the chunks this commit moves
        write(d, "%s-%s-%s" % (stem, m, h), body)

# ---- relay frames (our protocol), built from the recorded chunks ---------------------------

def relay_chunk_item(tb, c, incomplete, producer_id=1):
    chunk_id, writer_id, count, flags = chunk_header(c)
    chunk = (fv(1, producer_id) + fv(2, writer_id) + fv(3, chunk_id) + fv(4, count) +
             fv(5, flags) + fv(6, tb) + fv(7, int(incomplete)) + fv(8, 1000) + fv(9, 4242) +
             fb(10, c[8:]))
    return fb(1, chunk)

def relay_patch_item(tb, writer, chunk_id, entries, more, producer_id=1):
    body = fv(1, producer_id) + fv(2, tb) + fv(3, writer) + fv(4, chunk_id)
    for off, data in entries:
        body += fb(5, fv(1, off) + ff32(2, struct.unpack("<I", data.ljust(4, b"\0")[:4])[0]))
    return fb(2, body + fv(6, int(more)))

def relay(msg_field, body):
    return le_frame(fb(msg_field, body))

def hello(instance=0x1122334455667788, acked=0, features=0xF):
    sysinfo = fb(1, fb(1, "Linux") + fb(3, "6.1.0-13-amd64")) + fb(4, "agent-typed-name")
    return relay(1, fv(1, features) + ff64(2, instance) + fb(3, sysinfo) + fv(4, acked) +
                 fv(5, 4 << 20))

def descriptors():
    out = []
    for _, m, args in producer_requests():
        if m == "RegisterDataSource":
            d = first(args, 1)
            if d is not None and bytes(d) not in out:
                out.append(bytes(d))
    return out

def producer_update(pid, state, with_sources=True, unregistered=()):
    body = fv(1, pid) + fv(2, state) + fb(3, "perfetto.producer") + fv(4, 1000) + fv(5, 4242)
    body += fb(6, "Perfetto v58.2")
    if with_sources:
        for d in descriptors()[:4]:
            body += fb(10, d)
    for name in unregistered:
        body += fb(11, name)
    return relay(10, body)

def batch(seq, items, zstd=False):
    raw = b"".join(fb(3, it) for it in items)
    if zstd:
        # From a file, so the zstd frame declares its content size (the decoder requires it).
        with tempfile.NamedTemporaryFile() as f:
            f.write(raw)
            f.flush()
            z = subprocess.run(["zstd", "-q", "-c", "-1", f.name], stdout=subprocess.PIPE,
                               check=True).stdout
        return relay(11, fv(1, seq) + fv(2, 1) + fb(4, z))
    return relay(11, fv(1, seq) + fv(2, 0) + raw)

def relay_streams():
    """Named frame streams, as an agent sends them on one connection."""
    chunks = moved_chunks()
    pts = patches()
    small = [c for c in chunks if len(c[1]) <= 4096][:6]
    items = [relay_chunk_item(tb, c, inc) for tb, c, inc in small[:3]]
    pitems = [relay_patch_item(*p) for p in pts[:4]]
    flush_ack = fb(3, fv(1, 7) + fv(2, 1))
    reply = lambda req, after, err="": relay(14, fv(1, req) + (fb(2, err) if err else b"") +
                                             fv(3, after))
    probe = relay(20, fv(1, 3) + fv(2, 1700000000000) + fv(3, 1700000000100) +
                  fv(4, 1700000000150))
    stats = relay(21, fb(1, fv(1, 1) + fv(2, 2) + fv(3, 8192) + fv(4, 1) + fv(5, 4096) +
                        fv(6, 3) + fv(8, 40) + fv(9, 20)) + fv(2, 1) + fv(3, 100) + fv(4, 0))
    snap = relay(22, fb(1, fv(1, 6) + fv(2, 123456789)) + fb(1, fv(1, 1) + fv(2, 987654321)) +
                 fb(1, fv(1, 3) + fv(2, 555)))
    return {
        "session": hello() + producer_update(1, 1) + batch(1, items) +
                   batch(2, pitems + [flush_ack]) + reply(11, 2) + reply(12, 3, "no such ds") +
                   batch(3, items[:1], zstd=True) + stats + probe + snap +
                   relay(4, fv(1, 99)) + producer_update(1, 2, False, ["track_event"]) +
                   producer_update(1, 3, False) + relay(3, fv(1, 1) + fb(2, "shutting down")),
        "reconnect-resync": hello(acked=0) + producer_update(1, 1) + producer_update(2, 1) +
                            batch(1, items[:1]) + le_frame(b"\xff") + hello(acked=1) +
                            producer_update(2, 1) + batch(2, items[1:2]) + reply(5, 2),
        "agent-restart": hello() + producer_update(1, 1) + reply(9, 5) + le_frame(b"\xff") +
                         hello(instance=0x99, acked=0) + batch(1, items[:1]),
        "seq-gap": hello() + batch(1, items[:1]) + batch(5, items[1:2]) + batch(3, items[:1]),
        "zstd-batch": hello() + batch(1, items, zstd=True),
        "patches": hello() + batch(1, pitems),
        "stats-probe-snapshot": hello() + stats + probe + snap,
    }

def seeds_relay():
    streams = relay_streams()
    d = reset("relay_frame")
    for name, s in streams.items():
        write(d, name, bytes([63]) + s)       # step byte: pushed in 64-byte pieces
        write(d, name + "-bytewise", bytes([0]) + s[:2048])
    d = reset("hosts")
    for name, s in streams.items():
        write(d, name, bytes([0]) + s)
    # fuzz_session_chunks: the same sessions into a running session, a read pass (Heartbeat)
    # after them; machines with 1 MiB ring buffers, global-clocks with 64 KiB ones, 64 KiB
    # DISCARD.
    d = reset("session_chunks")
    hb = relay(4, fv(1, 0))
    for name, s in streams.items():
        write(d, name, bytes([0]) + s + hb)
        write(d, name + "-global-small", bytes([3]) + s + hb)
        write(d, name + "-discard", bytes([6]) + s + hb)

# ---- clock_frames: a regional's probe answers, its relayed exchanges (fuzz_clock_frames.c) ----

def seeds_clock_frames():
    """The harness's time moves 10 ms a frame from 1 s; its schedule sends probe k at frame
    5(k - 1) (ten dense probes 50 ms apart, each answered in the next frame, its follow-up in
    the one after). The regional's clock is 300 ms behind the service's, web-1's 700 ms ahead;
    the relayed exchanges are web-1's with the regional, on their clocks."""
    d = reset("clock_frames")
    ms = 1000000
    def now(i): return (1000 + 10 * (i + 1)) * ms
    hb = relay(4, fv(1, 0))
    def answer(k, i):
        t1 = now(i - 1); t2 = t1 + 2 * ms - 300 * ms
        return relay(20, fv(1, k) + fv(3, t2) + fv(4, t2 + 100000))
    def follow_up(k, i, late=False):
        t3 = now(i - 2) + 2 * ms - 300 * ms + 120000
        return relay(23, fv(1, k) + (fv(3, 1) if late else fv(2, t3)))
    def relayed(i):
        t1 = now(i) - 300 * ms - 5 * ms
        t2 = t1 + 300 * ms + 700 * ms + 2 * ms
        return relay(24, fv(1, t1) + fv(2, t2) + fv(3, t2 + 50000) + fv(4, t1 + 4 * ms))
    def snapshot(i):
        clocks = b"".join(fb(1, fv(1, c) + fv(2, now(i) + 700 * ms + c)) for c in (1, 3, 4, 5, 6))
        return relay(22, clocks)
    for follow in (False, True):
        out, i = [], 0
        for k in range(1, 13):
            group = [hb, answer(k, i + 1)]
            group.append(follow_up(k, i + 2, late=(k % 4 == 0)) if follow else relayed(i + 2))
            group += [relayed(i + 3), snapshot(i + 4)]
            out += group
            i += 5
        write(d, "dense-follow-up" if follow else "dense", bytes([(10 << 1) | follow]) + b"".join(out))
    # Refused on purpose: a relayed exchange out of order, a time past 2^62, a snapshot of clock
    # 64 and an empty one, an answer with t2 past 2^62, a follow-up before its answer.
    bad = [hb, relay(24, fv(1, 5) + fv(2, 9) + fv(3, 8) + fv(4, 6)),
           relay(24, fv(1, 1) + fv(2, 1 << 62) + fv(3, 1 << 62) + fv(4, 2)),
           relay(22, fb(1, fv(1, 64) + fv(2, 1))), relay(22, b""),
           relay(23, fv(1, 1) + fv(2, 5)), relay(20, fv(1, 1) + fv(3, 1 << 62) + fv(4, 1))]
    write(d, "refused", bytes([(10 << 1) | 1]) + b"".join(bad))

# ---- agent_commands: the service's frames at an agent (fuzz_agent_commands.c) --------------

def seeds_agent_commands():
    """A session's life as the service commands it: two producers' data sources set up,
    started, flushed, their incremental state cleared, stopped; a clock probe,
    heartbeats, UpstreamLost (a regional's upstream went away), a Goodbye. The first byte:
    the Welcome accepts every feature offered."""
    d = reset("agent_commands")
    def cmd(req, pid, field, body):
        return relay(13, fv(1, req) + fv(2, pid) + fb(field, body))
    ds_config = fb(1, "track_event") + fv(2, 1) + fv(3, 10000)
    life = []
    for pid, inst in ((1, 11), (2, 12)):
        life.append(cmd(inst, pid, 10, fv(1, inst) + fb(2, ds_config)))
    for pid, inst in ((1, 11), (2, 12)):
        life.append(cmd(20 + inst, pid, 11, fv(1, inst) + fv(2, 100)))
    life += [relay(4, fv(1, 5)), relay(20, fv(1, 1) + fv(2, 123456789)),
             cmd(40, 1, 13, fv(1, 40) + fv(2, 11) + fv(3, 1)),
             cmd(41, 2, 13, fv(1, 41)),
             cmd(42, 1, 14, fv(1, 11))]
    for pid, inst in ((1, 11), (2, 12)):
        life.append(cmd(50 + inst, pid, 12, fv(1, inst)))
    write(d, "session", bytes([0xff]) + b"".join(life))
    write(d, "session-upstream-lost", bytes([0xff]) + b"".join(life[:4]) +
          relay(25, fb(1, "the root is gone")) + b"".join(life[4:]))
    write(d, "goodbye", bytes([0xff]) + b"".join(life[:2]) + relay(3, fv(1, 1) + fb(2, "bye")))
    # Refused: a command without its body, a stop of an instance never set up, an ack of a
    # batch never sent, a frame the agent never takes (Hello).
    write(d, "refused", bytes([0xff]) + relay(13, fv(1, 1) + fv(2, 1)) +
          cmd(2, 1, 12, fv(1, 99)) + relay(12, fv(1, 77)) + relay(1, fv(1, 1)))

# ---- regional_upstream: the root's frames at a regional (fuzz_regional_upstream.c) ---------

def seeds_regional_upstream():
    """On the agent's slot (1) after its Welcome: the commands of a session, a BatchAck, the
    carrier's own heartbeat (slot 0), a frame for a slot never opened (2), UpstreamSessions,
    then a Goodbye with a reason (NOT_AUTHORIZED); and the refused: a second Welcome, a clock
    probe on the relayed link. The first byte: the slot's Welcome accepts every feature."""
    d = reset("regional_upstream")
    def on(slot, frame):  # frame: le_frame(RelayFrame); its slot (field 30) appended
        body = frame[4:] + fv(30, slot)
        return le_frame(body)
    def cmd(req, field, body):
        return relay(13, fv(1, req) + fv(2, 1) + fb(field, body))
    session = [cmd(1, 10, fv(1, 11) + fb(2, fb(1, "track_event") + fv(2, 1))),
               cmd(2, 11, fv(1, 11)), relay(12, fv(1, 1)), cmd(3, 13, fv(1, 3) + fv(2, 11)),
               cmd(4, 12, fv(1, 11))]
    life = [on(1, f) for f in session] + [on(0, relay(4, fv(1, 1))), on(2, relay(4, fv(1, 2))),
                                          on(1, relay(26, fv(1, 1)))]
    write(d, "session", bytes([0x1f]) + b"".join(life))
    write(d, "goodbye", bytes([0x1f]) + b"".join(life[:2]) +
          on(1, relay(3, fv(1, 5) + fb(2, "revoked"))))
    write(d, "refused", bytes([0x1f]) + on(1, relay(2, fv(1, 1))) + on(1, relay(20, fv(1, 1))))
    write(d, "carrier-goodbye", bytes([0x01]) + b"".join(life[:3]) +
          on(0, relay(3, fv(1, 1) + fb(2, "shutting down"))))

# ---- relay_carrier: a carrier's input, ops between socket reads (fuzz_relay_carrier.c) -------

def on_slot(frame, slot):
    """A whole relay frame (header included) moved onto a slot: RelayFrame.slot = 30."""
    return le_frame(frame[4:] + fv(30, slot))

def reads(stream, piece=240):
    """The stream as socket reads of at most piece bytes: [n - 1][n bytes] each."""
    return b"".join(bytes([len(stream[i:i + piece]) - 1]) + stream[i:i + piece]
                    for i in range(0, len(stream), piece))

OPEN, CLOSE, CLOSE_REASON, HANG_UP, SEND, TURN, DRAIN, SHUTDOWN, PEER_GONE = range(0xf0, 0xf9)

CARRIER_MAX_SLOTS = [1, 2, 3, 4, 8, 17, 33, 256]  # picked by config bits 1-3

def carrier_config(accept, max_slots, refuse=False, keep_on_goodbye=False):
    return bytes([int(accept) | CARRIER_MAX_SLOTS.index(max_slots) << 1 | int(refuse) << 4 |
                  int(keep_on_goodbye) << 5])

def seeds_relay_carrier():
    d = reset("relay_carrier")
    s = relay_streams()
    beat = lambda n: relay(4, fv(1, n))
    bye = lambda reason=None: relay(3, (fv(1, reason) + fb(2, "going away")) if reason else b"")
    agents = [s["session"], s["reconnect-resync"].split(le_frame(b"\xff"))[0], s["seq-gap"]]
    # Three agents' sessions on slots 1-3, frame by frame in turn, the carrier's own heartbeats
    # between; slot 2 ends silently, slot 1 with a reason, frames follow for both (dropped).
    per_agent = [[on_slot(f, n + 1) for f in le_frames(a)] for n, a in enumerate(agents)]
    mixed = b""
    for k in range(max(len(p) for p in per_agent)):
        for p in per_agent:
            if k < len(p) and len(mixed) < 8000:  # small seeds keep the fuzzer's inputs small
                mixed += p[k]
        mixed += beat(k + 1)
    tail = (on_slot(bye(), 2) + on_slot(beat(7), 2) + on_slot(bye(5), 1) + on_slot(beat(8), 1) +
            on_slot(beat(9), 3))
    upstream = carrier_config(True, 8) + reads(mixed) + bytes([TURN, DRAIN, 0x81, SEND, 0]) + \
        reads(tail) + bytes([TURN, SEND, 0, TURN])
    write(d, "upstream-three-agents", upstream)
    write(d, "upstream-three-agents-bytewise",
          carrier_config(True, 8) + reads(mixed[:1500], 1) + bytes([TURN]) + reads(tail, 1))
    write(d, "upstream-keep-on-goodbye",
          carrier_config(True, 8, keep_on_goodbye=True) + reads(mixed) + reads(tail))
    # Slots with gaps; one below the highest never opened, one that ended: both dropped.
    hello = lambda slot: on_slot(s["patches"][:len(le_frames(s["patches"])[0])], slot)
    gaps = (hello(1) + hello(5) + on_slot(beat(1), 3) + on_slot(bye(), 1) + on_slot(beat(2), 1) +
            on_slot(beat(3), 5) + on_slot(beat(4), 2**64 - 1) + on_slot(beat(5), 5))
    write(d, "upstream-unknown-slots", carrier_config(True, 4) + reads(gaps) +
          bytes([TURN, OPEN, SEND, 1, TURN]))
    # Forty slots, then all of them ended in one read, then the carrier (past the tables' sizes).
    many = b"".join(hello(n) for n in range(1, 41))
    write(d, "upstream-many-slots", carrier_config(True, 256) + reads(many) + bytes([TURN]) +
          reads(b"".join(on_slot(bye(), n) for n in range(1, 41))) + bytes([TURN]) +
          reads(b"".join(hello(n) for n in range(41, 61))))
    # More slots than the carrier takes: a protocol error ends it.
    write(d, "upstream-too-many-slots",
          carrier_config(True, 2) + reads(hello(1) + hello(2) + hello(3) + on_slot(beat(1), 1)))
    # The end refuses slots 3 and 6 at their Hello (as --max-agents does): their frames dropped.
    refused = b"".join(hello(n) + on_slot(beat(n), n) for n in range(1, 8))
    write(d, "upstream-refuses", carrier_config(True, 8, refuse=True) + reads(refused) +
          bytes([TURN]) + reads(on_slot(beat(9), 3) + on_slot(bye(4), 4)) + bytes([TURN]))
    # A regional's carrier: this side opens slots and sends; the upstream answers on them, says
    # Goodbye on one, writes for a slot never opened; slots close from this side too.
    answers = (on_slot(relay(2, fv(1, 7) + ff64(2, 0x1122) + fv(3, 4 << 20)), 1) +
               on_slot(relay(2, fv(1, 7)), 2) + on_slot(beat(1), 3) + on_slot(beat(1), 9) +
               on_slot(bye(3), 3) + on_slot(beat(2), 3))
    regional = (carrier_config(False, 4) + bytes([OPEN, OPEN, OPEN, SEND, 0, SEND, 1, SEND, 2,
                                                  TURN]) + reads(answers) +
                bytes([CLOSE_REASON, 1, SEND, 1, CLOSE, 0, TURN, OPEN, OPEN, OPEN, DRAIN, 0x80,
                       HANG_UP, 0, TURN, SEND, 0]) + reads(on_slot(beat(3), 2) + beat(99)))
    write(d, "regional-opens-slots", regional)
    write(d, "regional-shutdown", regional + bytes([SEND, 1, SHUTDOWN]))
    write(d, "regional-peer-gone", regional + bytes([SEND, 1, PEER_GONE]))
    # The peer ends the carrier with a Goodbye, while slots are open and output is gathered.
    write(d, "carrier-goodbye", carrier_config(True, 8) + reads(hello(1) + hello(2)) +
          bytes([SEND, 0, SEND, 1]) + reads(bye(1)))
    # A frame that does not decode, and one longer than the reader takes.
    write(d, "undecodable", carrier_config(True, 8) + reads(hello(1) + le_frame(b"\xff\xff")))
    write(d, "too-long", carrier_config(True, 8) + reads(hello(1) + struct.pack("<I", 5 << 20)))

def le_frames(stream):
    """The whole frames (header included) of a stream."""
    i, out = 0, []
    while i + 4 <= len(stream):
        n = struct.unpack_from("<I", stream, i)[0]
        out.append(stream[i:i + 4 + n]); i += 4 + n
    return out

# ---- trace_buffer: an op stream (fuzz_trace_buffer.c) over real fragments ------------------

def seeds_trace_buffer():
    d = reset("trace_buffer")
    chunks = moved_chunks()
    for n, (tb, c, inc) in enumerate(chunks[:8]):
        chunk_id, writer, count, flags = chunk_header(c)
        payload = c[8:]
        # Whole fragments that fit the op's one-byte length.
        frags, i, used = 0, 0, 0
        while frags < min(count, 7):
            size, j = read_varint(payload, i)
            if j + size - 0 > 255:
                break
            i = j + size; frags += 1
        ops = bytearray([n & 31, n & 1])
        for k in range(3):
            ops += bytes([0, (writer - 1) << 1 & 2 | (4 if inc else 0), k, frags,
                          flags & 7, i]) + payload[:i]
        ops += bytes([3, 7, 2, 1, 0, 0, 0, 0, 0, 3, 7])
        write(d, "emulated-%d" % n, bytes(ops))
    # Structured chunks: fragment sizes only (bodies are generated), across the id wrap.
    write(d, "structured-continued", bytes([1, 0, 1, 0, 0, 3, 2, 10, 20, 30, 1, 0, 1, 3, 1,
                                           5, 1, 0, 2, 1, 1, 7, 3, 7]))

# ---- packet_rewrite: [state byte][TracePacket] from the recorded traces --------------------

def seeds_packet_rewrite():
    d = reset("packet_rewrite")
    seen = {}
    for trace in ("sdk-track-event", "relay-emulated", "traced-relay-2machines"):
        data = open(os.path.join(VEC, "traces", trace + ".pftrace"), "rb").read()
        for n, pkt in enumerate(all_of(data, 1)):
            # One seed per distinct set of top-level fields: clock snapshots, track events,
            # interned data, ftrace bundles, defaults...
            shape = tuple(sorted({f for f, _, _ in fields(pkt)}))
            if shape in seen or len(pkt) > 8192:
                continue
            seen[shape] = 1
            write(d, "%s-%d" % (trace, n), bytes([n & 3]) + bytes(pkt))

# ---- trace_filter: [u16 code len][u16 overlay len][code][overlay][split][TracePacket] -----

def filter_code(words):
    """Bytecode from words: their varints and the FNV-1a checksum traced expects."""
    h = 0xcbf29ce484222325
    for w in words:
        for k in range(4):
            h = ((h ^ ((w >> (8 * k)) & 0xFF)) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return b"".join(varint(w) for w in words) + varint(h & 0xFFFFFFFF)

def seeds_trace_filter():
    d = reset("trace_filter")
    code = open(os.path.join(VEC, "ipc", "trace-filter.bytecode"), "rb").read()
    # an overlay making TrackEvent's name (message of Trace.packet.track_event) a filter string
    overlay = filter_code([0, (1 << 3) | 4, 0])
    data = open(os.path.join(VEC, "traces", "trace-filter-unfiltered.pftrace"), "rb").read()
    seen = {}
    for n, pkt in enumerate(all_of(data, 1)):
        shape = tuple(sorted({f for f, _, _ in fields(pkt)}))
        if shape in seen or len(pkt) > 8192:
            continue
        seen[shape] = 1
        head = struct.pack("<HH", len(code), 0) + code
        write(d, "vector-%d" % n, head + bytes([len(pkt) // 2 & 0xFF]) + bytes(pkt))
    small = filter_code([(1 << 3) | 3, 1, 0, (8 << 3) | 1, (11 << 3) | 4, 0])
    atrace = fb(1, fv(8, 5) + fb(11, b"B|12|ev k=abc k=de"))
    write(d, "overlay-atrace", struct.pack("<HH", len(small), len(overlay)) + small + overlay +
          bytes([3]) + atrace)

# ---- text formats ------------------------------------------------------------------------

def seeds_pbtxt():
    d = os.path.join(CORPUS, "pbtxt")
    for name in ("traced-relay-2machines.config.pbtxt",):
        write(d, "2machines.pbtxt", b"0" + open(os.path.join(VEC, "traces", name), "rb").read())

def seeds_config_file():
    d = os.path.join(CORPUS, "config_file")
    text = open(os.path.join(ROOT, "docs", "configuration.md")).read().split("```")
    n = 0
    for block in text[1::2]:
        lines = block.split("\n", 1)
        if len(lines) < 2 or "=" not in lines[1] or lines[1].lstrip().startswith("tracerelay"):
            continue
        write(d, "docs-%d.conf" % n, lines[1].encode()); n += 1

def seeds_ipc_frame():
    d = os.path.join(CORPUS, "ipc_frame")
    s = open(os.path.join(VEC, "ipc", "producer-unix.to-service.bin"), "rb").read()[:3000]
    write(d, "stream-producer-unix-head", bytes([0]) + s)

def main():
    seeds_producer_port()
    seeds_relay()
    seeds_relay_carrier()
    seeds_clock_frames()
    seeds_agent_commands()
    seeds_regional_upstream()
    seeds_trace_buffer()
    seeds_packet_rewrite()
    seeds_trace_filter()
    seeds_pbtxt()
    seeds_config_file()
    seeds_ipc_frame()
    total = 0
    for root, _, files in os.walk(CORPUS):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    print("corpus: %d bytes" % total)

if __name__ == "__main__":
    main()
