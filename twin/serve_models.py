"""The OpenAI request bodies ``twin serve`` takes, as typed pydantic models (as vLLM's ``protocol.py``), and
the 400 message that names every field a body gets wrong.

Fields are strict where a lax reading changed the request: ``"stream": "no"`` was truthy and streamed, a
``max_tokens`` of 2.7 became 2. Where one value may take several shapes (a prompt, a message's content) a
validator checks the shape first, so the message names the exact place (``prompt[0][1]``,
``messages[0].content[1].text``) rather than every member of a union. Fields the twin does not model
(temperature, top_p, seed, stop ...) are accepted and ignored, as the filler reply does not depend on them.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal, Mapping, Sequence, TypeVar, get_args

from pydantic import (BaseModel, BeforeValidator, Field, StrictBool, StrictInt, ValidationError,
                      ValidationInfo, model_validator)

from twin.serve import render_chat
from workloads.tokens import approx_tokens

COMPLETION_MAX_TOKENS = 16
"""Reply length of a completions request without max_tokens (OpenAI's completions default)."""
CHAT_MAX_TOKENS = 256
"""Reply length of a chat request without max_tokens / max_completion_tokens. (vLLM's own default is
whatever fits in max_model_len; the twin, whose replies are filler, gives a short fixed one.)"""
Role = Literal["system", "developer", "user", "assistant", "tool", "function"]
"""The chat roles of OpenAI's API; a message of another role is refused."""
ROLES: tuple[str, ...] = get_args(Role)
VOCAB_SIZE = "vocab_size"
"""Validation context key: the model's vocabulary size, which token ids must stay below."""
M = TypeVar("M", bound=BaseModel)


class Invalid(ValueError):
    """A value refused: ``phrase`` follows the field's path, and ``at`` the place inside the value
    (``[0][1]``), so the message reads ``prompt[0][1] must be ...``."""

    def __init__(self, phrase: str, at: str = "") -> None:
        super().__init__(phrase)
        self.at = at


def _got(value: Any) -> str:
    """What the client sent, as JSON (true, null, "3")."""
    return json.dumps(value)


def _token_ids(ids: list[Any], at: str, info: ValidationInfo) -> None:
    """A non-empty list of integers (a JSON true is not one) inside the model's vocabulary."""
    if not ids:
        raise Invalid("must be a non-empty list of token ids, got []", at)
    vocab = (info.context or {}).get(VOCAB_SIZE)
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int):
            raise Invalid(f"must be a token id (an integer), got {_got(t)}", f"{at}[{i}]")
        if vocab is not None and not 0 <= t < vocab:  # (vLLM: "Token id ... is out of vocabulary")
            raise Invalid(f"must be a token id in the model's vocabulary, 0 to {vocab - 1}, got {t}", f"{at}[{i}]")


def _prompt(value: Any, info: ValidationInfo) -> Any:
    """A string, a list of token ids, or a batch of one of either, as vLLM takes them."""
    if isinstance(value, list):
        if not value:  # (vLLM: "please provide at least one prompt")
            raise Invalid("must be non-empty: a string, a list of token ids or a list of one string or token "
                          "list, got []")
        if isinstance(value[0], int):
            _token_ids(value, "", info)
            return value
        if len(value) != 1:
            raise Invalid(f"must hold one prompt per request, got {len(value)}")
        if isinstance(value[0], list):
            _token_ids(value[0], "[0]", info)
            return value
        if isinstance(value[0], str):
            return value
        value = value[0]
    if not isinstance(value, str):
        raise Invalid(f"must be a string or a list of token ids, got {_got(value)}")
    return value


def _content(value: Any) -> Any:
    """A message's text: a string, a list of content parts and strings (a plain string is text, as vLLM's
    chat parser reads it), or null; parts without text (images ...) add nothing."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise Invalid(f"must be a string or a list of content parts, got {_got(value)}")
    for j, part in enumerate(value):
        if isinstance(part, str):
            continue
        if not isinstance(part, dict):
            raise Invalid(f"must be a content part (an object) or a string, got {_got(part)}", f"[{j}]")
        for key in ("type", "text"):
            if key in part and not isinstance(part[key], str):
                raise Invalid(f"must be a string, got {_got(part[key])}", f"[{j}].{key}")
    return value


def _role(value: Any) -> Any:
    if not isinstance(value, str):
        raise Invalid(f"must be a string, got {_got(value)}")
    if value not in ROLES:
        raise Invalid(f"must be one of {', '.join(ROLES)}, got {_got(value)}")
    return value


def _count(value: Any) -> Any:
    """``n``: a whole number >= 1 (null: 1)."""
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Invalid(f"must be an integer >= 1, got {_got(value)}")
    return value


def _false_is_none(value: Any) -> Any:
    return None if value is False else value


Tokens = Annotated[StrictInt, Field(ge=1)]


def _max_tokens(default: int) -> Any:
    return Field(None, description=f"Tokens of the reply, exactly (the simulated engine ignores EOS); "
                                   f"default {default}.")


class StreamOptions(BaseModel):
    include_usage: StrictBool | None = None
    """A last chunk with the request's usage."""
    continuous_usage_stats: StrictBool | None = None
    """With include_usage, every chunk carries its choice's usage so far (vLLM's extension)."""


class ContentPart(BaseModel):
    type: str = "text"
    text: str = ""


