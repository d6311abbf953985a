"""The Starlette app: the three pages (one HTML shell whose script draws them), the JSON API under /api/v1,
the package's static files and read-only; who may ask at all is ``_auth.TokenGate``'s."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from determined_trials.core.store import LocalStore, NotFoundError
from determined_trials.experiment import ExperimentError, activate_experiment, kill_experiment, pause_experiment
from determined_trials.ui import _data
from determined_trials.ui._auth import TokenGate
from determined_trials.ui._search import search_view
from determined_trials.ui._watch import StoreWatch

__all__ = ["STATIC_DIR", "UiSettings", "create_app"]

STATIC_DIR = Path(__file__).resolve().parent / "static"
MAX_POINTS_LIMIT = 20_000
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_ACTIONS: dict[str, Callable[[LocalStore, int], Any]] = {
    "pause": pause_experiment, "activate": activate_experiment, "kill": kill_experiment,
}

Endpoint = Callable[[Request], Awaitable[Response]]
_MAX_ID = 2**63 - 1  # SQLite's largest integer: a larger id is no row (and no OverflowError)


@dataclasses.dataclass(frozen=True)
class UiSettings:
    """How the app serves: the run folder, the token every request brings (None: ``--no-token``, no check),
    read-only, and whether the server listens on loopback only (then Host headers must name this machine)."""

    run_dir: Path
    token: str | None
    read_only: bool = False
    loopback: bool = True


class _ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _json(data: Any, status: int = 200) -> Response:
    body = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return Response(body, status_code=status, media_type="application/json",
                    headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _ApiError(400, f"{name} must be an integer, not {raw!r}") from None
    if not low <= value <= high:
        raise _ApiError(400, f"{name} must be between {low} and {high}, not {value}")
    return value


def _group(request: Request, default: str = "training") -> str:
    group = request.query_params.get("group", default)
    if not group or len(group) > 100:
        raise _ApiError(400, "group must be a metric group such as training or validation")
    return group


def create_app(settings: UiSettings) -> Starlette:
    """The dashboard app over ``settings.run_dir``'s store (which must exist)."""
    store = LocalStore(settings.run_dir, create=False)
    watch = StoreWatch(store.db_path, store.path)
    shell = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    body = shell.replace("{{READ_ONLY}}", "1" if settings.read_only else "0")

    def api(handler: Callable[[Request], Any]) -> Endpoint:
        """A GET endpoint: runs ``handler`` in a worker thread, answers JSON errors (410 once the run folder is
        gone)."""

        @functools.wraps(handler)
        async def endpoint(request: Request) -> Response:
            if (gone := watch.gone()) is not None:
                return _json({"error": gone}, 410)
            try:
                return _json(await run_in_threadpool(handler, request))
            except _ApiError as exc:
                return _json({"error": str(exc)}, exc.status)
            except NotFoundError as exc:
                return _json({"error": str(exc)}, 404)

        return endpoint

    def ident(request: Request, kind: str) -> int:
        """The id in the path; one beyond SQLite's integers is unknown, as any other id the store lacks."""
        value = int(request.path_params["id"])
        if value > _MAX_ID:
            raise store._not_found(kind, value)
        return value

    async def action(request: Request) -> Response:
        if settings.read_only:
            return _json({"error": "read-only dashboard (started with --read-only)"}, 403)
        if (gone := watch.gone()) is not None:
            return _json({"error": gone}, 410)
        name = request.path_params["action"]
        if name not in _ACTIONS:
            return _json({"error": f"unknown action {name!r}: pause, activate or kill"}, 404)
        try:
            experiment_id = ident(request, "experiment")
            await run_in_threadpool(_ACTIONS[name], store, experiment_id)
            return _json({"experiment_id": experiment_id, "action": name,
                          "state": (await run_in_threadpool(store.experiment, experiment_id)).state})
        except NotFoundError as exc:
            return _json({"error": str(exc)}, 404)
        except ExperimentError as exc:
            return _json({"error": str(exc)}, 409)

    async def page(request: Request) -> Response:
        return HTMLResponse(body, headers={"Content-Security-Policy": _CSP, "Cache-Control": "no-store",
                                           "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff"})

    async def not_found(request: Request) -> Response:
        return _json({"error": f"no such endpoint: {request.url.path}"}, 404)

    routes = [
        Route("/", page),
        Route("/experiments/{id:int}", page),
        Route("/trials/{id:int}", page),
        Route("/api/v1/experiments", api(lambda r: {"experiments": _data.experiments(store)})),
        Route("/api/v1/experiments/{id:int}", api(lambda r: _data.experiment(store, ident(r, "experiment")))),
        Route("/api/v1/experiments/{id:int}/trials", api(lambda r: _data.trials(store, ident(r, "experiment")))),
        Route("/api/v1/experiments/{id:int}/metrics",
              api(lambda r: _experiment_metric(store, r, ident(r, "experiment")))),
        Route("/api/v1/experiments/{id:int}/search", api(lambda r: search_view(store, ident(r, "experiment")))),
        Route("/api/v1/experiments/{id:int}/{action:str}", action, methods=["POST"]),
        Route("/api/v1/trials/{id:int}", api(lambda r: _data.trial(store, ident(r, "trial")))),
        Route("/api/v1/trials/{id:int}/metrics", api(lambda r: _data.trial_metrics(
            store, ident(r, "trial"), _group(r), _int_param(r, "max_points", 1000, 2, MAX_POINTS_LIMIT)))),
        Route("/api/v1/trials/{id:int}/checkpoints",
              api(lambda r: {"trial_id": ident(r, "trial"),
                             "checkpoints": _data.checkpoints(store, ident(r, "trial"))})),
        Route("/api/v1/trials/{id:int}/logs", api(lambda r: _data.log_tail(
            store, ident(r, "trial"), _int_param(r, "tail", 200, 0, _data.MAX_LOG_LINES)))),
        Route("/api/{rest:path}", not_found, methods=["GET", "POST"]),
        Mount("/static", app=StaticFiles(directory=STATIC_DIR, follow_symlink=False), name="static"),
    ]
    app = Starlette(routes=routes)
    app.add_middleware(TokenGate, token=settings.token, loopback=settings.loopback)
    app.state.settings = settings
    app.state.store = store
    return app


def _experiment_metric(store: LocalStore, request: Request, experiment_id: int) -> dict[str, Any]:
    metric = request.query_params.get("metric")
    if not metric:
        raise _ApiError(400, "metric is required (e.g. ?group=validation&metric=loss)")
    return _data.experiment_metric(store, experiment_id, _group(request, "validation"), metric,
                                   _int_param(request, "max_points", 300, 2, MAX_POINTS_LIMIT))
