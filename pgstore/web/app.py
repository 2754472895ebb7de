"""The console's web app: Starlette routes, Jinja2 pages, uvicorn to serve them.

Every page is rendered on the server from the store's SQL functions (``views``); the
only requests that change anything are the POSTs of ``ACTIONS``, each one call of the
store's own function per target, behind a CSRF check (``security``) and a privilege
check (``has_function_privilege``: a role without EXECUTE sees no button and its POST is
refused with 403, before any call). Responses carry a Content-Security-Policy that
allows no script at all, and only this host's names are served when it listens on a
loopback address (no DNS rebinding).
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import psycopg
import uvicorn
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgstore.errors import InvalidArgument, NotPermitted, PgStoreError
from pgstore.postgres import job_calls, schedule_calls
from pgstore.postgres.jobs import AsyncPgJobStore
from pgstore.postgres.schedules import AsyncPgScheduleStore
from pgstore.schema.function import Function
from pgstore.web import views
from pgstore.web.chart import chart_svg
from pgstore.web.security import COOKIE, FIELD, PRIVILEGE_QUERY, CsrfTokens, privilege_args

__all__ = ["ACTIONS", "DEFAULT_HOST", "DEFAULT_PORT", "Action", "Stores", "create_app", "serve"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
HERE = Path(__file__).parent
#: How long a page waits for a connection before it says the database does not answer.
POOL_TIMEOUT = 10.0
#: How many jobs the jobs page shows unless asked for more.
SHOWN = 200
#: The most targets one POST may name, and the most bytes its body may have.
MAX_TARGETS = 1000
MAX_BODY = 1 << 20
#: No script runs, whatever a page holds; styles and images from this host only.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
PAGES = (
    ("/", "Overview"), ("/jobs", "Jobs"), ("/failed", "Failed"), ("/leases", "Leases"),
    ("/queues", "Queues"), ("/schedules", "Schedules"), ("/workers", "Workers"),
)


@dataclass(frozen=True)
class Stores:
    """What the app talks to: one pool, both stores over it."""

    pool: AsyncConnectionPool[Any]
    jobs: AsyncPgJobStore
    schedules: AsyncPgScheduleStore


@dataclass(frozen=True)
class Action:
    """A change the console offers: the store function it calls (which the role needs
    EXECUTE on), the form field naming its targets, and the call for one target, which
    answers in a word. Schedule pause, resume and trigger are one entry each here and a
    button in ``schedules.html``; queue pause and resume, in ``queues.html``."""

    name: str
    label: str
    function: Function
    field: str
    call: Callable[[Stores, str], Awaitable[str]]
    #: A form must also carry ``confirm=yes`` (a checkbox the operator ticks).
    confirm: bool = False


async def _retry(stores: Stores, run_id: str) -> str:
    return str(await stores.jobs.retry(run_id))


async def _cancel(stores: Stores, run_id: str) -> str:
    return str(await stores.jobs.cancel(run_id))


async def _delete(stores: Stores, id: str) -> str:
    await stores.schedules.delete(id)
    return "deleted (its fencing token kept as the id's high-water mark)"


async def _pause(stores: Stores, id: str) -> str:
    record = await stores.schedules.pause(id)
    return "no such schedule" if record is None else "paused (a run in progress finishes)"


async def _resume(stores: Stores, id: str) -> str:
    record = await stores.schedules.resume(id)
    if record is None:
        return "no such schedule"
    return f"resumed (missed occurrences: catch-up {record.catch_up})"


async def _trigger(stores: Stores, id: str) -> str:
    record = await stores.schedules.trigger(id)
    if record is not None:
        return "triggered (the next claim runs it once; its next run stays)"
    current = await stores.schedules.get(id)
    if current is None:
        return "no such schedule"
    return "refused: paused" if current.paused else "refused: running (a live lease)"


async def _pause_queue(stores: Stores, queue: str) -> str:
    if await stores.jobs.pause_queue(queue):
        return "paused (no lease takes its jobs; leases held run on)"
    return "was paused already: nothing changed"


async def _resume_queue(stores: Stores, queue: str) -> str:
    if await stores.jobs.resume_queue(queue):
        return "resumed (idle dispatchers are woken)"
    return "was not paused: nothing changed"


ACTIONS: dict[str, Action] = {
    a.name: a
    for a in (
        Action("job-retry", "Retry", job_calls.RETRY, "run_id", _retry),
        Action("job-cancel", "Cancel", job_calls.CANCEL, "run_id", _cancel),
        Action("schedule-delete", "Delete", schedule_calls.DELETE, "id", _delete, confirm=True),
        Action("schedule-pause", "Pause", schedule_calls.PAUSE, "id", _pause),
        Action("schedule-resume", "Resume", schedule_calls.RESUME, "id", _resume),
        Action("schedule-trigger", "Run now", schedule_calls.TRIGGER, "id", _trigger),
        Action("queue-pause", "Pause", job_calls.QUEUE_PAUSE, "queue", _pause_queue),
        Action("queue-resume", "Resume", job_calls.QUEUE_RESUME, "queue", _resume_queue),
    )
}


def _signature(schema: str, function: Function) -> str:
    return f"{schema}.{function.name}({', '.join(function.arg_types)})"


class _Headers:
    """Adds ``SECURITY_HEADERS`` to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for key, value in SECURITY_HEADERS.items():
                    headers[key] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every value is escaped unless a template says otherwise
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["instant"] = views.format_instant
    env.filters["span"] = views.format_span
    env.filters["relative"] = views.relative
    env.filters["tz"] = views.time_zone
    env.globals["pages"] = PAGES
    env.globals["job_states"] = views.JOB_STATES
    return env


