#!/usr/bin/env python3
"""ui_record.py: records a trace through Perfetto's websocket_bridge as the Perfetto UI's "Record
new trace" page does for a Linux target (v58.2, plugin dev.perfetto.RecordTraceV2: files
traced_websocket_target.ts, tracing_protocol.ts, consumer_ipc_tracing_session.ts,
packet_assembler.ts; docs/querying.md#recording-from-the-perfetto-ui says what they do).
Python stdlib only: a WebSocket client (RFC 6455 handshake, masked binary frames) carrying
Perfetto IPC frames, as the browser's WebSocket does.

  1. Target selected: a management connection binds ConsumerPort and runs QueryServiceState
     (the preflight table: version, #producers, #datasources, #sessions). It stays open.
  2. Start tracing: a second connection binds ConsumerPort and sends EnableTracing with the
     page's TraceConfig; GetTraceStats every second while recording (the "Buffer usage" cell).
  3. Stop (a line "stop" on stdin): Flush with the UI's flags, then DisableTracing. Or the
     duration ends on its own.
  4. The EnableTracing reply (error "" = stopped): ReadBuffers until has_more is false, packets
     reassembled from slices, then the connection is closed (the UI sends no FreeBuffers).

The UI's own strictness is kept: a reply with success=false (Flush excepted) or a frame other
than an InvokeMethodReply is an error. A summary goes to --summary as JSON; exit 0 when a
trace was written, 1 otherwise (the error on stderr).

Usage: ui_record.py --url ws://127.0.0.1:8037/traced --out TRACE --summary JSON
                    [--duration-ms N] [--buffer-kb N] [--data-source NAME] [--category C]...
                    [--timeout S]"""
import argparse
import base64
import hashlib
import json
import os
import select
import socket
import struct
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tools"))
from pbwire import all_of, fb, fields, first, fv  # noqa: E402

ORIGIN = "https://ui.perfetto.dev"  # one of websocket_bridge's default allowed origins
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_WS_MESSAGE = 64 << 20  # the bridge's own kMaxPayloadSize
MAX_IPC_FRAME = 128 << 10  # Perfetto's kIPCBufferSize
UI_FLUSH_FLAGS = (2 << 4) | 2  # consumer_ipc_tracing_session.ts stop(): kPerfettoCmd, kTraceStop
STATS_PERIOD_S = 1.0  # target_selection_page.ts polls the buffer usage every 1000 ms


class ProtocolError(Exception):
    pass


