"""A formed step reduced to the sums the cost model needs (hardware.BatchShape): integer sums, so any split
of a batch adds up exactly."""

from __future__ import annotations

from typing import Iterable

from hardware import BatchShape
from twin.core.request import Request


def batch_shape(scheduled: Iterable[tuple[Request, int]], num_decode: int = 0, decode_kv: int = 0,
                decode_max: int = 0) -> BatchShape:
    """The batch shape of ``scheduled`` (request, new tokens) plus ``num_decode`` more decodes attending
    ``decode_kv`` tokens (context after the step) in all, at most ``decode_max`` each; the decodes' own
    context and longest context are given to the shape (without them a mixed step's decode context was a
    pro-rata share of the whole batch's)."""
    num_reqs = num_decode
    d_kv = decode_kv
    d_max = decode_max
    sum_kv = sum_q_kv = sum_q_sq = new_tokens = 0
    for req, q in scheduled:
        num_reqs += 1
        kv_len = req.num_computed_tokens + q
        if q == 1:
            num_decode += 1
            d_kv += kv_len
            if kv_len > d_max:
                d_max = kv_len
        else:
            sum_kv += kv_len
            sum_q_kv += q * kv_len
            sum_q_sq += q * q
            new_tokens += q
    return BatchShape(num_reqs=num_reqs, num_decode=num_decode, new_tokens=new_tokens + num_decode,
                      sum_kv=sum_kv + d_kv, sum_q_kv=sum_q_kv + d_kv, sum_q_sq=sum_q_sq + num_decode,
                      decode_sum_kv=d_kv, decode_max_kv=d_max)


def verify_shape(scheduled: Iterable[tuple[Request, int]], drafts: dict[Request, int], decode_q: int) -> BatchShape:
    """The batch shape of a step with speculative decodes (those in ``drafts``): each one a decode of
    ``decode_q`` = 1 + k query tokens over its context, the others (prefill chunks) as in :func:`batch_shape`."""
    num_reqs = num_decode = new_tokens = sum_kv = sum_q_kv = sum_q_sq = decode_kv = decode_max = 0
    for req, q in scheduled:
        kv_len = req.num_computed_tokens + q
        num_reqs += 1
        new_tokens += q
        sum_kv += kv_len
        sum_q_kv += q * kv_len
        sum_q_sq += q * q
        if req in drafts:
            num_decode += 1
            decode_kv += kv_len
            if kv_len > decode_max:
                decode_max = kv_len
    return BatchShape(num_reqs=num_reqs, num_decode=num_decode, new_tokens=new_tokens, sum_kv=sum_kv,
                      sum_q_kv=sum_q_kv, sum_q_sq=sum_q_sq, decode_sum_kv=decode_kv, decode_q=decode_q,
                      decode_max_kv=decode_max)