class Console:
    """The app's state: the stores (from the lifespan on), the CSRF tokens, the pages."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self.tokens = CsrfTokens()
        self.env = _environment()
        self._stores: Stores | None = None

    @property
    def stores(self) -> Stores:
        assert self._stores is not None, "the app's lifespan has not started"
        return self._stores

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            self.dsn, min_size=1, max_size=4, kwargs={"autocommit": True}, open=False,
            name="pgstore-web", timeout=POOL_TIMEOUT,
        )
        await pool.open(wait=True)
        try:
            jobs = AsyncPgJobStore(pool, schema=self.schema)
            schedules = AsyncPgScheduleStore(pool, schema=self.schema)
            await jobs.start()  # SchemaNotReady, saying what to run
            self._stores = Stores(pool, jobs, schedules)
            yield
        finally:
            self._stores = None
            await pool.close()

    async def allowed(self) -> tuple[str, dict[str, bool]]:
        """The connected role, and whether it may run each action's function."""
        functions = [a.function for a in ACTIONS.values()]
        async with self.stores.pool.connection() as conn:
            cursor = await conn.execute(PRIVILEGE_QUERY, privilege_args(self.schema, functions))
            rows = await cursor.fetchall()
        by_name = {name: bool(ok) for name, ok, _ in rows}
        role = str(rows[0][2]) if rows else ""
        return role, {a.name: by_name.get(a.function.name, False) for a in ACTIONS.values()}

    async def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        role, allowed = await self.allowed()
        cookie = request.cookies.get(COOKIE)
        token = cookie if cookie is not None and self.tokens.valid(cookie) else self.tokens.new()
        html = self.env.get_template(template).render(
            schema=self.schema, role=role, allowed=allowed, csrf=token,
            may=[a.function.name for a in ACTIONS.values() if allowed[a.name]],
            path=request.url.path, **context,
        )
        response = HTMLResponse(html, status_code=status)
        if token != cookie:
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
        return response

    def refuse(self, status: int, reason: str) -> HTMLResponse:
        """A plain refusal page; no store call is made for it."""
        html = self.env.get_template("refused.html").render(
            schema=self.schema, status=status, reason=reason, path="",
        )
        return HTMLResponse(html, status_code=status)

    async def failure(self, request: Request, exc: Exception) -> Response:
        """A page the database could not answer: 403 when the role may not call a
        function the page reads (a monitoring role missing a grant), else 503; the
        error on one line."""
        message = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, (NotPermitted, psycopg.errors.InsufficientPrivilege)):
            return self.refuse(403, f"the role may not read this page: {message}")
        return self.refuse(503, f"the database did not answer this page: {message}")

    # --- pages ------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        data = await views.read_overview(self.stores.jobs)
        chart = Markup(chart_svg(data.minutes)) if data.minutes is not None else None
        return await self.render(request, "overview.html", data=data, now=data.now,
                                 chart=chart)

    async def jobs(self, request: Request) -> Response:
        query = request.query_params
        state = query.get("state", "all")
        if state not in views.JOB_STATES:
            return self.refuse(400, f"unknown state {state!r}: one of "
                                    f"{', '.join(views.JOB_STATES)}")
        try:
            limit = int(query.get("limit", str(min(SHOWN, views.READ_LIMIT))))
        except ValueError:
            limit = 0
        if not 1 <= limit <= views.READ_LIMIT:
            return self.refuse(400, f"limit must be an integer from 1 to {views.READ_LIMIT}")
        run_id = query.get("run_id", "")
        holder = query.get("holder", "")
        queue = query.get("queue", "")
        data = await views.read_jobs(self.stores.jobs, state, run_id, holder, limit, queue)
        return await self.render(request, "jobs.html", data=data, now=data.now, state=state,
                                 run_id=run_id, holder=holder, limit=limit, queue=queue)

    async def failed(self, request: Request) -> Response:
        data = await views.read_failed(self.stores.jobs)
        return await self.render(request, "failed.html", data=data, now=data.now)

    async def leases(self, request: Request) -> Response:
        data = await views.read_leases(self.stores.jobs, self.stores.schedules)
        return await self.render(request, "leases.html", data=data, now=data.now)

    async def queues(self, request: Request) -> Response:
        data = await views.read_queues(self.stores.jobs)
        return await self.render(request, "queues.html", data=data, now=data.now)

    async def schedules(self, request: Request) -> Response:
        data = await views.read_schedules(self.stores.schedules)
        return await self.render(request, "schedules.html", data=data, now=data.now)

    async def workers(self, request: Request) -> Response:
        data = await views.read_workers(self.stores.jobs, self.stores.schedules)
        return await self.render(request, "workers.html", data=data, now=data.now)

    # --- actions ------------------------------------------------------------------------

    async def act(self, request: Request) -> Response:
        action = ACTIONS.get(request.path_params["action"])
        if action is None:
            return self.refuse(404, "no such action")
        origin = request.headers.get("origin")
        own = f"{request.url.scheme}://{request.url.netloc}"
        if origin is not None and origin != own:
            return self.refuse(403, f"refused: the request comes from {origin}, not from this "
                                    "console; nothing changed")
        body = await request.body()
        if len(body) > MAX_BODY:
            return self.refuse(413, "refused: the form is too large; nothing changed")
        try:
            form = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False,
                            max_num_fields=MAX_TARGETS + 10)
        except (UnicodeDecodeError, ValueError):
            return self.refuse(400, "refused: the form cannot be read; nothing changed")
        field_token = (form.get(FIELD) or [""])[0]
        why = self.tokens.refusal(request.cookies.get(COOKIE), field_token)
        if why is not None:
            return self.refuse(403, f"refused: {why}; nothing changed")
        role, allowed = await self.allowed()
        if not allowed[action.name]:
            return self.refuse(
                403,
                f"refused: role {role!r} may not execute "
                f"{_signature(self.schema, action.function)} (no EXECUTE privilege), so this "
                "console is read-only for it; nothing changed",
            )
        targets = list(dict.fromkeys(t for t in form.get(action.field, []) if t))
        if not targets:
            return self.refuse(400, f"refused: no {action.field} was selected; nothing changed")
        if len(targets) > MAX_TARGETS:
            return self.refuse(400, f"refused: at most {MAX_TARGETS} at a time; nothing changed")
        if action.confirm and (form.get("confirm") or [""])[0] != "yes":
            return self.refuse(400, "refused: tick the box to confirm; nothing changed")
        answers: list[tuple[str, str]] = []
        for target in targets:
            try:
                answers.append((target, await action.call(self.stores, target)))
            except (NotPermitted, psycopg.errors.InsufficientPrivilege) as exc:
                # 42501: the grant went between the check and the call
                return self.refuse(403, f"refused: {exc}; nothing changed for "
                                        f"{target!r} and those after it")
            except InvalidArgument as exc:
                answers.append((target, f"refused: {exc}"))
        back = (form.get("back") or ["/"])[0]
        if back not in {p for p, _ in PAGES}:
            back = "/"
        return await self.render(request, "done.html", action=action, answers=answers,
                                 back=back)


