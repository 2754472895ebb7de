"""``pgstore web``: the on-call console, a small server-rendered web app (the ``web`` extra).

It reads the store only through its SQL functions (``store_stats``, ``job_list``,
``schedule_list``, ...) by way of the asyncio store classes, so the read-only
monitoring role of docs/privileges.md can run it; the actions it offers (a failed
job's retry, a job's cancel, a schedule's delete) are the store's own functions, shown
only to a role that may execute them. docs/console.md describes the pages.

Nothing here is imported by ``pgstore`` itself: ``pgstore.web.app`` needs Starlette,
Jinja2 and uvicorn (``pip install 'pgstore[web]'``); this package's other modules need
nothing beyond pgstore.
"""

from __future__ import annotations
