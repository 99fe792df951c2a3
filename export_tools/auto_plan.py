"""Choosing each table's storage format for ``--dtype auto`` (numpy only).

The measurements (export_tools/sensitivity.py) give, for every table t and
candidate format f, the vector ``d[t][f]`` of |change| of every float output
element of the verification requests when only t is replaced by
``decode(encode(t, f))``; its max is t's *single-table error* in f. FP32
(``FP32``, the table left as it is) changes nothing.

The budget E is shared by predicting the error of a choice as
``max over elements of sum over tables of d[t][f_t]``: the triangle
inequality per element, exact when the tables' effects add. It is never more
than the sum of the single-table errors, and less when tables move different
outputs (a user table and an item table feeding different heads do not share
the budget).

1. Options: a table's candidates sorted by bytes; an option is dropped if
   one no larger has a smaller error (int4 of dim 2 stores more than fp16;
   int8 and fp16 of dim 4 both store 8 bytes). Options of equal error are
   kept (a table no request changes has error 0 in every format): the
   choice takes the smallest, and the proof can still move up.
2. Greedy knapsack: every table starts at its smallest option; while the
   prediction exceeds E, the move (a table to a larger option) that lowers
   it most per byte added is made (ties, where several elements share the
   max: the one removing the most single-table error per byte).
3. Minimality: each table then takes the smallest option that keeps the
   prediction within E with the others as they are, until none changes: no
   table can be made smaller alone.
4. Proof: the caller measures the model with every table in its chosen
   format at once; while that exceeds E (effects that do not add), the
   table with the largest single-table error moves up one option
   (:meth:`Plan.upgrade_largest`), and it is measured again.
"""
from __future__ import annotations

import dataclasses

import numpy as np

FP32 = "fp32"


@dataclasses.dataclass
class Option:
    """One way to store a table: `bytes` in total, `error` its single-table
    error, `delta` the |change| of every measured output element (flat)."""
    format: str
    bytes: int
    error: float
    delta: np.ndarray = dataclasses.field(repr=False, default=None)


def options(candidates: list[Option]) -> list[Option]:
    """`candidates` sorted by bytes, without those that one no larger beats
    (step 1 of the module): errors never increase along the list, and the
    FP32 option (error 0) is always last."""
    kept = []
    for option in sorted(candidates, key=lambda o: (o.bytes, o.error)):
        if not kept or option.error <= kept[-1].error:
            kept.append(option)
    return kept


class Plan:
    """Format choices for tables {name: [Option]} under the bound `max_error`."""

    def __init__(self, tables: dict, max_error: float):
        self.max_error = float(max_error)
        self.options = {name: options(c) for name, c in sorted(tables.items())}
        sizes = {o.delta.shape for opts in self.options.values() for o in opts}
        if len(sizes) > 1:
            raise ValueError(f"delta vectors of different shapes: {sorted(sizes)}")
        self._size = sizes.pop()[0] if sizes else 0
        self.choice = {name: 0 for name in self.options}
        self._resum()

    def _resum(self):
        # From scratch after each change, so no rounding accumulates.
        self._sum = np.zeros(self._size, np.float64)
        for name in self.options:
            self._sum += self.option(name).delta

    def option(self, name) -> Option:
        """The chosen option of table `name`."""
        return self.options[name][self.choice[name]]

    def formats(self) -> dict:
        return {name: self.option(name).format for name in self.options}

    def predicted(self) -> float:
        """The predicted error of the current choice (see the module)."""
        return float(self._sum.max(initial=0.0))

    def single_sum(self) -> float:
        """The sum of the chosen options' single-table errors."""
        return float(sum(self.option(n).error for n in self.options))

    def total_bytes(self) -> int:
        return int(sum(self.option(n).bytes for n in self.options))

    def _set(self, name, index):
        self.choice[name] = index
        self._resum()

    def _predicted_with(self, name, index):
        changed = self._sum - self.option(name).delta + self.options[name][index].delta
        return float(changed.max(initial=0.0))

    def choose(self) -> Plan:
        """Steps 2 and 3 of the module; returns self."""
        while self.predicted() > self.max_error:
            self._best_move()
        self._minimize()
        return self

    def _best_move(self):
        now, best = self.predicted(), None
        for name, opts in self.options.items():
            here = self.option(name)
            for index in range(self.choice[name] + 1, len(opts)):
                cost = max(opts[index].bytes - here.bytes, 1)
                gain = now - self._predicted_with(name, index)
                single = here.error - opts[index].error
                key = (gain / cost, single / cost)
                if (gain > 0 or single > 0) and (best is None or key > best[0]):
                    best = (key, name, index)
        if best is None:  # cannot happen while FP32 (error 0) is an option
            raise ValueError("no option lowers the predicted error")
        self._set(best[1], best[2])

    def _minimize(self):
        changed = True
        while changed:
            changed = False
            # Largest savings first: bytes of the choice over the smallest option.
            order = sorted(self.options, key=lambda n: (
                self.options[n][0].bytes - self.option(n).bytes, n))
            for name in order:
                for index in range(self.choice[name]):
                    if self._predicted_with(name, index) <= self.max_error:
                        self._set(name, index)
                        changed = True
                        break

    def set_formats(self, formats: dict) -> Plan:
        """Sets the choice to {name: format} (each one of the table's options)."""
        for name, fmt in formats.items():
            self.choice[name] = [o.format for o in self.options[name]].index(fmt)
        self._resum()
        return self

    def smaller_predicted(self, name):
        """The predicted error if table `name` alone took its next smaller
        option (None at its smallest): above E when the choice is minimal."""
        index = self.choice[name]
        return None if index == 0 else self._predicted_with(name, index - 1)

    def upgrade_largest(self):
        """Step 4 of the module: moves the table with the largest single-table
        error (not yet at its last option) up one option; returns (name, old
        format, new format), or None when every table is at its last."""
        movable = [n for n in self.options if self.choice[n] + 1 < len(self.options[n])]
        if not movable:
            return None
        name = max(movable, key=lambda n: (self.option(n).error, n))
        old = self.option(name).format
        self._set(name, self.choice[name] + 1)
        return name, old, self.option(name).format
