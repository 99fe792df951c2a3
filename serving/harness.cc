// Serving harness: a stand-in for TF Serving in tests and benchmarks.
//
// Loads a SavedModel with TensorFlow's own loader (tensorflow::LoadSavedModel,
// the one TF Serving uses), optionally replays its warmup requests the way TF
// Serving's `enable_model_warmup` does, then replays PredictRequests through
// Session::Run on the SignatureDef's tensor names (what TF Serving's Predict
// does) from 1..N client threads sharing the session, and prints one JSON
// report on stdout. See serving/README.md for the flags and the report.
//
// Requests are `tensorflow.serving.PredictionLog` records (the format of
// assets.extra/tf_serving_warmup_requests), decoded by prediction_log.cc.

#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "serving/prediction_log.h"
#include "tensorflow/c/c_api.h"  // TF_Version
#include "tensorflow/cc/saved_model/loader.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/lib/io/record_writer.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/protobuf/named_tensor.pb.h"
#include "tensorflow/core/public/session.h"

namespace tfce_harness {
namespace {

using Clock = std::chrono::steady_clock;

// The tag TF Serving loads (tag_constants.h is not in the pip wheel).
constexpr char kServeTag[] = "serve";
constexpr char kWarmupFile[] = "assets.extra/tf_serving_warmup_requests";

// ---------------------------------------------------------------------------
// Command line

struct Options {
  std::string model;
  std::string ops;
  std::string signature = kDefaultSignature;
  std::string
      requests;  // empty: <model>/assets.extra/tf_serving_warmup_requests
  std::string dump_outputs;
  bool warmup = false;
  long iterations = 200;
  std::vector<int> threads = {1};
  int intra_op_threads = 0;  // 0: TensorFlow's default (all cores)
  int inter_op_threads = 0;
};

constexpr char kUsage[] =
    "usage: harness --model DIR [--ops LIB.so] [--signature KEY]\n"
    "               [--requests FILE] [--warmup] [--iterations N]\n"
    "               [--threads 1,2,...] [--intra-op-threads N]\n"
    "               [--inter-op-threads N] [--dump-outputs FILE]\n";

[[noreturn]] void UsageError(const std::string& message) {
  std::fprintf(stderr, "harness: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

long ParseInt(const std::string& flag, const std::string& text, long min) {
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < min) {
    UsageError(flag + " needs an integer >= " + std::to_string(min) +
               ", got '" + text + "'");
  }
  return value;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (flag == "--warmup") {
      o.warmup = true;
      continue;
    }
    if (i + 1 >= argc) UsageError(flag + " needs a value");
    std::string value = argv[++i];
    if (flag == "--model") {
      o.model = value;
    } else if (flag == "--ops") {
      o.ops = value;
    } else if (flag == "--signature") {
      o.signature = value;
    } else if (flag == "--requests") {
      o.requests = value;
    } else if (flag == "--dump-outputs" || flag == "--outputs") {
      o.dump_outputs = value;
    } else if (flag == "--iterations") {
      o.iterations = ParseInt(flag, value, 0);
    } else if (flag == "--intra-op-threads") {
      o.intra_op_threads = static_cast<int>(ParseInt(flag, value, 0));
    } else if (flag == "--inter-op-threads") {
      o.inter_op_threads = static_cast<int>(ParseInt(flag, value, 0));
    } else if (flag == "--threads") {
      o.threads.clear();
      std::stringstream list(value);
      std::string item;
      while (std::getline(list, item, ',')) {
        o.threads.push_back(static_cast<int>(ParseInt(flag, item, 1)));
      }
      if (o.threads.empty()) UsageError("--threads needs a list like 1,2,4");
    } else {
      UsageError("unknown flag " + flag);
    }
  }
  if (o.model.empty()) UsageError("--model is required");
  if (o.requests.empty()) o.requests = o.model + "/" + kWarmupFile;
  return o;
}

// ---------------------------------------------------------------------------
// Running a request the way TF Serving's Predict does

// A request bound to the session: feeds and fetches by tensor name.
struct BoundRequest {
  std::string signature;
  std::vector<std::pair<std::string, tensorflow::Tensor>> feeds;
  std::vector<std::string> output_keys;  // sorted
  std::vector<std::string> fetches;      // tensor names, same order
};

std::string TensorName(const tensorflow::TensorInfo& info,
                       const std::string& what) {
  if (info.encoding_case() != tensorflow::TensorInfo::kName) {
    Fail(what + " is a composite tensor; only dense tensors are supported");
  }
  return info.name();
}

BoundRequest Bind(const tensorflow::SavedModelBundle& bundle,
                  const Request& request, size_t index) {
  const std::string where = "request record " + std::to_string(index);
  const auto& signatures = bundle.GetSignatures();
  auto it = signatures.find(request.signature);
  if (it == signatures.end()) {
    std::string names;
    for (const auto& [name, def] : signatures) names += " '" + name + "'";
    Fail(where + ": the model has no signature '" + request.signature +
         "' (it has" + names + ")");
  }
  const tensorflow::SignatureDef& def = it->second;
  BoundRequest bound;
  bound.signature = request.signature;
  // TF Serving refuses requests whose input keys differ from the signature's.
  if (request.inputs.size() != static_cast<size_t>(def.inputs_size())) {
    Fail(where + ": " + std::to_string(request.inputs.size()) +
         " inputs given, signature '" + request.signature + "' has " +
         std::to_string(def.inputs_size()));
  }
  for (const auto& [key, tensor] : request.inputs) {
    auto input = def.inputs().find(key);
    if (input == def.inputs().end()) {
      Fail(where + ": signature '" + request.signature + "' has no input '" +
           key + "'");
    }
    if (input->second.dtype() != tensor.dtype()) {
      Fail(where + ": input '" + key + "' is " +
           tensorflow::DataTypeString(tensor.dtype()) +
           ", the signature expects " +
           tensorflow::DataTypeString(input->second.dtype()));
    }
    bound.feeds.emplace_back(TensorName(input->second, "input '" + key + "'"),
                             tensor);
  }
  for (const auto& [key, info] : def.outputs())
    bound.output_keys.push_back(key);
  std::sort(bound.output_keys.begin(), bound.output_keys.end());
  for (const auto& key : bound.output_keys) {
    bound.fetches.push_back(
        TensorName(def.outputs().at(key), "output '" + key + "'"));
  }
  return bound;
}

absl::Status Run(tensorflow::Session* session, const BoundRequest& request,
                 std::vector<tensorflow::Tensor>* outputs) {
  tensorflow::RunOptions run_options;
  tensorflow::RunMetadata metadata;
  return session->Run(run_options, request.feeds, request.fetches, {}, outputs,
                      &metadata);
}

// ---------------------------------------------------------------------------
// Measurements

double ReadStatusMiB(
    const char* field) {  // a "VmXXX:  N kB" line of /proc/self/status
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(status, line)) {
    if (line.compare(0, prefix.size(), prefix) == 0) {
      return std::strtod(line.c_str() + prefix.size(), nullptr) / 1024.0;
    }
  }
  return 0.0;
}

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Nearest-rank percentile of sorted values.
double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * sorted.size()));
  return sorted[std::min(sorted.size(), std::max<size_t>(rank, 1)) - 1];
}

