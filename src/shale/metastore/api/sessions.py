"""Browser sessions for the status page, and the cross-site checks of every state-changing request.

A browser never holds a token in a form it would send on its own: the operator pastes the token into the login
form (``POST /ui/login``, same origin only), and the node answers with a random session id in a cookie that is
``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no cross-site request carries it) and ``Secure`` over
HTTPS. The node keeps, per session, only the token's SHA-256 digest and an expiry, and authenticates that digest
on every request, so revoking the token ends its sessions. A session opens only ``SESSION_ROUTES`` (the read-only
status page); the API needs ``Authorization: Bearer``. Sessions live in the memory of the node that made them.

Every other request that can change state must be JSON (``application/json`` or ``application/msgpack``: a
cross-site HTML form can send neither without a CORS preflight, which this server never grants) and must not come
from another site (``Origin`` another host, or ``Sec-Fetch-Site`` other than ``same-origin``/``none``).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import urlsplit

COOKIE = "shale_session"
SESSION_SECONDS = 8 * 3600
MAX_SESSIONS = 10_000
SESSION_ROUTES = frozenset({"GET /ui", "GET /v1/ui/status"})
FORM_ROUTES = frozenset({"POST /ui/login", "POST /ui/logout"})
"""The only state-changing routes that take an HTML form (they change a session, never the metastore)."""
JSON_TYPES = ("application/json", "application/msgpack")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class Sessions:
    """Session id -> (token digest, expiry), oldest evicted first past ``MAX_SESSIONS``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._by_id: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, token: str) -> str:
        session = secrets.token_urlsafe(32)
        with self._lock:
            self._by_id[session] = (hashlib.sha256(token.encode()).digest(), self._clock() + SESSION_SECONDS)
            while len(self._by_id) > MAX_SESSIONS:
                self._by_id.popitem(last=False)
        return session

    def digest(self, session: str | None) -> bytes | None:
        """The token digest of a live session, or None."""
        if not session:
            return None
        with self._lock:
            found = self._by_id.get(session)
            if found is None:
                return None
            if found[1] <= self._clock():
                del self._by_id[session]
                return None
            return found[0]

    def close(self, session: str | None) -> None:
        with self._lock:
            self._by_id.pop(session or "", None)

    def __len__(self) -> int:
        return len(self._by_id)


def cookie_header(session: str, secure: bool) -> str:
    return (f"{COOKIE}={session}; Path=/; Max-Age={SESSION_SECONDS}; HttpOnly; SameSite=Strict"
            + ("; Secure" if secure else ""))


def cleared_cookie_header(secure: bool) -> str:
    return f"{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")


def cross_site(method: str, origin: str | None, fetch_site: str | None, host: str | None,
               form: bool = False) -> str | None:
    """Why a request must be refused as cross-site, or None. A state-changing request is cross-site when its
    ``Origin`` names another host than the one it was sent to, or its ``Sec-Fetch-Site`` is not ``same-origin`` or
    ``none`` (typed by the user). A form route also needs an ``Origin`` (every browser sends one on a POST):
    non-browser clients have no reason to log in."""
    if method in SAFE_METHODS:
        return None
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return f"Sec-Fetch-Site is {fetch_site!r}: state-changing requests must come from this site"
    if origin is None:
        return "a login form must be sent by a browser from this site (no Origin header)" if form else None
    if origin == "null" or not host or urlsplit(origin).netloc.lower() != host.lower():
        return f"Origin {origin[:100]!r} is not this server: state-changing requests must come from this site"
    return None


def wrong_content_type(method: str, content_type: str | None, form: bool = False) -> str | None:
    """Why a state-changing request's body type is refused (415), or None."""
    if method in SAFE_METHODS:
        return None
    media = (content_type or "").split(";", 1)[0].strip().lower()
    allowed = ("application/x-www-form-urlencoded",) if form else JSON_TYPES
    if media in allowed:
        return None
    return (f"Content-Type {media or '(none)'!r} is not accepted here; send {' or '.join(allowed)}")