class ChatMessage(BaseModel):
    role: Annotated[Role, BeforeValidator(_role)] = "user"
    content: Annotated[str | list[str | ContentPart] | None, BeforeValidator(_content)] = None


class OpenAIRequest(BaseModel):
    """What completions and chat requests share."""

    chat: ClassVar[bool] = False
    default_max_tokens: ClassVar[int] = COMPLETION_MAX_TOKENS
    model: str | None = None
    max_completion_tokens: Tokens | None = None
    n: Annotated[int, BeforeValidator(_count)] = Field(1, description="Choices: n requests with the prompt.")
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    echo: StrictBool | None = None
    best_of: StrictInt | None = None
    max_tokens: Tokens | None = None
    logprobs: Any = None
    top_logprobs: Any = None

    def prompt_tokens(self) -> list[str] | list[int]:
        """The prompt as the twin counts it: token ids, or text tokens."""
        raise NotImplementedError

    @property
    def output_tokens(self) -> int:
        """max_completion_tokens, else max_tokens, else the route's default."""
        for value in (self.max_completion_tokens, self.max_tokens):
            if value is not None:
                return value
        return self.default_max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Usage in every chunk: continuous_usage_stats, only with include_usage as well (as vLLM)."""
        return self.include_usage and bool(self.stream_options and self.stream_options.continuous_usage_stats)

    @model_validator(mode="after")
    def _refuse_unsimulated(self) -> OpenAIRequest:
        """Options the twin cannot answer are refused, naming them, rather than dropped; ``best_of`` as vLLM's
        V1 engine refuses it (only 1 is accepted)."""
        if self.best_of is not None and self.best_of != 1:
            raise ValueError(f"best_of is not supported (vLLM's V1 engine accepts only 1), got {self.best_of}")
        # (a completions request's ``logprobs: 0`` asks for the chosen tokens' logprobs; a chat request's
        # ``top_logprobs: 0`` asks for none)
        options = (("logprobs", self.logprobs), ("top_logprobs", self.top_logprobs), ("echo", self.echo))
        asked = [key for key, value in options
                 if value is not None and value is not False and not (self.chat and key == "top_logprobs" and value == 0)]
        if asked:
            raise ValueError(f"{', '.join(asked)} not simulated: the twin's replies are filler tokens with no "
                             f"probabilities or prompt text")
        return self


class CompletionRequest(OpenAIRequest):
    """``POST /v1/completions``."""

    prompt: Annotated[str | list[int] | list[list[int]] | list[str], BeforeValidator(_prompt)]
    max_tokens: Tokens | None = _max_tokens(COMPLETION_MAX_TOKENS)
    logprobs: Annotated[StrictInt | None, BeforeValidator(_false_is_none)] = None
    """A count of logprobs per token (refused: not simulated)."""

    def prompt_tokens(self) -> list[str] | list[int]:
        """The token ids sent, or the text cut by :func:`workloads.tokens.approx_tokens`."""
        prompt: Any = self.prompt
        if isinstance(prompt, list) and isinstance(prompt[0], (list, str)):  # a batch of one prompt
            prompt = prompt[0]
        return approx_tokens(prompt) if isinstance(prompt, str) else list(prompt)


class ChatCompletionRequest(OpenAIRequest):
    """``POST /v1/chat/completions``."""

    chat: ClassVar[bool] = True
    default_max_tokens: ClassVar[int] = CHAT_MAX_TOKENS
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Tokens | None = _max_tokens(CHAT_MAX_TOKENS)
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None

    def prompt_tokens(self) -> list[str]:
        """The messages rendered by :func:`twin.serve.render_chat`, cut by approx_tokens."""
        return approx_tokens(render_chat([m.model_dump() for m in self.messages]))


def parse(model: type[M], body: Any, vocab_size: int | None = None) -> M:
    """``body`` as a ``model``; a ValueError whose message names every field it gets wrong."""
    try:
        return model.model_validate(body, context={VOCAB_SIZE: vocab_size})
    except ValidationError as exc:
        raise ValueError("; ".join(describe(e) for e in exc.errors())) from None


def describe(error: Mapping[str, Any]) -> str:
    """One pydantic error as the twin words it: the field's path, then what it must be and what it got."""
    path = _path(error["loc"])
    kind, got, ctx = error["type"], _got(error.get("input")), error.get("ctx") or {}
    if kind == "value_error":
        exc = ctx.get("error")
        if isinstance(exc, Invalid):
            return f"{path}{exc.at} {exc}".lstrip()
        return f"{path}: {exc}" if path else str(exc)
    if kind == "missing":
        return f"missing field '{path}' (required)"
    phrase = {"int_type": "an integer", "int_from_float": "an integer", "int_parsing": "an integer",
              "bool_type": "a boolean (true or false)", "bool_parsing": "a boolean (true or false)",
              "string_type": "a string", "model_type": "an object", "model_attributes_type": "an object",
              "dict_type": "an object", "list_type": "a list", "too_short": "non-empty"}.get(kind)
    if kind == "greater_than_equal":
        phrase = f">= {ctx['ge']}"
    subject = path or "the body"
    if phrase is None:
        return f"{subject}: {error['msg']}"
    return f"{subject} must be {phrase}, got {got}"


def _path(loc: Sequence[Any]) -> str:
    """``("messages", 0, "content")`` -> ``messages[0].content``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
