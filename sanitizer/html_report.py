"""One self-contained HTML page of a sanitizer run: what to fix first, what happened when, and where.

``torchlint-sanitize --report-html report.html``, ``pytest --gpu-sanitize-html``,
``session.write_html(path)``, or for saved reports (several ranks merge into
one page with a rank filter)::

    python -m torchlint.sanitizer.html_report rank0.json rank1.json -o report.html

The page needs no network: the charts are inline SVG drawn here from the
report's ``timeline`` field, hovering uses SVG ``<title>`` tooltips, and the
one inline script only filters by rank. It opens with what to fix first
(``ranking.py``: races, out-of-memory errors, then what the run measured
each costing, one line each: the place, the cost, the fix), then the run's
facts and where its time went (``phases.py``), a timeline (steps, sync
stalls sized by host wait, races and OOMs), a memory chart (allocated and
reserved bytes as the memory check's watcher saw them, steps or no steps,
each value held until the next; new segments, the fragmented peak, the OOM
and its allocating line), and per-site tables in the same order (races,
memory, syncs; periodic and one-off syncs last) linked to the static rule's
text (``torchlint rule CODE``). A report of a run that checked nothing (no
CUDA device) says so, and never "no findings".
"""

from __future__ import annotations

import argparse
import html
import math
import sys
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from . import ranking

