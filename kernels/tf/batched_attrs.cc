#include "kernels/tf/batched_attrs.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "kernels/tf/bag_inputs.h"
#include "kernels/tf/op_util.h"
#include "kernels/tf/table_format.h"
#include "tensorflow/core/framework/types.h"

namespace tfce {

std::string BatchedAttrs::Label(int64_t f) const {
  if (names.empty()) return absl::StrCat("feature ", f);
  return absl::StrCat("feature ", f, " ('", names[f], "')");
}

absl::Status BatchedAttrs::Labeled(int64_t f,
                                   const absl::Status& status) const {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(Label(f), ": ", status.message()));
}

absl::Status ParseBagKind(const std::string& name, BagKind* kind) {
  static constexpr std::pair<const char*, BagKind> kKinds[] = {
      {"segment_ids", BagKind::kSegmentIds},
      {"row_splits", BagKind::kRowSplits},
      {"dense", BagKind::kDense},
      {"padded", BagKind::kPadded},
  };
  for (const auto& [kind_name, value] : kKinds) {
    if (name == kind_name) {
      *kind = value;
      return absl::OkStatus();
    }
  }
  return InvalidArgument(
      "bag_kinds must be 'segment_ids', 'row_splits', 'dense' or 'padded', "
      "got '",
      name, "'");
}

absl::Status ParseBagCount(const std::string& name, BagCount* count) {
  static constexpr std::pair<const char*, BagCount> kCounts[] = {
      {"given", BagCount::kGiven},
      {"rows_of_bags", BagCount::kRowsOfBags},
      {"rows_with_ids", BagCount::kRowsWithIds},
  };
  for (const auto& [count_name, value] : kCounts) {
    if (name == count_name) {
      *count = value;
      return absl::OkStatus();
    }
  }
  return InvalidArgument(
      "bag_counts must be 'given', 'rows_of_bags' or 'rows_with_ids', got '",
      name, "'");
}

