"""trigger_packets.py TRACE: prints one line per `trigger` packet of a Perfetto trace
(TracePacket field 46): "TIMESTAMP NAME PRODUCER UID STOP_DELAY_MS", for test_triggers.sh."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import pbwire  # noqa: E402

with open(sys.argv[1], "rb") as f:
    trace = f.read()
for packet in pbwire.all_of(trace, 1):
    trigger = pbwire.first(packet, 46)
    if trigger is None:
        continue
    print(pbwire.first(packet, 8, 0), pbwire.first(trigger, 1, b"").decode(),
          pbwire.first(trigger, 2, b"").decode().replace(" ", "_"), pbwire.first(trigger, 3, 0),
          pbwire.first(trigger, 4, 0))
