"""Who may ask the dashboard anything: the strict Host check on loopback (DNS rebinding), the Origin check on
POSTs (cross-site requests), and the token every request brings (``Authorization: Bearer`` or the ``HttpOnly``,
``SameSite=Strict`` cookie set when the printed ``?token=`` address is first opened)."""

from __future__ import annotations

import hmac
import json
import re
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["LOOPBACK_NAMES", "TokenGate", "cookie_name", "parse_host", "same_token"]

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_HOST = re.compile(r"(?P<name>\[[0-9a-f:.]+\]|[a-z0-9.\-_]+)(?::(?P<port>[0-9]{1,5}))?")
_SAFE_METHODS = ("GET", "HEAD")
_NO_STORE = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff"}


def parse_host(value: str) -> tuple[str, int | None] | None:
    """A Host header as (lower-case name, port or None), or None unless it is exactly a name or an address with an
    optional all-digit port (so ``127.0.0.1:8765@evil.com`` and ``localhost:evil`` are no hosts at all)."""
    match = _HOST.fullmatch(value.strip().lower())
    if match is None:
        return None
    port = int(match["port"]) if match["port"] else None
    if port is not None and not 0 < port < 65536:
        return None
    return match["name"], port


def same_token(given: str | None, token: str) -> bool:
    """Whether ``given`` is the token (compared in constant time)."""
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def cookie_name(request: Request) -> str:
    """The cookie holding the token, named by the port the browser sees (cookies ignore ports: two dashboards
    on one machine keep one cookie each)."""
    parsed = parse_host(request.headers.get("host", ""))
    port = parsed[1] if parsed and parsed[1] else 80
    return f"det-ui-token-{port}"


def _bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _refuse(request: Request, status: int, message: str) -> Response:
    """A JSON error under /api, a short HTML page elsewhere."""
    if request.url.path.startswith("/api/"):
        return Response(json.dumps({"error": message}), status_code=status, media_type="application/json",
                        headers=_NO_STORE)
    text = message.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return HTMLResponse(f"<!doctype html><title>det-trials ui</title><p>{text}</p>", status, headers=_NO_STORE)


class TokenGate:
    """Every request passes three checks, in order: on loopback its Host header must name this machine (421:
    a web page whose own name was pointed at 127.0.0.1 would otherwise be same-origin with the dashboard); a
    POST's ``Origin``, when a browser sends one, must be the dashboard's own (403); and, unless ``token`` is
    None (``--no-token``), it must bring the token (401): as ``Authorization: Bearer``, as the cookie, or as
    ``?token=`` on a GET, which is answered by setting the cookie and redirecting to the address without it."""

    def __init__(self, app: ASGIApp, *, token: str | None, loopback: bool) -> None:
        self.app = app
        self.token = token
        self.loopback = loopback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refusal = self._host_refusal(request) or self._origin_refusal(request)
        if refusal is None and self.token is not None:
            given = request.query_params.get("token")
            if given is not None and request.method in _SAFE_METHODS and same_token(given, self.token):
                refusal = self._login(request, self.token)
            elif not (same_token(_bearer(request), self.token)
                      or same_token(request.cookies.get(cookie_name(request)), self.token)):
                refusal = _refuse(request, 401, "unauthorized: open the address det-trials ui printed (it carries "
                                                "the token once), or send Authorization: Bearer <token>")
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _host_refusal(self, request: Request) -> Response | None:
        parsed = parse_host(request.headers.get("host", ""))
        if self.loopback and (parsed is None or parsed[0] not in LOOPBACK_NAMES):
            return _refuse(request, 421, "this dashboard answers to 127.0.0.1, localhost or [::1] only")
        return None

    def _origin_refusal(self, request: Request) -> Response | None:
        """A browser names the page behind every POST in ``Origin``: only the dashboard's own may act (SameSite
        cookies still reach it from another port of the same host)."""
        origin = request.headers.get("origin")
        if request.method in _SAFE_METHODS or origin is None:
            return None
        host = request.headers.get("host", "")
        if origin.lower() in (f"http://{host}".lower(), f"https://{host}".lower()):
            return None
        return _refuse(request, 403, f"cross-origin request from {origin} refused")

    @staticmethod
    def _login(request: Request, token: str) -> Response:
        """The token address's answer: the cookie, and the same address without the token."""
        query = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
        target = "/" + request.url.path.lstrip("/") + (f"?{query}" if query else "")  # never //other.host
        response = RedirectResponse(target, status_code=303, headers=_NO_STORE)
        response.set_cookie(cookie_name(request), token, path="/", httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response
