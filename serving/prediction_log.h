// Request records of the serving harness: `tensorflow.serving.PredictionLog`
// protos (the format of assets.extra/tf_serving_warmup_requests) decoded by
// hand from the protobuf wire format, so the harness needs no TF Serving
// protos; only the TensorProto values are parsed with TensorFlow's generated
// class. And the harness's error handling, which the decoding shares.
#ifndef TFCE_SERVING_PREDICTION_LOG_H_
#define TFCE_SERVING_PREDICTION_LOG_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "tensorflow/core/framework/tensor.h"

namespace tfce_harness {

// TF Serving's signature when a request names none.
constexpr char kDefaultSignature[] = "serving_default";

// Any failure: reported on stderr by main(), exit status 1.
struct Failure {
  std::string message;
};

[[noreturn]] inline void Fail(const std::string& message) {
  throw Failure{message};
}

inline void Check(const absl::Status& status, const std::string& context) {
  if (!status.ok()) Fail(context + ": " + std::string(status.ToString()));
}

// One PredictRequest, its inputs already converted to Tensors.
struct Request {
  std::string signature;
  std::vector<std::pair<std::string, tensorflow::Tensor>> inputs;  // by key
};

// Decodes record `index` of a requests file; Fail()s on anything but a
// PredictLog with valid TensorProto inputs.
Request DecodePredictionLog(const std::string& record, size_t index);

// Every record of the TFRecord file at `path`.
std::vector<Request> ReadRequests(const std::string& path);

}  // namespace tfce_harness

#endif  // TFCE_SERVING_PREDICTION_LOG_H_
