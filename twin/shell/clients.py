"""Clients: one closed-loop SimPy process per session, started by a launcher at the session's arrival.

Call k+1 is sent only after call k's last token, its sub-agents' join and its wait. The session's context is
a :class:`~twin.core.tokens.TokenSequence`: the prefix group's tokens, then the session's own stream, which grows
by each call's append and output, so the blocks of call k are the first blocks of call k+1. A cut
(``keep_tokens``) starts a new stream epoch: tokens written after the cut are new content.
An open-loop request stream is the one-call case, placed by the workload's arrival rule; the launcher sends
such a request itself (no process of its own, :meth:`SessionDriver._send_alone`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import simpy

from twin.core.request import Request, Status
from twin.core.errors import ConfigError
from twin.shell.sim import CLOCK_MAX_NS, CLOCK_RANGE, ProcessGen, now_ns, to_ns
from twin.core.tokens import KeyTable, SourceTable, TokenSequence
from workloads.sessions import Call, Session

class SessionDriver:
    """Starts sessions at their start times (optionally at most ``max_concurrent`` at once) and runs them."""

    def __init__(
        self,
        env: simpy.Environment,
        sessions: Sequence[Session],
        start_ns: Sequence[int] | np.ndarray,
        submit: Callable[[Request], None],
        *,
        block_size: int,
        sources: SourceTable,
        keys: KeyTable | None = None,
        wait_scale: float = 1.0,
        max_concurrent: int | None = None,
        stop_ns: int | None = None,
        record_token_times: bool = False,
        warmup_s: float = 0.0,
        max_model_len: int | None = None,
        keep_requests: bool = False,
    ) -> None:
        if len(sessions) != len(start_ns):
            raise ValueError(f"{len(sessions)} sessions but {len(start_ns)} start times")
        self.env = env
        self.submit = submit
        self.block_size = block_size
        self.sources = sources
        self.keys = keys
        """Numbers the block keys of requests when given (see :class:`~twin.core.tokens.KeyTable`)."""
        self.wait_scale = wait_scale
        self.stop_ns = stop_ns
        self.record_token_times = record_token_times
        self.warmup_s = warmup_s
        """Requests sent before it are not measured (their gaps stay out of the ITL, as the summary's
        figures leave them out: the same test on the same float, ``arrival_s >= warmup_s``)."""
        self.max_model_len = max_model_len
        """The engines' limit on prompt + output tokens: a request above it fails on arrival, its block keys
        never read, so none are computed (a trace's 10**12-token prompt took hours and all memory)."""
        self.num_requests = 0
        """Requests sent so far (the next one's id)."""
        self.live: dict[int, Request] = {}
        """Requests sent and not yet ended, by id (:meth:`ended` lets go of them)."""
        self.requests: list[Request] | None = [] if keep_requests else None
        """Every request sent, kept past its end only when asked (``keep_requests``: tests, notebooks); a long
        run keeps none, so its memory does not grow with the requests it has finished."""
        self.sessions = {"started": 0, "finished": 0, "failed": 0, "skipped": 0}
        """The workload's own sessions; skipped: not started, as they would have arrived after
        ``run.duration_s``."""
        self.subagents = {"started": 0, "finished": 0, "failed": 0}
        """Sub-agent sessions, counted apart."""
        self.active = 0
        self.in_wait = 0
        """Sessions sleeping through a tool / think wait (or a pacing interval) right now."""
        self._prefixes: dict[tuple[str, int], TokenSequence] = {}
        """Shared prefixes by (group, tokens), their block keys computed: each session starts from a copy
        instead of hashing (and numbering) the same blocks again."""
        self._plan = np.argsort(np.asarray(start_ns, dtype=np.int64), kind="stable")
        """Sessions to start (their indices) by start time, ties in their order: an array, since a long run
        plans millions (a list of Python ints and the sort's keys cost some 150 bytes each)."""
        self._planned = 0
        """Sessions of :attr:`_plan` taken so far."""
        self._start_ns = start_ns
        self._sessions: Sequence[Session | None] = list(sessions) if isinstance(sessions, list) else sessions
        """The sessions: a list is copied and each entry let go once started (None), so a script is not kept
        past its run; a sequence that makes its sessions when read (workloads.generators.OpenLoopSessions)
        holds none, and is read as they start."""
        self._num_planned = len(self._plan)
        self._slots = simpy.Resource(env, capacity=max_concurrent) if max_concurrent else None
        self.all_done = env.event()
        self._alone = 0
        """One-call sessions sent and not yet finished (:meth:`_send_alone`)."""
        self._alone_done: simpy.Event | None = None
        self.launcher = env.process(self._launch())

    @property
    def planned_sessions(self) -> int:
        """The workload's own sessions, started or still to start (sub-agents not counted)."""
        return self._num_planned

    def gauges(self) -> dict[str, float]:
        return {"sessions_active": self.active, "sessions_in_wait": self.in_wait}

    @property
    def pending_requests(self) -> list[Request]:
        """Requests sent and not yet ended, in the order they were sent."""
        return [r for r in self.live.values() if not r.is_done]

    def _take(self, i: int) -> Session:
        """Session ``i``, let go here once it is started (:attr:`_sessions`)."""
        sessions = self._sessions
        session = sessions[i]
        if isinstance(sessions, list):
            sessions[i] = None
        assert session is not None
        return session

    def ended(self, req: Request) -> None:
        """``req`` completed or failed: the driver lets go of it (a request ``twin serve`` took over HTTP
        is not the driver's: it was never in :attr:`live`)."""
        self.live.pop(req.id, None)

    def _launch(self) -> ProcessGen:
        env = self.env
        running: list[simpy.Event] = []
        plan = self._plan
        while self._planned < len(plan):
            i = int(plan[self._planned])
            self._planned += 1
            t_ns, session = int(self._start_ns[i]), self._take(i)
            if self.stop_ns is not None and t_ns > self.stop_ns:
                self.sessions["skipped"] += 1
                continue
            if t_ns > env.now:
                yield env.timeout(t_ns - env.now)
            if self._slots is not None:
                slot = self._slots.request()
                yield slot
                running.append(env.process(self._hold(slot, session)))
            elif len(session.calls) == 1 and not session.calls[0].subagents:
                self._send_alone(session)
            else:
                running.append(env.process(self._run_session(session, None)))
            self.sessions["started"] += 1
        if self._alone:
            self._alone_done = env.event()
            running.append(self._alone_done)
        yield simpy.AllOf(env, running)
        self.all_done.succeed()

    def _send_alone(self, session: Session) -> None:
        """A one-call session (an open-loop request) sent without a process of its own: nothing follows its
        call, so its finish closes it (:meth:`_alone_finished`), as the end of its process would."""
        sid = session.id
        self.active += 1
        seq = self._context(session, None)
        base = len(seq)
        call = session.calls[0]
        stream_len, _, src = self._grow(seq, call, sid, 0, base, 0, 0, self.sources.get(("session", sid, 0)))
        req = self._request(seq, src, stream_len, call, sid, 0, session.priority)
        req.on_finish = self._alone_finished
        self._alone += 1
        self.submit(req)

    def _alone_finished(self, req: Request) -> None:
        self._forget_streams(req.session, 1, 1)   # (a cut or hashed prompt moves a one-call stream to epoch 1)
        self.sessions["finished" if req.status is Status.FINISHED else "failed"] += 1
        self.active -= 1
        self._alone -= 1
        if self._alone == 0 and self._alone_done is not None:
            self._alone_done.succeed()

    def _hold(self, slot: simpy.Event, session: Session) -> ProcessGen:
        assert self._slots is not None
        try:
            yield from self._run_session(session, None)
        finally:
            self._slots.release(slot)  # type: ignore[arg-type]

    def _run_session(self, session: Session, context: TokenSequence | None,
                     name: str | None = None) -> ProcessGen:
        """One session (or sub-agent, named ``name``): returns normally whether it finished or failed."""
        env = self.env
        sid = name or session.id
        counts = self.sessions if name is None else self.subagents  # (a session is counted started at launch)
        if name is not None:
            self.subagents["started"] += 1
        self.active += 1
        seq = self._context(session, context)
        base = len(seq)
        stream_len = 0
        epoch = 0
        src = self.sources.get(("session", sid, epoch))
        last_send_ns: int | None = None
        for k, call in enumerate(session.calls):
            stream_len, epoch, src = self._grow(seq, call, sid, k, base, stream_len, epoch, src)
            if call.min_interval_s and last_send_ns is not None:
                earliest = last_send_ns + to_ns(call.min_interval_s)
                if earliest > env.now:
                    self._on_clock(earliest, sid, k, "its pacing interval (min_interval_s)")
                    self.in_wait += 1
                    yield env.timeout(earliest - env.now)
                    self.in_wait -= 1
            req = self._request(seq, src, stream_len, call, sid, k, session.priority)
            stream_len += call.output_tokens
            done = env.event()
            req.on_finish = lambda r, done=done: done.succeed(r)  # type: ignore[misc]
            last_send_ns = now_ns(env)
            self.submit(req)
            yield done
            if req.status is not Status.FINISHED:
                self._forget_streams(sid, epoch, k + 1)
                counts["failed"] += 1
                self.active -= 1
                return
            if call.subagents:
                subs = [env.process(self._run_session(sub, seq.copy() if call.fork_context else None,
                                                      f"{sid}/{sub.id}"))
                        for sub in call.subagents]
                yield simpy.AllOf(env, subs)
            if call.wait_after_s and k + 1 < len(session.calls):
                wait_ns = to_ns(call.wait_after_s * self.wait_scale)
                self._on_clock(now_ns(env) + wait_ns, sid, k + 1, "its wait (wait_s x wait_scale)")
                self.in_wait += 1
                yield env.timeout(wait_ns)
                self.in_wait -= 1
        self._forget_streams(sid, epoch, len(session.calls))
        counts["finished"] += 1
        self.active -= 1

    def _forget_streams(self, sid: str, epochs: int, calls: int) -> None:
        """A session (or sub-agent) named ``sid`` ended: its own streams' names (epochs 0 .. ``epochs``, the
        hashed prompts' tails of its first ``calls`` calls) are let go, as no one names them again (session
        ids are unique in a workload; a sub-agent's name carries its parent's)."""
        sources = self.sources
        for epoch in range(epochs + 1):
            sources.forget(("session", sid, epoch))
        for k in range(calls):
            sources.forget(("tail", sid, k))

    def _on_clock(self, send_ns: int, sid: str, k: int, what: str) -> None:
        """Refuses to send call ``k`` of ``sid`` past the clock's range. The plan checks each session's own
        waits before the run, but a closed loop starts a session only when another ends, so their waits add
        up across sessions; past the range the run would stall (the scheduler takes nothing queued there)."""
        if send_ns > CLOCK_MAX_NS:
            raise ConfigError("workload", f"session {sid!r} would send call {k} at {send_ns / 1e9!r} s after "
                              f"{what}, past {CLOCK_RANGE}; simulated until {now_ns(self.env) / 1e9!r} s")

    def _context(self, session: Session, context: TokenSequence | None) -> TokenSequence:
        """The sequence a session's first call extends: a sub-agent's forked context, the session's prefix
        group's tokens, or nothing."""
        if context is not None:
            return context
        if session.prefix_group is not None and session.prefix_tokens:
            return self._prefix(session.prefix_group, session.prefix_tokens)
        return TokenSequence()

    def _grow(self, seq: TokenSequence, call: Call, sid: str, k: int, base: int, stream_len: int, epoch: int,
              src: int) -> tuple[int, int, int]:
        """Write call ``k``'s new prompt tokens into the session's context (after a cut, if it makes one)
        and return the stream's length, epoch and token source after them."""
        sources = self.sources
        if call.block_hashes is not None:
            seq.truncate(base)
            self._extend_hashed(seq, call, sid, k)
            epoch += 1
            return len(seq) - base, epoch, sources.get(("session", sid, epoch))
        if call.keep_tokens is not None and call.keep_tokens < stream_len:
            seq.truncate(base + call.keep_tokens)
            stream_len = call.keep_tokens
            epoch += 1
            src = sources.get(("session", sid, epoch))
        seq.extend(src, stream_len, call.append_tokens)
        return stream_len + call.append_tokens, epoch, src

    def _request(self, seq: TokenSequence, src: int, stream_len: int, call: Call, sid: str, k: int,
                 priority: int) -> Request:
        """Call ``k``'s request, sent now: its prompt is the context so far; its output is written into the
        context (content the next call's prompt repeats)."""
        prompt = len(seq)
        seq.extend(src, stream_len, call.output_tokens)
        bs = self.block_size
        keys: Sequence[int] = ()
        if self.max_model_len is None or prompt + call.output_tokens <= self.max_model_len:
            keys = seq.block_keys(bs) if self.keys is None else seq.block_ids(bs, self.keys)
        req = Request(id=self.num_requests, prompt_tokens=prompt, max_output_tokens=call.output_tokens,
                      block_keys=tuple(keys), arrival_ns=now_ns(self.env), session=sid, turn=k,
                      priority=priority)
        if self.warmup_s and req.arrival_ns / 1e9 < self.warmup_s:
            req.measured = False
        self.num_requests += 1
        self.live[req.id] = req
        if self.requests is not None:
            self.requests.append(req)
        return req

    def _prefix(self, group: str, tokens: int) -> TokenSequence:
        """A new sequence holding the first ``tokens`` tokens of prefix group ``group``, with the keys of
        its full blocks computed (and numbered) when the first session of the group starts, unless every
        request on it is refused (the prefix alone reaches max_model_len)."""
        shared = self._prefixes.get((group, tokens))
        if shared is None:
            shared = TokenSequence()
            shared.extend(self.sources.get(("group", group)), 0, tokens)
            if self.max_model_len is None or tokens < self.max_model_len:
                if self.keys is None:
                    shared.block_keys(self.block_size)
                else:
                    shared.block_ids(self.block_size, self.keys)
            self._prefixes[(group, tokens)] = shared
        return shared.copy()

    def _extend_hashed(self, seq: TokenSequence, call: Call, sid: str, k: int) -> None:
        """A prompt whose block identities are given (Mooncake ``hash_ids``), re-blocked to the engine's size."""
        assert call.block_hashes is not None
        left = call.append_tokens
        for h in call.block_hashes:
            if left <= 0:
                break
            take = min(call.hash_block_tokens, left)
            seq.extend(self.sources.get(("hash", h)), 0, take)
            left -= take
        if left > 0:
            seq.extend(self.sources.get(("tail", sid, k)), 0, left)
