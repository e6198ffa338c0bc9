#!/usr/bin/env python3
"""Where a lane import's connections wait, from an execution trace.

Reads what `go tool trace -d=parsed FILE.trace` prints for one lane run of
BenchmarkImport (-kvfabric.bench.import.trace DIR writes DIR/lane-N.trace)
and prints:

- the lane connections' idle time: each goroutine that carries one read's
  parts on one connection (readLane's; also those a widenLaneRead started,
  in the build that had it: BENCHMARKS.md) is that connection busy from
  its start to its end; a connection not busy
  between the first read's start and the last read's end is idle. The idle
  time is split by how many reads were under way then (idle with reads
  under way on fewer connections than they could use) and at the run's
  tail (after the last read started: no read is left to start);
- the callers' time between reads (their lease, release, registration and
  Import calls, and a read's wait for its first connection while all are
  busy): callers (BenchmarkImport's Import calls in flight, 4 by default)
  minus the reads under way, summed up to the last read's start;
- where goroutines waited (by reason and their first kvfabric frames) and
  waited for a core (runnable), with --waits N.

The -d=parsed format is the Go toolchain's debug output (Go 1.26 here);
another release may print it otherwise.

    go tool trace -d=parsed /tmp/tr/lane-2.trace > /tmp/tr/lane-2.txt
    python3 testbed/lanetrace.py /tmp/tr/lane-2.txt --conns 4 --callers 4
"""

import argparse
import collections
import re
import sys

EVENT = re.compile(r" G=(-?\d+) (\w+) Time=(\d+)")
TRANSITION = re.compile(r'GoID=(\d+) (\w+)->(\w+) Reason="([^"]*)"')


def parse(path):
    """The trace's events, each with its stacks' function names."""
    evs, cur, mode = [], None, None
    with open(path) as f:
        for line in f:
            if line.startswith("M="):
                m = EVENT.search(line)
                if not m:
                    cur = None
                    continue
                cur = {"g": int(m.group(1)), "kind": m.group(2),
                       "t": int(m.group(3)), "line": line,
                       "stk": [], "tstk": []}
                evs.append(cur)
                mode = None
            elif line.startswith("Stack="):
                mode = "stk"
            elif line.startswith("TransitionStack="):
                mode = "tstk"
            elif (line.startswith("\t") and not line.startswith("\t\t")
                  and cur is not None and mode):
                cur[mode].append(line.strip().split(" @")[0])
    return evs


def transitions(evs):
    """(event, goroutine, from, to, reason, stack) of state transitions."""
    for e in evs:
        if e["kind"] != "StateTransition":
            continue
        m = TRANSITION.search(e["line"])
        if m:
            yield (e, int(m.group(1)), m.group(2), m.group(3), m.group(4),
                   e["tstk"] or e["stk"])


def key(stk):
    own = [f.split("kvfabric/kvfabric/")[1] for f in stk
           if "kvfabric/kvfabric/" in f]
    return " < ".join(own[:3]) if own else (stk[0] if stk else "?")


