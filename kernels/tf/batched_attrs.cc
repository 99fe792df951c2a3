#include "kernels/tf/batched_attrs.h"

#include "absl/strings/str_cat.h"
#include "kernels/tf/bag_inputs.h"
#include "kernels/tf/op_util.h"
#include "kernels/tf/table_format.h"

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

absl::Status ParseBatchedAttrs(int64_t num_features, bool concat,
                               int64_t num_outputs,
                               const std::vector<tensorflow::DataType>& dtypes,
                               const InputListSizes& input_lists,
                               const std::vector<std::string>& row_formats,
                               const std::vector<int64_t>& dims,
                               const std::vector<std::string>& combiners,
                               const std::vector<std::string>& bag_kinds,
                               const std::vector<std::string>& names,
                               BatchedAttrs* attrs) {
  const int64_t n = num_features;
  const std::pair<const char*, size_t> lists[] = {
      {"Ttables", dtypes.size()},
      {"row_formats", row_formats.size()},
      {"dims", dims.size()},
      {"combiners", combiners.size()},
      {"bag_kinds", bag_kinds.size()},
      {"Tids (the ids inputs)", input_lists.ids},
      {"Tsplits (the bag_splits inputs)", input_lists.splits},
      {"Tnum_bags (the num_bags inputs)", input_lists.num_bags},
  };
  for (const auto& [name, size] : lists) {
    if (static_cast<int64_t>(size) != n) {
      return InvalidArgument("attr ", name,
                             " must have one entry per "
                             "feature (N = ",
                             n, "), but has ", size);
    }
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
  attrs->combiners.assign(n, Combiner::kSum);
  attrs->bag_kinds.assign(n, BagKind::kSegmentIds);
  for (int64_t f = 0; f < n; ++f) {
    // The combiner first, as TF checks the single op's enum attr before
    // its kernel reads the table format.
    TF_RETURN_IF_ERROR(
        attrs->Labeled(f, ParseCombiner(combiners[f], &attrs->combiners[f])));
    TF_RETURN_IF_ERROR(
        attrs->Labeled(f, ParseTableFormat(dtypes[f], row_formats[f], dims[f],
                                           &attrs->storages[f])));
    TF_RETURN_IF_ERROR(
        attrs->Labeled(f, ParseBagKind(bag_kinds[f], &attrs->bag_kinds[f])));
  }
  return absl::OkStatus();
}

}  // namespace tfce
