// Every op of the library is registered here, with closed type lists and
// shape functions. Names are fixed: rewritten SavedModels depend on them.
#include "kernels/core/kernel_api.h"
#include "kernels/tf/batched_attrs.h"
#include "kernels/tf/op_util.h"
#include "kernels/tf/table_format.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfce {
namespace {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// table [V, D] (row_format 'plain') or [V, record bytes] (rowwise, D the
// `dim` attr); scales [V] (int8) or [0]. Returns D. The attrs' agreement with
// T is checked here too, so a bad node fails when the graph is built.
absl::Status TableDim(InferenceContext* c, DimensionHandle* dim) {
  ShapeHandle table, scales;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &table));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &scales));
  std::string row_format;
  int64_t dim_attr = -1;
  ::tensorflow::DataType dtype;
  TF_RETURN_IF_ERROR(c->GetAttr("row_format", &row_format));
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim_attr));
  TF_RETURN_IF_ERROR(c->GetAttr("T", &dtype));
  Storage storage;
  TF_RETURN_IF_ERROR(ParseTableFormat(dtype, row_format, dim_attr, &storage));
  *dim = row_format == "plain" ? c->Dim(table, 1) : c->MakeDim(dim_attr);
  return absl::OkStatus();
}

absl::Status LookupShape(InferenceContext* c) {
  DimensionHandle dim;
  TF_RETURN_IF_ERROR(TableDim(c, &dim));
  ShapeHandle out;
  TF_RETURN_IF_ERROR(c->Concatenate(c->input(2), c->Vector(dim), &out));
  c->set_output(0, out);
  return absl::OkStatus();
}

absl::Status FusedDecodeAxpyShape(InferenceContext* c) {
  DimensionHandle dim;
  TF_RETURN_IF_ERROR(TableDim(c, &dim));
  ShapeHandle ids, segment_ids, weights, num_segments;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &ids));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &segment_ids));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &weights));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 0, &num_segments));
  TF_RETURN_IF_ERROR(c->Merge(ids, segment_ids, &ids));
  DimensionHandle bags;
  TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(5, &bags));
  c->set_output(0, c->Matrix(bags, dim));
  return absl::OkStatus();
}

