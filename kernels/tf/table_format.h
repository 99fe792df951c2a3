// What a compressed table input means: its dtype and the ops' `row_format`
// and `dim` attrs give the storage format (kernel_api.h), which the table's
// and scales' shapes must then fit.
#ifndef TFCE_KERNELS_TF_TABLE_FORMAT_H_
#define TFCE_KERNELS_TF_TABLE_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/core/kernel_api.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.pb.h"

namespace tfce {

// The storage format of a table of `dtype` under attrs `row_format` and
// `dim`: 'plain' takes it from the dtype (int8: kInt8Split, half: kFp16)
// and needs dim -1; a rowwise format needs a uint8 table and dim >= 0.
// Called by the shape functions (a bad node fails when the graph is built)
// and by the OpKernels' constructors.
absl::Status ParseTableFormat(tensorflow::DataType dtype,
                              const std::string& row_format, int64_t dim,
                              Storage* storage);

// Checks table ([V, D], or [V, RecordBytes(storage, dim)] for rowwise
// formats) and scales ([V] for kInt8Split, else [0]) and fills *view.
// Everything is checked in 64-bit before any narrowing.
absl::Status MakeTableView(const tensorflow::Tensor& table,
                           const tensorflow::Tensor& scales, Storage storage,
                           int64_t dim, TableView* view);

}  // namespace tfce

#endif  // TFCE_KERNELS_TF_TABLE_FORMAT_H_