struct RunStats {
  int threads;
  long requests;
  double p50_ms, p99_ms, mean_ms, throughput_rps, seconds;
  // The process's CPU time (every thread: clients, TF's pools) over the
  // run, per request: what a request costs a loaded server.
  double cpu_ms_per_request;
};

double ProcessCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// `iterations` requests (cycling through `requests`) issued by `threads`
// client threads that each take the next request as soon as the last returns.
RunStats Replay(tensorflow::Session* session,
                const std::vector<BoundRequest>& requests, long iterations,
                int threads) {
  std::atomic<long> next{0};
  std::atomic<bool> failed{false};
  std::vector<std::vector<double>> latencies(threads);
  std::vector<absl::Status> errors(threads);
  auto client = [&](int t) {
    std::vector<tensorflow::Tensor> outputs;
    while (!failed.load(std::memory_order_relaxed)) {
      long i = next.fetch_add(1);
      if (i >= iterations) break;
      auto start = Clock::now();
      absl::Status status =
          Run(session, requests[i % requests.size()], &outputs);
      latencies[t].push_back(Seconds(start) * 1e3);
      if (!status.ok()) {
        errors[t] = status;
        failed = true;
      }
    }
  };
  auto start = Clock::now();
  const double cpu_start = ProcessCpuSeconds();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(client, t);
  for (auto& thread : pool) thread.join();
  double seconds = Seconds(start);
  const double cpu_seconds = ProcessCpuSeconds() - cpu_start;
  for (const auto& error : errors) Check(error, "Session::Run failed");

  std::vector<double> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  double sum = 0;
  for (double v : all) sum += v;
  return {threads,
          static_cast<long>(all.size()),
          Percentile(all, 50),
          Percentile(all, 99),
          all.empty() ? 0.0 : sum / all.size(),
          seconds > 0 ? all.size() / seconds : 0.0,
          seconds,
          all.empty() ? 0.0 : cpu_seconds * 1e3 / all.size()};
}

