"""LMBenchmark ShareGPT replay lists (``run.json``: ``[{"input", "output_length"}, ...]``) -> sessions.

LMBenchmark's ``sharegpt-qa.py`` sends entry ``i`` at ``i / qps`` seconds as one user message whose text is
the whole conversation so far (earlier questions and the dataset's answers) + the next question, with
``max_tokens = output_length`` (Llama-3.1-8B tokens of the dataset answer). Rounds of one conversation are
entries whose text extends an earlier entry's text, so:

* a session is a chain of entries, each extending the previous one; its calls are that chain;
* prompt tokens are estimated from the text (:mod:`workloads.tokens`): ``estimate(text) +
  message_overhead_tokens``, with the text split at the previous round's end so the shared part counts
  the same in both rounds;
* the next round's prompt holds the dataset's answer, not the generated one, so only the previous
  round's text is reusable: ``keep = estimate(previous text)`` (this drops the generated output and the
  template tokens after the text) and ``append`` is the rest of the prompt;
* timing: the session arrives at its first entry's ``index / qps`` and every later call has
  ``min_interval_s = (index - previous index) / qps``. The twin sends a round after the previous one
  finished, LMBenchmark does not wait; the two agree whenever a round finishes within its interval.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from workloads.convert._access import Doc, load_json
from workloads.errors import WorkloadFormatError
from workloads.sessions import Call, Session
from workloads.tokens import ChatTokenModel

PathLike = str | os.PathLike[str]

LMBENCHMARK_SHAREGPT_QPS = 1.34
"""The default QPS of LMBenchmark's ``sharegpt/run.sh``."""


def convert_lmbenchmark_sharegpt(
    inputs: Sequence[PathLike], *, qps: float = LMBENCHMARK_SHAREGPT_QPS, tokens: ChatTokenModel | None = None
) -> list[Session]:
    """Sessions in order of their first entry; ids ``conv-{n}`` (``{stem}/conv-{n}`` for several files)."""
    if not (qps > 0 and math.isfinite(qps)):
        raise ValueError(f"qps must be a finite number > 0, got {qps}")
    model = tokens or ChatTokenModel()
    sessions: list[Session] = []
    stems: dict[str, PathLike] = {}
    for path in inputs:
        stem = os.path.basename(path).split(".")[0]
        if len(inputs) > 1 and stem in stems:  # (a/run.json and b/run.json both gave run/conv-0, ...)
            raise WorkloadFormatError(path, f"its session ids ({stem}/conv-N) would repeat those of {stems[stem]}, "
                                            f"whose name starts the same")
        stems[stem] = path
        prefix = "" if len(inputs) == 1 else f"{stem}/"
        sessions.extend(_convert_file(path, qps, model, prefix))
    return sessions


def _convert_file(path: PathLike, qps: float, model: ChatTokenModel, id_prefix: str) -> list[Session]:
    entries = Doc(path, load_json(path)).items()
    texts: list[str] = []
    outputs: list[int] = []
    for entry in entries:
        obj = entry.obj()
        extra = sorted(set(obj) - {"input", "output_length"})
        if extra:
            raise entry.fail("unknown key; expected 'input' and 'output_length'", f"{entry.where}.{extra[0]}")
        texts.append(entry.get("input").str_())
        outputs.append(entry.get("output_length").count(1))
    chains: list[list[int]] = []
    tail_of: dict[int, int] = {}  # entry index -> chain index, for chain tails only
    for j, text in enumerate(texts):
        parent = next(
            (
                i
                for i in sorted(tail_of, reverse=True)
                if len(texts[i]) < len(text) and text.startswith(texts[i])
            ),
            None,
        )
        if parent is None:
            chains.append([j])
            tail_of[j] = len(chains) - 1
        else:
            owner = tail_of.pop(parent)
            chains[owner].append(j)
            tail_of[j] = owner
    sessions = []
    for n, chain in enumerate(chains):
        calls = []
        kept = 0  # estimated tokens of the previous round's text
        for k, j in enumerate(chain):
            if k == 0:
                head = model.text(texts[j])
                calls.append(
                    Call(append_tokens=head + model.message_overhead_tokens, output_tokens=outputs[j])
                )
            else:
                i = chain[k - 1]
                new = model.text(texts[j][len(texts[i]) :])
                calls.append(
                    Call(
                        append_tokens=new + model.message_overhead_tokens,
                        output_tokens=outputs[j],
                        keep_tokens=kept,
                        min_interval_s=(j - i) / qps,
                    )
                )
                head = kept + new
            kept = head
        sessions.append(Session(id=f"{id_prefix}conv-{n}", arrival_s=chain[0] / qps, calls=tuple(calls)))
    return sessions
