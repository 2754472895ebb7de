"""``pgstore web``, the console, in a real browser (headless chromium under selenium)
against a real store: every page shows what the store holds, retry, cancel, pause, resume and trigger change
the database, the monitoring role gets a read-only console whose forged POSTs are
refused, CSRF, hostile values rendered as text, and the command itself."""

from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgstore import PgJobStore, PgScheduleStore
from pgstore.postgres.grants import MONITOR_FUNCTIONS
from tests.support.web import chromium, console

pytest.importorskip("starlette", reason="the web extra is not installed")

HOSTILE_ID = '<script>alert("run")</script>\'"><img src=x onerror=alert(2)>'
HOSTILE_ERROR = '<script>alert("error")</script> "quoted" & \'single\' </td></tr>'
HOSTILE_HOLDER = 'holder"><b>bold</b>'
LONG_ID = "meeting-" + "x" * 180 + "-end"


@dataclass
class Store:
    dsn: str
    schema: str

    def jobs(self) -> PgJobStore:
        return PgJobStore(self.dsn, schema=self.schema)

    def row(self, run_id: str) -> tuple[Any, ...] | None:
        """The job's row, read as the owner straight from the table."""
        with psycopg.connect(self.dsn) as conn:
            return conn.execute(
                sql.SQL("SELECT failed, attempts, cancelled, dispatched, lease_holder "
                        "FROM {}.jobs WHERE run_id = %s").format(sql.Identifier(self.schema)),
                (run_id,),
            ).fetchone()

    def table(self) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn) as conn:
            return conn.execute(sql.SQL("SELECT * FROM {}.jobs ORDER BY run_id").format(
                sql.Identifier(self.schema))).fetchall() + conn.execute(
                sql.SQL("SELECT * FROM {}.schedules ORDER BY id").format(
                    sql.Identifier(self.schema))).fetchall()


def _fail(jobs: PgJobStore, run_id: str, error: str, holder: str = "dispatcher-f") -> None:
    """Schedule ``run_id`` due long ago with one attempt, lease it, release it with
    ``error``: failed."""
    jobs.schedule(run_id, 1, max_attempts=1)
    for _ in range(100):
        job = jobs.lease(holder, None, 60_000)
        assert job is not None
        if job.run_id == run_id:
            break
        jobs.release(job.run_id, holder, 2)  # not ours: put back, still due
    assert jobs.release(run_id, holder, 2, error=error)


@pytest.fixture
def store(pgstore_database: str, pgstore_schema: str) -> Iterator[Store]:
    """A store holding jobs in every state and three schedules."""
    s = Store(pgstore_database, pgstore_schema)
    with s.jobs() as jobs, PgScheduleStore(s.dsn, schema=s.schema) as schedules:
        now = jobs.now_ms()
        _fail(jobs, "failed-1", "provider 503")
        _fail(jobs, "failed-2", "provider 504")
        _fail(jobs, "failed-3", "timeout")
        _fail(jobs, HOSTILE_ID, HOSTILE_ERROR)
        for n in range(3):
            jobs.schedule(f"sent-{n}", now - 60_000 + n)
        jobs.schedule(LONG_ID, now - 50_000)
        for n in range(3):
            job = jobs.lease("dispatcher-a", None, 600_000)
            assert job is not None and job.run_id == f"sent-{n}"
            assert jobs.mark_dispatched(job.run_id, "dispatcher-a", f"bot-{n}").recorded
        leased = jobs.lease(HOSTILE_HOLDER, None, 600_000)
        assert leased is not None and leased.run_id == LONG_ID
        jobs.schedule("due-1", now - 1000)
        jobs.schedule("later-1", now + 3_600_000)
        jobs.schedule("to-cancel", now + 7_200_000)
        schedules.register("nightly", "cron", "TZ=Europe/Berlin 30 2 * * *", now + 100_000)
        schedules.register("heartbeat", "interval", "500", now - 1000)
        assert schedules.claim_due("heartbeat", "scheduler-1", None, 600_000) is not None
    yield s


