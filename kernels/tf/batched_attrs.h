// The attrs of BatchedFusedDecodeAxpy, read and checked the same way by its
// shape function (a bad node fails when the graph is built) and its
// OpKernel: one storage format, combiner and bag kind per feature.
#ifndef TFCE_KERNELS_TF_BATCHED_ATTRS_H_
#define TFCE_KERNELS_TF_BATCHED_ATTRS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/core/kernel_api.h"
#include "tensorflow/core/framework/types.pb.h"
#include "tensorflow/core/platform/errors.h"

namespace tfce {

// How a feature's ids form its bags (the bag_kinds attr).
enum class BagKind {
  kSegmentIds,  // ids [n], sorted segment ids [n] in bag_splits
  kRowSplits,   // ids [n], a RaggedTensor's row splits in bag_splits
  kDense,       // ids [rows, width]: each row is a bag of width ids
  kPadded,      // ids [rows, width]: each row's ids >= 0 are a bag
};

struct BatchedAttrs {
  int64_t num_features = 0;  // N
  bool concat = false;
  std::vector<Storage> storages;
  std::vector<int64_t> dims;  // the dims attr: D of rowwise tables, else -1
  std::vector<Combiner> combiners;
  std::vector<BagKind> bag_kinds;
  std::vector<std::string> names;  // feature_names: empty, or one each

  // "feature 3", or "feature 3 ('user_id')" when the node names them.
  std::string Label(int64_t f) const;
  // `status` with Label(f) in front of its message.
  absl::Status Labeled(int64_t f, const absl::Status& status) const;
};

// The lengths of the type lists of the other per-feature inputs.
struct InputListSizes {
  size_t ids, splits, num_bags;
};

// One bag_kinds entry as a BagKind; anything else is an error.
absl::Status ParseBagKind(const std::string& name, BagKind* kind);

// Checks the raw attrs (every list N long, num_outputs N or 1 as concat
// says, each feature's format, combiner and bag kind) into *attrs.
absl::Status ParseBatchedAttrs(int64_t num_features, bool concat,
                               int64_t num_outputs,
                               const std::vector<tensorflow::DataType>& dtypes,
                               const InputListSizes& input_lists,
                               const std::vector<std::string>& row_formats,
                               const std::vector<int64_t>& dims,
                               const std::vector<std::string>& combiners,
                               const std::vector<std::string>& bag_kinds,
                               const std::vector<std::string>& names,
                               BatchedAttrs* attrs);

// Reads and checks the attrs from an OpKernelConstruction or a shape
// function's InferenceContext (both have GetAttr).
template <typename Context>
absl::Status ReadBatchedAttrs(Context* c, BatchedAttrs* attrs) {
  int64_t num_features = 0, num_outputs = 0;
  bool concat = false;
  std::vector<tensorflow::DataType> dtypes, ids, splits, num_bags;
  std::vector<std::string> row_formats, combiners, bag_kinds, names;
  std::vector<int64_t> dims;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &num_features));
  TF_RETURN_IF_ERROR(c->GetAttr("Tids", &ids));
  TF_RETURN_IF_ERROR(c->GetAttr("Tsplits", &splits));
  TF_RETURN_IF_ERROR(c->GetAttr("Tnum_bags", &num_bags));
  TF_RETURN_IF_ERROR(c->GetAttr("concat", &concat));
  TF_RETURN_IF_ERROR(c->GetAttr("num_outputs", &num_outputs));
  TF_RETURN_IF_ERROR(c->GetAttr("Ttables", &dtypes));
  TF_RETURN_IF_ERROR(c->GetAttr("row_formats", &row_formats));
  TF_RETURN_IF_ERROR(c->GetAttr("dims", &dims));
  TF_RETURN_IF_ERROR(c->GetAttr("combiners", &combiners));
  TF_RETURN_IF_ERROR(c->GetAttr("bag_kinds", &bag_kinds));
  TF_RETURN_IF_ERROR(c->GetAttr("feature_names", &names));
  return ParseBatchedAttrs(num_features, concat, num_outputs, dtypes,
                           {ids.size(), splits.size(), num_bags.size()},
                           row_formats, dims, combiners, bag_kinds, names,
                           attrs);
}

}  // namespace tfce

#endif  // TFCE_KERNELS_TF_BATCHED_ATTRS_H_
