#include "kernels/tf/parallel_run.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/core/tuning_env.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tfce {
namespace {

using Fn = std::function<void(int64_t, int64_t)>;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// One split call's units, shared by the caller and the pool threads that
// join it. Held by shared_ptr: a thread may arrive after the call returned;
// it then finds no chunk left and touches nothing else.
struct SharedWork {
  SharedWork(int64_t total, int64_t chunk, int64_t helpers, const Fn* fn)
      : total(total), chunk(chunk), fn(fn), helper_slots(helpers) {}
  const int64_t total;
  const int64_t chunk;
  const Fn* const fn;  // valid while done < total: the caller waits for that
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  // Pool threads that may still join: the call's thread cap minus the
  // caller. Threads standing by and threads scheduled for the call both
  // take a slot first, so the cap holds however many of them turn up.
  std::atomic<int64_t> helper_slots;

  // Runs chunks as one of the call's helpers, if a slot is left; returns
  // whether it did.
  bool Help() {
    if (helper_slots.fetch_sub(1, std::memory_order_acq_rel) <= 0) {
      return false;
    }
    Drain();
    return true;
  }

  // Runs chunks until none is left.
  void Drain() {
    for (;;) {
      const int64_t begin = next.fetch_add(chunk, std::memory_order_relaxed);
      if (begin >= total) return;
      const int64_t end = std::min(total, begin + chunk);
      (*fn)(begin, end);
      done.fetch_add(end - begin, std::memory_order_acq_rel);
    }
  }
};

// Where a split call posts its work for pool threads standing by.
class Standby {
 public:
  // Posts `work`; returns how many threads were standing by to see it.
  int Post(std::shared_ptr<SharedWork> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      posted_ = std::move(work);
    }
    generation_.fetch_add(1, std::memory_order_acq_rel);
    return waiting_.load(std::memory_order_acquire);
  }

  // Called by a pool thread after it ran chunks: joins calls posted within
  // StandbyMicros() of the last one it joined, then returns to the pool.
  void Linger() {
    const auto window = std::chrono::microseconds(StandbyMicros());
    if (window.count() == 0) return;
    waiting_.fetch_add(1, std::memory_order_acq_rel);
    uint64_t seen = generation_.load(std::memory_order_acquire);
    auto deadline = std::chrono::steady_clock::now() + window;
    for (int spins = 1;; ++spins) {
      const uint64_t now_gen = generation_.load(std::memory_order_acquire);
      if (now_gen != seen) {
        seen = now_gen;
        std::shared_ptr<SharedWork> work;
        {
          std::lock_guard<std::mutex> lock(mu_);
          work = posted_;
        }
        if (work != nullptr) {
          // Busy with this call's chunks, so not standing by: a call posted
          // meanwhile wakes another pool thread instead of counting on this
          // one (which still joins it afterwards, if chunks are left).
          waiting_.fetch_sub(1, std::memory_order_acq_rel);
          work->Help();
          waiting_.fetch_add(1, std::memory_order_acq_rel);
        }
        deadline = std::chrono::steady_clock::now() + window;
      }
      CpuRelax();
      if (spins % 32 == 0 && std::chrono::steady_clock::now() > deadline) {
        break;
      }
    }
    waiting_.fetch_sub(1, std::memory_order_acq_rel);
  }

 private:
  std::mutex mu_;
  std::shared_ptr<SharedWork> posted_;  // guarded by mu_
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> waiting_{0};
};

Standby& GlobalStandby() {
  static Standby* standby = new Standby;  // never destroyed: pool threads
  return *standby;                        // may outlive static destructors
}

}  // namespace

double MinParallelCost() {
  static const double cost =
      TuningEnv("TFCE_MIN_PARALLEL_COST", kDefaultMinParallelCost,
                std::numeric_limits<double>::infinity());  // inf: never
  return cost;
}

int64_t StandbyMicros() {
  static const int64_t micros = static_cast<int64_t>(
      TuningEnv("TFCE_STANDBY_US", kDefaultStandbyMicros, 1e6));
  return micros;
}

absl::Status ReadMaxThreads(tensorflow::OpKernelConstruction* ctx,
                            int64_t* max_threads) {
  *max_threads = 0;
  if (!ctx->HasAttr(kMaxThreadsAttr)) return absl::OkStatus();
  TF_RETURN_IF_ERROR(ctx->GetAttr(kMaxThreadsAttr, max_threads));
  if (*max_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kMaxThreadsAttr, " must be >= 0 (0: all intra-op ",
                     "threads), got ", *max_threads));
  }
  return absl::OkStatus();
}

int64_t ParallelRunThreads(tensorflow::OpKernelContext* ctx,
                           int64_t max_threads) {
  const int64_t threads =
      ctx->device()->tensorflow_cpu_worker_threads()->num_threads;
  return max_threads > 0 ? std::min(threads, max_threads) : threads;
}

void ParallelRun(tensorflow::OpKernelContext* ctx, int64_t total,
                 int64_t cost_per_unit, int64_t max_threads, const Fn& fn) {
  if (total <= 0) return;
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  const int64_t threads =
      std::min<int64_t>(ParallelRunThreads(ctx, max_threads), total);
  const double cost = static_cast<double>(total) * cost_per_unit;
  if (threads <= 1 || cost < MinParallelCost()) {
    fn(0, total);
    return;
  }
  const int64_t chunks = std::min<int64_t>(
      threads * kChunksPerThread,
      std::max<int64_t>(1, static_cast<int64_t>(cost / kMinChunkCost)));
  const int64_t chunk = (total + chunks - 1) / chunks;
  auto work = std::make_shared<SharedWork>(total, chunk, threads - 1, &fn);
  Standby& standby = GlobalStandby();
  const int64_t standing_by = standby.Post(work);
  for (int64_t t = 1 + standing_by; t < threads; ++t) {
    workers->workers->Schedule([work, &standby] {
      if (work->Help()) standby.Linger();  // a surplus thread goes back
    });
  }
  work->Drain();
  // At most one chunk per thread is left, already running: spin rather than
  // sleep, which would cost the caller a wake-up of its own.
  for (int spins = 0; work->done.load(std::memory_order_acquire) < total;
       ++spins) {
    if (spins < 20000) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace tfce
