"""Encoding one table chunk by chunk, straight from the source checkpoint.

Only one chunk of FP32 rows (and its encoding) is in memory at a time; the
error statistics of the encoding are accumulated on the way.
"""
import dataclasses

import numpy as np

from export_tools.errors import ExportError
from tf_compressed_embedding import quantization


@dataclasses.dataclass
class TableReport:
    """One converted table: sizes and quantization error."""
    name: str
    checkpoint_key: str
    rows: int
    dim: int
    format: str
    bytes_before: int
    bytes_after: int
    max_abs_error: float = 0.0
    mean_abs_error: float = 0.0
    max_abs_value: float = 0.0
    # worst error of an element relative to the largest magnitude of its row
    relative_error: float = 0.0
    signatures: list = dataclasses.field(default_factory=list)
    lookups: int = 0
    pooled_lookups: int = 0


def new_report(location, fmt):
    """The report of a table stored as `fmt`: its bytes are the stored rows
    (records, or values) and any separate scales."""
    rows, dim = location.shape
    return TableReport(location.name, location.key, rows, dim, fmt,
                       rows * dim * location.dtype.size,
                       rows * quantization.row_bytes(fmt, dim))


def encoded_chunks(reader, location, fmt, chunk_rows, report, on_rows=None):
    """Yields (row_start, data, scales) for each chunk of `location`, encoded in
    `fmt`; fills the error fields of `report`. `on_rows(n)` reports progress."""
    rows, dim = location.shape
    total_error = 0.0
    for start in range(0, rows, chunk_rows):
        count = min(chunk_rows, rows - start)
        values = reader.read_rows(location, start, count).astype(np.float32, copy=False)
        try:
            data, scales = quantization.encode(values, fmt, row_offset=start)
        except ValueError as e:
            raise ExportError(f"table {location.name!r}: {e}") from e
        error = quantization.decode(data, scales, fmt, dim)
        np.subtract(error, values, out=error)
        np.abs(error, out=error)
        if error.size:
            row_error, row_max = error.max(axis=1), np.abs(values).max(axis=1)
            report.max_abs_error = max(report.max_abs_error, float(row_error.max()))
            report.max_abs_value = max(report.max_abs_value, float(row_max.max()))
            relative = row_error[row_max > 0] / row_max[row_max > 0]
            if relative.size:
                report.relative_error = max(report.relative_error, float(relative.max()))
            total_error += float(error.sum(dtype=np.float64))
        del error, values  # before the next chunk is read: memory stays one chunk
        yield start, data, scales
        if on_rows:
            on_rows(count)
    cells = rows * dim
    report.mean_abs_error = total_error / cells if cells else 0.0