WIDTH = 960
MiB = 1 << 20
MEMORY_KINDS = ("oom", "fragmentation", "alloc-churn", "alloc-retry", "low-utilization", "near-capacity")

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d2330;max-width:1000px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #dde}
table{border-collapse:collapse;width:100%;margin:8px 0}
td,th{border-bottom:1px solid #e4e6ee;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f3f4f8}code,pre{font:12px ui-monospace,monospace}pre{white-space:pre-wrap;background:#f6f7fa;padding:8px}
.facts td:first-child{width:220px;color:#556}svg{background:#fbfbfd;border:1px solid #e4e6ee}
.step{fill:#e8ecf7}.step.odd{fill:#d7def0}.sync-mark{fill:#e07b00;fill-opacity:.7}.race-mark{fill:#c81e1e}
.oom-mark{fill:#7a00c8}.segment-mark{fill:#1e78c8}.frag-peak-mark{fill:none;stroke:#c81e1e;stroke-width:2}
.allocated{fill:none;stroke:#1e78c8;stroke-width:1.5}
.reserved{fill:none;stroke:#7b8194;stroke-width:1.5;stroke-dasharray:4 2}
.axis{font-size:11px;fill:#556}.legend{font-size:12px}.none{color:#778}
"""

_SCRIPT = """
document.getElementById('rank-filter').addEventListener('change', function (event) {
  var rank = event.target.value;
  document.querySelectorAll('[data-rank]').forEach(function (node) {
    node.style.display = (rank === 'all' || node.getAttribute('data-rank') === rank) ? '' : 'none';
  });
});
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _mib(nbytes: Optional[float]) -> str:
    return "n/a" if nbytes is None else f"{nbytes / MiB:,.1f} MiB"


def _where(file: Optional[str], line: Optional[int]) -> str:
    if not file:
        return "the process"
    return f"{file}:{line}" if line is not None else file


def _rank_of(report: Dict[str, Any], index: int) -> str:
    rank = (report.get("timeline") or {}).get("rank")
    return str(rank if rank is not None else index)


# -- the pieces -------------------------------------------------------------------


def _facts(reports: Sequence[Dict[str, Any]], ranks: Sequence[str]) -> str:
    rows = []
    for report, rank in zip(reports, ranks):
        timeline = report.get("timeline") or {}
        device = report.get("device") or {}
        steps = report.get("steps") or {}
        duration = (timeline.get("clock") or {}).get("duration_s")
        overhead = timeline.get("overhead_s") or {}
        spent = sum(overhead.values())
        share = f" ({spent / duration:.2%} of the run)" if duration else ""
        if steps.get("completed"):
            step_text = (
                f"{steps['completed']} ({steps['warmup']} warm-up, {steps['measured']} measured; "
                f"from {steps['source']})"
            )
        elif "tests" in report:
            step_text = f"{len(report['tests'])} tests"
        else:
            step_text = "no optimizer steps: the whole run is one step"
        pairs = [
            (
                "GPU",
                f"{device.get('name', 'none')} (capability {device.get('capability', '?')}, "
                f"{_mib(device.get('total_memory_bytes'))})"
                if device
                else "no CUDA device",
            ),
            ("torch", report.get("torch") or "not imported"),
            ("allocator settings", timeline.get("alloc_conf") or "default (PYTORCH_ALLOC_CONF unset)"),
            ("checks", ", ".join(report.get("checks", [])) or "none"),
            ("steps", step_text),
            ("run time", f"{duration:.3f} s" if duration is not None else "n/a"),
            (
                "sanitizer's own time",
                f"{spent * 1e3:.1f} ms{share}: "
                + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in sorted(overhead.items())),
            ),
        ]
        body = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in pairs)
        rows.append(
            f'<table class="facts" data-rank="{_e(rank)}"><tr><th colspan="2">rank {_e(rank)}</th></tr>{body}</table>'
            if len(reports) > 1
            else f'<table class="facts">{body}</table>'
        )
    return "\n".join(rows)


class _Scale:
    """Time to x, with long stretches where nothing was recorded cut short.

    A run often spends seconds in CUDA start-up or a first step's lazy
    kernel loading and then does everything worth seeing in a fraction of a
    second; a linear axis would squeeze the whole story into one pixel. A gap
    longer than ``GAP_SHARE`` of the run with no event gets ``GAP_PX`` pixels
    and a marked break ("3.96 s without events").
    """

    GAP_SHARE = 0.1
    GAP_PX = 36

    def __init__(self, duration: float, times: Iterable[float] = (), left: int = 60, right: int = 20) -> None:
        self.duration = max(duration, 1e-6)
        self.left, self.span = left, WIDTH - left - right
        points = sorted({0.0, self.duration, *(min(max(t, 0.0), self.duration) for t in times)})
        self.gaps = [(a, b) for a, b in zip(points, points[1:]) if b - a > self.GAP_SHARE * self.duration]
        kept = self.duration - sum(b - a for a, b in self.gaps)
        self.per_second = (self.span - self.GAP_PX * len(self.gaps)) / max(kept, 1e-9)

    def x(self, t: float) -> float:
        t = min(max(t, 0.0), self.duration)
        position = self.left + t * self.per_second
        for a, b in self.gaps:
            if t <= a:
                break
            inside = min(t, b) - a
            position += (self.GAP_PX * inside / (b - a)) - inside * self.per_second
        return round(position, 2)

    def breaks(self, top: int, bottom: int) -> str:
        out = []
        for a, b in self.gaps:
            x0, x1 = self.x(a), self.x(b)
            out.append(
                f'<g class="axis-break"><rect x="{x0 + 4}" y="{top}" width="{max(x1 - x0 - 8, 1)}" '
                f'height="{bottom - top}" fill="#fff" stroke="#bbc" stroke-dasharray="3 3"/>'
                f'<text class="axis" x="{(x0 + x1) / 2}" y="{top + 12}" text-anchor="middle">⋯</text>'
                f"<title>{b - a:.2f} s without events (cut short)</title></g>"
            )
        return "".join(out)

    def ticks(self, y: int) -> str:
        marks = {0.0, self.duration}
        edges = [0.0] + [t for gap in self.gaps for t in gap] + [self.duration]
        for a, b in zip(edges[::2], edges[1::2]):
            marks.update(a + (b - a) * i / 4 for i in range(5) if (self.x(b) - self.x(a)) > 160 or i in (0, 4))
        out, last = [], -1e9
        for t in sorted(marks):
            x = self.x(t)
            if x - last < 55:
                continue
            last = x
            out.append(f'<text class="axis" x="{x}" y="{y}" text-anchor="middle">{t:.3f} s</text>')
        return "".join(out)


def _event_times(reports: Sequence[Dict[str, Any]]) -> List[float]:
    times: List[float] = []
    for report in reports:
        timeline = report.get("timeline") or {}
        times.extend(timeline.get("steps", []))
        for name in ("syncs", "memory", "segments", "snapshots", "ooms", "races", "launches"):
            times.extend(row[0] for row in timeline.get(name, []))
    return times


def _shared_scale(reports: Sequence[Dict[str, Any]]) -> "_Scale":
    duration = max(((r.get("timeline") or {}).get("clock") or {}).get("duration_s") or 0.0 for r in reports)
    return _Scale(duration, _event_times(reports))


def _timeline_svg(reports: Sequence[Dict[str, Any]], ranks: Sequence[str]) -> str:
    scale = _shared_scale(reports)
    lane_height = 86
    height = lane_height * len(reports) + 30
    parts = [
        f'<svg id="timeline" width="{WIDTH}" height="{height}" role="img" aria-label="timeline of the run">',
        scale.breaks(2, height - 20),
    ]
    for lane, (report, rank) in enumerate(zip(reports, ranks)):
        timeline = report.get("timeline") or {}
        top = lane * lane_height + 6
        parts.append(
            f'<g data-rank="{_e(rank)}"><text class="axis" x="4" y="{top + 14}">steps</text>'
            f'<text class="axis" x="4" y="{top + 44}">syncs</text>'
            f'<text class="axis" x="4" y="{top + 72}">events</text>'
        )
        if len(reports) > 1:
            parts.append(f'<text class="axis" x="4" y="{top + 84}">rank {_e(rank)}</text>')
        previous = 0.0
        for index, end in enumerate(timeline.get("steps", [])):
            x0, x1 = scale.x(previous), scale.x(end)
            parts.append(
                f'<rect class="step{" odd" if index % 2 else ""}" x="{x0}" y="{top + 2}" '
                f'width="{max(x1 - x0, 0.5)}" height="18">'
                f"<title>step {index}: {(end - previous) * 1e3:.2f} ms</title></rect>"
            )
            previous = end
        for start, wait, kind, file, line, rule, step in timeline.get("syncs", []):
            wait_ms = (wait or 0.0) * 1e3
            radius = round(2 + 3 * math.sqrt(wait_ms), 2)
            waited = f"{wait_ms:.3f} ms host wait" if wait is not None else "host wait not timed"
            parts.append(
                f'<circle class="sync-mark" cx="{scale.x(start)}" cy="{top + 40}" r="{min(radius, 14)}" '
                f'data-wait-ms="{wait_ms:.4f}"><title>sync {_e(kind)} at {_e(_where(file, line))}: {waited}'
                f"{' [' + _e(rule) + ']' if rule else ''}, step {step}</title></circle>"
            )
        for t, file, line, step in timeline.get("races", []):
            x = scale.x(t)
            parts.append(
                f'<path class="race-mark" d="M{x} {top + 62} l6 12 h-12 z"><title>race seen at '
                f"{_e(_where(file, line))}, step {step}</title></path>"
            )
        for t, nbytes, file, line, step in timeline.get("ooms", []):
            x = scale.x(t)
            parts.append(
                f'<rect class="oom-mark" x="{x - 5}" y="{top + 62}" width="10" height="12"><title>OOM: '
                f"{_mib(nbytes)} requested at {_e(_where(file, line))}, step {step}</title></rect>"
            )
        parts.append("</g>")
    parts.append(scale.ticks(height - 6) + "</svg>")
    legend = (
        '<p class="legend">Shaded bands are steps; <span style="color:#e07b00">●</span> a sync, its area '
        'the time the host waited; <span style="color:#c81e1e">▲</span> a race; '
        '<span style="color:#7a00c8">■</span> an OOM. Hover a mark for its line; a dashed box is a stretch '
        "without events, cut short.</p>"
    )
    return "".join(parts) + legend


def _memory_svg(reports: Sequence[Dict[str, Any]], ranks: Sequence[str]) -> str:
    scale = _shared_scale(reports)
    height, top, bottom = 260, 14, 230
    peak = 1
    for report in reports:
        for row in (report.get("timeline") or {}).get("memory", []):
            peak = max(peak, row[1], row[2])
        for finding in report.get("findings", []):
            if finding["kind"] == "oom":
                peak = max(peak, int(finding["details"].get("reserved_bytes") or 0))

    def y(nbytes: float) -> float:
        return round(bottom - (bottom - top) * nbytes / peak, 2)

    parts = [
        f'<svg id="memory-chart" width="{WIDTH}" height="{height}" role="img" aria-label="GPU memory over the run">',
        scale.breaks(top - 8, bottom + 14),
    ]
    for i in range(5):
        value = peak * i / 4
        parts.append(f'<text class="axis" x="4" y="{y(value) + 4}">{value / MiB:,.0f} MiB</text>')
    for report, rank in zip(reports, ranks):
        timeline = report.get("timeline") or {}
        rows = timeline.get("memory", [])
        end = (timeline.get("clock") or {}).get("duration_s")
        parts.append(f'<g data-rank="{_e(rank)}">')
        for index, name in ((1, "allocated"), (2, "reserved")):
            points = " ".join(f"{scale.x(t)},{y(value)}" for t, value in _step_curve(rows, index, end))
            if points:
                parts.append(f'<polyline class="{name}" points="{points}"><title>{name} bytes</title></polyline>')
        for row in rows:
            parts.append(
                f'<circle cx="{scale.x(row[0])}" cy="{y(row[2])}" r="3" fill-opacity="0">'
                f"<title>{row[0]:.3f} s, step {row[4]}: allocated {_mib(row[1])}, reserved {_mib(row[2])}, "
                f"{row[3]} segments</title></circle>"
            )
        for t, added, nbytes, file, line, step in timeline.get("segments", []):
            parts.append(
                f'<rect class="segment-mark" x="{scale.x(t) - 3}" y="{bottom + 4}" width="6" height="8">'
                f"<title>{added} new segment(s), reserved +{_mib(nbytes)}, seen at {_e(_where(file, line))} "
                f"(step {step})</title></rect>"
            )
        # The fragmented peak: of the snapshots judged fragmented, the one with the most free-but-unusable bytes.
        fragmented = [row for row in timeline.get("snapshots", []) if row[2]]
        for t, reason, category, free_bytes, _step in sorted(fragmented, key=lambda row: row[3] or 0)[-1:]:
            if category:
                reserved = _reserved_at(rows, t)
                parts.append(
                    f'<circle class="frag-peak-mark" cx="{scale.x(t)}" cy="{y(reserved)}" r="8"><title>'
                    f"{_e(category)} fragmentation ({_e(reason)}): {_mib(free_bytes)} free but unusable, "
                    f"reserved {_mib(reserved)}</title></circle>"
                )
        ooms = [f for f in report.get("findings", []) if f["kind"] == "oom"]
        for t, nbytes, file, line, _step in timeline.get("ooms", []):
            finding = next((f for f in ooms if f.get("line") == line), None)
            cause = f" ({finding['details'].get('cause')})" if finding else ""
            reserved = int(finding["details"].get("reserved_bytes") or 0) if finding else _reserved_at(rows, t)
            parts.append(
                f'<rect class="oom-mark" x="{scale.x(t) - 5}" y="{y(reserved) - 5}" width="10" height="10">'
                f"<title>OOM{_e(cause)}: {_mib(nbytes)} requested, allocated at {_e(_where(file, line))}"
                f"</title></rect>"
            )
        parts.append("</g>")
    parts.append(scale.ticks(height - 4) + "</svg>")
    legend = (
        '<p class="legend"><span style="color:#1e78c8">━</span> allocated, <span style="color:#7b8194">┅</span> '
        'reserved; <span style="color:#1e78c8">▮</span> new segments; <span style="color:#c81e1e">○</span> '
        'the fragmented peak; <span style="color:#7a00c8">■</span> an OOM. Hover for the line.</p>'
    )
    return "".join(parts) + legend


def _step_curve(rows: List[list], index: int, end: Optional[float]) -> List[Tuple[float, float]]:
    """The corners of column ``index`` drawn as held values: each row lasts until the next, the last until ``end``."""
    corners: List[Tuple[float, float]] = []
    for row in rows:
        if corners:
            corners.append((row[0], corners[-1][1]))
        corners.append((row[0], row[index]))
    if corners and end is not None and end > corners[-1][0]:
        corners.append((end, corners[-1][1]))
    return corners


def _reserved_at(rows: List[list], t: float) -> int:
    before = [row for row in rows if row[0] <= t]
    return int((before[-1] if before else rows[0])[2]) if rows else 0


def _rule_link(code: Optional[str]) -> str:
    return f'<a class="rule-link" href="#rule-{_e(code)}">{_e(code)}</a>' if code else '<span class="none">none</span>'


def _stack(frames: Iterable[Dict[str, Any]]) -> str:
    return "<br>".join(f"<code>{_e(f['file'])}:{_e(f['line'])}</code> {_e(f['function'])}" for f in frames)


def _tables(reports: Sequence[Dict[str, Any]], ranks: Sequence[str]) -> Tuple[str, List[str]]:
    rules: List[str] = []
    syncs, memory, races = [], [], []
    for report, rank in zip(reports, ranks):
        for finding in report.get("findings", []):
            finding = dict(finding, _rank=rank)
            if finding["kind"] == "sync":
                syncs.append(finding)
            elif finding["kind"] == "race":
                races.append(finding)
            elif finding["kind"] in MEMORY_KINDS:
                memory.append(finding)
            if finding.get("rule") and finding["rule"] not in rules:
                rules.append(finding["rule"])
    syncs.sort(key=lambda f: -(f["details"].get("stall_ms") or 0.0))
    memory.sort(key=lambda f: -ranking.cost_bytes(f))
    sync_rows = []
    for f in syncs:
        stall = f["details"].get("stall_ms")
        cadence = f["details"].get("cadence") or ("repeated" if f["details"].get("repeated", True) else "one-off")
        if cadence == "periodic":
            cadence = f"every {f['details'].get('period_steps')} steps"
        sync_rows.append(
            f'<tr class="site-row" data-rank="{_e(f["_rank"])}" data-host-wait-ms="{stall or 0}">'
            f"<td><code>{_e(_where(f['file'], f['line']))}</code> {_e(f['function'] or '')}</td>"
            f"<td>{_e(f['details'].get('sync_kind'))}</td><td>{_e(cadence)}</td><td>{f['count']}</td>"
            f"<td>{_e(f['details'].get('per_step'))}</td>"
            f"<td>{'not timed' if stall is None else f'{stall:.2f} ms'}</td>"
            f"<td>{_rule_link(f.get('rule'))}</td><td>{_e(f['fix_hint'])}</td></tr>"
        )
    memory_rows = [
        f'<tr class="site-row" data-rank="{_e(f["_rank"])}"><td>{_e(f["kind"])}</td>'
        f"<td><code>{_e(_where(f['file'], f['line']))}</code></td><td>{_mib(ranking.cost_bytes(f))}</td>"
        f"<td>{_e(f['message'])}</td><td>{_e(f['fix_hint'])}</td></tr>"
        for f in memory
    ]
    race_rows = [
        f'<tr class="site-row" data-rank="{_e(f["_rank"])}"><td>{_e(f["message"])}</td>'
        f"<td>{_access(f['details'].get('first') or {})}</td><td>{_access(f['details'].get('second') or {})}</td>"
        f"<td>{_e(f['fix_hint'])}</td></tr>"
        for f in races
    ]
    out = [
        _table("Races", "race-table", ("race", "first access", "second access", "fix"), race_rows, "No races."),
        _table(
            "Memory, by what it cost",
            "memory-table",
            ("finding", "where", "bytes", "what happened", "fix"),
            memory_rows,
            "No memory findings.",
        ),
        _table(
            "Sync stalls, by total host wait",
            "sync-table",
            ("site", "kind", "how often", "count", "per step", "host wait", "rule", "fix"),
            sync_rows,
            "No sync stalls.",
        ),
    ]
    return "\n".join(out), rules


FIX_FIRST = 5  # items in the page's opening list


def _fix_first(reports: Sequence[Dict[str, Any]], ranks: Sequence[str]) -> str:
    """The page's opening: one line per top item (the place, the cost, the fix), races and OOMs first."""
    items = [
        dict(f, _rank=rank)
        for report, rank in zip(reports, ranks)
        for f in report.get("findings", [])
        if not ranking.is_note(f)
    ]
    if not items:
        return ""
    lines = []
    for f in ranking.ranked(items)[:FIX_FIRST]:
        what = f"sync {f['details'].get('sync_kind')}" if f["kind"] == "sync" else f["kind"]
        rank = f" [rank {_e(f['_rank'])}]" if len(reports) > 1 else ""
        lines.append(
            f'<li data-rank="{_e(f["_rank"])}"><code>{_e(_where(f.get("file"), f.get("line")))}</code>{rank}: '
            f"<b>{_e(what)}</b>: {_e(ranking.cost_text(f))}. Fix: {_e(f.get('fix_hint') or '')} "
            f"{_rule_link(f.get('rule')) if f.get('rule') else ''}</li>"
        )
    more = len(items) - len(lines)
    tail = f'<p class="none">{more} more below.</p>' if more > 0 else ""
    return f'<h2>Fix first</h2><ol id="fix-first">{"".join(lines)}</ol>{tail}'


def _phases(reports: Sequence[Dict[str, Any]]) -> str:
    """Where each run's time went (phases.py), with the GPU's utilization per phase."""
    rows = []
    for report in reports:
        for entry in (report.get("phases") or {}).get("phases", []):
            busy = entry.get("utilization_mean_percent")
            rows.append(
                f"<tr><td>{_e(entry['phase'])}</td><td>{entry['seconds']:.2f} s</td>"
                f"<td>{entry['share']:.0%}</td><td>{'n/a' if busy is None else f'{busy:.0f}%'}</td></tr>"
            )
    if not rows:
        return ""
    return (
        '<h2>Where the time went</h2><table id="phases-table"><tr><th>phase</th><th>time</th><th>share</th>'
        f"<th>GPU busy (NVML)</th></tr>{''.join(rows)}</table>"
    )


def _access(access: Dict[str, Any]) -> str:
    return (
        f"{_e(access.get('mode'))} by {_e(access.get('op'))} on {_e(access.get('stream'))}<br>"
        f"{_stack(access.get('stack', []))}"
    )


def _table(title: str, table_id: str, headers: Sequence[str], rows: List[str], empty: str) -> str:
    if not rows:
        return f'<h2>{_e(title)}</h2><p class="none" id="{table_id}">{_e(empty)}</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    return f'<h2>{_e(title)}</h2><table id="{table_id}"><tr>{head}</tr>{"".join(rows)}</table>'


def _rule_texts(codes: Sequence[str]) -> str:
    if not codes:
        return ""
    try:
        from torchlint.registry import all_rules
    except ImportError:  # the sanitizer without the linter's dependencies
        return ""
    rules = all_rules()
    out = ["<h2>The static rules (<code>torchlint rule CODE</code>)</h2>"]
    for code in sorted(codes):
        rule = rules.get(code)
        if rule is None:
            continue
        out.append(
            f'<details id="rule-{_e(code)}" class="rule-text"><summary><b>{_e(code)}</b> {_e(rule.name)}: '
            f"{_e(rule.summary)}</summary><pre>{_e(rule.doc())}</pre></details>"
        )
    return "\n".join(out)


def render(reports: Sequence[Dict[str, Any]]) -> str:
    """The page for one report, or several (one per rank) merged."""
    if not reports:
        raise ValueError("no report to render")
    ranks = [_rank_of(report, index) for index, report in enumerate(reports)]
    tables, rules = _tables(reports, ranks)
    counts: Dict[str, int] = {}
    for report in reports:
        for finding in report.get("findings", []):
            counts[finding["kind"]] = counts.get(finding["kind"], 0) + 1
    inactive = [report["inactive"] for report in reports if report.get("inactive")]
    headline = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "no findings"
    if inactive:  # nothing ran: never "no findings"
        headline = f"Nothing was checked: the GPU sanitizer was inactive ({inactive[0]})"
    rank_filter = ""
    if len(reports) > 1:
        options = "".join(f'<option value="{_e(rank)}">rank {_e(rank)}</option>' for rank in ranks)
        rank_filter = (
            f'<p><label>Rank: <select id="rank-filter"><option value="all">all ranks</option>'
            f"{options}</select></label></p><script>{_SCRIPT}</script>"
        )
    no_timeline = ""
    if inactive:
        no_timeline = (
            f'<p class="none" id="inactive">The GPU sanitizer was inactive ({_e(inactive[0])}): the program '
            "ran without it, so nothing was measured and no finding is to be expected from this run.</p>"
        )
    elif any("tests" in r for r in reports):
        no_timeline = (
            '<p class="none">A pytest run sanitizes each test on its own: the per-site tables cover the '
            "whole run; the charts need a script run (torchlint-sanitize) or session.write_html().</p>"
        )
    elif not all(r.get("timeline") for r in reports):
        no_timeline = (
            '<p class="none">This report has no timeline (an older torchlint wrote it): the charts are empty.</p>'
        )
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>torchlint sanitizer report</title>'
        f"<style>{_STYLE}</style></head><body><h1>torchlint sanitizer report</h1>"
        f'<p id="headline">{_e(headline)}</p>{rank_filter}{_fix_first(reports, ranks)}'
        f"<h2>The run</h2>{_facts(reports, ranks)}{_phases(reports)}{no_timeline}"
        f"<h2>Timeline</h2>{_timeline_svg(reports, ranks)}<h2>GPU memory</h2>{_memory_svg(reports, ranks)}"
        f"{tables}{_rule_texts(rules)}</body></html>\n"
    )


def write_html(path: str, reports: Sequence[Dict[str, Any]]) -> None:
    """The page at ``path`` (``report.ReportWriteError`` when it cannot be written)."""
    from .report import write_atomically

    write_atomically(path, render(reports))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torchlint.sanitizer.html_report",
        description="Sanitizer JSON reports (one per rank) to one HTML page.",
    )
    parser.add_argument("reports", nargs="+")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args(argv)
    from torchlint.runtime_join import read_json_object

    try:
        loaded = [read_json_object(path) for path in args.reports]
    except ValueError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    write_html(args.output, loaded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
