"""The explore server: a Starlette app over the models named at start, served by uvicorn.

    GET  /                 the page (static/explore.html; its script and style from /static/)
    GET  /api/models       the served models: name, source, config, the block's layout (LAYOUTS' steps)
    POST /api/trace        {model, input | tokens, target?, position?, stages?, ablate?} -> the trace JSON
    POST /api/predict      {..., temperature, top_k, ablate?} -> next-token bars, plain and ablated
    POST /api/step         {..., temperature, top_k, sample, seed} -> the input with one more token
    POST /api/gradients    {..., target, ablate?} -> d loss / d stage per position, identity vs branch paths
    POST /api/explain      {..., what, vector, ...} -> a typed vector through a norm, activation, FFN

Safe by default: the browser chooses only among the models named at start; a body is JSON (the
content type a cross-site form cannot send without asking) of at most ``MAX_BODY`` bytes; the Host
header must name this machine (no DNS rebinding); an input is capped in characters and tokens; every
mistake is a 4xx JSON ``{"error": message}`` and the server goes on serving; each model is used by
one request at a time (``Explored.lock``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from importlib import resources
from typing import Any

from ..errors import UsageError, one_line
from ..files.jsonfiles import json_safe
from .by_hand import explain
from .session import Explored, Request, RequestError, gradients, predict, step, trace

MAX_BODY = 64 * 1024  # bytes of one request body
STATIC = {"explore.js": "text/javascript", "explore.css": "text/css", "heatmap.js": "text/javascript"}
INSTALL_HINT = "blocklab explore needs Starlette and uvicorn: pip install 'blocklab[explore]'"


def _of_next_tokens(action: Callable[[Request], dict]) -> Callable[[Request], dict]:
    """``action`` (next-token bars, a generation step), refused (409, in the model's own words) for a
    model without a next-token head (an encoder)."""
    def checked(request: Request) -> dict:
        subject = request.entry.subject
        if not subject.next_token:
            raise RequestError(f"{request.entry.name}: {'; '.join(subject.notes)}", 409)
        return action(request)
    return checked


ACTIONS = {"trace": trace, "predict": _of_next_tokens(predict), "step": _of_next_tokens(step),
           "gradients": gradients, "explain": explain}
WITH_BODY = {"explain"}  # the actions that read fields of their own from the body, beside the Request's


def _arguments(action: str, body: Any, models: dict[str, Explored]) -> tuple:
    """What ``action`` is called with: the parsed Request, and the body itself for a ``WITH_BODY`` action."""
    request = Request.parse(body, models)
    return (request, body) if action in WITH_BODY else (request,)


def _static(name: str) -> str:
    """A file of the page; ``heatmap.js`` is the static trace page's heatmap script (one source for both)."""
    if name == "heatmap.js":
        from ..inspect.trace.html import HEATMAP_JS

        return HEATMAP_JS
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def require_server_packages() -> None:
    """Refuse with one line saying how to install them when Starlette or uvicorn is missing."""
    import importlib.util

    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"{INSTALL_HINT} ({', '.join(missing)} is not installed)")


def _encode(data: Any) -> bytes:
    """Strict JSON as ``blocklab trace --json`` writes it: NaN and infinities as null."""
    return json.dumps(json_safe(data), allow_nan=False).encode()


