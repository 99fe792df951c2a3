#include "serving/prediction_log.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/lib/io/record_reader.h"
#include "tensorflow/core/platform/env.h"

namespace tfce_harness {
namespace {

// Walks the fields of one serialized message.
class WireReader {
 public:
  explicit WireReader(const std::string& data)
      : p_(data.data()), end_(data.data() + data.size()) {}

  // Reads the next field; false at the end of the message. Length-delimited
  // payloads are returned in `bytes`; other wire types are skipped.
  bool Next(uint32_t* field, int* wire_type, std::string* bytes) {
    if (p_ == end_) return false;
    uint64_t tag = Varint();
    *field = static_cast<uint32_t>(tag >> 3);
    *wire_type = static_cast<int>(tag & 7);
    switch (*wire_type) {
      case 0:
        Varint();
        break;
      case 1:
        Skip(8);
        break;
      case 5:
        Skip(4);
        break;
      case 2: {
        uint64_t length = Varint();
        const char* start = p_;
        Skip(length);
        bytes->assign(start, length);
        break;
      }
      default:  // groups (3, 4) are not used by these protos
        Fail("malformed protobuf: wire type " + std::to_string(*wire_type));
    }
    return true;
  }

 private:
  uint64_t Varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ == end_) break;
      uint8_t byte = static_cast<uint8_t>(*p_++);
      value |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if (!(byte & 0x80)) return value;
    }
    Fail("malformed protobuf: truncated varint");
  }
  void Skip(uint64_t n) {
    if (n > static_cast<uint64_t>(end_ - p_))
      Fail("malformed protobuf: truncated field");
    p_ += n;
  }
  const char* p_;
  const char* end_;
};

// Field numbers from
// tensorflow_serving/apis/{prediction_log,predict,model}.proto.
constexpr uint32_t kPredictionLogPredictLog = 6;
constexpr uint32_t kPredictLogRequest = 1;
constexpr uint32_t kPredictRequestModelSpec = 1;
constexpr uint32_t kPredictRequestInputs = 2;
constexpr uint32_t kModelSpecSignatureName = 3;
constexpr uint32_t kMapKey = 1;
constexpr uint32_t kMapValue = 2;

// Returns the last length-delimited occurrence of `field`, or false.
bool FindField(const std::string& message, uint32_t wanted, std::string* out) {
  WireReader reader(message);
  uint32_t field;
  int wire_type;
  std::string bytes;
  bool found = false;
  while (reader.Next(&field, &wire_type, &bytes)) {
    if (field == wanted && wire_type == 2) {
      *out = bytes;
      found = true;
    }
  }
  return found;
}

}  // namespace

Request DecodePredictionLog(const std::string& record, size_t index) {
  const std::string where = "request record " + std::to_string(index);
  std::string predict_log, request;
  if (!FindField(record, kPredictionLogPredictLog, &predict_log)) {
    Fail(where + " is not a PredictLog (only Predict requests are supported)");
  }
  if (!FindField(predict_log, kPredictLogRequest, &request)) {
    Fail(where + ": PredictLog has no request");
  }
  Request result;
  std::string spec;
  if (FindField(request, kPredictRequestModelSpec, &spec)) {
    FindField(spec, kModelSpecSignatureName, &result.signature);
  }
  // TF Serving's default when the request names no signature.
  if (result.signature.empty()) result.signature = kDefaultSignature;

  WireReader reader(request);
  uint32_t field;
  int wire_type;
  std::string entry;
  while (reader.Next(&field, &wire_type, &entry)) {
    if (field != kPredictRequestInputs || wire_type != 2) continue;
    std::string key, value;
    FindField(entry, kMapKey, &key);
    FindField(entry, kMapValue, &value);
    tensorflow::TensorProto proto;
    if (!proto.ParseFromString(value)) {
      Fail(where + ": input '" + key + "' is not a valid TensorProto");
    }
    tensorflow::Tensor tensor;
    if (!tensor.FromProto(proto)) {
      Fail(where + ": input '" + key + "' cannot be converted to a Tensor");
    }
    result.inputs.emplace_back(key, std::move(tensor));
  }
  std::sort(result.inputs.begin(), result.inputs.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return result;
}

std::vector<Request> ReadRequests(const std::string& path) {
  std::unique_ptr<tensorflow::RandomAccessFile> file;
  Check(tensorflow::Env::Default()->NewRandomAccessFile(path, &file),
        "cannot open requests file " + path);
  tensorflow::io::SequentialRecordReader reader(file.get());
  std::vector<Request> requests;
  tensorflow::tstring record;
  while (true) {
    absl::Status status = reader.ReadRecord(&record);
    if (absl::IsOutOfRange(status)) break;
    Check(status, "cannot read " + path);
    requests.push_back(
        DecodePredictionLog(std::string(record), requests.size()));
  }
  return requests;
}

}  // namespace tfce_harness
