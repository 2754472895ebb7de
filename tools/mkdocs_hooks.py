"""mkdocs hooks: placeholders for the pages other branches are writing.

``mkdocs.yml`` lists every page, including those in ``PENDING_PAGES``, which are
written on other branches. Until one is merged, the build would fail under
``--strict`` (a nav entry and links to a missing file); this hook adds a
placeholder page for each one missing, and logs it. A page that exists is
never replaced, so once all are merged this hook does nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mkdocs.structure.files import Files

log = logging.getLogger("mkdocs.hooks.pgstore")

#: Page file -> title: the pages written on other branches.
PENDING_PAGES = {
    "security.md": "Security",
    "runtime-faults.md": "Runtime faults",
    "wakeups.md": "Wake-ups",
    "limits.md": "Limits",
    "other-languages.md": "Other languages",
}


def on_files(files: Files, config: Any) -> Files:
    """Add a placeholder for every pending page that is not in ``docs/``."""
    from mkdocs.structure.files import File  # mkdocs only: tests read PENDING_PAGES without it

    for name, title in PENDING_PAGES.items():
        if files.get_file_from_path(name) is None:
            log.info("pending page %s is not merged yet: building a placeholder", name)
            content = f"# {title}\n\nThis page is not written yet.\n"
            files.append(File.generated(config, name, content=content))
    return files