def ms(ns):
    return ns / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("parsed", help="go tool trace -d=parsed output")
    ap.add_argument("--conns", type=int, default=4,
                    help="lane connections per peer (Config.LaneConns)")
    ap.add_argument("--callers", type=int, default=4,
                    help="Import calls in flight")
    ap.add_argument("--waits", type=int, default=0,
                    help="print the N longest waits by frame")
    args = ap.parse_args()
    evs = parse(args.parsed)
    if not evs:
        sys.exit("no events in " + args.parsed)
    t0 = min(e["t"] for e in evs)
    t1 = max(e["t"] for e in evs)

    born, died, parent = {}, {}, {}
    conn_gs, widener_gs = set(), set()
    state, since, why = {}, {}, {}
    wait, runq = collections.Counter(), collections.Counter()
    for e, g, fr, to, reason, stk in transitions(evs):
        if fr == "NotExist":
            born.setdefault(g, e["t"])
            parent[g] = e["g"]
        elif fr == "Undetermined":
            born.setdefault(g, t0)
        if to == "NotExist":
            died[g] = e["t"]
        if e["g"] == g and any("readLane.func" in f for f in stk):
            conn_gs.add(g)
        if e["g"] == g and any("widenLaneRead" in f for f in stk):
            widener_gs.add(g)
        if g in state:
            d = e["t"] - since[g]
            if state[g] == "Waiting":
                wait[why[g]] += d
            elif state[g] == "Runnable":
                runq[why[g][1]] += d
        state[g], since[g] = to, e["t"]
        if to == "Waiting":
            why[g] = (reason, key(stk))
        elif to == "Runnable":
            why[g] = ("", key(stk) if stk else why.get(g, ("", "?"))[1])
    conn_gs -= widener_gs
    if not conn_gs:
        sys.exit("no lane reads in " + args.parsed)

    conns, callers = args.conns, args.callers
    iv = [(born.get(g, t0), died.get(g, t1)) for g in conn_gs]
    first = min(a for a, _ in iv)
    last = max(b for _, b in iv)
    last_start = max(a for a, _ in iv)

    # Reads: one per Import call's goroutine; its connections are started
    # by it or by its widener. Overlapping spans of one root are one read.
    def root(g):
        p = parent.get(g)
        while p in widener_gs:
            p = parent.get(p)
        return p
    by_root = collections.defaultdict(list)
    for g in conn_gs:
        by_root[root(g)].append((born.get(g, t0), died.get(g, t1)))
    reads = []
    for spans in by_root.values():
        spans.sort()
        cur = None
        for a, b in spans:
            if cur and a <= cur[1]:
                cur = [cur[0], max(cur[1], b), cur[2] + 1]
            else:
                if cur:
                    reads.append(tuple(cur))
                cur = [a, b, 1]
        reads.append(tuple(cur))

    points = sorted([(a, "c", 1) for a, _ in iv] + [(b, "c", -1) for _, b in iv]
                    + [(a, "r", 1) for a, _, _ in reads]
                    + [(b, "r", -1) for _, b, _ in reads])
    used = nreads = 0
    prev = first
    idle_by_reads = collections.Counter()
    idle_tail = gap = 0
    for t, kind, d in points:
        if t > prev:
            idle = (conns - used) * (t - prev)
            if prev >= last_start:
                idle_tail += idle
            else:
                idle_by_reads[nreads] += idle
                gap += max(0, callers - nreads) * (min(t, last_start) - prev)
        if kind == "c":
            used += d
        else:
            nreads += d
        prev = max(prev, t)
    idle_mid = sum(idle_by_reads.values())
    span = last - first
    print(f"trace window {ms(t1 - t0):.1f} ms; reads {len(reads)}, "
          f"connections per read {dict(collections.Counter(n for _, _, n in reads))}")
    print(f"lane connections idle from the first read's start to the last's end "
          f"({ms(span):.1f} ms, {conns} connections): "
          f"{ms(idle_mid + idle_tail):.1f} conn-ms, "
          f"{100 * (idle_mid + idle_tail) / (conns * span):.0f}%")
    print(f"  before the last read started: {ms(idle_mid):.1f} conn-ms; by reads under way: "
          + ", ".join(f"{k}: {ms(v):.1f}" for k, v in sorted(idle_by_reads.items())))
    print(f"  the tail ({ms(last - last_start):.1f} ms after the last read started): "
          f"{ms(idle_tail):.1f} conn-ms")
    print(f"callers between reads before the last read started: {ms(gap):.1f} caller-ms, "
          f"{ms(gap) / max(1, len(reads) - callers):.1f} ms per read after the first {callers}")
    if args.waits:
        print("waiting, by reason and first kvfabric frames (goroutine-ms):")
        for (reason, k), v in wait.most_common(args.waits):
            print(f"  {ms(v):9.1f}  {reason:12s} {k}")
        print("runnable, waiting for a core (goroutine-ms):")
        for k, v in runq.most_common(args.waits):
            print(f"  {ms(v):9.1f}  {k}")


if __name__ == "__main__":
    main()
