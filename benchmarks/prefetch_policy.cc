// The shipped pooling kernel with software prefetch off, 16 rows ahead
// (kDefaultPrefetchRows) and PrefetchDistance(table) rows ahead, per table
// size, dim and bag length: the measurements behind the ops' prefetch policy
// (tfce::PoolPrefetchRows, kernels/core/prefetch_policy.h). No TensorFlow in
// the loop.
//
// Usage: prefetch_policy ROWS DIM IDS_PER_BAG REPEATS
// CSV on stdout: storage,prefetch,ns_per_row,policy (the distance the ops
// use for this table and bag length), for each storage format: int8 and int4
// (rowwise records), fp16, int8_split.
#include "kernels/core/prefetch_policy.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "benchmarks/bench_memory.h"
#include "kernels/core/dispatch.h"
#include "kernels/core/kernel_api.h"

namespace {

using bench::kBags;

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr,
                 "usage: prefetch_policy ROWS DIM IDS_PER_BAG REPEATS\n");
    return 2;
  }
  const int64_t rows = std::atoll(argv[1]), dim = std::atoll(argv[2]);
  const int64_t per_bag = std::atoll(argv[3]);
  const int repeats = std::atoi(argv[4]);
  const tfce::KernelVariant& kernels = bench::SelectedVariantOrExit();
  const auto batches = bench::IdBatches(rows, per_bag);
  std::vector<int64_t> offsets(kBags + 1);
  for (int64_t b = 0; b <= kBags; ++b) offsets[b] = b * per_bag;
  std::vector<float> weights(kBags * per_bag, 1.0f);
  std::vector<float> out(kBags * dim);
  const int iters =
      static_cast<int>(std::max<int64_t>(4, 1000000 / (kBags * per_bag)));

  std::printf("storage,prefetch,ns_per_row,policy\n");
  using tfce::Storage;
  const struct {
    Storage storage;
    const char* name;
  } formats[] = {{Storage::kInt8Rowwise, "int8"},
                 {Storage::kInt4Rowwise, "int4"},
                 {Storage::kFp16, "fp16"},
                 {Storage::kInt8Split, "int8_split"}};
  for (const auto& format : formats) {
    const Storage storage = format.storage;
    const bool split = storage == Storage::kInt8Split;
    const size_t data_bytes = rows * tfce::RecordBytes(storage, dim);
    // Huge pages where the ops would ask for them (buffers of 4 MiB or more).
    void* data = bench::Table(data_bytes, data_bytes >= (size_t{4} << 20));
    float* scales = nullptr;
    // Valid rows (the rest is bytes of 1): fp16 1.0; int8 scales 1/127,
    // inline or separate; int4 scale 1/15 and bias -0.5 as float16.
    const float scale8 = 1.0f / 127;
    const uint16_t meta4[2] = {0x2c44, 0xb800};
    const int64_t stride = tfce::RecordBytes(storage, dim);
    auto* bytes = static_cast<char*>(data);
    if (split) {
      scales = static_cast<float*>(
          bench::Table(rows * 4, rows * 4 >= (size_t{4} << 20)));
      std::fill(scales, scales + rows, scale8);
    } else if (storage == Storage::kFp16) {
      std::fill(static_cast<uint16_t*>(data),
                static_cast<uint16_t*>(data) + rows * dim, uint16_t{0x3c00});
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        if (storage == Storage::kInt8Rowwise) {
          std::memcpy(bytes + r * stride, &scale8, 4);
        } else {
          std::memcpy(bytes + r * stride, meta4, 4);
        }
      }
    }
    tfce::PoolArgs args{};
    args.table = tfce::TableView{storage, data, scales, rows, dim};
    args.weights = weights.data();
    args.bag_offsets = offsets.data();
    args.combiner = tfce::Combiner::kSum;
    args.bag_begin = 0;
    args.bag_end = kBags;
    args.out = out.data();
    args.out_stride = dim;
    std::vector<int64_t> distances = {0, tfce::kDefaultPrefetchRows};
    const int64_t lines_distance = tfce::PrefetchDistance(args.table);
    if (lines_distance != tfce::kDefaultPrefetchRows) {
      distances.push_back(lines_distance);
    }
    auto run = [&](int64_t distance, int count) {
      for (int it = 0; it < count; ++it) {
        tfce::PoolArgs a = args;
        a.prefetch_rows = distance;
        a.ids = tfce::IdsView{batches[it % batches.size()].data(), true};
        if (!kernels.pool(a)) std::abort();
      }
    };
    // Round-robin over the distances, so drift on a shared machine hits
    // both alike; medians over the repeats.
    std::vector<std::vector<double>> ns(distances.size());
    for (int64_t d : distances) run(d, iters / 4 + 1);
    for (int r = 0; r < repeats; ++r) {
      for (size_t k = 0; k < distances.size(); ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        run(distances[k], iters);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count();
        ns[k].push_back(s / iters / (kBags * per_bag) * 1e9);
      }
    }
    for (size_t k = 0; k < distances.size(); ++k) {
      std::sort(ns[k].begin(), ns[k].end());
      std::printf(
          "%s,%lld,%.3f,%lld\n", format.name,
          static_cast<long long>(distances[k]), ns[k][ns[k].size() / 2],
          static_cast<long long>(tfce::PoolPrefetchRows(args.table, per_bag)));
    }
  }
  return 0;
}
