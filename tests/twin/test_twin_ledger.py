"""The worker's cost ledger: batched additions of a fast-forwarded run equal step-by-step additions; the
step-price memo gives the cost model's own prices."""

import numpy as np
import pytest

from twin.core.prices import Ledger


def test_add_steps_is_add_per_step_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    names = tuple(f"t{i}" for i in range(7))
    vectors = [rng.random(7) * 10.0 ** rng.integers(-9, 3) for _ in range(50)]
    steps_ns = [int(x) for x in rng.integers(1, 10**7, 50)]
    one, batched = Ledger(names), Ledger(names)
    for v, ns in zip(vectors, steps_ns):
        one.add(v, ns)
    batched.add_steps(vectors[:20], steps_ns[:20])
    batched.add_steps(vectors[20:], steps_ns[20:])
    assert [x.hex() for x in one.terms_s.values()] == [x.hex() for x in batched.terms_s.values()]
    assert (one.steps, one.busy_ns) == (batched.steps, batched.busy_ns)


def test_add_steps_short_and_long_batches_mix_bit_for_bit() -> None:
    """Steps of any batch sizes, added in waiting batches of any length: the same bits as a running sum."""
    rng = np.random.default_rng(1)
    names = tuple(f"t{i}" for i in range(5))
    vectors = [rng.random(5) * 10.0 ** rng.integers(-12, 6, 5) for _ in range(80)]
    acc = np.zeros(5)
    for v in vectors:
        acc += v
    one, batched = Ledger(names), Ledger(names)
    one.batch = 1  # every step added as it comes
    batched.batch = 7  # waiting batches that end inside add_steps calls
    for v in vectors:
        one.add(v, 1)
    assert [x.hex() for x in one.terms_s.values()] == [float(x).hex() for x in acc]
    start = 0
    for size in (3, 17, 1, 29, 16, 14):
        batched.add_steps(vectors[start:start + size], [1] * size)
        start += size
    assert start == len(vectors)
    assert [x.hex() for x in one.terms_s.values()] == [x.hex() for x in batched.terms_s.values()]


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_step_prices_memo_gives_the_cost_models_decode_prices(kv_dtype: str) -> None:
    """The decode-price memo keeps a price by context alone where the longest context does not matter
    (CostModel.decode_max_kv_bound) and by (context, longest) elsewhere: every price it returns is the cost
    model's own for that (requests, context, longest), asked in any order and again."""
    import random

    from hardware import CostModel, Deployment, load_engine, load_gpu, load_model
    from twin.core.prices import StepPrices

    d = Deployment(gpu=load_gpu("h100_sxm"), model=load_model("meta-llama/Llama-3.1-8B"),
                   engine=load_engine("vllm"), kv_dtype=kv_dtype)
    prices, direct = StepPrices(CostModel(d)), CostModel(d)
    rng = random.Random(3)
    asked = 0
    for _ in range(300):
        n = rng.choice([1, 2, 8, 64])
        sum_kv = n * rng.randint(1, 3000) + rng.randint(0, n - 1)
        low = -(-sum_kv // n)
        max_kv = rng.choice([low, rng.randint(low, sum_kv - (n - 1)), sum_kv - (n - 1)])
        steps = range(rng.randint(0, 3), rng.randint(4, 12))
        for i, (vector, ns) in zip(steps, prices.decode_costs(n, sum_kv, max_kv, steps)):
            terms, want_ns = direct.decode_step(n, sum_kv + i * n, max_kv + i)
            assert ns == want_ns and vector.tolist() == terms, (n, sum_kv, max_kv, i)
            asked += 1
    assert asked > 1000
