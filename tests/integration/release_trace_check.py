#!/usr/bin/env python3
"""release_trace_check.py TRACE HOSTS: checks a trace of the compat producer (tests/vectors/
releases/README.md) on HOSTS hosts. A burst is 20 TrackEvent slices, a counter, then a custom
packet (its own data source, stopped apart from track_event). Per machine_id, with K bursts
begun (slice begins / 20, rounded up): as many slice ends as begins, K or K - 1 counters and
custom packets (the stop may cut the last burst after any of its parts, not an earlier one),
the custom packets' seq_values consecutive. Prints one line per host; exits 1 if a host is
missing or incomplete."""
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from pbwire import fields, first  # noqa: E402

SLICES_PER_BURST = 20
trace, hosts = sys.argv[1], int(sys.argv[2])
count = collections.defaultdict(collections.Counter)
bursts = collections.defaultdict(set)
for f, _, packet in fields(open(trace, "rb").read()):
    if f != 1:
        continue
    machine = first(packet, 98, 0)
    event = first(packet, 11)
    if event is not None:
        count[machine][{1: "begin", 2: "end", 4: "counter"}.get(first(event, 9, 0), "other")] += 1
    test = first(packet, 900)
    if test is not None and first(test, 1, b"").startswith(b"compat burst "):
        bursts[machine].add(first(test, 2, 0))
ok = len(bursts) == hosts
for machine, seen in sorted(bursts.items()):
    c = count[machine]
    k = -(-c["begin"] // SLICES_PER_BURST)
    whole = (k >= 5 and c["end"] == c["begin"] and k - 1 <= c["counter"] <= k and
             k - 1 <= len(seen) <= k and seen == set(range(min(seen), min(seen) + len(seen))))
    ok &= whole
    print("machine %#x: %d bursts begun, %d slice begins, %d ends, %d counters, %d custom "
          "packets: %s" % (machine, k, c["begin"], c["end"], c["counter"], len(seen),
                           "whole" if whole else "INCOMPLETE"))
if len(bursts) != hosts:
    print("%d hosts' bursts in the trace, %d expected" % (len(bursts), hosts))
sys.exit(0 if ok else 1)
