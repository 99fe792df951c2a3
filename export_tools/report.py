"""What an export did: tables converted, sizes, errors, verification, and
for `--dtype auto` what was measured and chosen."""
import dataclasses
import json
import os


@dataclasses.dataclass
class AutoTable:
    """One table as `--dtype auto` saw it. Errors are single-table errors:
    the largest change of a float output element when only this table is
    stored in that format (measured on the rebuilt source)."""
    name: str
    checkpoint_key: str
    rows: int
    dim: int
    format: str           # the choice: a format of quantization.FORMATS, or "fp32"
    bytes: int            # the table's bytes in that format
    error: float          # the choice's single-table error (0 for fp32)
    errors: dict          # candidate format -> single-table error (None: unusable)
    unusable: dict        # candidate format -> why it cannot store the table
    # the predicted error of the plan with this table alone one option
    # smaller (None at its smallest): above max_error, or it would be smaller
    smaller_predicted: float = None


@dataclasses.dataclass
class AutoReport:
    """`--dtype auto`: the bound, the choice and the proof."""
    max_error: float
    tables: list                   # [AutoTable]
    predicted_error: float         # the plan's prediction (auto_plan.py)
    single_sum: float              # the sum of the chosen single-table errors
    substituted_error: float       # every table replaced at once, on the rebuilt source
    # the export's largest float difference from the source, measured by
    # verification: what the bound is proven by
    measured_error: float = None
    # tables moved up a format because the choice measured above max_error
    upgrades: list = dataclasses.field(default_factory=list)
    output_values: int = 0         # float output values measured
    bytes: int = 0                 # the candidate tables' bytes, as chosen
    bytes_int8: int = 0            # ... as --dtype int8 stores them
    bytes_fp32: int = 0            # ... as FP32


@dataclasses.dataclass
class ExportReport:
    """Returned by `compress_saved_model` and written by `--report FILE.json`."""
    src: str
    dst: str
    dtype: str
    ops: str
    tables: list = dataclasses.field(default_factory=list)      # [TableReport]
    kept_fp32: list = dataclasses.field(default_factory=list)   # names left FP32 (--keep)
    # large float variables no lookup reads (left FP32): name -> the op reading them
    not_lookups: dict = dataclasses.field(default_factory=dict)
    checkpoint_bytes_before: int = 0
    checkpoint_bytes_after: int = 0
    # signature key -> output key -> max abs difference against the source
    verification: dict = dataclasses.field(default_factory=dict)
    tolerance: float = None
    verified: bool = False
    warmup_requests: int = 0
    warnings: list = dataclasses.field(default_factory=list)
    auto: AutoReport = None        # dtype "auto" only
    # signature key -> features pooled by each BatchedFusedDecodeAxpy node
    batched_lookups: dict = dataclasses.field(default_factory=dict)

    @property
    def table_bytes_before(self):
        return sum(t.bytes_before for t in self.tables)

    @property
    def table_bytes_after(self):
        return sum(t.bytes_after for t in self.tables)

    def to_dict(self):
        result = dataclasses.asdict(self)
        result["table_bytes_before"] = self.table_bytes_before
        result["table_bytes_after"] = self.table_bytes_after
        return result

    def write_json(self, path):
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=True)
            f.write("\n")


def directory_bytes(path):
    """Total size of the files under `path`."""
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total
