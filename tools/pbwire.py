"""pbwire.py: a minimal protobuf wire-format codec for the project's Python scripts (fuzz seed
generation, trace checks in tests): varints, a message's fields, field builders, and Perfetto's
IPC framing (uint32 LE length + IPCFrame). No schema: the callers name field numbers
themselves."""
import struct


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)

def read_varint(b, i):
    v = shift = 0
    while True:
        c = b[i]; i += 1
        v |= (c & 0x7F) << shift
        if not c & 0x80:
            return v, i
        shift += 7

def fields(b):
    """(field, wiretype, value) of one message; value is int or bytes."""
    i, out = 0, []
    while i < len(b):
        key, i = read_varint(b, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(b, i)
        elif wt == 1:
            v = b[i:i + 8]; i += 8
        elif wt == 2:
            n, i = read_varint(b, i)
            v = b[i:i + n]; i += n
        elif wt == 5:
            v = b[i:i + 4]; i += 4
        else:
            raise ValueError("wire type %d" % wt)
        out.append((f, wt, v))
    return out

def first(b, f, default=None):
    for ff, _, v in fields(b):
        if ff == f:
            return v
    return default

def all_of(b, f):
    return [v for ff, _, v in fields(b) if ff == f]

def fv(f, v):       # varint field
    return varint(f << 3) + varint(v)

def fb(f, data):    # length-delimited field
    if isinstance(data, str):
        data = data.encode()
    return varint(f << 3 | 2) + varint(len(data)) + data

def ff64(f, v):     # fixed64 field
    return varint(f << 3 | 1) + struct.pack("<Q", v)

def ff32(f, v):     # fixed32 field
    return varint(f << 3 | 5) + struct.pack("<I", v)

def split_frames(buf):
    """(the whole IPC frames' payloads at the start of buf, the bytes after them)."""
    frames, i = [], 0
    while len(buf) - i >= 4:
        n = struct.unpack_from("<I", buf, i)[0]
        if len(buf) - i - 4 < n:
            break
        frames.append(bytes(buf[i + 4:i + 4 + n]))
        i += 4 + n
    return frames, buf[i:]