absl::Status BatchedFusedDecodeAxpyShape(InferenceContext* c) {
  BatchedAttrs attrs;
  TF_RETURN_IF_ERROR(ReadBatchedAttrs(c, &attrs));
  const int64_t n = attrs.num_features;
  // Feature f's input in `list`: rank-checked into *shape (left alone when
  // the feature has none there).
  auto with_rank = [&](BatchedInput list, int64_t f, int rank, bool at_most,
                       ShapeHandle* shape) {
    const int64_t index = attrs.InputIndex(list, f);
    if (index < 0) return absl::OkStatus();
    const ShapeHandle given = c->input(static_cast<int>(index));
    return at_most ? c->WithRankAtMost(given, rank, shape)
                   : c->WithRank(given, rank, shape);
  };
  std::vector<DimensionHandle> bags(n), dims(n);
  for (int64_t f = 0; f < n; ++f) {
    ShapeHandle table, scales, ids, splits, weights, num_bags;
    const BagKind kind = attrs.bag_kinds[f];
    const BagCount count = attrs.bag_counts[f];
    const bool matrix = kind == BagKind::kDense || kind == BagKind::kPadded;
    absl::Status status;
    if (!attrs.table_names.empty()) {  // a variable known by name only
      table = c->UnknownShapeOfRank(2);
    } else if (attrs.table_is_handle[f]) {  // the variable's shape, if known
      const auto* handle = c->input_handle_shapes_and_types(static_cast<int>(
          attrs.InputIndex(BatchedInput::kTables, f)));
      table = handle != nullptr && handle->size() == 1 ? (*handle)[0].shape
                                                       : c->UnknownShape();
      status = c->WithRank(table, 2, &table);
    } else {
      status = with_rank(BatchedInput::kTables, f, 2, false, &table);
    }
    if (status.ok()) {
      status = with_rank(BatchedInput::kScales, f, 1, false, &scales);
    }
    if (status.ok()) {
      status = with_rank(BatchedInput::kIds, f, matrix ? 2 : 1, false, &ids);
    }
    if (status.ok()) {
      status = with_rank(BatchedInput::kBagSplits, f, 1, false, &splits);
    }
    if (status.ok()) {
      status = with_rank(BatchedInput::kWeights, f, matrix ? 2 : 1, true,
                         &weights);
    }
    if (status.ok()) {
      status = with_rank(BatchedInput::kNumBags, f, 0, false, &num_bags);
    }
    if (status.ok() && kind == BagKind::kSegmentIds) {
      status = c->Merge(ids, splits, &ids);
    }
    // The rows the bag structure gives: a given num_bags must equal them
    // for row splits and dense ids, so the two dims merge.
    DimensionHandle structure_rows = c->UnknownDim();
    if (!status.ok()) {
      // Named below.
    } else if (kind == BagKind::kRowSplits) {
      status = c->Subtract(c->Dim(splits, 0), 1, &structure_rows);
    } else if (matrix) {
      structure_rows = c->Dim(ids, 0);
    }
    if (!status.ok()) {
      // Named below.
    } else if (count == BagCount::kGiven) {
      status = c->MakeDimForScalarInput(
          static_cast<int>(attrs.InputIndex(BatchedInput::kNumBags, f)),
          &bags[f]);
      if (status.ok() &&
          (kind == BagKind::kRowSplits || kind == BagKind::kDense)) {
        status = c->Merge(bags[f], structure_rows, &bags[f]);
      }
    } else if (count == BagCount::kRowsWithIds ||
               kind == BagKind::kSegmentIds) {
      bags[f] = c->UnknownDim();  // counted from the values
    } else {  // the rows of the row splits, dense or padded ids
      bags[f] = structure_rows;
    }
    TF_RETURN_IF_ERROR(attrs.Labeled(f, status));
    dims[f] = attrs.dims[f] < 0 ? c->Dim(table, 1) : c->MakeDim(attrs.dims[f]);
  }
  if (!attrs.concat) {
    for (int64_t f = 0; f < n; ++f) {
      c->set_output(static_cast<int>(f), c->Matrix(bags[f], dims[f]));
    }
    return absl::OkStatus();
  }
  DimensionHandle rows = bags[0], width = dims[0];
  for (int64_t f = 1; f < n; ++f) {
    TF_RETURN_IF_ERROR(attrs.Labeled(f, c->Merge(rows, bags[f], &rows)));
    TF_RETURN_IF_ERROR(c->Add(width, dims[f], &width));
  }
  c->set_output(0, c->Matrix(rows, width));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("CompressedEmbeddingLookup")
    .Input("table: T")
    .Input("scales: float")
    .Input("ids: Tidx")
    .Output("output: float")
    .Attr("T: {int8, half, uint8}")
    .Attr("row_format: {'plain', 'int8_rowwise', 'int4_rowwise'} = 'plain'")
    .Attr("dim: int = -1")
    .Attr("Tidx: {int32, int64} = DT_INT64")
    .SetShapeFn(LookupShape)
    .Doc(R"doc(
Gathers rows of a compressed embedding table and decodes them to float32.

output[i..., :] = decode(table[ids[i...], :]) where decode is
float(table[r, :]) * scales[r] for int8 tables, float(table[r, :]) for
half tables (whose scales must be an empty vector), and q * scale (+ bias)
from a row's record for rowwise formats.

table: [V, D] int8 or half rows (row_format 'plain'), or uint8 [V, R]
  records of rowwise formats (R = 4 + D for 'int8_rowwise', 4 + ceil(D/2)
  for 'int4_rowwise'; tf_compressed_embedding/quantization.py defines them).
scales: float32 [V] for int8 tables, [0] for every other table.
row_format: 'plain': the layout T names (int8 with separate scales, or
  half); a rowwise layout: one record per row with its scale (and bias)
  inline, T uint8.
dim: D, for rowwise formats (whose records do not give it); -1 for 'plain'.
ids: ids of any shape, each in [0, V).
output: float32, shape ids.shape + [D].
)doc");

REGISTER_OP("FusedDecodeAxpy")
    .Input("table: T")
    .Input("scales: float")
    .Input("ids: Tidx")
    .Input("segment_ids: Tseg")
    .Input("weights: float")
    .Input("num_segments: Tnumsegments")
    .Output("output: float")
    .Attr("T: {int8, half, uint8}")
    .Attr("row_format: {'plain', 'int8_rowwise', 'int4_rowwise'} = 'plain'")
    .Attr("dim: int = -1")
    .Attr("Tidx: {int32, int64} = DT_INT64")
    .Attr("Tseg: {int32, int64} = DT_INT64")
    .Attr("Tnumsegments: {int32, int64} = DT_INT64")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'} = 'sum'")
    .SetShapeFn(FusedDecodeAxpyShape)
    .Doc(R"doc(
Decodes looked-up rows of a compressed table and pools them per segment in
one pass (the decoded rows are never written to memory).

output[s, :] = sum over i with segment_ids[i] == s of
weights[i] * decode(table[ids[i], :]), divided by sum(weights) for 'mean'
and by sqrt(sum(weights^2)) for 'sqrtn'. Unweighted when weights is empty.
An empty segment or a zero denominator gives zeros. These are the semantics
of tf.nn.embedding_lookup_sparse.

table: [V, D] int8 or half rows (row_format 'plain'), or uint8 [V, R]
  records of rowwise formats (R = 4 + D for 'int8_rowwise', 4 + ceil(D/2)
  for 'int4_rowwise'; tf_compressed_embedding/quantization.py defines them).
scales: float32 [V] for int8 tables, [0] for every other table.
row_format: 'plain': the layout T names (int8 with separate scales, or
  half); a rowwise layout: one record per row with its scale (and bias)
  inline, T uint8.
dim: D, for rowwise formats (whose records do not give it); -1 for 'plain'.
ids: [N] ids, each in [0, V).
segment_ids: [N] sorted segment ids, each in [0, num_segments).
weights: [N] float32 per-id weights, or [0] for unweighted.
num_segments: scalar >= 0, the number of output rows.
output: float32 [num_segments, D].
)doc");

REGISTER_OP("BatchedFusedDecodeAxpy")
    .Input("tables: Ttables")
    .Input("scales: num_scales * float")
    .Input("ids: Tids")
    .Input("bag_splits: Tsplits")
    .Input("weights: num_weights * float")
    .Input("num_bags: Tnum_bags")
    .Output("outputs: num_outputs * float")
    .Attr("Ttables: list({int8, half, uint8, resource}) >= 0")
    .Attr("table_dtypes: list({int8, half, uint8}) >= 0 = []")
    .Attr("table_names: list(string) = []")
    .Attr("num_scales: int >= 0 = 0")
    .Attr("Tids: list({int32, int64})")
    .Attr("Tsplits: list({int32, int64}) >= 0 = []")
    .Attr("num_weights: int >= 0 = 0")
    .Attr("Tnum_bags: list({int32, int64}) >= 0 = []")
    .Attr("row_formats: list(string)")
    .Attr("dims: list(int)")
    .Attr("combiners: list(string)")
    .Attr("bag_kinds: list(string)")
    .Attr("bag_counts: list(string)")
    .Attr("weighted: list(bool)")
    .Attr("concat: bool = false")
    .Attr("num_outputs: int >= 1")
    .Attr("feature_names: list(string) = []")
    .SetShapeFn(BatchedFusedDecodeAxpyShape)
    .Doc(R"doc(
Pools N features (N = len(tables), or len(table_names)), each over its own
compressed table, in one call: the
results of N FusedDecodeAxpy calls, one per feature f on tables[f] with
ids[f], its bags, its weights and combiners[f], as N outputs or (concat)
side by side in one [num_bags, sum of dims] output.

A feature has only the inputs it needs (each input costs the executor on
every call): scales if its table is 'plain' int8, bag splits if its bags
are 'segment_ids' or 'row_splits', weights if weighted[f], num_bags if
bag_counts[f] is 'given'. Each of those lists holds them in feature order.

Feature f's bags are given by bag_kinds[f]:
- 'segment_ids': its bag splits are sorted segment ids, one per id, in
  [0, num_bags), as in FusedDecodeAxpy;
- 'row_splits': its bag splits are a RaggedTensor's row splits [rows + 1]:
  bag b is ids[row_splits[b]:row_splits[b + 1]];
- 'dense': ids[f] is [rows, width] and each row is a bag;
- 'padded': ids[f] is [rows, width], and row r's ids >= 0 are bag r, the
  rest padding (the bags of the SparseTensor tf.where(ids >= 0) and
  tf.gather_nd make).
Its number of output rows by bag_counts[f]:
- 'given': its num_bags input, a scalar >= 0: exactly the rows of 'dense'
  and 'row_splits' bags, and for the other kinds at least the last row
  holding an id + 1 (the rest are empty bags);
- 'rows_of_bags': the rows of the bag structure (row splits' rows, the
  rows of dense and padded ids, the last segment id + 1);
- 'rows_with_ids': the last row holding an id + 1, as SparseSegment* ops
  without num_segments count them (the rows tf.nn.embedding_lookup_sparse
  gives a SparseTensor or a RaggedTensor).
Features may share a table (the same tensor passed twice). Errors name the
feature (and its name, when feature_names gives it).

tables: N tables: [V, D] int8 or half rows (row_formats[f] 'plain'), or
  uint8 [V, R] records of a rowwise format (as FusedDecodeAxpy's table);
  each a tensor, or a resource variable's handle that the op reads itself
  (no ReadVariableOp node per table), as read_value_no_copy() reads it: the
  variable's copy-on-read mode turned off, its buffer shared.
table_dtypes: each table's dtype (needed when a table is a handle or
  named), or empty when every table is a tensor.
table_names: empty (the tables are inputs), or instead of table inputs the
  shared name of each feature's table variable, which the op looks up in
  its device's resource manager (default container) on every call and reads
  as a handle input. For graphs run by a Session (TF Serving), where the
  variables live there by these names: no handle node per table and call.
scales: the float32 [V] scales of each 'plain' int8 table.
ids: N id tensors, each id in [0, V) of its table: vectors, or [rows,
  width] matrices for 'dense' and 'padded' features.
bag_splits: the segment ids [len(ids)] or row splits [rows + 1] of each
  'segment_ids' or 'row_splits' feature.
weights: each weighted feature's float32 per-id weights, of the shape of
  its ids ([0]: unweighted after all).
num_bags: each 'given' feature's int32 or int64 scalar number of rows.
outputs: N float32 [rows_f, D_f], or one [rows, sum D_f] (concat).
row_formats: each feature's table layout, as FusedDecodeAxpy's row_format.
dims: each feature's D for rowwise formats, -1 for 'plain'.
combiners: each feature's 'sum', 'mean' or 'sqrtn'.
bag_kinds: each feature's 'segment_ids', 'row_splits', 'dense' or 'padded'.
bag_counts: each feature's 'given', 'rows_of_bags' or 'rows_with_ids'.
weighted: whether each feature has a weights input.
concat: one [rows, sum D_f] output (every feature has the same number of
  rows) instead of one per feature.
num_outputs: 1 when concat, else N.
feature_names: empty, or a name per feature for error messages.
)doc");

}  // namespace tfce
