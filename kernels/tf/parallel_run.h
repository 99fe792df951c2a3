// Splitting one op call's work over the intra-op thread pool.
//
// Waking a sleeping pool thread costs tens of microseconds on small VMs,
// comparable to a whole batch, so the split is built around it: chunks are
// taken from a shared counter (a thread that wakes late takes fewer), the
// caller computes too and spins for the last chunk instead of sleeping, and a
// pool thread that ran chunks stands by for a short while for the next split
// call, as OpenMP runtimes do, so back-to-back calls need no wake-up.
#ifndef TFCE_KERNELS_TF_PARALLEL_RUN_H_
#define TFCE_KERNELS_TF_PARALLEL_RUN_H_

#include <atomic>
#include <cstdint>
#include <functional>

#include "tensorflow/core/framework/op_kernel.h"

namespace tfce {

// Work below this estimate (units * cost_per_unit, ~cycles) runs on the
// calling thread alone. TFCE_MIN_PARALLEL_COST overrides it (read once).
constexpr double kDefaultMinParallelCost = 2e5;
double MinParallelCost();

// A split call is cut into up to kChunksPerThread chunks per thread, each
// estimated at kMinChunkCost or more.
constexpr int64_t kChunksPerThread = 8;
constexpr double kMinChunkCost = 2e4;

// How long a pool thread that ran chunks waits for the next split call
// before going back to the pool. TFCE_STANDBY_US overrides it (read once;
// 0 disables standing by).
constexpr int64_t kDefaultStandbyMicros = 100;
int64_t StandbyMicros();

// The node attribute "_tfce_max_threads" caps the threads one call of an op
// uses (absent or 0: the whole intra-op pool). TF hands attributes whose
// names start with "_" to kernels without an OpDef entry, so it is no part
// of the ops' signatures; benchmarks/op_bench.py sets it to time 1 and 2
// threads side by side in one process. Reads it into *max_threads (0 when
// absent); a negative value is an InvalidArgument error.
constexpr char kMaxThreadsAttr[] = "_tfce_max_threads";
absl::Status ReadMaxThreads(tensorflow::OpKernelConstruction* ctx,
                            int64_t* max_threads);

// The threads ParallelRun may use for a call: the intra-op pool's (the
// caller included), at most max_threads (0: no cap).
int64_t ParallelRunThreads(tensorflow::OpKernelContext* ctx,
                           int64_t max_threads);

// Runs fn(begin, end) over [0, total) on the calling thread and, when the
// work is large enough to pay for it, on up to max_threads (0: all) of the
// intra-op pool's threads, the caller included. Each unit is computed by
// one call of fn, so results are identical to a single-threaded run.
// Returns when every unit is done.
void ParallelRun(tensorflow::OpKernelContext* ctx, int64_t total,
                 int64_t cost_per_unit, int64_t max_threads,
                 const std::function<void(int64_t, int64_t)>& fn);

// Runs `kernel` over units [0, total) of `args` in shards (ParallelRun):
// each shard is a copy of `args` with its [begin, end) in the members
// `begin` and `end`. Returns false when any shard returned false (a bad id:
// the caller re-scans the ids for the precise error).
template <typename Args>
bool RunKernelSharded(tensorflow::OpKernelContext* ctx,
                      bool (*kernel)(const Args&), const Args& args,
                      int64_t Args::*begin, int64_t Args::*end, int64_t total,
                      int64_t cost_per_unit, int64_t max_threads) {
  std::atomic<bool> ok(true);
  ParallelRun(ctx, total, cost_per_unit, max_threads,
              [&](int64_t shard_begin, int64_t shard_end) {
                Args shard = args;
                shard.*begin = shard_begin;
                shard.*end = shard_end;
                if (!kernel(shard)) ok.store(false);
              });
  return ok.load();
}

}  // namespace tfce

#endif  // TFCE_KERNELS_TF_PARALLEL_RUN_H_
