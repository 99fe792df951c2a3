"""The choice of `--dtype auto` (export_tools/auto_plan.py) on made-up
measurements: options, budget sharing per output element, the greedy
choice within the bound and per-table minimal, the proof's upgrades."""
import itertools

import numpy as np
import pytest

from export_tools.auto_plan import FP32, Option, Plan, options


def opt(fmt, size, delta):
    delta = np.asarray(delta, np.float64)
    return Option(fmt, size, float(delta.max(initial=0.0)), delta)


def table(size, deltas, n):
    """Options int4 / int8 / fp16 of a table of `size` FP32 bytes, and FP32."""
    found = [opt(f, size * b // 32, d) for f, b, d in zip(("int4", "int8", "fp16"),
                                                            (5, 9, 16), deltas)]
    return found + [opt(FP32, size, np.zeros(n))]


def predicted(plan, choice):
    return max(sum(plan.options[name][i].delta for name, i in choice.items()))


def test_options_drop_what_a_no_larger_option_beats():
    n = 2
    found = options([opt("int8", 6, [3, 0]), opt("int4", 5, [9, 0]), opt("fp16", 4, [1, 1]),
                     opt(FP32, 8, [0, 0])])
    # fp16 is smallest and best (as int4/int8 of dim 2): only FP32 can follow
    assert [o.format for o in found] == ["fp16", FP32]
    same = options([opt("fp16", 8, [1, 0]), opt("int8", 8, [2, 0]), opt("int4", 6, [5, 0]),
                    opt(FP32, 16, np.zeros(n))])
    assert [o.format for o in same] == ["int4", "fp16", FP32]  # int8: as big, worse
    ties = options([opt("int4", 1, [0, 0]), opt("int8", 2, [0, 0]), opt(FP32, 4, [0, 0])])
    assert [o.format for o in ties] == ["int4", "int8", FP32]  # kept for the proof


def test_tables_moving_different_outputs_do_not_share_the_bound():
    """Two tables each at E/2 < error <= E on their own outputs: both keep
    int4, although the sum of their errors is above E."""
    plan = Plan({"a": table(64, [[0.9, 0], [0.1, 0], [0.01, 0]], 2),
                 "b": table(64, [[0, 0.9], [0, 0.1], [0, 0.01]], 2)}, 1.0).choose()
    assert plan.formats() == {"a": "int4", "b": "int4"}
    assert plan.predicted() == pytest.approx(0.9)
    assert plan.single_sum() == pytest.approx(1.8)
    shared = Plan({"a": table(64, [[0.9], [0.1], [0.01]], 1),
                   "b": table(64, [[0.9], [0.1], [0.01]], 1)}, 1.0).choose()
    assert sorted(shared.formats().values()) == ["int4", "int8"]


def test_the_larger_table_gets_the_cheaper_upgrade():
    """Same errors, one table 10x larger: the small one is upgraded."""
    plan = Plan({"big": table(6400, [[0.6], [0.05], [0.001]], 1),
                 "small": table(640, [[0.6], [0.05], [0.001]], 1)}, 1.0).choose()
    assert plan.formats() == {"big": "int4", "small": "int8"}


@pytest.mark.parametrize("seed", range(30))
def test_choice_is_within_the_bound_and_per_table_minimal(seed):
    rng = np.random.default_rng(seed)
    n, tables = 6, {}
    for i in range(int(rng.integers(1, 6))):
        size = int(rng.integers(1, 50)) * 32
        base = rng.uniform(0, 1, n) * (rng.uniform(0, 1, n) < 0.6)
        tables[f"t{i}"] = table(size, [base, base / 10, base / 200], n)
    bound = float(rng.uniform(0.01, 2))
    plan = Plan(tables, bound).choose()
    assert plan.predicted() <= bound
    assert predicted(plan, plan.choice) == pytest.approx(plan.predicted())
    for name, index in plan.choice.items():
        for smaller in range(index):
            assert predicted(plan, dict(plan.choice, **{name: smaller})) > bound
        if index:
            assert plan.smaller_predicted(name) > bound
        else:
            assert plan.smaller_predicted(name) is None
    # No choice of the same options is within the bound with fewer bytes by
    # more than the greedy's worst case here (it is no exact knapsack).
    best = min(sum(plan.options[n][i].bytes for n, i in zip(plan.options, c))
               for c in itertools.product(*[range(len(o)) for o in plan.options.values()])
               if predicted(plan, dict(zip(plan.options, c))) <= bound)
    assert best <= plan.total_bytes() <= 2 * best


def test_upgrade_largest_moves_the_largest_single_error_up_one_option():
    plan = Plan({"a": table(64, [[0.3], [0.1], [0.01]], 1),
                 "b": table(64, [[0.5], [0.2], [0.01]], 1)}, 10.0).choose()
    assert plan.formats() == {"a": "int4", "b": "int4"}
    assert plan.upgrade_largest() == ("b", "int4", "int8")
    assert plan.upgrade_largest() == ("a", "int4", "int8")
    for _ in range(4):
        plan.upgrade_largest()
    assert plan.formats() == {"a": FP32, "b": FP32}
    assert plan.upgrade_largest() is None
    assert plan.predicted() == 0
