"""The alert rules (docs/alerts.yml) and the exposition, checked by Prometheus' promtool.

``promtool check metrics`` lints the page a Scheduler and a Dispatcher observed in one
registry serve with the store's gauges; ``promtool check rules`` the rules; ``promtool
test rules`` runs docs/alerts.test.yml, which fires every documented alert. Skipped
when promtool is missing (Debian's ``prometheus`` package; .ci/run installs it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from pgstore import Dispatcher, PgJobStore, PgScheduleStore, Scheduler
from pgstore.runtime.metrics import RuntimeMetrics, StoreStatsCollector

DOCS = Path(__file__).resolve().parent.parent / "docs"
RULES = DOCS / "alerts.yml"
RULE_TESTS = DOCS / "alerts.test.yml"


@pytest.fixture
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return found


def _promtool(promtool: str, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run([promtool, *args], input=stdin, capture_output=True, text=True,
                          timeout=120, cwd=DOCS)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def test_the_exposition_passes_promtool_check_metrics(
    promtool: str, pgstore_database: str, pgstore_schema: str
) -> None:
    registry = CollectorRegistry()
    metrics = RuntimeMetrics(registry)
    schedules = PgScheduleStore(pgstore_database, schema=pgstore_schema)
    jobs = PgJobStore(pgstore_database, schema=pgstore_schema)
    try:
        metrics.observe(Scheduler(schedules, owner="s1"))
        metrics.observe(Dispatcher(jobs, lambda job: "bot", holder="d1"))
        gauges = StoreStatsCollector()
        registry.register(gauges)
        jobs.schedule("later", jobs.now_ms() + 60_000)
        gauges.update(jobs.stats())
        page = generate_latest(registry).decode()
    finally:
        schedules.close()
        jobs.close()
    # What the alerts read is on the page, at 0 before anything happened.
    for series in ('pgstore_claimed_total{runtime="scheduler"} 0.0',
                   'pgstore_claim_rounds_empty_total{runtime="dispatcher"} 0.0',
                   'pgstore_recalls_total{outcome="ok",reason="cancelled"} 0.0',
                   'pgstore_jobs{state="failed"} 0.0', 'pgstore_jobs{state="pending"} 1.0'):
        assert series in page, series
    assert _promtool(promtool, "check", "metrics", stdin=page).strip() == ""


def test_the_alert_rules_pass_promtool_check_and_their_unit_tests(promtool: str) -> None:
    assert "SUCCESS" in _promtool(promtool, "check", "rules", str(RULES))
    assert "SUCCESS" in _promtool(promtool, "test", "rules", str(RULE_TESTS))


def test_every_documented_alert_fires_in_the_unit_tests() -> None:
    rules = RULES.read_text()
    tests = RULE_TESTS.read_text()
    names = re.findall(r"^\s+- alert: (\w+)$", rules, re.MULTILINE)
    assert "PgstoreSchedulersNotClaiming" in names and "PgstoreNoScheduler" in names
    for name in names:
        fired = re.search(rf"alertname: {name}\n\s+exp_alerts:\n\s+- exp_labels:", tests)
        assert fired, f"{name} never fires in {RULE_TESTS.name}"
        assert f"`{name}`" in (DOCS / "metrics.md").read_text(), f"{name} is not documented"
