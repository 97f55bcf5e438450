"""Token counts estimated from text, for sources that carry text but no usage counts (tau-bench, ShareGPT).

No tokenizer files are available offline, so :func:`estimate_tokens` imitates a 128k-vocabulary BPE
(Llama-3, DeepSeek-V3, GPT-4o class): text is split with a GPT-4-style pre-tokenizer pattern (words with
their leading space, 1-3 digit groups, punctuation runs, newline and space runs), each piece is one token,
and a piece longer than ``chars_per_piece`` characters counts ``ceil(len / chars_per_piece)`` tokens.

Measured error (``measure_estimate_error`` on the 23 shared mini-swe-agent DeepSeek trajectories, whose
usage gives exact DeepSeek-V3 counts; code and shell output, so harder than chat text):

* tool-result messages (1,820), against ``prompt(k+1) - prompt(k) - completion(k)``: text alone is 3.1 %
  short in total; with a constant 16-token template overhead (the median difference) the total bias is
  +3.8 % and, on messages above 200 tokens, the absolute error has median 7.1 %, p90 17.4 %.
* assistant outputs (1,843; text + tool-call arguments vs ``completion_tokens``): text alone is 11.5 %
  short, because DeepSeek's tool-call framing adds about 34 tokens per call; with that constant the
  total bias is +5.1 %, median absolute error 7.5 %, p90 15.2 % above 200 tokens.
* whole-trajectory context growth (``prompt(last) - prompt(first)``, 23 trajectories): text alone is
  7.0 % short in total (per trajectory -14.1 % .. -0.4 %); with 33 template tokens per assistant + tool
  turn the total bias is +0.6 %, the per-trajectory error median 2.2 %, worst 6.1 %.

So the approximation is good to about 5-15 % per message and a few per cent per session, before chat
template tokens, which :class:`ChatTokenModel` adds per message and per tool call.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

_PIECES = re.compile(
    r"""'(?:[sdmt]|ll|ve|re)|[^\r\n\w]?[^\W\d_]+|\d{1,3}| ?[^\s\w]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    re.UNICODE,
)


