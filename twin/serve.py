"""``twin serve``: an OpenAI-compatible HTTP endpoint driven by the simulation in scaled wall-clock time.

Unmodified benchmark clients (vLLM's bench, LMBenchmark, any ``openai`` client) can run against a
simulated deployment. The simulation runs in a SimPy real-time environment on its own thread (one
simulated second takes ``time_scale`` wall seconds); HTTP threads hand requests over through a queue and
stream tokens as the simulation produces them.

Prompt tokens: token ids when the client sends them; otherwise text is cut by
:func:`workloads.tokens.approx_tokens` (a Llama-3-style pre-tokenizer split, long pieces every 6
characters: within about 7 % of real counts on the SWE-bench trajectories, see ``workloads/tokens.py``).
Equal text prefixes give equal token prefixes, so prefix caching sees multi-turn reuse. Chat messages are
rendered with a fixed template that keeps turn k's prompt and reply a prefix of turn k+1's prompt. The
reply is filler text of exactly ``max_tokens`` tokens (the simulated engine ignores EOS).

As vLLM's V1 server: ``n`` > 1 runs n requests with the same prompt, added together (V1's parallel
sampling fans a request out into n children; the later ones hit the prefix cache on the blocks the first
is computing, as the engine does), answered as n choices with the prompt counted once in ``usage``; a
``model`` other than the served name is a 404; ``best_of`` other than 1 is refused, as V1 refuses it.
Options whose answer the twin cannot give (``logprobs``, ``top_logprobs``, ``echo``) are refused with a 400
naming them rather than ignored. Sampling parameters (temperature, top_p, seed, stop ...) do not change
the filler reply, and the sampler's cost follows the deployment (``engine.sampling``), not the request.
"""

from __future__ import annotations

import json
import math
import queue
import re
import select
import socket
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator, TypeVar

import attrs
import simpy
import simpy.rt

from twin.config import TwinConfig, WorkloadSpec
from twin.registry import register
from twin.request import Request, Status
from twin.sim import ProcessGen, now_ns, to_ns
from twin.tokens import ROOT_KEY
from workloads.tokens import approx_tokens

FILLER = " tok"
POLL_S = 0.002
GONE = "the client disconnected (aborted, as vLLM aborts a request whose client goes away)"
T = TypeVar("T")
_BODY_PIECE = 1 << 20
"""Bytes of a request body read at a time."""


@register("workload", "external")
@attrs.frozen(kw_only=True)
class ExternalWorkload(WorkloadSpec):
    """No built-in traffic: requests come from outside (``twin serve``)."""

    def build(self, rng: Any) -> Any:
        import numpy as np

        from twin.sources import WorkloadPlan

        return WorkloadPlan(sessions=[], start_s=np.zeros(0))


def block_keys(tokens: list[Any], block_size: int) -> list[int]:
    """Chained keys of the full blocks of a token list (text tokens hashed with CRC-32: no salted hashes)."""
    keys: list[int] = []
    prev = ROOT_KEY
    for start in range(0, len(tokens) - block_size + 1, block_size):
        chunk = tokens[start:start + block_size]
        if chunk and isinstance(chunk[0], str):
            ident = zlib.crc32("\x00".join(chunk).encode())  # type: ignore[arg-type]
            prev = hash((prev, ident, len(chunk)))
        else:
            prev = hash((prev, *chunk))
        keys.append(prev)
    return keys


def render_chat(messages: list[dict[str, Any]]) -> str:
    """A fixed chat template; the generation prompt ends the text so a reply continues it directly."""
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be an object with a role and content")
        role = m.get("role", "user")
        if not isinstance(role, str):
            raise ValueError(f"messages[{i}].role must be a string, got {json.dumps(role)}")
        parts.append(f"<|{role}|>{_content_text(m.get('content'), f'messages[{i}].content')}\n")
    return "".join(parts) + "<|assistant|>"


