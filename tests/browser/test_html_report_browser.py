"""The HTML report rendered by a real Chromium: the marks and rows a user sees, no console errors.

The page is built from tests/sanitizer/data/reports/tour.json, one run of
examples/sanitizer_tour.py on an H100 with its sync-heavy, fragmenting and
racy parts.
"""
import copy
import json
import pathlib



def test_the_racy_part_shows_its_races_on_the_timeline_and_in_the_table(open_report, tour):
    report = open_report(tour)
    page = report.page
    races = [f for f in tour["findings"] if f["kind"] == "race"]
    assert page.locator("#timeline .race-mark").count() == len(tour["timeline"]["races"]) >= 2
    assert page.locator("#race-table tr.site-row").count() == len(races)
    first_row = page.locator("#race-table tr.site-row").first.inner_text()
    assert "wait_stream" in first_row and "examples/sanitizer_tour.py:84" in first_row
    assert page.locator("#timeline .race-mark").first.bounding_box() is not None
    assert report.errors == []


def test_the_fragmenting_part_shows_memory_segments_the_fragmented_peak_and_the_oom(open_report, tour):
    report = open_report(tour)
    page = report.page
    reserved = page.locator("#memory-chart polyline.reserved")
    assert reserved.count() == 1 and len(reserved.get_attribute("points").split()) == _step_corners(tour)
    assert page.locator("#memory-chart .segment-mark").count() == len(tour["timeline"]["segments"]) >= 1
    peak = page.locator("#memory-chart .frag-peak-mark")
    assert peak.count() == 1 and "soft fragmentation" in peak.locator("title").text_content()
    oom = page.locator("#memory-chart .oom-mark")
    assert oom.count() == 1 and oom.bounding_box()["width"] > 0
    # Hovering the OOM shows the allocating line (an SVG <title> tooltip).
    oom.hover()
    assert "allocated at examples/sanitizer_tour.py:69" in oom.locator("title").text_content()
    memory_rows = page.locator("#memory-table tr.site-row")
    memory_findings = [f for f in tour["findings"] if f["kind"] not in ("sync", "race")]
    assert memory_rows.count() == len(memory_findings) >= 2
    assert report.errors == []


def test_the_sync_heavy_part_shows_stalls_sized_by_wait_and_sorted_by_total_time(open_report, tour):
    report = open_report(tour)
    page = report.page
    marks = page.locator("#timeline .sync-mark")
    assert marks.count() == len(tour["timeline"]["syncs"])
    radii = page.eval_on_selector_all("#timeline .sync-mark", "nodes => nodes.map(n => n.r.baseVal.value)")
    waits = page.eval_on_selector_all("#timeline .sync-mark", "nodes => nodes.map(n => +n.dataset.waitMs)")
    longest = max(range(len(waits)), key=waits.__getitem__)
    assert radii[longest] == max(radii) and max(radii) > min(radii)
    rows = page.locator("#sync-table tr.site-row")
    syncs = sum(f["kind"] == "sync" for f in tour["findings"])
    assert rows.count() == syncs
    totals = page.eval_on_selector_all("#sync-table tr.site-row", "rows => rows.map(r => +r.dataset.hostWaitMs)")
    assert totals == sorted(totals, reverse=True)
    longest = max((f for f in tour["findings"] if f["kind"] == "sync"), key=lambda f: f["details"]["stall_ms"] or 0)
    assert f"{longest['file']}:{longest['line']}" in rows.first.inner_text()
    link = page.locator('#sync-table a.rule-link[href="#rule-TL101"]').first
    assert link.inner_text() == "TL101"
    link.click()
    assert page.evaluate("location.hash") == "#rule-TL101"
    assert "host-sync-in-loop" in page.locator("#rule-TL101 summary").inner_text()
    assert page.locator("#timeline rect.step").count() == tour["steps"]["completed"] > 0
    assert report.errors == []


def test_the_rank_filter_of_a_merged_report(open_report, tour):
    ranks = []
    for rank in (0, 1):
        report = copy.deepcopy(tour)
        report["timeline"]["rank"] = rank
        ranks.append(report)
    loaded = open_report(*ranks)
    page = loaded.page
    rows = page.locator("#sync-table tr.site-row")
    total = rows.count()
    assert total == 2 * sum(f["kind"] == "sync" for f in tour["findings"]) > 0
    assert all(rows.nth(i).is_visible() for i in range(total))
    page.select_option("#rank-filter", "1")
    visible = [rows.nth(i).get_attribute("data-rank") for i in range(total) if rows.nth(i).is_visible()]
    assert visible == ["1"] * (total // 2)
    assert not page.locator('#timeline g[data-rank="0"]').is_visible()
    page.select_option("#rank-filter", "all")
    assert all(rows.nth(i).is_visible() for i in range(total))
    assert loaded.errors == []


def test_a_run_without_optimizer_steps_renders_without_errors(open_report, tour):
    report = copy.deepcopy(tour)
    report["steps"] = {"completed": 0, "warmup": 0, "measured": 0, "source": "none"}
    report["timeline"]["steps"] = []
    loaded = open_report(report)
    assert loaded.page.locator("#timeline rect.step").count() == 0
    assert "no optimizer steps" in loaded.page.locator("table.facts").inner_text()
    assert loaded.errors == []


def _step_corners(report):
    """The corners of the memory curve: each row held until the next, the last until the run's end."""
    rows, end = report["timeline"]["memory"], report["timeline"]["clock"]["duration_s"]
    return 2 * len(rows) - 1 + (end > rows[-1][0]) if rows else 0


def test_a_run_without_steps_draws_memory_across_the_chart(open_report, stepless):
    """A step-less script: the watcher's looks give the chart its shape (made by tests/sanitizer/stepless_run.py)."""
    loaded = open_report(stepless)
    page = loaded.page
    assert page.locator("#timeline rect.step").count() == 0
    for name in ("allocated", "reserved"):
        line = page.locator(f"#memory-chart polyline.{name}")
        assert len(line.get_attribute("points").split()) == _step_corners(stepless)
        assert line.bounding_box()["width"] > 600  # every phase has room, start-up cut short
    segments = page.locator("#memory-chart .segment-mark")
    assert segments.count() == len(stepless["timeline"]["segments"]) > 0
    segments.first.hover()
    assert "stepless_run.py:" in segments.first.locator("title").text_content()
    assert loaded.errors == []


def _recorded_runs():
    reports = pathlib.Path(__file__).resolve().parents[1] / "sanitizer" / "data" / "reports"
    return sorted(path for path in reports.glob("*.json") if path.name != "profiler_alignment.json")


def test_every_recorded_run_renders_every_event_without_errors(open_report):
    runs = _recorded_runs()
    assert runs, "no recorded report in tests/sanitizer/data/reports"
    for path in runs:
        report = json.loads(path.read_text())
        loaded = open_report(report)
        page, timeline = loaded.page, report["timeline"]
        assert page.locator("#timeline .sync-mark").count() == len(timeline["syncs"]), path.name
        assert page.locator("#timeline .race-mark").count() == len(timeline["races"]), path.name
        assert page.locator("#timeline .oom-mark").count() == len(timeline["ooms"]), path.name
        assert page.locator("#memory-chart .segment-mark").count() == len(timeline["segments"]), path.name
        assert page.locator("tr.site-row").count() == len(report["findings"]), path.name
        assert loaded.errors == [], path.name
