// The attrs of BatchedFusedDecodeAxpy, read and checked the same way by its
// shape function (a bad node fails when the graph is built) and its
// OpKernel: one storage format, combiner, bag kind and bag count per
// feature, and where each feature's inputs are. Only the inputs a feature
// needs are there (every input is an executor edge, paid on every call):
// scales for 'plain' int8 tables, bag splits for 'segment_ids' and
// 'row_splits' bags, weights for weighted features, num_bags for features
// whose row count is given.
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

// How a feature's number of output rows is known (the bag_counts attr).
enum class BagCount {
  kGiven,        // its num_bags input
  kRowsOfBags,   // the rows of its bag structure
  kRowsWithIds,  // the last row holding an id + 1
};

// The op's input lists, in order.
enum class BatchedInput { kTables, kScales, kIds, kBagSplits, kWeights,
                          kNumBags };
constexpr int kNumBatchedInputs = 6;

struct BatchedAttrs {
  int64_t num_features = 0;  // N, the number of tables
  bool concat = false;
  std::vector<Storage> storages;
  // Whether feature f's table input is a resource variable's handle, read
  // by the op itself (no ReadVariableOp node per table and call).
  std::vector<bool> table_is_handle;
  // The table_names attr: empty, or each feature's table variable by its
  // shared name in the device's resource manager (no table inputs then:
  // table_is_handle is true for every feature, tables' list is empty).
  std::vector<std::string> table_names;
  std::vector<tensorflow::DataType> table_dtypes;  // each table's elements
  std::vector<int64_t> dims;  // the dims attr: D of rowwise tables, else -1
  std::vector<Combiner> combiners;
  std::vector<BagKind> bag_kinds;
  std::vector<BagCount> bag_counts;
  std::vector<std::string> names;  // feature_names: empty, or one each
  // positions[list][f]: feature f's position in that input list, or -1
  // when it has no input there.
  std::vector<int64_t> positions[kNumBatchedInputs];
  // The size of each input list.
  int64_t list_sizes[kNumBatchedInputs] = {};

  // Feature f's position in input list `list`, or -1.
  int64_t Position(BatchedInput list, int64_t f) const {
    return positions[static_cast<int>(list)][f];
  }
  // Feature f's index among all the node's inputs, or -1.
  int64_t InputIndex(BatchedInput list, int64_t f) const;

  // "feature 3", or "feature 3 ('user_id')" when the node names them.
  std::string Label(int64_t f) const;
  // `status` with Label(f) in front of its message.
  absl::Status Labeled(int64_t f, const absl::Status& status) const;
};

// The lengths of the op's input lists, as its attrs give them.
struct InputListSizes {
  int64_t scales, ids, splits, weights, num_bags;
};

// One bag_kinds entry as a BagKind; anything else is an error.
absl::Status ParseBagKind(const std::string& name, BagKind* kind);
// One bag_counts entry as a BagCount; anything else is an error.
absl::Status ParseBagCount(const std::string& name, BagCount* count);

// Checks the raw attrs (every per-feature list N long, num_outputs N or 1
// as concat says, each feature's format, combiner, bag kind and bag count,
// each input list as long as the features that need it) into *attrs.
// `dtypes` are the table inputs' (Ttables), `table_dtypes` the tables'
// element types (empty: the same; required for a resource input),
// `table_names` the tables' variables by name (empty: they are inputs; else
// one per feature, and no table inputs).
absl::Status ParseBatchedAttrs(int64_t num_features, bool concat,
                               int64_t num_outputs,
                               const std::vector<tensorflow::DataType>& dtypes,
                               const std::vector<tensorflow::DataType>&
                                   table_dtypes,
                               const std::vector<std::string>& table_names,
                               const InputListSizes& input_lists,
                               const std::vector<std::string>& row_formats,
                               const std::vector<int64_t>& dims,
                               const std::vector<std::string>& combiners,
                               const std::vector<std::string>& bag_kinds,
                               const std::vector<std::string>& bag_counts,
                               const std::vector<bool>& weighted,
                               const std::vector<std::string>& names,
                               BatchedAttrs* attrs);

// Reads and checks the attrs from an OpKernelConstruction or a shape
// function's InferenceContext (both have GetAttr).
template <typename Context>
absl::Status ReadBatchedAttrs(Context* c, BatchedAttrs* attrs) {
  int64_t num_features = 0, num_outputs = 0, num_scales = 0, num_weights = 0;
  bool concat = false;
  std::vector<tensorflow::DataType> dtypes, table_dtypes, ids, splits,
      num_bags;
  std::vector<std::string> row_formats, combiners, bag_kinds, bag_counts,
      names, table_names;
  std::vector<int64_t> dims;
  std::vector<bool> weighted;
  TF_RETURN_IF_ERROR(c->GetAttr("num_scales", &num_scales));
  TF_RETURN_IF_ERROR(c->GetAttr("num_weights", &num_weights));
  TF_RETURN_IF_ERROR(c->GetAttr("Tids", &ids));
  TF_RETURN_IF_ERROR(c->GetAttr("Tsplits", &splits));
  TF_RETURN_IF_ERROR(c->GetAttr("Tnum_bags", &num_bags));
  TF_RETURN_IF_ERROR(c->GetAttr("concat", &concat));
  TF_RETURN_IF_ERROR(c->GetAttr("num_outputs", &num_outputs));
  TF_RETURN_IF_ERROR(c->GetAttr("Ttables", &dtypes));
  TF_RETURN_IF_ERROR(c->GetAttr("table_names", &table_names));
  // One table each: an input, or a variable named in table_names.
  num_features = static_cast<int64_t>(
      table_names.empty() ? dtypes.size() : table_names.size());
  TF_RETURN_IF_ERROR(c->GetAttr("table_dtypes", &table_dtypes));
  TF_RETURN_IF_ERROR(c->GetAttr("row_formats", &row_formats));
  TF_RETURN_IF_ERROR(c->GetAttr("dims", &dims));
  TF_RETURN_IF_ERROR(c->GetAttr("combiners", &combiners));
  TF_RETURN_IF_ERROR(c->GetAttr("bag_kinds", &bag_kinds));
  TF_RETURN_IF_ERROR(c->GetAttr("bag_counts", &bag_counts));
  TF_RETURN_IF_ERROR(c->GetAttr("weighted", &weighted));
  TF_RETURN_IF_ERROR(c->GetAttr("feature_names", &names));
  const InputListSizes lists = {
      num_scales, static_cast<int64_t>(ids.size()),
      static_cast<int64_t>(splits.size()), num_weights,
      static_cast<int64_t>(num_bags.size())};
  return ParseBatchedAttrs(num_features, concat, num_outputs, dtypes,
                           table_dtypes, table_names, lists,
                           row_formats, dims, combiners, bag_kinds,
                           bag_counts, weighted, names, attrs);
}

}  // namespace tfce

#endif  // TFCE_KERNELS_TF_BATCHED_ATTRS_H_