def create_app(dsn: str, schema: str, host: str = DEFAULT_HOST) -> Starlette:
    """The console for ``schema`` on ``dsn``, to be served on ``host``. On 127.0.0.1 (or
    localhost) only requests naming 127.0.0.1 or localhost are answered (no DNS
    rebinding); on another address, any (put it behind a proxy that authenticates)."""
    console = Console(dsn, schema)
    hosts = ["127.0.0.1", "localhost"] if host in ("127.0.0.1", "localhost") else ["*"]
    routes = [
        Route("/", console.overview),
        Route("/jobs", console.jobs),
        Route("/failed", console.failed),
        Route("/leases", console.leases),
        Route("/queues", console.queues),
        Route("/schedules", console.schedules),
        Route("/workers", console.workers),
        Route("/actions/{action}", console.act, methods=["POST"]),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(
        routes=routes,
        lifespan=console.lifespan,
        exception_handlers={psycopg.Error: console.failure, PgStoreError: console.failure},
        middleware=[Middleware(_Headers), Middleware(TrustedHostMiddleware, allowed_hosts=hosts)],
    )


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (0: any free port), listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, stopping gracefully at SIGINT or SIGTERM (a second one: at once)
    and then returning, where uvicorn raises the signal again once stopped (which makes
    a SIGTERM kill the process and a SIGINT a KeyboardInterrupt)."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def server(app: Starlette, log_level: str = "warning") -> uvicorn.Server:
    """A uvicorn server for ``app`` (sockets are given to its ``run``)."""
    config = uvicorn.Config(app, log_level=log_level, server_header=False, proxy_headers=False,
                            access_log=False, lifespan="on")
    return _Server(config)


def serve(dsn: str, schema: str, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          announce: Callable[[str], None] = print) -> None:
    """Serve the console until SIGINT or SIGTERM; ``announce`` gets its URL first."""
    sock = listening_socket(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    announce(f"pgstore web: schema {schema!r} at http://{shown}:{bound}/ (Ctrl-C stops)")
    server(create_app(dsn, schema, host), log_level="info").run(sockets=[sock])