def create_app(models: dict[str, Explored], hosts: list[str] | None = None) -> Any:
    """The Starlette app serving ``models`` (name -> Explored); ``hosts``: the Host names accepted
    (default: this machine's loopback names)."""
    require_server_packages()
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.requests import Request as HttpRequest
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    def error(status: int, message: str, request: HttpRequest | None = None) -> Response:
        if request is not None:  # one line per failed request on the server's stderr, never a traceback
            line = f"{request.method} {request.url.path} {status}: {one_line(message)[:300]}"
            print(f"blocklab explore: {line}", file=sys.stderr, flush=True)
        return JSONResponse({"error": message}, status_code=status)

    async def page(_: HttpRequest) -> Response:
        return HTMLResponse(_static("explore.html"))

    async def static(request: HttpRequest) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return error(404, f"no file {name!r}")
        return Response(_static(name), media_type=STATIC[name])

    async def listing(_: HttpRequest) -> Response:
        return Response(_encode({"models": [m.describe() for m in models.values()]}),
                        media_type="application/json")

    async def api(request: HttpRequest) -> Response:
        action = ACTIONS.get(request.path_params["action"])
        if action is None:
            return error(404, f"no API call {request.path_params['action']!r}; "
                              f"there are: {', '.join(ACTIONS)}", request)
        try:
            args = _arguments(request.path_params["action"], await _request_json(request), models)
            result = await run_in_threadpool(action, *args)
        except RequestError as e:
            return error(e.status, str(e), request)
        except (KeyboardInterrupt, SystemExit, GeneratorExit, asyncio.CancelledError):
            raise
        except BaseException as e:  # a bug, or a third party's BaseException (a Rust panic): we go on
            return error(500, internal_message(e), request)
        return Response(_encode(result), media_type="application/json")

    async def http_error(_: HttpRequest, e: Exception) -> Response:
        assert isinstance(e, HTTPException)
        return error(e.status_code, str(e.detail))

    async def internal(request: HttpRequest, e: Exception) -> Response:
        return error(500, internal_message(e), request)

    routes = [Route("/", page), Route("/static/{name}", static), Route("/api/models", listing),
              Route("/api/{action}", api, methods=["POST"])]
    allowed = hosts or ["127.0.0.1", "localhost", "[::1]", "testserver"]
    return Starlette(routes=routes, middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=allowed)],
                     exception_handlers={HTTPException: http_error, Exception: internal})


async def _request_json(request: Any) -> Any:
    """The JSON body of an API request (a Starlette request); RequestError (415 not JSON, 413 over
    ``MAX_BODY`` bytes, 400 unreadable) naming what is wrong."""
    from starlette.requests import ClientDisconnect

    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind != "application/json":
        raise RequestError("send the request as JSON (Content-Type: application/json), "
                           f"not {kind or 'nothing'}", 415)
    declared = request.headers.get("content-length", "0")
    if not declared.isdigit() or int(declared) > MAX_BODY:
        raise RequestError(f"the request body is over {MAX_BODY} bytes", 413)
    body = b""
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                raise RequestError(f"the request body is over {MAX_BODY} bytes", 413)
    except ClientDisconnect:  # nobody to answer
        raise RequestError("the client went away before its request was read") from None
    try:
        return json.loads(body, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as e:
        raise RequestError(f"the request body is not JSON blocklab reads: {e}") from None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys each appear once (``json.loads`` would keep the last of two silently)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"the key {key!r:.40} appears twice in one object; give each field once")
        found[key] = value
    return found


def internal_message(error: BaseException) -> str:
    """The 500's message for what the server did not expect: one line."""
    detail = one_line(str(error))[:300]
    return f"internal error: {type(error).__name__}: {detail} (a bug in blocklab; the server goes on)"


def accepted_hosts(host: str) -> list[str]:
    """The Host header names a server listening on ``host`` accepts: the loopback names and ``host``;
    every name when ``host`` is every interface (0.0.0.0, ::), whose names the server cannot know."""
    named = {host if ":" not in host else f"[{host}]", "127.0.0.1", "localhost", "[::1]"}
    return sorted(named | ({"*"} if host in ("0.0.0.0", "::") else set()))


def serve(models: dict[str, Explored], host: str, port: int, on_start: Any = None) -> None:
    """Serve the app with uvicorn until interrupted; ``on_start(url)`` once it listens."""
    require_server_packages()
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))  # bound here, so the URL printed has the real port (--port 0: any free one)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else (f"[{host}]" if ":" in host else host)
    url = f"http://{shown}:{sock.getsockname()[1]}/"
    config = uvicorn.Config(create_app(models, accepted_hosts(host)), log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    if on_start is not None:
        on_start(url)
    server.run(sockets=[sock])


__all__ = ["MAX_BODY", "accepted_hosts", "create_app", "serve"]