// Writes every output of every request: a TFRecord of NamedTensorProto, one
// record per output, requests in file order, outputs in sorted key order,
// each named "<record index>/<signature>/<output key>".
void DumpOutputs(tensorflow::Session* session,
                 const std::vector<BoundRequest>& requests,
                 const std::string& path) {
  std::unique_ptr<tensorflow::WritableFile> file;
  Check(tensorflow::Env::Default()->NewWritableFile(path, &file),
        "cannot create " + path);
  tensorflow::io::RecordWriter writer(file.get());
  for (size_t i = 0; i < requests.size(); ++i) {
    std::vector<tensorflow::Tensor> outputs;
    Check(Run(session, requests[i], &outputs),
          "request record " + std::to_string(i) + " failed");
    for (size_t k = 0; k < outputs.size(); ++k) {
      tensorflow::NamedTensorProto named;
      named.set_name(std::to_string(i) + "/" + requests[i].signature + "/" +
                     requests[i].output_keys[k]);
      outputs[k].AsProtoTensorContent(named.mutable_tensor());
      std::string bytes;
      named.SerializeToString(&bytes);
      Check(writer.WriteRecord(bytes), "cannot write " + path);
    }
  }
  Check(writer.Close(), "cannot write " + path);
  Check(file->Close(), "cannot write " + path);
}

// ---------------------------------------------------------------------------
// JSON output

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