def _content_text(content: Any, where: str) -> str:
    """A message's text: its content string, or its content parts' texts joined (null: none). A wrong type is
    a ValueError naming it, as vLLM's request models refuse it with a 400; parts without text (images ...)
    add nothing, and a plain string part is text, as vLLM's chat parser reads it."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where} must be a string or a list of content parts, got {json.dumps(content)}")
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise ValueError(f"{where}[{j}] must be a content part (an object) or a string, got {json.dumps(part)}")
        text = part.get("text", "")
        if not isinstance(text, str):
            raise ValueError(f"{where}[{j}].text must be a string, got {json.dumps(text)}")
        texts.append(text)
    return "".join(texts)


class ServedRequest:
    """An HTTP request's handle: the twin's Request plus what the HTTP thread needs."""

    def __init__(self, prompt_tokens: list[str] | list[int], max_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.req: Request | None = None
        self.done = threading.Event()


class SimulationServer:
    """The simulation thread: a real-time SimPy run that accepts requests from other threads."""

    def __init__(self, config: TwinConfig, time_scale: float = 1.0, served_model_name: str | None = None) -> None:
        from twin.config import load_config
        from twin.runner import Simulation

        if not 0 < time_scale < math.inf:  # (infinity slept NaN seconds: the simulation thread died)
            raise ValueError(f"time_scale must be a finite number > 0, got {time_scale}")
        data = config.to_dict()
        data["workload"] = {"kind": "external"}
        data["run"] = {**data["run"], "fast_forward": False}  # tokens become visible step by step
        # Each token's step, so a step's tokens (a speculative decode's accepted drafts) stream as one chunk.
        data["metrics"] = {**data["metrics"], "record_token_times": True}
        self.config = load_config(data)
        self.time_scale = time_scale
        env = simpy.rt.RealtimeEnvironment(factor=time_scale / 1e9, strict=False)
        self.sim = Simulation(self.config, env=env)
        self.model_name = served_model_name or self.config.model.name
        """The name clients address (``--served-model-name``, as vLLM's; by default the model's)."""
        limit = self.sim.workers[0].sched.limits.max_model_len
        assert limit is not None
        self.context_length = limit
        """Prompt + max_tokens above the engine's max_model_len (as the simulated engine enforces it) is
        refused with a 400, as vLLM refuses it."""
        self.inbox: queue.Queue[ServedRequest] = queue.Queue()
        self.aborts: queue.Queue[tuple[ServedRequest, str]] = queue.Queue()
        """Requests whose clients went away, to be dropped as the engines abort them."""
        self.requests: list[Request] = []
        self._stop = threading.Event()
        self.env = env
        self._halt = env.event()
        env.process(self._intake())
        self.thread = threading.Thread(target=self._run, name="twin-simulation", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)

    def submit(self, served: ServedRequest) -> None:
        self.inbox.put(served)

    def abort(self, served: ServedRequest, reason: str) -> None:
        """Drop a submitted request (after the inbox has handed it over, which it was first given to)."""
        self.aborts.put((served, reason))

    def _run(self) -> None:
        self.env.run(until=self._halt)

    def _intake(self) -> ProcessGen:
        """Poll the inbox every POLL_S of wall time; each request arrives at the simulated time it is seen."""
        env = self.env
        block_size = self.sim.config.kv_cache.block_size
        assert block_size is not None
        poll_ns = max(1, to_ns(POLL_S / self.time_scale))
        while not self._stop.is_set():
            for served in _drain(self.inbox):
                tokens: list[Any] = [*served.prompt_tokens, *([FILLER] * served.max_tokens)]
                req = Request(id=len(self.requests), prompt_tokens=len(served.prompt_tokens),
                              max_output_tokens=served.max_tokens, block_keys=block_keys(tokens, block_size),
                              arrival_ns=now_ns(env), session=f"http-{len(self.requests)}")
                req.on_finish = lambda r, s=served: s.done.set()  # type: ignore[misc]
                served.req = req
                self.requests.append(req)
                self.sim.system.submit(req)
            for served, reason in _drain(self.aborts):
                if served.req is not None:
                    self.sim.system.abort(served.req, reason)
            yield env.timeout(poll_ns)
        self._halt.succeed()

    # ---------------------------------------------------------------------------------- metrics
    def prometheus(self) -> str:
        """Gauges and counters under vLLM's metric names."""
        label = f'model_name="{self.model_name}"'
        running = waiting = 0
        used = total = preempt = prompt = generated = cached = 0
        for w in self.sim.workers:
            s = w.sched
            running += len(s.running)
            waiting += len(s.waiting)
            used += s.kv.pool.num_used
            total += s.kv.pool.num_blocks
            preempt += s.preemptions
            prompt += s.prompt_tokens_admitted
            cached += s.cached_tokens_admitted
            generated += s.output_tokens
        ok = sum(1 for r in self.requests if r.status is Status.FINISHED)
        lines = [
            ("vllm:num_requests_running", "gauge", running), ("vllm:num_requests_waiting", "gauge", waiting),
            ("vllm:gpu_cache_usage_perc", "gauge", used / total if total else 0.0),
            ("vllm:num_preemptions_total", "counter", preempt), ("vllm:prompt_tokens_total", "counter", prompt),
            ("vllm:generation_tokens_total", "counter", generated),
            ("vllm:prefix_cache_queries_total", "counter", prompt), ("vllm:prefix_cache_hits_total", "counter", cached),
            ("vllm:request_success_total", "counter", ok),
        ]
        out = []
        for name, kind, value in lines:
            out += [f"# TYPE {name} {kind}", f"{name}{{{label}}} {value}"]
        return "\n".join(out) + "\n"


