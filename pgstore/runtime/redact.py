"""The text a failed dispatch leaves in ``jobs.last_error``, and how secrets are kept out.

When ``dispatch`` raises, the Dispatcher releases the job with a text made from the
exception, which the store keeps as the job's ``last_error`` (at most 4096
characters): anyone who may read the jobs (``pgstore jobs``, ``job_list``, a
backup) reads it. An exception's message often quotes the request that failed, and
with it a provider URL's ``api_key=...`` or a connection string's password. The
Dispatcher's ``redact_error`` turns the exception into that text before it leaves
the process:

* ``redact_secrets`` (the default): ``"<Type>: <message>"`` with the values of
  credential-like parameters (``api_key=``, ``token=``, ``password=``,
  ``secret=``... in a URL's query or anywhere in the message), the password of a
  URL's ``user:password@``, and ``Bearer`` / ``Basic`` credentials replaced by
  ``***``. A pattern list: it cannot know every provider's secrets, so give your own
  hook when the messages may carry others.
* ``verbatim``: ``"<Type>: <message>"`` as raised (what ``redact_error=None`` stores).
* your own ``Callable[[BaseException], str]``.

``error_text`` applies a hook safely: a hook that raises, or answers something that
is not a string, never costs the release (the job would wait for its lease to expire
instead of its backoff): the text is then ``"<Type> (error text withheld:
redact_error raised <Error>)"``. Whatever the hook answers is made storable: NUL
characters and lone surrogates (which PostgreSQL's text cannot hold) are escaped,
and the text is cut to 4096 characters.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pgstore.models import ERROR_MAX_CHARS

__all__ = ["RedactError", "error_text", "redact_secrets", "verbatim"]

#: ``redact_error``: the exception a dispatch raised -> the text stored as ``last_error``.
RedactError = Callable[[BaseException], str]

_MASK = "***"
#: ``name=value`` (a URL's query, a form, a log-style message) for credential-like names.
_PARAMETER = re.compile(
    r"(?i)(?<![A-Za-z0-9])((?:[A-Za-z0-9]+[_-])*(?:api[_-]?key|apikey|key|token|secret|"
    r"password|passwd|pwd|pass|auth|authorization|signature|sig|credentials?|"
    r"session(?:[_-]?id)?))(\s*[=:]\s*)(?!\*\*\*)([^\s&;,'\"<>]+)")
#: ``scheme://user:password@host``.
_USERINFO = re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^/\s:@]+:)([^/\s@]+)(@)")
#: ``Bearer <token>``, ``Basic <credentials>``.
_SCHEME = re.compile(r"(?i)\b(bearer|basic)(\s+)(?!\*\*\*)([A-Za-z0-9._~+/=-]+)")


def verbatim(exc: BaseException) -> str:
    """``"<Type>: <message>"``, the exception as raised."""
    return f"{type(exc).__name__}: {exc}"


def redact_secrets(exc: BaseException) -> str:
    """``verbatim(exc)`` with the credentials it recognises replaced by ``***`` (see the
    module's doc): ``ConnectionError: GET https://api.example.com/v1?api_key=***&q=1``."""
    text = verbatim(exc)
    text = _USERINFO.sub(lambda m: f"{m[1]}{_MASK}{m[3]}", text)
    text = _SCHEME.sub(lambda m: f"{m[1]}{m[2]}{_MASK}", text)
    return _PARAMETER.sub(lambda m: f"{m[1]}{m[2]}{_MASK}", text)


def error_text(exc: BaseException, redact: RedactError | None) -> str:
    """The text to store for ``exc``: ``redact(exc)`` (``verbatim`` for None), or the
    withheld text when the hook fails; storable and at most 4096 characters."""
    hook = verbatim if redact is None else redact
    try:
        text = hook(exc)
        if not isinstance(text, str):
            raise TypeError(f"redact_error returned {type(text).__name__}, not str")
    except Exception as failure:
        text = (f"{type(exc).__name__} (error text withheld: redact_error raised "
                f"{type(failure).__name__})")
    return _storable(text)[:ERROR_MAX_CHARS]


def _storable(text: str) -> str:
    """``text`` without what PostgreSQL's text cannot hold: NUL (``\\x00``) and lone
    surrogates, escaped with a backslash."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