int Main(const Options& o) {
  if (!o.ops.empty()) {
    // RTLD_GLOBAL so the library binds to (and registers its ops and kernels
    // in) the TensorFlow already loaded in this process.
    if (!dlopen(o.ops.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      Fail(std::string("cannot load op library: ") + dlerror());
    }
  }

  tensorflow::SessionOptions session_options;
  session_options.config.set_intra_op_parallelism_threads(o.intra_op_threads);
  session_options.config.set_inter_op_parallelism_threads(o.inter_op_threads);
  tensorflow::SavedModelBundle bundle;
  // What the process holds before the model (TF runtime, op library): the
  // model's own resident memory is rss_after_load - rss_before_load.
  const double rss_before_load = ReadStatusMiB("VmRSS");
  auto load_start = Clock::now();
  Check(tensorflow::LoadSavedModel(session_options, tensorflow::RunOptions(),
                                   o.model, {kServeTag}, &bundle),
        "cannot load SavedModel " + o.model);
  double load_seconds = Seconds(load_start);
  double rss_after_load = ReadStatusMiB("VmRSS");
  tensorflow::Session* session = bundle.GetSession();

  // A missing default warmup file is not an error (TF Serving skips warmup
  // then); a missing --requests file is.
  std::vector<Request> requests;
  bool have_requests = tensorflow::Env::Default()->FileExists(o.requests).ok();
  if (have_requests || o.requests != o.model + "/" + kWarmupFile) {
    requests = ReadRequests(o.requests);
  }
  std::vector<BoundRequest> bound;
  for (size_t i = 0; i < requests.size(); ++i)
    bound.push_back(Bind(bundle, requests[i], i));

  // Warmup: every record once, in order, any failure fatal (TF Serving then
  // marks the model version as failed to load).
  double warmup_seconds = 0;
  if (o.warmup) {
    auto start = Clock::now();
    std::vector<tensorflow::Tensor> outputs;
    for (size_t i = 0; i < bound.size(); ++i) {
      Check(Run(session, bound[i], &outputs),
            "warmup request record " + std::to_string(i) + " (signature '" +
                bound[i].signature + "') failed");
    }
    warmup_seconds = Seconds(start);
  }

  if (!o.dump_outputs.empty()) DumpOutputs(session, bound, o.dump_outputs);

  std::vector<RunStats> runs;
  if (o.iterations > 0) {
    std::vector<BoundRequest> selected;
    for (const auto& request : bound) {
      if (request.signature == o.signature) selected.push_back(request);
    }
    if (selected.empty()) {
      Fail("no request for signature '" + o.signature + "' in " + o.requests);
    }
    // One untimed pass: the first Run of a feed/fetch set builds its executor,
    // which a server has done before traffic arrives.
    std::vector<tensorflow::Tensor> outputs;
    for (const auto& request : selected) {
      Check(Run(session, request, &outputs), "Session::Run failed");
    }
    for (int threads : o.threads) {
      runs.push_back(Replay(session, selected, o.iterations, threads));
    }
  }

  std::ostringstream json;
  json << "{\"model\": " << Quote(o.model)
       << ", \"signature\": " << Quote(o.signature)
       << ", \"ops\": " << (o.ops.empty() ? "null" : Quote(o.ops))
       << ", \"tensorflow\": " << Quote(TF_Version())
       << ", \"requests_file\": " << Quote(o.requests)
       << ", \"records\": " << requests.size()
       << ", \"intra_op_threads\": " << o.intra_op_threads
       << ", \"inter_op_threads\": " << o.inter_op_threads
       << ", \"load_seconds\": " << Number(load_seconds)
       << ", \"warmup_records\": " << (o.warmup ? bound.size() : 0)
       << ", \"warmup_seconds\": " << Number(warmup_seconds)
       << ", \"rss_before_load_mib\": " << Number(rss_before_load)
       << ", \"rss_after_load_mib\": " << Number(rss_after_load)
       << ", \"rss_final_mib\": " << Number(ReadStatusMiB("VmRSS"))
       << ", \"peak_rss_mib\": " << Number(ReadStatusMiB("VmHWM"))
       << ", \"iterations\": " << o.iterations << ", \"runs\": [";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunStats& r = runs[i];
    json << (i ? ", " : "") << "{\"threads\": " << r.threads
         << ", \"requests\": " << r.requests
         << ", \"p50_ms\": " << Number(r.p50_ms)
         << ", \"p99_ms\": " << Number(r.p99_ms)
         << ", \"mean_ms\": " << Number(r.mean_ms)
         << ", \"throughput_rps\": " << Number(r.throughput_rps)
         << ", \"seconds\": " << Number(r.seconds)
         << ", \"cpu_ms_per_request\": " << Number(r.cpu_ms_per_request) << "}";
  }
  json << "]}\n";
  std::fputs(json.str().c_str(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace tfce_harness

int main(int argc, char** argv) {
  using namespace tfce_harness;  // NOLINT(build/namespaces)
  Options options = ParseArgs(argc, argv);
  try {
    return Main(options);
  } catch (const Failure& failure) {
    std::fprintf(stderr, "harness: error: %s\n", failure.message.c_str());
    return 1;
  }
}