class WebSocket:
    """A client WebSocket: the handshake, masked binary frames out, whole messages in."""

    def __init__(self, url, timeout):
        u = urllib.parse.urlparse(url)
        if u.scheme != "ws" or not u.hostname:
            raise ProtocolError(f"not a ws:// URL: {url}")
        self.sock = socket.create_connection((u.hostname, u.port or 80), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        req = (f"GET {u.path or '/'} HTTP/1.1\r\nHost: {u.netloc}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               f"Sec-WebSocket-Version: 13\r\nOrigin: {ORIGIN}\r\n\r\n")
        self.sock.sendall(req.encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self._fill()
            if len(self.buf) > 16384:
                raise ProtocolError("handshake: response headers too long")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        if len(lines[0].split()) < 2 or lines[0].split()[1] != "101":
            raise ProtocolError(f"handshake refused: {lines[0]}")
        hdrs = {k.strip().lower(): v.strip()
                for k, _, v in (line.partition(":") for line in lines[1:])}
        want = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        if hdrs.get("sec-websocket-accept") != want:
            raise ProtocolError("handshake: wrong Sec-WebSocket-Accept")
        self.closed = False
        self.partial = b""  # a fragmented message's first frames

    def fileno(self):
        return self.sock.fileno()

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError
        self.buf += data

    def send(self, payload, opcode=2):
        n = len(payload)
        if n < 126:
            hdr = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 65536:
            hdr = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            hdr = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        mask = os.urandom(4)
        body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(hdr + mask + body)

    def _frame(self):
        """One complete frame from the buffer, or None: (fin, opcode, payload)."""
        if len(self.buf) < 2:
            return None
        b0, b1 = self.buf[0], self.buf[1]
        if b1 & 0x80:
            raise ProtocolError("the server sent a masked frame")
        n, off = b1 & 0x7F, 2
        if n == 126:
            if len(self.buf) < 4:
                return None
            n, off = struct.unpack("!H", self.buf[2:4])[0], 4
        elif n == 127:
            if len(self.buf) < 10:
                return None
            n, off = struct.unpack("!Q", self.buf[2:10])[0], 10
        if n > MAX_WS_MESSAGE:
            raise ProtocolError(f"a {n}-byte WebSocket frame")
        if len(self.buf) < off + n:
            return None
        payload, self.buf = self.buf[off:off + n], self.buf[off + n:]
        return bool(b0 & 0x80), b0 & 0x0F, payload

    def messages(self):
        """Reads once from the socket; returns the whole binary messages now complete."""
        self._fill()
        out, partial = [], self.partial
        while (fr := self._frame()) is not None:
            fin, op, payload = fr
            if op == 8:
                self.closed = True
                raise EOFError
            if op == 9:
                self.send(payload, opcode=10)
                continue
            if op in (0, 1, 2):
                partial += payload
                if len(partial) > MAX_WS_MESSAGE:
                    raise ProtocolError("a WebSocket message over 64 MiB")
                if fin:
                    out.append(partial)
                    partial = b""
        self.partial = partial
        return out

    def close(self):
        if not self.closed:
            try:
                self.send(struct.pack("!H", 1000), opcode=8)
            except OSError:
                pass
            self.closed = True
        self.sock.close()


class TracingProtocol:
    """The consumer side of Perfetto's IPC over a byte stream, as tracing_protocol.ts has it."""

    def __init__(self, url, timeout):
        self.ws = WebSocket(url, timeout)
        self.rx = b""
        self.pending = {}  # request id -> (method, callback(success, has_more, reply))
        self.next_id = 2
        self.timeout = timeout
        # BindService, request id 1: one request, one reply, before anything else.
        self._send(fv(2, 1) + fb(3, fb(1, "ConsumerPort")))
        frame = self._one_frame()
        reply = first(frame, 4)
        if reply is None:
            raise ProtocolError("BindService: the first frame is not a BindServiceReply")
        if not first(reply, 1, 0):
            raise ProtocolError("BindService ConsumerPort refused")
        self.service_id = first(reply, 2, 0)
        self.methods = {first(m, 2, b"").decode(): first(m, 1, 0) for m in all_of(reply, 3)}

    def _send(self, frame):
        self.ws.send(struct.pack("<I", len(frame)) + frame)

    def _frames(self):
        out = []
        while len(self.rx) >= 4:
            n = struct.unpack("<I", self.rx[:4])[0]
            if n > MAX_IPC_FRAME:
                raise ProtocolError(f"an IPC frame of {n} bytes (over 128 KiB)")
            if len(self.rx) < 4 + n:
                break
            out.append(self.rx[4:4 + n])
            self.rx = self.rx[4 + n:]
        return out

    def _one_frame(self):
        deadline = time.monotonic() + self.timeout
        while True:
            frames = self._frames()
            if frames:
                return frames[0]
            if not select.select([self.ws], [], [], max(0, deadline - time.monotonic()))[0]:
                raise ProtocolError("no reply to BindService")
            for m in self.ws.messages():
                self.rx += m

    def invoke(self, method, args, callback):
        if method not in self.methods:
            raise ProtocolError(f"RPC Error: method {method} not supported")
        req = self.next_id
        self.next_id += 1
        invoke = fv(1, self.service_id) + fv(2, self.methods[method]) + fb(3, args)
        self._send(fv(2, req) + fb(5, invoke))
        self.pending[req] = (method, callback)

    def on_readable(self):
        for m in self.ws.messages():
            self.rx += m
        for frame in self._frames():
            reply = first(frame, 6)
            if reply is None:
                raise ProtocolError("Tracing protocol: unrecognized frame")
            req = first(frame, 2, 0)
            if req not in self.pending:
                raise ProtocolError(f"a reply to request {req}, which is not pending")
            method, callback = self.pending[req]
            ok, more = bool(first(reply, 1, 0)), bool(first(reply, 2, 0))
            if not ok and method != "Flush":
                raise ProtocolError(f"Tracing Protocol: {method} failed")
            if not more:
                del self.pending[req]
            callback(ok, more, first(reply, 3, b""))

    def close(self):
        self.ws.close()


def service_state(state):
    """The preflight table's figures from a TracingServiceState."""
    producers = [{"name": first(p, 2, b"").decode(), "machine_name": first(p, 8, b"").decode()}
                 for p in all_of(state, 1)]
    return {"version": first(state, 5, b"N/A").decode(), "producers": producers,
            "data_sources": len(all_of(state, 2)), "sessions_started": first(state, 4, 0)}


def preflight(url, timeout):
    """traced_websocket_target.ts runPreflightChecks(): the management connection and its
    QueryServiceState. The replies are concatenated and decoded as one
    QueryServiceStateResponse, as ServiceStateMerger does."""
    mgmt = TracingProtocol(url, timeout)
    chunks, done = [], []
    def on_state(ok, more, reply):
        chunks.append(reply)
        if not more:
            done.append(True)

    mgmt.invoke("QueryServiceState", b"", on_state)
    deadline = time.monotonic() + timeout
    while not done:
        if not select.select([mgmt.ws], [], [], max(0, deadline - time.monotonic()))[0]:
            raise ProtocolError("QueryServiceState: no last reply")
        mgmt.on_readable()
    merged = b"".join(chunks)
    states = [v for f, _, v in fields(merged) if f == 1]
    if not states:
        raise ProtocolError("Failed to decode QueryServiceStateResponse")
    summary = {"replies": len(chunks), "bytes": len(merged),
               # what the page builds (protobufjs 7.6.5): the last service_state only
               "last_state": service_state(states[-1]),
               # what a merging decoder builds: every element of every reply
               "merged_state": service_state(b"".join(states))}
    return mgmt, summary


def trace_config(args):
    """The TraceConfig the page builds (trace_config_builder.ts toTraceConfig()) for the mode
    "Stop when full": one DISCARD buffer, no target_buffer; the Perfetto SDK probe's track_event
    with "*" disabled and the chosen categories enabled, or another data source by name."""
    if args.data_source == "track_event":
        te = fb(1, "*") + b"".join(fb(2, c) for c in args.category)
        ds = fb(1, fb(1, "track_event") + fb(113, te))
    else:
        ds = fb(1, fb(1, args.data_source))
    return fb(1, fv(1, args.buffer_kb) + fv(4, 2)) + fb(2, ds) + fv(3, args.duration_ms)


def buffer_usage(reply):
    """consumer_ipc_tracing_session.ts getBufferUsagePct(), None where the UI shows NaN."""
    tot = used = 0
    for bs in all_of(first(reply, 1, b""), 1):
        size = first(bs, 12, 0)
        tot += size
        used += min(first(bs, 1, 0), size)
    return None if tot == 0 else min(round(100 * used / tot), 100)


def record(args, summary):
    summary["log"] = []

    def log(msg):
        summary["log"].append(msg)
        print(f"ui_record: {msg}", file=sys.stderr, flush=True)

    mgmt, summary["preflight"] = preflight(args.url, args.timeout)
    st = summary["preflight"]["last_state"]
    log(f"preflight: Traced version {st['version']}; #producers: {len(st['producers'])}, "
        f"#datasources: {st['data_sources']}, #sessions: {st['sessions_started']}")

    ipc = TracingProtocol(args.url, args.timeout)
    summary["methods"] = sorted(ipc.methods)
    state = {"name": "RECORDING", "trace": bytearray(), "slices": [], "packets": 0}
    summary["buffer_usage"] = []

    def on_trace_data(ok, more, reply):
        for sl in all_of(reply, 2):
            data = first(sl, 1)
            if data is None:
                continue
            state["slices"].append(data)
            if first(sl, 2, 0):
                body = b"".join(state["slices"])
                state["slices"] = []
                state["trace"] += fb(1, body)  # TracePacket preamble, as PacketAssembler
                state["packets"] += 1
        if not more:
            state["name"] = "FINISHED"

    def on_enable_reply(ok, more, reply):
        error = first(reply, 3, b"").decode()
        if error:
            log(f"Tracing failed: {error}")
            state["name"] = "ERRORED"
            return
        state["name"] = "STOPPING"
        log("Tracing stopped. Reading back data")
        ipc.invoke("ReadBuffers", b"", on_trace_data)

    def on_flushed(ok, more, reply):
        log("Flush complete, stopping trace")
        ipc.invoke("DisableTracing", b"", lambda *_: None)

    def on_stats(ok, more, reply):
        pct = buffer_usage(reply)
        summary["buffer_usage"].append(pct)
        print(f"ui_record: buffer usage {'NaN' if pct is None else pct} %", flush=True)

    log(f"Starting trace, durationMs: {args.duration_ms}")
    ipc.invoke("EnableTracing", fb(1, trace_config(args)), on_enable_reply)
    print("ui_record: recording", flush=True)
    next_poll = time.monotonic() + STATS_PERIOD_S
    deadline = time.monotonic() + args.timeout
    stdin_open = True
    while state["name"] not in ("FINISHED", "ERRORED"):
        if time.monotonic() > deadline:
            raise ProtocolError(f"still {state['name']} after {args.timeout} s")
        watch = [ipc.ws] + ([sys.stdin] if stdin_open else [])
        ready = select.select(watch, [], [], max(0, next_poll - time.monotonic()))[0]
        if ipc.ws in ready:
            ipc.on_readable()
        if sys.stdin in ready:
            line = sys.stdin.readline()
            stdin_open = bool(line)
            if line.strip() == "stop" and state["name"] == "RECORDING":
                state["name"] = "STOPPING"
                log("Flushing data sources")
                ipc.invoke("Flush", fv(2, UI_FLUSH_FLAGS), on_flushed)
        if time.monotonic() >= next_poll:
            if state["name"] == "RECORDING":
                ipc.invoke("GetTraceStats", b"", on_stats)
            next_poll = time.monotonic() + STATS_PERIOD_S
    ipc.close()
    mgmt.close()
    summary["state"] = state["name"]
    summary["packets"] = state["packets"]
    summary["bytes"] = len(state["trace"])
    if state["name"] != "FINISHED":
        return False
    with open(args.out, "wb") as f:
        f.write(state["trace"])
    log(f"FINISHED: {state['packets']} packets, {len(state['trace'])} bytes")
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="ws://127.0.0.1:8037/traced")
    ap.add_argument("--out", required=True)
    ap.add_argument("--summary", required=True)
    ap.add_argument("--duration-ms", type=int, default=10000)  # the page's defaults
    ap.add_argument("--buffer-kb", type=int, default=64 * 1024)
    ap.add_argument("--data-source", default="track_event")
    ap.add_argument("--category", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args()
    summary, ok = {}, False
    try:
        ok = record(args, summary)
    except (ProtocolError, OSError, EOFError, ValueError, IndexError) as e:
        summary["error"] = f"{type(e).__name__}: {e}"
        print(f"ui_record: {summary['error']}", file=sys.stderr)
    with open(args.summary, "w") as f:
        json.dump(summary, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