int64_t BatchedAttrs::InputIndex(BatchedInput list, int64_t f) const {
  const int64_t position = Position(list, f);
  if (position < 0) return -1;
  int64_t first = 0;
  for (int l = 0; l < static_cast<int>(list); ++l) first += list_sizes[l];
  return first + position;
}

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
                               BatchedAttrs* attrs) {
  const int64_t n = num_features;
  if (n == 0) {
    return InvalidArgument(
        "the op needs at least one table: table inputs (Ttables) or their "
        "variables' names (attr table_names)");
  }
  if (!table_names.empty() && !dtypes.empty()) {
    return InvalidArgument(
        "attr table_names names the tables' variables, so there must be no "
        "table inputs, but Ttables has ",
        dtypes.size());
  }
  const std::pair<const char*, size_t> lists[] = {
      {"row_formats", row_formats.size()},
      {"dims", dims.size()},
      {"combiners", combiners.size()},
      {"bag_kinds", bag_kinds.size()},
      {"bag_counts", bag_counts.size()},
      {"weighted", weighted.size()},
      {"Tids (the ids inputs)", static_cast<size_t>(input_lists.ids)},
  };
  for (const auto& [name, size] : lists) {
    if (static_cast<int64_t>(size) != n) {
      return InvalidArgument("attr ", name,
                             " must have one entry per "
                             "feature (N = ",
                             n, "), but has ", size);
    }
  }
  if (!table_dtypes.empty() && static_cast<int64_t>(table_dtypes.size()) != n) {
    return InvalidArgument(
        "attr table_dtypes must be empty (every table a tensor) or have one "
        "entry per feature (N = ",
        n, "), but has ", table_dtypes.size());
  }
  if (!names.empty() && static_cast<int64_t>(names.size()) != n) {
    return InvalidArgument(
        "attr feature_names must be empty or have one "
        "name per feature (N = ",
        n, "), but has ", names.size());
  }
  const int64_t want_outputs = concat ? 1 : n;
  if (num_outputs != want_outputs) {
    return InvalidArgument(
        "attr num_outputs must be ", want_outputs, " (",
        concat ? "one concatenated output" : "one output per feature",
        ", concat = ", concat ? "true" : "false", "), got ", num_outputs);
  }
  attrs->num_features = n;
  attrs->concat = concat;
  attrs->names = names;
  attrs->dims = dims;
  attrs->storages.assign(n, Storage::kInt8Split);
  attrs->table_names = table_names;
  attrs->table_is_handle.assign(n, !table_names.empty());
  attrs->table_dtypes = dtypes;
  attrs->table_dtypes.resize(n, tensorflow::DT_RESOURCE);
  attrs->combiners.assign(n, Combiner::kSum);
  attrs->bag_kinds.assign(n, BagKind::kSegmentIds);
  attrs->bag_counts.assign(n, BagCount::kGiven);
  for (auto& positions : attrs->positions) positions.assign(n, -1);
  int64_t counts[kNumBatchedInputs] = {};
  auto place = [&](BatchedInput list, int64_t f) {
    const int l = static_cast<int>(list);
    attrs->positions[l][f] = counts[l]++;
  };
  for (int64_t f = 0; f < n; ++f) {
    // The combiner first, as TF checks the single op's enum attr before
    // its kernel reads the table format.
    TF_RETURN_IF_ERROR(
        attrs->Labeled(f, ParseCombiner(combiners[f], &attrs->combiners[f])));
    if (table_names.empty()) {
      attrs->table_is_handle[f] = dtypes[f] == tensorflow::DT_RESOURCE;
    } else if (table_names[f].empty()) {
      return attrs->Labeled(
          f, InvalidArgument("attr table_names gives its table no name"));
    }
    tensorflow::DataType table_dtype = attrs->table_dtypes[f];
    if (!table_dtypes.empty()) {
      table_dtype = table_dtypes[f];
      if (!attrs->table_is_handle[f] && dtypes[f] != table_dtype) {
        return attrs->Labeled(
            f, InvalidArgument("table is ", tensorflow::DataTypeString(dtypes[f]),
                               " but table_dtypes says ",
                               tensorflow::DataTypeString(table_dtype)));
      }
    } else if (attrs->table_is_handle[f]) {
      return attrs->Labeled(
          f, InvalidArgument("a table given as a resource variable needs "
                             "its dtype in attr table_dtypes"));
    }
    attrs->table_dtypes[f] = table_dtype;
    TF_RETURN_IF_ERROR(
        attrs->Labeled(f, ParseTableFormat(table_dtype, row_formats[f],
                                           dims[f], &attrs->storages[f])));
    TF_RETURN_IF_ERROR(
        attrs->Labeled(f, ParseBagKind(bag_kinds[f], &attrs->bag_kinds[f])));
    TF_RETURN_IF_ERROR(attrs->Labeled(
        f, ParseBagCount(bag_counts[f], &attrs->bag_counts[f])));
    const BagKind kind = attrs->bag_kinds[f];
    if (table_names.empty()) place(BatchedInput::kTables, f);
    if (attrs->storages[f] == Storage::kInt8Split) {
      place(BatchedInput::kScales, f);
    }
    place(BatchedInput::kIds, f);
    if (kind == BagKind::kSegmentIds || kind == BagKind::kRowSplits) {
      place(BatchedInput::kBagSplits, f);
    }
    if (weighted[f]) place(BatchedInput::kWeights, f);
    if (attrs->bag_counts[f] == BagCount::kGiven) {
      place(BatchedInput::kNumBags, f);
    }
  }
  const std::pair<const char*, int64_t> needed[] = {
      {"num_scales (the scales inputs): one per 'plain' int8 table",
       input_lists.scales},
      {nullptr, input_lists.ids},  // N, checked above
      {"Tsplits (the bag_splits inputs): one per 'segment_ids' or "
       "'row_splits' feature",
       input_lists.splits},
      {"num_weights (the weights inputs): one per weighted feature",
       input_lists.weights},
      {"Tnum_bags (the num_bags inputs): one per feature whose bag_counts "
       "is 'given'",
       input_lists.num_bags},
  };
  for (int l = 1; l < kNumBatchedInputs; ++l) {
    const auto& [what, size] = needed[l - 1];
    if (what != nullptr && size != counts[l]) {
      return InvalidArgument("attr ", what, ": ", counts[l],
                             " for these features, but has ", size);
    }
  }
  std::copy(std::begin(counts), std::end(counts), attrs->list_sizes);
  return absl::OkStatus();
}

}  // namespace tfce