def _usage(prompt: int, completion: int) -> dict[str, int]:
    """An OpenAI ``usage`` object."""
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _token_ids(prompt: list[Any], name: str) -> list[int]:
    """A prompt given as token ids: a non-empty list, every item an integer (a JSON true is not one), else a
    ValueError naming it."""
    if not prompt:
        raise ValueError(f"{name} must be a non-empty list of token ids, got []")
    for i, t in enumerate(prompt):
        if isinstance(t, bool) or not isinstance(t, int):
            raise ValueError(f"{name}[{i}] must be a token id (an integer), got {json.dumps(t)}")
    return list(prompt)


def _drain(inbox: queue.Queue[T]) -> Iterator[T]:
    """What is in ``inbox`` now, taken out in order, without waiting."""
    while True:
        try:
            yield inbox.get_nowait()
        except queue.Empty:
            return


def make_handler(server: SimulationServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet by default
            pass

        def _json(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, code: int, message: str, kind: str = "invalid_request_error") -> None:
            self._json(code, {"error": {"message": message, "type": kind, "code": code}})

        def do_GET(self) -> None:
            route = self.path.split("?", 1)[0].rstrip("/")  # a query string does not change the route
            if route == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": server.model_name, "object": "model",
                                                              "owned_by": "servetwin", "created": 0}]})
            elif route in ("/health", "/ping"):
                self._json(200, {"status": "ok"})
            elif route == "/metrics":
                data = server.prometheus().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            if path not in ("/v1/completions", "/v1/chat/completions"):
                self._error(404, f"no route {self.path}")
                return
            try:
                body = json.loads(self._body() or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
                chat = path.endswith("chat/completions")
                model = body.get("model")
                if model is not None and model != server.model_name:  # (vLLM's _check_model)
                    self._error(404, f"The model `{model}` does not exist.", "NotFoundError")
                    return
                tokens = self._prompt(body, chat)
                max_tokens = self._max_tokens(body, chat)
                n = self._n(body)
                self._refuse_unsimulated(body, chat)
                stream = self._flag(body, "stream")
                options = body.get("stream_options") or {}
                if not isinstance(options, dict):
                    raise ValueError("stream_options must be an object")
                include_usage = self._flag(options, "include_usage", "stream_options.include_usage")
                # (vLLM: usage in every chunk only with include_usage as well)
                continuous = self._flag(options, "continuous_usage_stats",
                                        "stream_options.continuous_usage_stats") and include_usage
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                self._error(400, f"bad request: {exc}")
                return
            if not tokens:
                self._error(400, "need a non-empty prompt")
                return
            context = server.context_length
            if len(tokens) + max_tokens > context:
                self._error(400, f"this model's maximum context length is {context} tokens: {len(tokens)} prompt "
                                 f"+ {max_tokens} max_tokens ask for more")
                return
            children = [ServedRequest(tokens, max_tokens) for _ in range(n)]
            for served in children:  # one hand-over after another: the intake adds them at one instant
                server.submit(served)
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{id(children[0]):x}"
            if stream:
                self._stream(children, rid, chat, include_usage, continuous)
            else:
                while not all(served.done.wait(0.05) for served in children):
                    if not server.thread.is_alive():
                        self._error(500, "the simulation thread stopped")
                        return
                    if self._gone():
                        for served in children:
                            server.abort(served, GONE)
                        return
                self._finish(children, rid, chat)

        def _body(self) -> bytes:
            """The request's body, read in pieces as it arrives: a Content-Length of 10**11 was one allocation
            of that size (a MemoryError, a traceback and no reply), and a negative one read until the client
            closed. A length that is not a whole number, or a body that ends short of it, is a ValueError."""
            text = self.headers.get("Content-Length", "0").strip()
            if re.fullmatch("[0-9]+", text) is None:
                self.close_connection = True  # (where this body ends, and the next request begins, is unknown)
                raise ValueError(f"Content-Length must be a whole number of bytes, got {text!r}")
            left = int(text)
            pieces = []
            while left > 0:
                piece = self.rfile.read(min(left, _BODY_PIECE))
                if not piece:
                    raise ValueError(f"the body ended after {int(text) - left} of its {text} bytes")
                pieces.append(piece)
                left -= len(piece)
            return b"".join(pieces)

        def _gone(self) -> bool:
            """Whether the client closed its connection: its socket reads as ended (a client that sent
            more, e.g. its next request on the same connection, is still there)."""
            try:
                readable, _, _ = select.select([self.connection], [], [], 0)
                return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)
            except OSError:  # reset by the peer
                return True

        @staticmethod
        def _max_tokens(body: dict[str, Any], chat: bool) -> int:
            """max_completion_tokens, else max_tokens, else the default (256 for chat, 16 as OpenAI's
            completions): a whole number >= 1, never rounded or replaced."""
            for key in ("max_completion_tokens", "max_tokens"):
                value = body.get(key)
                if value is None:
                    continue
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"{key} must be an integer, got {json.dumps(value)}")
                if value < 1:
                    raise ValueError(f"{key} must be >= 1, got {value}")
                return value
            return 256 if chat else 16

        @staticmethod
        def _n(body: dict[str, Any]) -> int:
            """Completions asked for (``n``, default 1): a whole number >= 1."""
            value = body.get("n")
            if value is None:
                return 1
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"n must be an integer >= 1, got {json.dumps(value)}")
            return value

        @staticmethod
        def _flag(body: dict[str, Any], key: str, name: str | None = None) -> bool:
            """A boolean field, false when absent or null. Anything else is a ValueError naming it ("no" was
            truthy, so it streamed): a JSON boolean, as max_tokens must be a JSON integer (pydantic's lax
            mode behind vLLM's models also takes "yes" / "no" / 1 / 0, and refuses every other value)."""
            value = body.get(key)
            if value is None:
                return False
            if not isinstance(value, bool):
                raise ValueError(f"{name or key} must be a boolean (true or false), got {json.dumps(value)}")
            return value

        @classmethod
        def _refuse_unsimulated(cls, body: dict[str, Any], chat: bool) -> None:
            """Options the twin cannot answer are refused, naming them, rather than dropped; ``best_of`` as
            vLLM's V1 engine refuses it (only 1 is accepted)."""
            for key in ("echo", "logprobs") if chat else ("echo",):  # (a completions request's logprobs is a count)
                cls._flag(body, key)
            best_of = body.get("best_of")
            if best_of is not None and best_of != 1:
                raise ValueError(f"best_of is not supported (vLLM's V1 engine accepts only 1), got "
                                 f"{json.dumps(best_of)}")
            # (identity tests: a completions request's ``logprobs: 0`` asks for the chosen tokens' logprobs)
            asked = [key for key in ("logprobs", "top_logprobs", "echo")
                     if body.get(key) is not None and body.get(key) is not False
                     and not (chat and key == "top_logprobs" and body.get(key) == 0)]
            if asked:
                raise ValueError(f"{', '.join(asked)} not simulated: the twin's replies are filler tokens "
                                 f"with no probabilities or prompt text")

        @staticmethod
        def _prompt(body: dict[str, Any], chat: bool) -> list[str] | list[int]:
            field = "messages" if chat else "prompt"
            if field not in body:
                raise ValueError(f"missing field '{field}' (required)")
            if chat:
                messages = body["messages"]
                if not isinstance(messages, list) or not messages:
                    raise ValueError("messages must be a non-empty list")
                return approx_tokens(render_chat(messages))
            prompt = body["prompt"]
            if isinstance(prompt, list):
                if not prompt:  # (vLLM: "please provide at least one prompt")
                    raise ValueError("prompt must be non-empty: a string, a list of token ids or a list of one "
                                     "string or token list, got []")
                if isinstance(prompt[0], int):
                    return _token_ids(prompt, "prompt")
                if len(prompt) != 1:
                    raise ValueError("one prompt per request")
                prompt = prompt[0]
                if isinstance(prompt, list):  # a batch of one token list, as vLLM takes it
                    return _token_ids(prompt, "prompt[0]")
            if not isinstance(prompt, str):
                raise ValueError("prompt must be a string or a list of token ids")
            return approx_tokens(prompt)

        @staticmethod
        def _usage(children: list[ServedRequest]) -> dict[str, int]:
            """The prompt once (the children share it) and every child's completion tokens, as vLLM counts."""
            return _usage(len(children[0].prompt_tokens),
                          sum(s.req.num_output_tokens for s in children if s.req is not None))

        def _finish(self, children: list[ServedRequest], rid: str, chat: bool) -> None:
            choices: list[dict[str, Any]] = []
            for index, served in enumerate(children):
                req = served.req
                assert req is not None
                if req.status is not Status.FINISHED:
                    self._error(503, f"request failed: {req.fail_reason}")
                    return
                text = FILLER * req.num_output_tokens
                choices.append({"index": index, "message": {"role": "assistant", "content": text},
                                "finish_reason": "length"} if chat else
                               {"index": index, "text": text, "finish_reason": "length"})
            self._json(200, {"id": rid, "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": server.model_name, "choices": choices,
                             "usage": self._usage(children)})

        def _stream(self, children: list[ServedRequest], rid: str, chat: bool, include_usage: bool,
                    continuous: bool = False) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            kind = "chat.completion.chunk" if chat else "text_completion"

            def send(payload: str) -> None:
                data = f"data: {payload}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            prompt = len(children[0].prompt_tokens)

            def chunk(index: int, first: int, count: int, finish: str | None) -> str:
                """Tokens ``first`` .. ``count`` of choice ``index``, made in one engine step, in one chunk (vLLM
                streams one output per step: a speculative step's accepted drafts arrive together); with
                continuous usage stats, that choice's usage so far (as vLLM counts it per output)."""
                text = FILLER * (count - first + 1)
                delta = {"role": "assistant", "content": text} if first == 1 else {"content": text}
                choice: dict[str, Any] = ({"index": index, "delta": delta, "finish_reason": finish} if chat
                                          else {"index": index, "text": text, "finish_reason": finish})
                out: dict[str, Any] = {"id": rid, "object": kind, "created": int(time.time()),
                                       "model": server.model_name, "choices": [choice]}
                if continuous:
                    out["usage"] = _usage(prompt, count)
                return json.dumps(out)

            def abort_all() -> None:
                for served in children:
                    if not served.done.is_set():
                        server.abort(served, GONE)

            sent = [0] * len(children)
            while True:
                done = all(served.done.wait(POLL_S / len(children)) for served in children)
                if not done and self._gone():
                    abort_all()
                    return
                try:
                    for index, served in enumerate(children):
                        finished = served.done.is_set()
                        req = served.req
                        produced = req.num_output_tokens if req is not None else 0
                        # The last token waits for the request's end (the same simulated instant), so it
                        # carries the finish reason: read before the end, the count may already include it.
                        ready = produced if finished else min(produced, served.max_tokens - 1)
                        ok = finished and req is not None and req.status is Status.FINISHED
                        times = req.token_times_ns if req is not None else None
                        while sent[index] < ready:
                            start = end = sent[index]
                            end += 1
                            while times is not None and end < ready and times[end] == times[start]:
                                end += 1
                            send(chunk(index, start + 1, end, "length" if ok and end == produced else None))
                            sent[index] = end
                except (BrokenPipeError, ConnectionResetError):
                    abort_all()
                    return
                if done or not server.thread.is_alive():
                    break
            for served in children:
                req = served.req
                if req is not None and req.status is not Status.FINISHED:
                    send(json.dumps({"error": {"message": f"request failed: {req.fail_reason}"}}))
                    break
            if include_usage:
                send(json.dumps({"id": rid, "object": kind, "created": int(time.time()), "model": server.model_name,
                                 "choices": [], "usage": self._usage(children)}))
            send("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024
    """Connections waiting to be accepted (socketserver's default of 5 reset most of a burst of 64
    benchmark clients)."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-reply is not a server error (no traceback)."""
        import sys

        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


def serve(config: TwinConfig, host: str = "127.0.0.1", port: int = 8000, time_scale: float = 1.0,
          served_model_name: str | None = None) -> tuple[ThreadingHTTPServer, SimulationServer]:
    """Start the simulation thread and an HTTP server (not yet serving: call ``serve_forever``)."""
    sim = SimulationServer(config, time_scale, served_model_name)
    httpd = _Server((host, port), make_handler(sim))
    httpd.daemon_threads = True
    sim.start()
    return httpd, sim
