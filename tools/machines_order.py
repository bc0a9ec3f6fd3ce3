#!/usr/bin/env python3
"""machines_order.py TRACE: checks the packet order trace_processor v58 needs in a `machines`
trace (docs/timeline.md, `machines`): per machine, its first remote_clock_sync, then its clock
anchor (a packet with only a timestamp), then anything else of it with a timestamp or a
ClockSnapshot. Exits 1 with the first offending packets, 0 if every machine is anchored in
order. Used by tests/integration/test_timeline.sh and test_tiers.sh."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pbwire import fields  # noqa: E402

TRUSTED_UID, CLOCK_SNAPSHOT, TIMESTAMP, TRUSTED_SEQ, MACHINE_ID, REMOTE_CLOCK_SYNC = 3, 6, 8, 10, 98, 107
ANCHOR = {TIMESTAMP, MACHINE_ID, TRUSTED_UID, TRUSTED_SEQ}


def main(path):
    state, bad = {}, []
    for n, (f, _, packet) in enumerate(fields(open(path, "rb").read())):
        if f != 1:
            continue
        fs = {ff: v for ff, _, v in fields(packet)}
        m = fs.get(MACHINE_ID)
        if not m:
            continue
        seen = state.setdefault(m, "new")
        if REMOTE_CLOCK_SYNC in fs:
            state[m] = "synced" if seen == "new" else seen
        elif TIMESTAMP in fs or CLOCK_SNAPSHOT in fs:
            if seen == "synced" and set(fs) == ANCHOR:
                state[m] = "anchored"
            elif seen != "anchored":
                bad.append((n, m, seen))
    if bad or not state or any(v != "anchored" for v in state.values()):
        print(f"FAIL: machines: packet order trace_processor cannot use: {bad[:5]} {state}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