def estimate_tokens(text: str, *, chars_per_piece: int = 6) -> int:
    """Approximate BPE token count of ``text`` (see the module docstring for the method and its error)."""
    if chars_per_piece < 1:  # (0 was a ZeroDivisionError on the first long piece)
        raise ValueError(f"chars_per_piece must be >= 1, got {chars_per_piece!r}")
    count = 0
    for piece in _PIECES.findall(text):
        count += 1 if len(piece) <= chars_per_piece else -(-len(piece) // chars_per_piece)
    return count


def approx_tokens(text: str, *, chars_per_piece: int = 6) -> list[str]:
    """The text cut into the pseudo-tokens :func:`estimate_tokens` counts (long pieces split every
    ``chars_per_piece`` characters), so equal text prefixes give equal token prefixes."""
    out: list[str] = []
    for piece in _PIECES.findall(text):
        if len(piece) <= chars_per_piece:
            out.append(piece)
        else:
            out.extend(piece[i:i + chars_per_piece] for i in range(0, len(piece), chars_per_piece))
    return out


def _count(minimum: int) -> Any:
    def check(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{attribute.name} must be an integer >= {minimum}, got {value!r}")

    return check


@attrs.frozen(kw_only=True)
class ChatTokenModel:
    """Chat-template tokens around messages, on top of :func:`estimate_tokens` of their text.

    ``message_overhead_tokens`` is Llama-3's template: ``<|start_header_id|>role<|end_header_id|>\\n\\n``
    (4) + ``<|eot_id|>`` (1). ``tool_call_overhead_tokens`` covers a tool call's name and JSON framing
    beyond its argument text; 25 makes an assistant tool call + tool result turn cost 35 template tokens,
    close to the 33 measured on the DeepSeek trajectories (module docstring).
    """

    message_overhead_tokens: int = attrs.field(default=5, validator=_count(0))
    tool_call_overhead_tokens: int = attrs.field(default=25, validator=_count(0))
    chars_per_piece: int = attrs.field(default=6, validator=_count(1))
    """(Checked, as these come from ``--set tokens=...``: 0 characters per piece divided by zero, and a
    negative or fractional overhead gave counts no call can have.)"""

    def text(self, text: str) -> int:
        return estimate_tokens(text, chars_per_piece=self.chars_per_piece)

    def message(self, content: str, tool_calls: Sequence[tuple[str, str]] = ()) -> int:
        """Tokens of one message: text + template + each ``(name, arguments)`` tool call."""
        total = self.message_overhead_tokens + self.text(content)
        for name, arguments in tool_calls:
            total += self.tool_call_overhead_tokens + self.text(name) + self.text(arguments)
        return total


def measure_estimate_error(
    paths: Iterable[str | os.PathLike[str]], *, chars_per_piece: int = 6
) -> dict[str, Any]:
    """Compare :func:`estimate_tokens` with the usage counts of timestamped mini-swe-agent 1.1 trajectories.

    Returns, per kind (``tool_results``, ``outputs``, ``trajectories``): the number of samples, the fitted
    constant overhead (median of actual - estimate), the total bias after it, and the median / p90 relative
    absolute error on samples above 200 tokens. Used to produce the figures in the module docstring;
    the shared trajectories are not part of the test data.
    """
    import numpy as np

    tool_pairs: list[tuple[int, int]] = []
    out_pairs: list[tuple[int, int]] = []
    growth: list[tuple[int, int, int]] = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            messages = json.load(handle)["messages"]
        idx = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        usage = [messages[i]["extra"]["response"]["usage"] for i in idx]
        for k, i in enumerate(idx):
            out_pairs.append(
                (
                    estimate_tokens(_assistant_text(messages[i]), chars_per_piece=chars_per_piece),
                    usage[k]["completion_tokens"],
                )
            )
            if k + 1 < len(idx):
                text = "".join(str(m.get("content") or "") for m in messages[i + 1 : idx[k + 1]])
                actual = (
                    usage[k + 1]["prompt_tokens"] - usage[k]["prompt_tokens"] - usage[k]["completion_tokens"]
                )
                tool_pairs.append((estimate_tokens(text, chars_per_piece=chars_per_piece), actual))
        text_est = sum(
            estimate_tokens(
                _assistant_text(m) if m.get("role") == "assistant" else str(m.get("content") or ""),
                chars_per_piece=chars_per_piece,
            )
            for m in messages[idx[0] : idx[-1]]
        )
        growth.append((text_est, usage[-1]["prompt_tokens"] - usage[0]["prompt_tokens"], len(idx) - 1))

    def summary(pairs: Sequence[tuple[int, int]], per: Sequence[int] | None = None) -> dict[str, float]:
        est = np.array([p[0] for p in pairs], dtype=float)
        act = np.array([p[1] for p in pairs], dtype=float)
        units = np.ones_like(est) if per is None else np.array(per, dtype=float)
        overhead = float(np.median((act - est) / units))
        fitted = est + overhead * units
        big = act > 200
        rel = np.abs(fitted[big] - act[big]) / act[big]
        return {
            "n": len(pairs),
            "overhead_tokens": overhead,
            "bias_without_overhead": float(est.sum() / act.sum() - 1),
            "bias": float(fitted.sum() / act.sum() - 1),
            "median_abs_rel_error": float(np.median(rel)) if rel.size else 0.0,
            "p90_abs_rel_error": float(np.percentile(rel, 90)) if rel.size else 0.0,
            "max_abs_rel_error": float(rel.max()) if rel.size else 0.0,
        }

    return {
        "tool_results": summary(tool_pairs),
        "outputs": summary(out_pairs),
        "trajectories": summary([(g[0], g[1]) for g in growth], [g[2] for g in growth]),
    }


def _assistant_text(message: dict[str, Any]) -> str:
    calls = message.get("tool_calls") or []
    return str(message.get("content") or "") + "".join(str(c["function"]["arguments"]) for c in calls)
