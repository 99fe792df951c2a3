"""What an export did: tables converted, sizes, errors, verification."""
import dataclasses
import json
import os


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
