"""The batch shape of one step, reduced to sums that keep attention cost exact without padding."""

from __future__ import annotations

from typing import Sequence

import attrs


@attrs.frozen(kw_only=True)
class BatchShape:
    """Per request i in the step: q_i new tokens computed now, kv_i context attended after this step.

    sum_kv = sum kv_i, sum_q_kv = sum q_i*kv_i, sum_q_sq = sum q_i^2, new_tokens = sum q_i,
    num_decode = number of decode requests: q_i == 1, or q_i == decode_q when a speculative decode verifies
    decode_q = 1 + k tokens (the last sampled one and k drafts) against its context; decode_sum_kv and
    decode_max_kv = the sum and the largest of kv_i over the decode requests (the decode attention kernel's
    work and the request that sets its parallelism, see :attr:`decode_rows`).
    """

    num_reqs: int
    num_decode: int
    new_tokens: int
    sum_kv: int
    sum_q_kv: int
    sum_q_sq: int
    decode_sum_kv: int = -1     # sum kv_i over the decode requests; -1 = unknown (estimated pro rata)
    decode_q: int = 1           # query tokens of each decode request (1 + draft tokens when speculative)
    decode_max_kv: int = -1     # largest kv_i over the decode requests; -1 = unknown (taken as uniform)

    def __attrs_post_init__(self) -> None:
        if self.decode_q < 1:
            raise ValueError(f"BatchShape: need decode_q >= 1, got {self.decode_q}")
        if self.num_reqs < 0 or not 0 <= self.num_decode <= self.num_reqs:
            raise ValueError(f"BatchShape: need 0 <= num_decode <= num_reqs, got {self.num_decode}, "
                             f"{self.num_reqs}")
        if self.new_tokens < self.num_reqs or self.sum_q_sq < self.new_tokens:
            raise ValueError(f"BatchShape: need new_tokens >= num_reqs and sum_q_sq >= new_tokens "
                             f"(every request computes >= 1 token), got {self}")
        if self.sum_kv < self.new_tokens or self.sum_q_kv < self.sum_q_sq:
            raise ValueError(f"BatchShape: need kv_i >= q_i (sum_kv >= new_tokens, sum_q_kv >= sum_q_sq), "
                             f"got {self}")
        if self.decode_sum_kv > self.sum_kv or (self.decode_sum_kv >= 0 and self.decode_sum_kv < self.num_decode):
            raise ValueError(f"BatchShape: need num_decode <= decode_sum_kv <= sum_kv, got {self}")
        if self.decode_max_kv >= 0:
            if self.decode_sum_kv < 0:
                raise ValueError(f"BatchShape: decode_max_kv needs decode_sum_kv, got {self}")
            if not (self.decode_max_kv <= self.decode_sum_kv <= self.decode_max_kv * self.num_decode
                    and (self.decode_max_kv > 0) == (self.num_decode > 0)):
                raise ValueError(f"BatchShape: need decode_max_kv <= decode_sum_kv <= decode_max_kv x num_decode "
                                 f"(0 without decodes), got {self}")

    @classmethod
    def from_requests(cls, q: Sequence[int], kv: Sequence[int]) -> "BatchShape":
        """Build the sums from per-request new tokens q_i and post-step context lengths kv_i."""
        if len(q) != len(kv):
            raise ValueError(f"BatchShape.from_requests: {len(q)} q values but {len(kv)} kv values")
        return cls(
            num_reqs=len(q),
            num_decode=sum(1 for x in q if x == 1),
            new_tokens=sum(q),
            sum_kv=sum(kv),
            sum_q_kv=sum(a * b for a, b in zip(q, kv)),
            sum_q_sq=sum(a * a for a in q),
            decode_sum_kv=sum(b for a, b in zip(q, kv) if a == 1),
            decode_max_kv=max((b for a, b in zip(q, kv) if a == 1), default=0),
        )

    @property
    def attention_pairs(self) -> int:
        """Causal (query, key) pairs scored: sum(q_i*kv_i - q_i*(q_i-1)/2), exact."""
        return self.sum_q_kv - (self.sum_q_sq - self.new_tokens) // 2

    @property
    def decode_kv(self) -> int:
        """Context summed over decode requests: exact when given, else exact for pure batches, else pro rata."""
        if self.decode_sum_kv >= 0:
            return self.decode_sum_kv
        if self.num_decode == self.num_reqs:
            return self.sum_kv
        if self.num_decode == 0:
            return 0
        return max(self.num_decode, self.sum_kv * self.num_decode // self.num_reqs)

    @property
    def decode_rows(self) -> float:
        """The decode requests the decode attention kernel's rate is read at: their context over the longest
        one's, decode_kv / decode_max_kv (the request count of a batch whose contexts are equal, and without
        decode_max_kv). A split-KV decode kernel finishes with the longest request's splits, so a batch
        runs as decode_kv / decode_max_kv requests of the longest length would. Read at the request count,
        a short request beside a long one would make the step cheaper than the long one alone."""
        return decode_rate_rows(self.num_decode, self.decode_kv, self.decode_max_kv)

    @property
    def is_pure_decode(self) -> bool:
        return self.num_reqs > 0 and self.num_decode == self.num_reqs

    def key(self) -> tuple[int, ...]:
        return (self.num_reqs, self.num_decode, self.new_tokens, self.sum_kv, self.sum_q_kv, self.sum_q_sq,
                self.decode_sum_kv, self.decode_q, self.decode_max_kv)


def decode_rate_rows(num_decode: int, decode_kv: int, decode_max_kv: int) -> float:
    """:attr:`BatchShape.decode_rows` from its three numbers (the decode fast path prices without a shape)."""
    if decode_max_kv <= 0:
        return float(num_decode)
    return decode_kv / decode_max_kv
