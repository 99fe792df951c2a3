#include "kernels/tf/table_format.h"

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/types.h"

namespace tfce {

using ::tensorflow::Tensor;

namespace {

template <typename... Args>
absl::Status InvalidArgument(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

const char* FormatName(Storage storage) {
  switch (storage) {
    case Storage::kInt8Split:
      return "int8";
    case Storage::kFp16:
      return "float16";
    case Storage::kInt8Rowwise:
      return "int8_rowwise";
    case Storage::kInt4Rowwise:
      return "int4_rowwise";
  }
  return "?";
}

}  // namespace

absl::Status ParseTableFormat(tensorflow::DataType dtype,
                              const std::string& row_format, int64_t dim,
                              Storage* storage) {
  if (row_format == "plain") {
    if (dim != -1) {
      return InvalidArgument(
          "attr dim must be -1 (the table's second dimension gives it) for "
          "row_format 'plain', got ",
          dim);
    }
    if (dtype == tensorflow::DT_INT8) {
      *storage = Storage::kInt8Split;
    } else if (dtype == tensorflow::DT_HALF) {
      *storage = Storage::kFp16;
    } else {
      return InvalidArgument(
          "a table of row_format 'plain' must be int8 or float16, got ",
          tensorflow::DataTypeString(dtype),
          "; uint8 tables hold rowwise records: set row_format "
          "'int8_rowwise' or 'int4_rowwise'");
    }
    return absl::OkStatus();
  }
  if (row_format == "int8_rowwise") {
    *storage = Storage::kInt8Rowwise;
  } else if (row_format == "int4_rowwise") {
    *storage = Storage::kInt4Rowwise;
  } else {
    return InvalidArgument(
        "row_format must be 'plain', 'int8_rowwise' or 'int4_rowwise', got '",
        row_format, "'");
  }
  if (dtype != tensorflow::DT_UINT8) {
    return InvalidArgument("a table of row_format '", row_format,
                           "' must be uint8 (its rows are byte records), got ",
                           tensorflow::DataTypeString(dtype));
  }
  if (dim < 0 || dim > kMaxDim) {
    return InvalidArgument("attr dim must be in [0, ", kMaxDim,
                           "] for row_format '", row_format,
                           "' (its records do not give it), got ", dim);
  }
  return absl::OkStatus();
}

absl::Status MakeTableView(const Tensor& table, const Tensor& scales,
                           Storage storage, int64_t dim, TableView* view) {
  const bool rowwise =
      storage == Storage::kInt8Rowwise || storage == Storage::kInt4Rowwise;
  if (table.dims() != 2) {
    return InvalidArgument(
        "table must be a matrix [rows, ", rowwise ? "record bytes" : "dim",
        "], but has shape ", table.shape().DebugString(), " (rank ",
        table.dims(), ")");
  }
  const int64_t rows = table.dim_size(0);
  if (!rowwise) {
    dim = table.dim_size(1);
    if (dim > kMaxDim) {
      return InvalidArgument("table's dim (its second dimension) must be at "
                             "most ",
                             kMaxDim, ", but the table has shape ",
                             table.shape().DebugString());
    }
  }
  // dim <= kMaxDim (ParseTableFormat checked the attr): no overflow.
  const int64_t record_bytes = RecordBytes(storage, dim);
  if (rowwise && table.dim_size(1) != record_bytes) {
    return InvalidArgument(
        "table must have shape [rows, ", record_bytes, "] for ",
        FormatName(storage), " rows of dim ", dim, " (",
        kRecordHeaderBytes, " header bytes, then the values), but has shape ",
        table.shape().DebugString());
  }
  if (scales.dims() != 1) {
    return InvalidArgument("scales must be a vector, but has shape ",
                           scales.shape().DebugString());
  }
  if (storage == Storage::kInt8Split) {
    if (scales.dim_size(0) != rows) {
      return InvalidArgument(
          "scales must have one float32 per table row: expected shape [", rows,
          "] for an int8 table of shape ", table.shape().DebugString(),
          ", but got ", scales.shape().DebugString());
    }
    view->scales = scales.flat<float>().data();
  } else {
    if (scales.dim_size(0) != 0) {
      return InvalidArgument("scales must be empty (shape [0]) for ",
                             FormatName(storage), " tables, but got shape ",
                             scales.shape().DebugString());
    }
    view->scales = nullptr;
  }
  view->storage = storage;
  view->data = table.data();
  view->rows = rows;
  view->dim = dim;
  return absl::OkStatus();
}

}  // namespace tfce