@pytest.fixture
def monitor(store: Store) -> Iterator[str]:
    """A login role granted what docs/privileges.md grants a monitoring role: its conninfo."""
    role = f"pgstore_t_{uuid.uuid4().hex[:10]}"
    schema = sql.Identifier(store.schema)
    with psycopg.connect(store.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        admin.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            schema, sql.Identifier(role)))
        for function in MONITOR_FUNCTIONS:
            admin.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {}.{}({}) TO {}").format(
                schema, sql.Identifier(function.name),
                sql.SQL(", ").join(sql.SQL(t) for t in function.arg_types),
                sql.Identifier(role)))
    try:
        yield make_conninfo(store.dsn, user=role)
    finally:
        with psycopg.connect(store.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# --- plain HTTP, for what a browser would not send ------------------------------------


class Client:
    """A cookie-keeping HTTP client of the console that never follows redirects."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        return self._send(urllib.request.Request(self.base + path, headers=headers or {}))

    def post(self, path: str, fields: list[tuple[str, str]],
             headers: dict[str, str] | None = None) -> tuple[int, str]:
        body = urllib.parse.urlencode(fields).encode()
        request = urllib.request.Request(self.base + path, data=body, headers={
            "Content-Type": "application/x-www-form-urlencoded", **(headers or {})})
        return self._send(request)

    def _send(self, request: urllib.request.Request) -> tuple[int, str]:
        try:
            with self.opener.open(request, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def token(self) -> str:
        """The CSRF token of the page just read (its hidden field)."""
        _, page = self.get("/failed")
        match = re.search(r'name="csrf" value="([^"]+)"', page)
        if match is None:  # a read-only page has no form: the cookie holds the same token
            return next(c.value for c in self.jar if c.name == "pgstore_csrf" and c.value)
        return match.group(1)


# --- the pages ---------------------------------------------------------------------------


def _texts(browser: Any, selector: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.text for e in browser.find_elements(By.CSS_SELECTOR, selector)]


def test_each_page_shows_what_the_store_holds(store: Store) -> None:
    from selenium.webdriver.common.by import By

    with store.jobs() as jobs:
        stats = jobs.stats()
    with console(store.dsn, store.schema) as server, chromium() as browser:
        browser.get(server.url + "/")
        counts = dict(
            zip(_texts(browser, "#job-counts th"), _texts(browser, "#job-counts td:nth-of-type(1)"),
            strict=True)
        )
        assert counts == {
            "pending": str(stats.jobs_pending), "due": str(stats.jobs_due),
            "leased": str(stats.jobs_leased), "dispatched": str(stats.jobs_dispatched),
            "cancelled": str(stats.jobs_cancelled), "failed": str(stats.jobs_failed),
            "all": str(stats.jobs),
        }
        assert (stats.jobs_failed, stats.jobs_dispatched, stats.jobs_leased) == (4, 3, 1)
        assert "late" in browser.find_element(By.ID, "oldest-lag").text
        # The three dispatches, in one minute's bar or, across a minute's turn, in two.
        titles = [bar.get_attribute("textContent") for bar in
                  browser.find_elements(By.CSS_SELECTOR, "svg.chart rect.bar title")]
        assert 1 <= len(titles) <= 2 and sum(int(t or 0) for t in titles) == 3, titles

        browser.get(server.url + "/jobs")
        ids = _texts(browser, "#jobs td.id:first-child")
        assert set(ids) == {"failed-1", "failed-2", "failed-3", HOSTILE_ID, "sent-0", "sent-1",
                            "sent-2", LONG_ID, "due-1", "later-1", "to-cancel"}
        assert LONG_ID in ids  # whole, never cut
        browser.get(server.url + "/jobs?state=leased")
        assert _texts(browser, "#jobs td.id:first-child") == [LONG_ID]
        assert HOSTILE_HOLDER in _texts(browser, "#jobs td.id")
        browser.get(server.url + "/jobs?" + urllib.parse.urlencode({"holder": "dispatcher-a"}))
        assert _texts(browser, "#jobs td.id:first-child") == ["sent-0", "sent-1", "sent-2"]
        browser.get(server.url + "/jobs?state=pending&run_id=later")
        assert _texts(browser, "#jobs td.id:first-child") == ["later-1"]

        browser.get(server.url + "/failed")
        assert set(_texts(browser, "#failed td.id:nth-child(2)")) == {
            "failed-1", "failed-2", "failed-3", HOSTILE_ID}
        assert set(_texts(browser, "#failed td.error")) == {
            "provider 503", "provider 504", "timeout", HOSTILE_ERROR}
        assert _texts(browser, "#failed td:nth-child(3)") == ["1/1"] * 4

        browser.get(server.url + "/leases")
        row = _texts(browser, "#job-leases tbody td")
        assert row[:5] == [LONG_ID, HOSTILE_HOLDER, "leased", "1", "1/25"]
        assert _texts(browser, "#claims tbody td")[:3] == ["heartbeat", "scheduler-1", "1"]

        browser.get(server.url + "/schedules")
        cells = [_texts(browser, f"#schedules tbody tr:nth-child({n}) td") for n in (1, 2)]
        assert cells[0][:3] == ["heartbeat", "interval\ncatch-up once", "500"]
        assert cells[1][:3] == ["nightly", "cron\ncatch-up once",
                                "TZ=Europe/Berlin 30 2 * * *\ntime zone Europe/Berlin"]
        assert _texts(browser, "#schedules .tz") == ["Europe/Berlin"]
        assert _texts(browser, "#schedules .owner") == ["scheduler-1"]

        browser.get(server.url + "/workers")
        rows = {r[0]: r for r in (
            _texts(browser, f"#workers tbody tr:nth-child({n}) td") for n in range(1, 4))}
        # dispatcher-f released its jobs, which forgets their holder: not named any more
        assert set(rows) == {"dispatcher-a", HOSTILE_HOLDER, "scheduler-1"}
        assert len(_texts(browser, "#workers tbody tr")) == 3
        assert rows["dispatcher-a"][4] == "3"  # dispatched, kept
        assert rows[HOSTILE_HOLDER][2] == "1"  # one live lease
        assert rows["scheduler-1"][5] == "1"  # one claim
        logs = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert logs == []


def test_retry_and_cancel_change_the_database(store: Store) -> None:
    from selenium.webdriver.common.by import By

    with console(store.dsn, store.schema) as server, chromium() as browser:
        browser.get(server.url + "/failed")
        one = browser.find_element(By.CSS_SELECTOR, 'button[form="retry-one"][value="failed-1"]')
        assert _submit(browser, one) == ["failed-1", "retried"]
        assert store.row("failed-1")[:3] == (False, 0, False)  # type: ignore[index]
        assert store.row("failed-2")[:2] == (True, 1)  # type: ignore[index]

        browser.get(server.url + "/failed")
        assert "failed-1" not in _texts(browser, "#failed td.id")
        for run_id in ("failed-2", HOSTILE_ID):
            browser.find_element(
                By.CSS_SELECTOR, f'input.pick[value="{_css(run_id)}"]').click()
        cells = _submit(browser, browser.find_element(By.ID, "retry-selected"))
        assert dict(zip(cells[::2], cells[1::2], strict=True)) == {"failed-2": "retried", HOSTILE_ID: "retried"}
        assert store.row("failed-2")[:2] == (False, 0)  # type: ignore[index]
        assert store.row(HOSTILE_ID)[:2] == (False, 0)  # type: ignore[index]
        assert store.row("failed-3")[:2] == (True, 1)  # type: ignore[index]

        browser.get(server.url + "/jobs?state=pending&run_id=to-cancel")
        cancel = browser.find_element(By.CSS_SELECTOR, 'button[form="cancel-one"][value="to-cancel"]')
        assert _submit(browser, cancel) == ["to-cancel", "cancelled"]
        assert store.row("to-cancel")[2] is True  # type: ignore[index]
        assert store.row("later-1")[2] is False  # type: ignore[index]
        # dispatched and cancelled jobs offer no cancel
        browser.get(server.url + "/jobs?state=dispatched")
        assert browser.find_elements(By.CSS_SELECTOR, "button.cancel") == []

        browser.get(server.url + "/schedules")
        row = browser.find_element(By.CSS_SELECTOR, "#schedules tbody tr:nth-child(2)")
        row.find_element(By.CSS_SELECTOR, 'input[name="confirm"]').click()
        assert _submit(browser, row.find_element(By.CSS_SELECTOR, "button.delete"))[0] == "nightly"
    with PgScheduleStore(store.dsn, schema=store.schema) as schedules:
        assert [r.id for r in schedules.list()] == ["heartbeat"]


def test_pause_resume_and_trigger_change_the_database(store: Store) -> None:
    from selenium.webdriver.common.by import By

    def record(id: str) -> Any:
        with PgScheduleStore(store.dsn, schema=store.schema) as schedules:
            return schedules.get(id)

    before = record("nightly")
    with console(store.dsn, store.schema) as server, chromium() as browser:
        def row(id: str) -> Any:
            browser.get(server.url + "/schedules")
            (found,) = [r for r in browser.find_elements(By.CSS_SELECTOR, "#schedules tbody tr")
                        if r.find_element(By.CSS_SELECTOR, "td.id").text == id]
            return found

        cells = _submit(browser, row("nightly").find_element(By.CSS_SELECTOR, "button.pause"))
        assert cells == ["nightly", "paused (a run in progress finishes)"]
        assert record("nightly").paused
        paused = row("nightly")
        assert paused.find_elements(By.CSS_SELECTOR, ".paused") != []
        assert paused.find_elements(By.CSS_SELECTOR, "button.trigger, button.pause") == []
        cells = _submit(browser, paused.find_element(By.CSS_SELECTOR, "button.resume"))
        assert cells == ["nightly", "resumed (missed occurrences: catch-up once)"]
        assert not record("nightly").paused

        cells = _submit(browser, row("nightly").find_element(By.CSS_SELECTOR, "button.trigger"))
        assert cells[0] == "nightly" and cells[1].startswith("triggered")
        triggered = record("nightly")
        assert triggered.triggered_at is not None
        assert triggered.next_run_at == before.next_run_at
        assert row("nightly").find_elements(By.CSS_SELECTOR, ".triggered") != []

        # heartbeat runs under a live lease: its trigger is refused, nothing changed.
        held = record("heartbeat")
        cells = _submit(browser, row("heartbeat").find_element(By.CSS_SELECTOR,
                                                               "button.trigger"))
        assert cells == ["heartbeat", "refused: running (a live lease)"]
        assert record("heartbeat") == held


def test_queues_page_pauses_resumes_and_the_jobs_page_filters_by_queue(store: Store) -> None:
    """The queues page shows queue_list's counts; Pause and Resume change the queues
    table (a lease skips the paused queue meanwhile); the jobs page shows each job's
    queue and filters by one, exactly."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with store.jobs() as jobs:
        now = jobs.now_ms()
        jobs.schedule("px-1", now - 2000, queue="provider-x", priority=3)
        jobs.schedule("px-2", now + 600_000, queue="provider-x")
        jobs.schedule("px-old", now - 3000, queue="provider-xy")
        expected = {q.queue: q for q in jobs.list_queues(now)}
    assert set(expected) == {"default", "provider-x", "provider-xy"}

    def paused(queue: str) -> bool:
        with store.jobs() as jobs:
            return any(q.paused for q in jobs.list_queues() if q.queue == queue)

    with console(store.dsn, store.schema) as server, chromium() as browser:
        def rows() -> dict[str, Any]:
            browser.get(server.url + "/queues")
            return {r.find_element(By.CSS_SELECTOR, "td.id").text: r
                    for r in browser.find_elements(By.CSS_SELECTOR, "#queues tbody tr")}

        shown = {name: [c.text for c in row.find_elements(By.CSS_SELECTOR, "td")][:5]
                 for name, row in rows().items()}
        assert shown == {q.queue: [q.queue, str(q.depth), str(q.due), str(q.leased), "no"]
                         for q in expected.values()}
        assert shown["provider-x"][1:4] == ["2", "1", "0"]

        cells = _submit(browser, rows()["provider-x"].find_element(By.CSS_SELECTOR,
                                                                   "button.pause"))
        assert cells == ["provider-x", "paused (no lease takes its jobs; leases held run on)"]
        assert paused("provider-x") and not paused("provider-xy")
        with store.jobs() as jobs:
            leased = jobs.lease("d-1", None, 60_000, queues=["provider-x", "provider-xy"])
            assert leased is not None and leased.run_id == "px-old"
            assert jobs.lease("d-1", None, 60_000, queues=["provider-x"]) is None
        row = rows()["provider-x"]
        assert row.find_elements(By.CSS_SELECTOR, ".paused") != []
        assert row.find_elements(By.CSS_SELECTOR, "button.pause") == []
        cells = _submit(browser, row.find_element(By.CSS_SELECTOR, "button.resume"))
        assert cells == ["provider-x", "resumed (idle dispatchers are woken)"]
        assert not paused("provider-x")

        # The jobs page: the queue column, and the filter (an exact name: not provider-xy).
        rows()["provider-x"].find_element(By.CSS_SELECTOR, "td.id a").click()
        WebDriverWait(browser, 30).until(lambda b: "/jobs?" in b.current_url)
        assert _texts(browser, "#jobs td.id:first-child") == ["px-1", "px-2"]
        assert _texts(browser, "#jobs td.queue") == ["provider-x\npriority 3", "provider-x"]
        assert browser.find_element(By.ID, "queue").get_attribute("value") == "provider-x"
        browser.get(server.url + "/jobs?state=pending&queue=provider-x")
        assert _texts(browser, "#jobs td.id:first-child") == ["px-2"]
        browser.get(server.url + "/jobs?queue=nowhere")
        assert browser.find_element(By.ID, "empty").text == "No jobs in queue nowhere."
        browser.get(server.url + "/jobs?state=due")
        assert "default" in _texts(browser, "#jobs td.queue")


def _submit(browser: Any, button: Any) -> list[str]:
    """Click ``button``, wait for the action's answer page, and return its cells."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    button.click()
    WebDriverWait(browser, 30).until(
        lambda b: "/actions/" in b.current_url
        and b.find_elements(By.CSS_SELECTOR, "#answers, #reason")
    )
    return _texts(browser, "#answers td")


def _css(value: str) -> str:
    """``value`` inside a CSS attribute selector's double quotes."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def test_the_monitoring_role_gets_a_read_only_console(store: Store, monitor: str) -> None:
    from selenium.webdriver.common.by import By

    before = store.table()
    with console(monitor, store.schema) as server, chromium() as browser:
        for page in ("/", "/jobs", "/failed", "/leases", "/queues", "/schedules", "/workers"):
            browser.get(server.url + page)
            assert browser.find_element(By.ID, "access").text == "read-only"
            assert browser.find_elements(By.CSS_SELECTOR, "button.action, form[method=post]") == []
        browser.get(server.url + "/failed")
        assert len(_texts(browser, "#failed tbody tr")) == 4  # it reads them all the same

        client = Client(server.url)
        token = client.token()
        for action, field, target in (("job-retry", "run_id", "failed-1"),
                                      ("job-cancel", "run_id", "to-cancel"),
                                      ("schedule-delete", "id", "nightly"),
                                      ("schedule-pause", "id", "nightly"),
                                      ("schedule-resume", "id", "nightly"),
                                      ("schedule-trigger", "id", "nightly"),
                                      ("queue-pause", "queue", "default"),
                                      ("queue-resume", "queue", "default")):
            status, page = client.post(f"/actions/{action}", [
                ("csrf", token), (field, target), ("confirm", "yes")])
            assert status == 403
            assert "no EXECUTE privilege" in page and "nothing changed" in page
    assert store.table() == before


def test_a_role_missing_a_read_grant_is_told_which(store: Store, monitor: str) -> None:
    """A monitoring role without EXECUTE on job_list: the pages that call it answer 403
    naming the function; the schedules page, which does not, still works."""
    role = psycopg.conninfo.conninfo_to_dict(monitor)["user"]
    with psycopg.connect(store.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("REVOKE EXECUTE ON FUNCTION {}.job_list(text, bigint, integer, text[]) "
                              "FROM {}").format(sql.Identifier(store.schema),
                                                sql.Identifier(str(role))))
    with console(monitor, store.schema) as server:
        client = Client(server.url)
        for page in ("/", "/jobs", "/failed", "/leases", "/workers"):
            status, html = client.get(page)
            assert status == 403, page
            assert "the role may not read this page: permission denied for function job_list" in html
        status, html = client.get("/schedules")
        assert status == 200 and "nightly" in html


def test_a_post_without_the_right_csrf_token_is_refused(store: Store) -> None:
    from pgstore.web.security import CsrfTokens

    before = store.table()
    with console(store.dsn, store.schema) as server:
        client = Client(server.url)
        token = client.token()
        other = CsrfTokens().new()  # signed by another process's secret
        stranger = Client(server.url)  # no cookie at all
        for who, fields, headers in (
            (client, [("run_id", "failed-1")], {}),
            (client, [("run_id", "failed-1"), ("csrf", "")], {}),
            (client, [("run_id", "failed-1"), ("csrf", token[:-1] + ("1" if token.endswith("0") else "0"))], {}),
            (client, [("run_id", "failed-1"), ("csrf", other)], {}),
            (stranger, [("run_id", "failed-1"), ("csrf", token)], {}),
            (client, [("run_id", "failed-1"), ("csrf", token)], {"Origin": "http://evil.test"}),
        ):
            status, page = who.post("/actions/job-retry", fields, headers)
            assert status == 403, fields
            assert "nothing changed" in page
        assert store.table() == before
        # a cookie this process did not sign, sent with the same value in the form
        forged = CsrfTokens().new()
        client.jar.clear()
        status, _ = client.post("/actions/job-retry", [("run_id", "failed-1"), ("csrf", forged)],
                                {"Cookie": f"pgstore_csrf={forged}"})
        assert status == 403
        assert store.table() == before
        status, page = client.post("/actions/job-retry", [("run_id", "failed-1"),
                                                          ("csrf", client.token())])
        assert (status, "retried" in page) == (200, True)
    assert store.row("failed-1")[:2] == (False, 0)  # type: ignore[index]


def test_hostile_values_are_shown_as_text(store: Store) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    with console(store.dsn, store.schema) as server, chromium() as browser:
        client = Client(server.url)
        for page in ("/", "/jobs", "/failed", "/leases", "/workers",
                     "/jobs?" + urllib.parse.urlencode({"run_id": HOSTILE_ID})):
            status, html = client.get(page)
            assert status == 200
            for hostile in ("<script", "<img", "<b>bold", "onerror=alert(2)>"):
                assert hostile not in html, (page, hostile)
            browser.get(server.url + page)
            with pytest.raises(NoAlertPresentException):
                browser.switch_to.alert  # noqa: B018 - the property raises when none shows
            assert browser.find_elements(By.CSS_SELECTOR, "main script, main img, td b") == []
        browser.get(server.url + "/jobs?" + urllib.parse.urlencode({"run_id": "<script>"}))
        assert browser.find_element(By.ID, "run_id").get_attribute("value") == "<script>"
        assert HOSTILE_ID in _texts(browser, "#jobs td.id")
        status, html = client.get("/jobs?" + urllib.parse.urlencode({"state": "<b>x"}))
        assert status == 400 and "<b>x" not in html and "&lt;b&gt;x" in html


def test_only_loopback_host_names_are_answered(store: Store) -> None:
    """A DNS-rebound name reaching 127.0.0.1 gets nothing: no page, no token."""
    with console(store.dsn, store.schema) as server:
        client = Client(server.url)
        status, html = client.get("/", {"Host": "evil.test"})
        assert status == 400 and "pgstore_csrf" not in html
        assert client.get("/", {"Host": "localhost"})[0] == 200


def test_bad_requests_are_refused_and_change_nothing(store: Store) -> None:
    before = store.table()
    with console(store.dsn, store.schema) as server:
        client = Client(server.url)
        token = client.token()
        for path, fields, status in (
            ("/actions/job-retry", [("csrf", token)], 400),  # no run id
            ("/actions/job-retry", [("csrf", token), ("run_id", "")], 400),
            ("/actions/schedule-delete", [("csrf", token), ("id", "nightly")], 400),  # no confirm
            ("/actions/schedule-delete", [("csrf", token), ("id", "nightly"),
                                          ("confirm", "no")], 400),
            ("/actions/job-purge", [("csrf", token), ("run_id", "sent-0")], 404),
            ("/actions/job-retry", [("csrf", token)] + [("run_id", f"r{n}") for n in range(1001)],
             400),
        ):
            answer, page = client.post(path, fields)
            assert answer == status, (path, fields[:3])
            assert "nothing changed" in page or status == 404
        assert client.get("/jobs?state=bogus")[0] == 400
        assert client.get("/jobs?limit=abc")[0] == 400
        assert client.get("/jobs?limit=0")[0] == 400
        assert client.get("/actions/job-retry")[0] == 405
        # answers per job: a job that is not failed is left as it is
        status, page = client.post("/actions/job-retry", [("csrf", token), ("run_id", "sent-0"),
                                                          ("run_id", "nobody")])
        assert status == 200 and "not_failed" in page and "missing" in page
    assert store.table() == before


def test_pages_say_when_they_read_only_part(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``READ_LIMIT`` jobs a page says how many it read of how many; past
    ``CHART_READ`` dispatched jobs the overview draws no chart and says why."""
    from pgstore.web import views

    monkeypatch.setattr(views, "READ_LIMIT", 4)
    monkeypatch.setattr(views, "CHART_READ", 2)
    with console(store.dsn, store.schema) as server:
        client = Client(server.url)
        _, page = client.get("/")
        assert "No chart: 3 dispatched jobs are kept and the chart reads at most 2" in page
        assert "<svg" not in page
        _, page = client.get("/jobs")
        assert "Read the first 4 of 11 matching jobs" in page
        _, page = client.get("/workers")
        assert "Read the first 4 of 11 matching jobs" in page


# --- the command ---------------------------------------------------------------------------


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_pgstore_web_serves_until_interrupted(store: Store, stop: signal.Signals) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "pgstore", "web", "--dsn", store.dsn, "--schema", store.schema,
         "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
        assert match, line
        client = Client(match.group(1).rstrip("/"))
        status, html = 0, ""
        for _ in range(200):  # the line comes just before uvicorn starts
            try:
                status, html = client.get("/schedules")
                break
            except urllib.error.URLError:
                time.sleep(0.05)
        assert status == 200 and "nightly" in html
    finally:
        process.send_signal(stop)
        process.communicate(timeout=60)
    assert process.returncode == 0


def test_pgstore_web_without_the_extra_says_what_to_install(store: Store) -> None:
    code = ("import sys; sys.modules['starlette'] = None; from pgstore.cli import main; "
            "import pgstore; sys.exit(main(sys.argv[1:]))")
    done = _python(code, "web", "--dsn", store.dsn, "--schema", store.schema)
    assert done.returncode == 1
    assert done.stderr.strip() == ("pgstore: error: pgstore web needs the web extra "
                                   "(starlette is missing): pip install 'pgstore[web]'")
    done = _python(code, "jobs", "--dsn", store.dsn, "--schema", store.schema)
    assert done.returncode == 0 and "failed-1" in done.stdout


def test_pgstore_web_on_a_schema_not_migrated(pgstore_database: str) -> None:
    done = _python("import sys; from pgstore.cli import main; sys.exit(main(sys.argv[1:]))",
                   "web", "--dsn", pgstore_database, "--schema", "nowhere_" + uuid.uuid4().hex[:8])
    assert done.returncode == 1
    assert "pgstore migrate" in done.stderr
