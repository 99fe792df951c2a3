// Backs large tables with 2 MiB pages (Linux transparent huge pages).
//
// A lookup touches random rows, so on a table of more than a few MiB nearly
// every row costs a TLB miss and a page walk (a two-level one under a
// hypervisor). 2 MiB pages made the pooling kernel ~1.2x faster on 2M-row
// int8 tables (D = 12 and 128, same process, interleaved; see
// benchmarks/RESULTS.md). TF and TF Serving allocate tensors with 4 KiB
// pages, so the ops ask the OS, once per table buffer, to back the buffer's
// 2 MiB-aligned interior with huge pages.
//
// TF-free; a no-op on other systems.
#ifndef TFCE_KERNELS_TF_HUGE_PAGES_H_
#define TFCE_KERNELS_TF_HUGE_PAGES_H_

#include <cstdint>

#include "kernels/core/kernel_api.h"

namespace tfce {

// Buffers smaller than this are left alone: their pages fit the TLB's reach.
constexpr int64_t kHugePageMinBytes = int64_t{4} << 20;

// The first call for a buffer marks its aligned interior MADV_HUGEPAGE and
// collapses it to huge pages now (MADV_COLLAPSE, Linux >= 6.1; it copies the
// pages once, ~0.35 s per GiB here, so the first request on a table, e.g. a
// TF Serving warmup request, pays it); later calls for the same buffer only look it
// up. Contents never change and errors are ignored: it is a hint. Disabled by
// TFCE_HUGE_PAGES=0. Thread-safe; a second thread does not wait for a
// collapse in progress.
void AdviseHugePages(const void* data, int64_t bytes);

// Both buffers of a table: its rows and, for int8, its scales.
void AdviseHugePages(const TableView& table);

// Bytes of tables collapsed to huge pages so far in this process (for tests
// and benchmarks: 0 where the OS cannot do it or it is disabled).
int64_t HugePageBytes();

}  // namespace tfce

#endif  // TFCE_KERNELS_TF_HUGE_PAGES_H_
