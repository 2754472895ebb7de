"""What keeps the console's actions safe: CSRF tokens, and who may act at all.

CSRF: the signed double-submit pattern. Each process draws a secret at start; a token
is a random nonce and its HMAC under that secret. A page that offers an action sets the
token in a cookie (``HttpOnly``, ``SameSite=Strict``) and in a hidden form field; a
POST is taken only when both are present, equal, and signed by this process's secret.
Another site can neither read the cookie nor set one this process signed, so it cannot
forge the field; a token from an earlier run of the console is refused too.

Who may act: the role the console connects as, asked once per page through
``has_function_privilege`` (a catalog function: no table is read), for each action's
SQL function. A role without EXECUTE on it is shown no button for it, and a POST for it
is refused before any call.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence

from pgstore.schema.function import Function

__all__ = ["COOKIE", "FIELD", "PRIVILEGE_QUERY", "CsrfTokens", "privilege_args"]

#: The cookie and the form field that carry the CSRF token.
COOKIE = "pgstore_csrf"
FIELD = "csrf"


class CsrfTokens:
    """Tokens signed by a secret drawn when the object is made (once per process)."""

    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)

    def _sign(self, nonce: str) -> str:
        return hmac.new(self._secret, nonce.encode(), hashlib.sha256).hexdigest()

    def new(self) -> str:
        """A fresh token: ``nonce.signature``."""
        nonce = secrets.token_urlsafe(18)
        return f"{nonce}.{self._sign(nonce)}"

    def valid(self, token: str | None) -> bool:
        """Whether ``token`` was signed by this process."""
        if not token or token.count(".") != 1:
            return False
        nonce, signature = token.split(".")
        return hmac.compare_digest(signature, self._sign(nonce))

    def refusal(self, cookie: str | None, field: str | None) -> str | None:
        """Why a POST carrying ``cookie`` and ``field`` is refused; None: it is not."""
        if not field:
            return "the form carries no CSRF token"
        if not cookie:
            return "the request carries no CSRF cookie"
        if not hmac.compare_digest(cookie.encode(), field.encode()):
            return "the form's CSRF token does not match the cookie's"
        if not self.valid(field):
            return "the CSRF token was not issued by this console (reload the page)"
        return None


#: One round trip answering, for each function, whether the connected role may execute
#: it; the name is quoted by ``format('%I.%I(...)')`` on the server.
PRIVILEGE_QUERY = (
    "SELECT f.name, has_function_privilege(format('%%I.%%I(%%s)', %s::text, f.name, f.args),"
    " 'EXECUTE'), current_user"
    " FROM unnest(%s::text[], %s::text[]) AS f(name, args)"
)


def privilege_args(schema: str, functions: Sequence[Function]) -> tuple[str, list[str], list[str]]:
    """``PRIVILEGE_QUERY``'s parameters for ``functions`` of ``schema``."""
    return (
        schema,
        [f.name for f in functions],
        [", ".join(f.arg_types) for f in functions],
    )
