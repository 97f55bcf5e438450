"""``twin serve``: an OpenAI-compatible HTTP endpoint driven by the simulation in scaled wall-clock time.

Unmodified benchmark clients (vLLM's bench, LMBenchmark, any ``openai`` client) can run against a
simulated deployment. The simulation runs in a SimPy real-time environment on its own thread (one
simulated second takes ``time_scale`` wall seconds); the HTTP server (FastAPI on uvicorn, as vLLM's own
OpenAI server: :mod:`twin.serve_app`, :mod:`twin.serve_http`, the optional extra ``servetwin[serve]``) hands
requests over through a queue and streams tokens as the simulation produces them. This module is the
simulation's side, and imports no HTTP framework: the ``external`` workload is registered from here.

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
import threading
import zlib
from typing import TYPE_CHECKING, Any, Iterator, TypeVar

import attrs
import simpy
import simpy.rt

from hardware import load_model
from twin.config import TwinConfig, WorkloadSpec
from twin.core.errors import TwinError
from twin.registry import register
from twin.core.request import Request, Status
from twin.shell.sim import ProcessGen, now_ns, to_ns
from twin.serve_metrics import LatencyHistograms
from twin.core.tokens import ROOT_KEY

if TYPE_CHECKING:
    from twin.serve_http import HTTPServer
    from twin.shell.worker import Worker

FILLER = " tok"
POLL_S = 0.002
GONE = "the client disconnected (aborted, as vLLM aborts a request whose client goes away)"
EXTRA = "pip install 'servetwin[serve]'"
"""What installs the HTTP server's packages (FastAPI, uvicorn)."""
T = TypeVar("T")


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
        self.vocab_size = load_model(self.config.model.name).vocab_size
        """Token ids must be below it (vLLM: "Token id ... is out of vocabulary")."""
        self.latency = LatencyHistograms()
        self._ended: queue.SimpleQueue[Request] = queue.SimpleQueue()
        """Requests that ended, handed from the simulation thread to the next ``/metrics`` read."""
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
                req.on_finish = lambda r, s=served: self._ended_one(r, s)  # type: ignore[misc]
                served.req = req
                self.requests.append(req)
                self.sim.system.submit(req)
            for served, reason in _drain(self.aborts):
                if served.req is not None:
                    self.sim.system.abort(served.req, reason)
            yield env.timeout(poll_ns)
        self._halt.succeed()

    def _ended_one(self, req: Request, served: ServedRequest) -> None:
        self._ended.put(req)  # (before ``done``: a client that reads /metrics after its reply finds it there)
        served.done.set()

    # ------------------------------------------------------------------------------------- refusals
    def refusal(self, prompt_tokens: int, max_tokens: int) -> str | None:
        """Why the deployment refuses a request outright, in the words of vLLM's 400, or None: prompt +
        max_tokens above max_model_len, or more KV than every worker of a stage that must hold it could ever
        hold. (vLLM does not start with a max_model_len its KV cache cannot hold, so its context length
        ends there; the twin's pool may be smaller, and a request it could never hold used to be a 503.)"""
        asked = f"{prompt_tokens} prompt + {max_tokens} max_tokens"
        if prompt_tokens + max_tokens > self.context_length:
            return f"This model's maximum context length is {self.context_length} tokens: {asked} ask for more"
        for workers, holds_output in self._stages():
            probe = Request(id=-1, prompt_tokens=prompt_tokens, max_output_tokens=max_tokens if holds_output else 1,
                            block_keys=(), arrival_ns=0)
            reasons = []
            for w in workers:
                probe.worker = w.wid
                reasons.append(w.sched.unservable(probe))
            if all(reasons):
                pool = max(w.sched.kv.num_blocks * w.sched.kv.block_size for w in workers)
                return (f"This model's maximum context length is bounded by its KV cache ({pool} tokens a worker):"
                        f" {asked} can never be held ({reasons[0]})")
        return None

    def _stages(self) -> list[tuple[list[Worker], bool]]:
        """The workers a request must fit in, by stage, and whether that stage holds its output too: a
        disaggregated deployment's prefill workers hold the prompt (and one token), its decode workers all."""
        from twin.shell.disagg import DisaggSystem

        system = self.sim.system
        if isinstance(system, DisaggSystem):
            return [(list(system.prefill), False), (list(system.decode), True)]
        return [(list(self.sim.workers), True)]

    # ---------------------------------------------------------------------------------- metrics
    def prometheus(self) -> str:
        """Gauges, counters and latency histograms under vLLM's metric names."""
        for req in _drain(self._ended):
            self.latency.observe(req)
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
        return "\n".join([*out, *self.latency.lines(label)]) + "\n"


def _drain(inbox: queue.Queue[T] | queue.SimpleQueue[T]) -> Iterator[T]:
    """What is in ``inbox`` now, taken out in order, without waiting."""
    while True:
        try:
            yield inbox.get_nowait()
        except queue.Empty:
            return


def serve(config: TwinConfig, host: str = "127.0.0.1", port: int = 8000, time_scale: float = 1.0,
          served_model_name: str | None = None) -> tuple[HTTPServer, SimulationServer]:
    """Start the simulation thread and bind the HTTP server (not yet serving: call ``serve_forever``). Without
    the ``serve`` extra, or on a port in use, a TwinError says what to do."""
    try:
        from twin.serve_app import create_app
        from twin.serve_http import HTTPServer
    except ImportError as exc:
        if exc.name not in {"fastapi", "starlette", "uvicorn", "pydantic", "h11"}:
            raise
        raise TwinError(f"twin serve needs FastAPI and uvicorn ({exc.name} is not installed): {EXTRA}") from None
    sim = SimulationServer(config, time_scale, served_model_name)
    app = create_app(sim)
    httpd = HTTPServer(app, host, port, on_stop=app.state.waker.close)
    sim.start()
    return httpd, sim
