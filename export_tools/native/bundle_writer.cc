// A C interface to TF's checkpoint BundleWriter, for the export tool.
//
// The tool writes each compressed table as row slices of one checkpoint key.
// SaveV2 writes one bundle per call and MergeV2Checkpoints refuses a key that
// appears in two bundles, so streaming a table through SaveV2 would need the
// whole table in one call. BundleWriter::AddSlice writes each slice's bytes
// to the data file as it comes: memory stays one chunk, whatever the table.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/tensor_slice.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/util/tensor_bundle/tensor_bundle.h"

#define TFCE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

int Fail(const absl::Status& status, char* error, size_t error_size) {
  if (error_size) {
    std::string text(status.message());
    std::strncpy(error, text.c_str(), error_size - 1);
    error[error_size - 1] = '\0';
  }
  return 1;
}

}  // namespace

// Opens a bundle at `prefix` (writes prefix.index and prefix.data-*).
TFCE_EXPORT void* tfce_bundle_open(const char* prefix) {
  return new tensorflow::BundleWriter(tensorflow::Env::Default(), prefix);
}

// Adds rows [row_start, row_start + rows) of the tensor `key` of shape
// `full_shape` (rank `rank`, rows along dimension 0). `data` holds the rows,
// C order, of numeric dtype `dtype` (a tensorflow::DataType value).
TFCE_EXPORT int tfce_bundle_add_rows(void* handle, const char* key, int dtype,
                                     int rank, const int64_t* full_shape,
                                     int64_t row_start, int64_t rows,
                                     const void* data, size_t nbytes,
                                     char* error, size_t error_size) {
  auto* writer = static_cast<tensorflow::BundleWriter*>(handle);
  tensorflow::TensorShape full;
  tensorflow::TensorShape slice_shape;
  for (int d = 0; d < rank; ++d) {
    absl::Status status = full.AddDimWithStatus(full_shape[d]);
    if (status.ok()) status = slice_shape.AddDimWithStatus(d ? full_shape[d] : rows);
    if (!status.ok()) return Fail(status, error, error_size);
  }
  const auto type = static_cast<tensorflow::DataType>(dtype);
  if (rank < 1 || row_start < 0 || rows < 0 || row_start + rows > full_shape[0] ||
      !tensorflow::DataTypeCanUseMemcpy(type)) {
    return Fail(absl::InvalidArgumentError("bad slice or dtype"), error, error_size);
  }
  tensorflow::Tensor slice(type, slice_shape);
  if (slice.TotalBytes() != nbytes) {
    return Fail(absl::InvalidArgumentError("data size does not match the shape"),
                error, error_size);
  }
  std::memcpy(const_cast<char*>(slice.tensor_data().data()), data, nbytes);
  tensorflow::TensorSlice spec(rank);
  spec.set_start(0, row_start);
  spec.set_length(0, rows);
  const absl::Status status = writer->AddSlice(key, full, spec, slice);
  return status.ok() ? 0 : Fail(status, error, error_size);
}

// Writes the index and frees the writer (also on failure).
TFCE_EXPORT int tfce_bundle_finish(void* handle, char* error, size_t error_size) {
  std::unique_ptr<tensorflow::BundleWriter> writer(
      static_cast<tensorflow::BundleWriter*>(handle));
  const absl::Status status = writer->Finish();
  return status.ok() ? 0 : Fail(status, error, error_size);
}
