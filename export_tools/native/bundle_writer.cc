// A streaming writer of TF checkpoint bundles, for the export tool.
//
// The tool encodes each table chunk by chunk and must never hold a whole table.
// TF's writers take whole tensors (SaveV2, BundleWriter::Add); writing a table
// as row slices instead does not work either: bundles holding slices of one key
// cannot be merged, and TF cannot restore fp16 tensors stored in slices
// (BundleReader::GetSliceValue has no half case). So this writes the bundle
// format itself, one whole tensor at a time per data shard, appended chunk by
// chunk with its crc32c extended on the way:
//   prefix.data-0000S-of-0000N  raw little-endian tensor bytes, per shard S;
//   prefix.index                a table (TF's TableBuilder, no compression):
//                               "" -> BundleHeaderProto, key ->
//                               BundleEntryProto.
// Tensors that are streamed together (a table's data and scales) go to
// different shards, so each stays contiguous in its own file.
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/framework/versions.pb.h"
#include "tensorflow/core/lib/hash/crc32c.h"
#include "tensorflow/core/lib/io/table_builder.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/protobuf/tensor_bundle.pb.h"
#include "tensorflow/core/util/tensor_bundle/naming.h"
#include "tensorflow/core/util/tensor_bundle/tensor_bundle.h"

#define TFCE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct Shard {
  std::unique_ptr<tensorflow::WritableFile> file;
  int64_t written = 0;
  // The tensor being appended to this shard, if any.
  bool open = false;
  std::string key;
  tensorflow::BundleEntryProto entry;
  uint32_t crc = 0;
  int64_t expected = 0;
  int64_t appended = 0;
};

struct StreamingBundle {
  std::string prefix;
  std::vector<Shard> shards;
  std::map<std::string, tensorflow::BundleEntryProto> entries;  // sorted keys
};

int Fail(const absl::Status& status, char* error, size_t error_size) {
  if (error_size) {
    const std::string text(status.message());
    std::strncpy(error, text.c_str(), error_size - 1);
    error[error_size - 1] = '\0';
  }
  return 1;
}

int Fail(const std::string& message, char* error, size_t error_size) {
  return Fail(absl::InvalidArgumentError(message), error, error_size);
}

Shard* GetShard(StreamingBundle* bundle, int shard) {
  if (shard < 0 || shard >= static_cast<int>(bundle->shards.size()))
    return nullptr;
  return &bundle->shards[shard];
}

}  // namespace

// Opens a bundle of `num_shards` data files at `prefix`; NULL on failure.
TFCE_EXPORT void* tfce_bundle_open(const char* prefix, int num_shards,
                                   char* error, size_t error_size) {
  auto bundle = std::make_unique<StreamingBundle>();
  bundle->prefix = prefix;
  bundle->shards.resize(num_shards);
  for (int s = 0; s < num_shards; ++s) {
    const std::string path = tensorflow::DataFilename(prefix, s, num_shards);
    const absl::Status status = tensorflow::Env::Default()->NewWritableFile(
        path, &bundle->shards[s].file);
    if (!status.ok()) {
      Fail(status, error, error_size);
      return nullptr;
    }
  }
  return bundle.release();
}

// Starts tensor `key` ([rank] `shape`, numeric `dtype`) in data shard `shard`.
TFCE_EXPORT int tfce_bundle_begin(void* handle, int shard, const char* key,
                                  int dtype, int rank, const int64_t* shape,
                                  char* error, size_t error_size) {
  auto* bundle = static_cast<StreamingBundle*>(handle);
  Shard* out = GetShard(bundle, shard);
  if (out == nullptr || out->open)
    return Fail("bad or busy shard", error, error_size);
  if (bundle->entries.count(key))
    return Fail("duplicate key", error, error_size);
  const auto type = static_cast<tensorflow::DataType>(dtype);
  if (!tensorflow::DataTypeCanUseMemcpy(type)) {
    return Fail("only numeric tensors can be streamed", error, error_size);
  }
  tensorflow::TensorShape full;
  for (int d = 0; d < rank; ++d) {
    const absl::Status status = full.AddDimWithStatus(shape[d]);
    if (!status.ok()) return Fail(status, error, error_size);
  }
  out->open = true;
  out->key = key;
  out->entry.Clear();
  out->entry.set_dtype(type);
  full.AsProto(out->entry.mutable_shape());
  out->entry.set_shard_id(shard);
  out->entry.set_offset(out->written);
  out->crc = 0;
  out->appended = 0;
  out->expected = full.num_elements() * tensorflow::DataTypeSize(type);
  return 0;
}

