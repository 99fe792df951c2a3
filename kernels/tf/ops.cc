// Every op of the library is registered here, with closed type lists and
// shape functions. Names are fixed: rewritten SavedModels depend on them.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "kernels/core/kernel_api.h"
#include "kernels/tf/table_format.h"

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

}  // namespace tfce
