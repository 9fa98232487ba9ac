"""A brute-force happens-before reference for the race engine's property tests.

It builds the event graph explicitly (one node per launch or synchronization,
edges for program order, events, wait_stream, host syncs, collectives), takes
its transitive closure with bitsets, and checks every pair of overlapping,
conflicting accesses from different streams. Deliberately simple and slow: it
shares no code with sanitizer/races/happens_before.py.
"""
from __future__ import annotations

from torchlint.sanitizer.races import happens_before as hb


def reference_races(events):
    """Set of (later index, later arg, earlier stream, earlier index) for unordered pairs.

    For each access and each other stream, only the latest unordered earlier
    access is kept, which is what the engine promises to report.
    """
    preds = {}  # node index -> set of predecessor node indices
    accesses = []  # (node, stream, start, end, is_write, arg)
    last_node = {}
    host_last = None
    recorded = {}
    work_node = {}
    pledges = {}
    live = {}  # start -> end of the allocations not yet freed
    frees = []  # (index, start, end, pledged streams)
    capturing = set()
    graph = None
    graphs = {}

    def node(i, stream, extra=()):
        p = set(extra)
        if stream in last_node:
            p.add(last_node[stream])
        if host_last is not None:
            p.add(host_last)
        preds[i] = p
        last_node[stream] = i

    for i, ev in enumerate(events, start=1):
        if isinstance(ev, hb.Kernel):
            if ev.stream in capturing:
                graphs[graph].extend(ev.accesses)
                continue
            node(i, ev.stream)
            for a in ev.accesses:
                accesses.append((i, ev.stream, a.start, a.end, a.is_write, a.arg))
        elif isinstance(ev, hb.StreamCreated):
            pass
        elif isinstance(ev, hb.EventRecord):
            node(i, ev.stream)
            recorded[ev.event] = i
        elif isinstance(ev, hb.EventWait):
            node(i, ev.stream, [recorded[ev.event]] if ev.event in recorded else [])
        elif isinstance(ev, hb.WaitStream):
            node(i, ev.waiter, [last_node[ev.waitee]] if ev.waitee in last_node else [])
        elif isinstance(ev, hb.StreamSync):
            p = {host_last} if host_last is not None else set()
            if ev.stream in last_node:
                p.add(last_node[ev.stream])
            preds[i] = p
            host_last = i
        elif isinstance(ev, hb.EventSync):
            p = {host_last} if host_last is not None else set()
            if ev.event in recorded:
                p.add(recorded[ev.event])
            preds[i] = p
            host_last = i
        elif isinstance(ev, hb.DeviceSync):
            p = {host_last} if host_last is not None else set()
            p.update(last_node.values())
            preds[i] = p
            host_last = i
        elif isinstance(ev, hb.Collective):
            pseudo = hb.CollectiveStream(ev.group)
            node(i, pseudo, [last_node[ev.stream]] if ev.stream in last_node else [])
            work_node[ev.work] = i
            for a in ev.accesses:
                accesses.append((i, pseudo, a.start, a.end, a.is_write, a.arg))
        elif isinstance(ev, hb.WorkWait):
            node(i, ev.stream, [work_node[ev.work]] if ev.work in work_node else [])
        elif isinstance(ev, hb.Alloc):
            # New bytes imply their previous owner's free: a pledged owner they overlap is freed here.
            for start in list(pledges):
                if start in live and start < ev.end and ev.start < live[start]:
                    frees.append((i, start, live.pop(start), pledges.pop(start)))
            pledges.pop(ev.start, None)
            live[ev.start] = ev.end
        elif isinstance(ev, hb.RecordStream):
            pledges.setdefault(ev.start, set()).add(ev.stream)
        elif isinstance(ev, hb.Free):
            end = live.pop(ev.start, ev.end)
            frees.append((i, ev.start, end if end is not None else ev.end, pledges.pop(ev.start, set())))
        elif isinstance(ev, hb.CaptureBegin):
            capturing = {ev.stream}
            graph = ev.graph
            graphs[graph] = []
        elif isinstance(ev, hb.CaptureEnd):
            capturing = set()
            graph = None
        elif isinstance(ev, hb.GraphReplay):
            if ev.graph not in graphs:
                continue
            node(i, ev.stream)
            for a in graphs[ev.graph]:
                accesses.append((i, ev.stream, a.start, a.end, a.is_write, a.arg))
        else:
            raise TypeError(ev)

    # Transitive closure: reach[n] = bitset of nodes that happen before n.
    reach = {}
    for n in sorted(preds):
        bits = 0
        for p in preds[n]:
            bits |= reach[p] | (1 << p)
        reach[n] = bits

    def ordered(b_node, b_stream, b_start, b_end, a_node):
        if (reach[a_node] >> b_node) & 1:
            return True
        for f, start, end, pledged in frees:
            if b_node < f < a_node and b_stream in pledged and start <= b_start and b_end <= end:
                return True
        return False

    found = {}
    for a_node, a_stream, a_start, a_end, a_write, a_arg in accesses:
        for b_node, b_stream, b_start, b_end, b_write, _ in accesses:
            if b_node >= a_node or b_stream == a_stream:
                continue
            if not (a_write or b_write):
                continue
            if b_end <= a_start or a_end <= b_start or a_end <= a_start or b_end <= b_start:
                continue
            if ordered(b_node, b_stream, b_start, b_end, a_node):
                continue
            key = (a_node, a_arg, b_stream)
            found[key] = max(found.get(key, 0), b_node)
    return {(a, arg, stream, b) for (a, arg, stream), b in found.items()}


def engine_races(events):
    engine = hb.HappensBefore(keep_all=True, gc_min=4)
    engine.run(events)
    return {
        (r.later.index, r.later.arg, r.earlier.stream, r.earlier.index) for r in engine.all_races
    }