// Appends `nbytes` of the open tensor of `shard` (C order, little-endian).
TFCE_EXPORT int tfce_bundle_append(void* handle, int shard, const void* data,
                                   size_t nbytes, char* error,
                                   size_t error_size) {
  Shard* out = GetShard(static_cast<StreamingBundle*>(handle), shard);
  if (out == nullptr || !out->open)
    return Fail("no open tensor", error, error_size);
  if (out->appended + static_cast<int64_t>(nbytes) > out->expected) {
    return Fail("more bytes than the tensor's shape holds", error, error_size);
  }
  const char* bytes = static_cast<const char*>(data);
  const absl::Status status =
      out->file->Append(absl::string_view(bytes, nbytes));
  if (!status.ok()) return Fail(status, error, error_size);
  out->crc = tensorflow::crc32c::Extend(out->crc, bytes, nbytes);
  out->appended += nbytes;
  out->written += nbytes;
  return 0;
}

// Ends the open tensor of `shard`; all its bytes must have been appended.
TFCE_EXPORT int tfce_bundle_end(void* handle, int shard, char* error,
                                size_t error_size) {
  auto* bundle = static_cast<StreamingBundle*>(handle);
  Shard* out = GetShard(bundle, shard);
  if (out == nullptr || !out->open)
    return Fail("no open tensor", error, error_size);
  if (out->appended != out->expected) {
    return Fail("fewer bytes than the tensor's shape holds", error, error_size);
  }
  out->entry.set_size(out->expected);
  out->entry.set_crc32c(tensorflow::crc32c::Mask(out->crc));
  bundle->entries[out->key] = out->entry;
  out->open = false;
  return 0;
}

// Closes the data files, writes the index and frees the writer (always).
TFCE_EXPORT int tfce_bundle_finish(void* handle, char* error,
                                   size_t error_size) {
  std::unique_ptr<StreamingBundle> bundle(
      static_cast<StreamingBundle*>(handle));
  const int num_shards = static_cast<int>(bundle->shards.size());
  for (Shard& shard : bundle->shards) {
    if (shard.open)
      return Fail("a tensor was left unfinished", error, error_size);
    const absl::Status status = shard.file->Close();
    if (!status.ok()) return Fail(status, error, error_size);
  }
  std::unique_ptr<tensorflow::WritableFile> index;
  absl::Status status = tensorflow::Env::Default()->NewWritableFile(
      tensorflow::MetaFilename(bundle->prefix), &index);
  if (!status.ok()) return Fail(status, error, error_size);
  tensorflow::table::Options options;
  options.compression = tensorflow::table::kNoCompression;
  tensorflow::table::TableBuilder builder(options, index.get());
  tensorflow::BundleHeaderProto header;
  header.set_num_shards(num_shards);
  header.set_endianness(tensorflow::BundleHeaderProto::LITTLE);
  header.mutable_version()->set_producer(tensorflow::kTensorBundleVersion);
  header.mutable_version()->set_min_consumer(
      tensorflow::kTensorBundleMinConsumer);
  builder.Add(tensorflow::kHeaderEntryKey, header.SerializeAsString());
  for (const auto& [key, entry] : bundle->entries) {
    builder.Add(key, entry.SerializeAsString());
  }
  status = builder.Finish();
  if (status.ok()) status = index->Close();
  return status.ok() ? 0 : Fail(status, error, error_size);
}
