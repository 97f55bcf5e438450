"""The FastAPI application of ``twin serve``: OpenAI's completions and chat completions (streamed as
server-sent events, or whole), ``/v1/models``, ``/metrics`` and ``/health``, answered from a
:class:`~twin.serve.SimulationServer` running on its own thread.

Handlers run on uvicorn's event loop. The simulation has no hook per token, so one task (:class:`_Waker`)
looks at every waiting handler's requests each POLL_S of wall time and wakes those that moved, rather than
a timer per handler; a client that disconnects is seen at once (its connection's ``http.disconnect``, as
vLLM's ``with_cancellation`` watches it) and its requests are aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from twin.core.request import Status
from twin.serve import FILLER, GONE, POLL_S, ServedRequest, SimulationServer
from twin.serve_models import ChatCompletionRequest, CompletionRequest, OpenAIRequest, parse


class Refused(Exception):
    """A request answered with an OpenAI error object (``type`` as vLLM names it)."""

    def __init__(self, code: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.code = code
        self.kind = kind


def error(code: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": code}}, status_code=code)


def create_app(sim: SimulationServer) -> FastAPI:
    """The application serving ``sim`` (a trailing slash or a query string does not change a route).
    ``app.state.waker.close()`` ends the replies in progress, aborting their requests (a server stopping)."""
    app = FastAPI(title="ServeTwin", description="An OpenAI-compatible endpoint backed by a simulated deployment")
    app.add_middleware(_StripSlash)
    waker = app.state.waker = _Waker(sim)

    @app.exception_handler(Refused)
    async def refused(_: Request, exc: Refused) -> JSONResponse:
        return error(exc.code, str(exc), exc.kind)

    @app.exception_handler(HTTPException)
    async def no_route(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code in (404, 405):  # (a GET of a POST route too, as before)
            return error(404, f"no route {request.url.path}", "NotFoundError")
        return error(exc.status_code, str(exc.detail), "BadRequestError")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": sim.model_name, "object": "model", "owned_by": "servetwin",
                                            "created": 0}]}

    @app.get("/health")
    @app.get("/ping")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> Response:
        return PlainTextResponse(sim.prometheus(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _complete(sim, waker, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _complete(sim, waker, request, chat=True)

    _document(app, {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest})
    return app


def _document(app: FastAPI, bodies: dict[str, type[BaseModel]]) -> None:
    """The request models in the OpenAPI schema (``/openapi.json``, ``/docs``) with their fields' defaults
    and meanings: the handlers read their bodies themselves (any content type, the model checked first)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for path, model in bodies.items():
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(body.pop("$defs", {}))
                components[model.__name__] = body
                schema["paths"][path]["post"]["requestBody"] = {"required": True, "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


class _StripSlash:
    """``/v1/models/`` is ``/v1/models`` (Starlette would redirect it, and a client does not repeat a POST)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            scope = {**scope, "path": path.rstrip("/") or "/"}
        await self.app(scope, receive, send)


async def _complete(sim: SimulationServer, waker: _Waker, request: Request, chat: bool) -> Response:
    """A completions or chat request: refused (an error object), streamed, or answered whole."""
    try:
        body = await _read(sim, request, chat)
    except ClientDisconnect:  # (gone before its body arrived: nothing to answer)
        return Response(status_code=400)
    tokens = body.prompt_tokens()
    if not tokens:
        raise Refused(400, "need a non-empty prompt")
    max_tokens = body.output_tokens
    reason = sim.refusal(len(tokens), max_tokens)
    if reason is not None:
        raise Refused(400, reason)
    children = [ServedRequest(tokens, max_tokens) for _ in range(body.n)]
    for served in children:  # one hand-over after another: the intake adds them at one instant
        sim.submit(served)
    reply = _Reply(sim, children, f"{'chatcmpl' if chat else 'cmpl'}-{id(children[0]):x}", chat)
    if body.stream:
        return StreamingResponse(reply.events(request, waker, body.include_usage, body.continuous_usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    async with _watching(request) as gone:
        while True:
            seen = _progress(children, tokens=False)
            if all(served.done.is_set() for served in children):
                return reply.whole()
            if not sim.thread.is_alive():
                raise Refused(500, "the simulation thread stopped", "InternalServerError")
            if gone.is_set() or waker.closed:
                reply.abort()
                return error(503, "the server is stopping", "ServiceUnavailableError")
            await waker.wait(children, seen, gone, tokens=False)


async def _read(sim: SimulationServer, request: Request, chat: bool) -> OpenAIRequest:
    """The body as its request model: any content type is read as JSON, and a model other than the served
    one is a 404 before any field is checked (as before); a field it gets wrong is a 400 naming it."""
    try:
        data = json.loads(await request.body() or b"{}")
    except ValueError as exc:
        raise Refused(400, f"bad request: {exc}") from None
    if not isinstance(data, dict):
        raise Refused(400, "bad request: the body must be a JSON object")
    model = data.get("model")
    if model is not None and model != sim.model_name:  # (vLLM's _check_model)
        raise Refused(404, f"The model `{model}` does not exist.", "NotFoundError")
    try:
        return parse(ChatCompletionRequest if chat else CompletionRequest, data, sim.vocab_size)
    except ValueError as exc:
        raise Refused(400, f"bad request: {exc}") from None


@contextlib.asynccontextmanager
async def _watching(request: Request) -> AsyncIterator[asyncio.Event]:
    """An event set when the client disconnects (its body read, the next message is the disconnect)."""
    gone = asyncio.Event()

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone.set()

    task = asyncio.create_task(watch())
    try:
        yield gone
    finally:
        task.cancel()


def _progress(children: list[ServedRequest], tokens: bool = True) -> list[tuple[int, bool]]:
    """Where the simulation has got with ``children``: tokens made (with ``tokens``), and whether each ended."""
    return [(s.req.num_output_tokens if tokens and s.req is not None else 0, s.done.is_set()) for s in children]


class _Waker:
    """Wakes handlers whose requests moved (a token, an end), the client went away or the simulation
    stopped: one task checks every waiting handler each POLL_S of wall time, while any waits."""

    def __init__(self, sim: SimulationServer) -> None:
        self.sim = sim
        self.closed = False
        """The server is stopping: waits end at once, and their handlers end their replies."""
        self._waiting: list[tuple[Callable[[], Any], Any, asyncio.Event, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None

    def close(self) -> None:
        """Wake every handler for good (on the event loop's thread)."""
        self.closed = True
        for _, _, _, future in self._waiting:
            if not future.done():
                future.set_result(None)
        self._waiting = []

    async def wait(self, children: list[ServedRequest], seen: list[tuple[int, bool]], gone: asyncio.Event,
                   tokens: bool = True) -> None:
        """Until ``children`` are no longer where ``seen`` (taken before the caller last read them) had them,
        the client has gone or the simulation stopped."""
        if self.closed:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((lambda: _progress(children, tokens), seen, gone, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._poll())
        try:
            await future
        finally:
            future.cancel()  # (cancelled: the poll drops it)

    async def _poll(self) -> None:
        while self._waiting:
            await asyncio.sleep(POLL_S)
            alive = self.sim.thread.is_alive()
            waiting = []
            for entry in self._waiting:
                state, seen, gone, future = entry
                if future.done():
                    continue
                if gone.is_set() or not alive or state() != seen:
                    future.set_result(None)
                else:
                    waiting.append(entry)
            self._waiting = waiting


def _usage(prompt: int, completion: int) -> dict[str, int]:
    """An OpenAI ``usage`` object."""
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class _Reply:
    """The answer to one HTTP request: its n children (simulated requests sharing the prompt) as choices."""

    def __init__(self, sim: SimulationServer, children: list[ServedRequest], rid: str, chat: bool) -> None:
        self.sim = sim
        self.children = children
        self.rid = rid
        self.chat = chat
        self.kind = "chat.completion.chunk" if chat else "text_completion"

    def abort(self) -> None:
        for served in self.children:
            if not served.done.is_set():
                self.sim.abort(served, GONE)

    def usage(self) -> dict[str, int]:
        """The prompt once (the children share it) and every child's completion tokens, as vLLM counts."""
        return _usage(len(self.children[0].prompt_tokens),
                      sum(s.req.num_output_tokens for s in self.children if s.req is not None))

    def whole(self) -> JSONResponse:
        choices: list[dict[str, Any]] = []
        for index, served in enumerate(self.children):
            req = served.req
            assert req is not None
            if req.status is not Status.FINISHED:
                return error(503, f"request failed: {req.fail_reason}", "ServiceUnavailableError")
            text = FILLER * req.num_output_tokens
            choices.append({"index": index, "message": {"role": "assistant", "content": text},
                            "finish_reason": "length"} if self.chat else
                           {"index": index, "text": text, "finish_reason": "length"})
        return JSONResponse({"id": self.rid, "object": "chat.completion" if self.chat else "text_completion",
                             "created": int(time.time()), "model": self.sim.model_name, "choices": choices,
                             "usage": self.usage()})

    def _chunk(self, index: int, first: int, count: int, finish: str | None, continuous: bool) -> str:
        """Tokens ``first`` .. ``count`` of choice ``index``, made in one engine step, in one chunk (vLLM
        streams one output per step: a speculative step's accepted drafts arrive together); with continuous
        usage stats, that choice's usage so far (as vLLM counts it per output)."""
        text = FILLER * (count - first + 1)
        delta = {"role": "assistant", "content": text} if first == 1 else {"content": text}
        choice: dict[str, Any] = ({"index": index, "delta": delta, "finish_reason": finish} if self.chat
                                  else {"index": index, "text": text, "finish_reason": finish})
        out: dict[str, Any] = {"id": self.rid, "object": self.kind, "created": int(time.time()),
                               "model": self.sim.model_name, "choices": [choice]}
        if continuous:
            out["usage"] = _usage(len(self.children[0].prompt_tokens), count)
        return _event(json.dumps(out))

    async def events(self, request: Request, waker: _Waker, include_usage: bool,
                     continuous: bool) -> AsyncIterator[str]:
        """The stream: each engine step's new tokens per choice, the finish reason with the last, then a
        failure (if a child failed), the usage (with include_usage) and ``[DONE]``. A client that goes away
        (seen here, or the stream cancelled under it) aborts the children still running."""
        sent = [0] * len(self.children)
        try:
            async with _watching(request) as gone:
                while True:
                    seen = _progress(self.children)  # (before reading them: what moves while they are read wakes)
                    done = all(served.done.is_set() for served in self.children)
                    for index, served in enumerate(self.children):
                        for chunk, end in self._new_steps(served, sent[index], index, continuous):
                            yield chunk
                            sent[index] = end
                    if done or not self.sim.thread.is_alive():
                        break
                    await waker.wait(self.children, seen, gone)
                    if gone.is_set() or waker.closed:  # (the finally aborts what still runs)
                        return
            for served in self.children:
                req = served.req
                if req is not None and req.status is not Status.FINISHED:
                    yield _event(json.dumps({"error": {"message": f"request failed: {req.fail_reason}"}}))
                    break
            if include_usage:
                yield _event(json.dumps({"id": self.rid, "object": self.kind, "created": int(time.time()),
                                         "model": self.sim.model_name, "choices": [], "usage": self.usage()}))
            yield _event("[DONE]")
        finally:
            self.abort()

    def _new_steps(self, served: ServedRequest, sent: int, index: int,
                   continuous: bool) -> list[tuple[str, int]]:
        """Chunks of the tokens past ``sent``, one per engine step, each with the count it reaches. The last
        token waits for the request's end (the same simulated instant), so it carries the finish reason:
        read before the end, the count may already include it."""
        finished = served.done.is_set()
        req = served.req
        produced = req.num_output_tokens if req is not None else 0
        ready = produced if finished else min(produced, served.max_tokens - 1)
        ok = finished and req is not None and req.status is Status.FINISHED
        times = req.token_times_ns if req is not None else None
        out = []
        while sent < ready:
            start = end = sent
            end += 1
            while times is not None and end < ready and times[end] == times[start]:
                end += 1
            out.append((self._chunk(index, start + 1, end, "length" if ok and end == produced else None,
                                    continuous), end))
            sent = end
        return out


def _event(payload: str) -> str:
    """One server-sent event."""
    return f"data: {payload}\n\n"
