// Backs large tables with 2 MiB pages (Linux transparent huge pages).
//
// A lookup touches random rows, so on a table of more than a few MiB nearly
// every row costs a TLB miss and a page walk (a two-level one under a
// hypervisor); a 2 MiB page covers 512 times the rows of a 4 KiB one
// (benchmarks/op_bench.py measures it on and off, TFCE_HUGE_PAGES). TF and
// TF Serving allocate tensors with 4 KiB pages, so the ops ask the OS, once
// per table buffer, to back the buffer's 2 MiB-aligned interior with huge
// pages.
//
// TF-free (the C++ benchmarks include it for the constants); a no-op on
// other systems.
#ifndef TFCE_KERNELS_TF_HUGE_PAGES_H_
#define TFCE_KERNELS_TF_HUGE_PAGES_H_

#include <cstdint>

#include "kernels/core/kernel_api.h"

namespace tfce {

// Buffers smaller than this are left alone: their pages fit the TLB's reach.
constexpr int64_t kHugePageMinBytes = int64_t{4} << 20;

// A transparent huge page on x86-64 Linux.
constexpr uintptr_t kHugePageBytes = uintptr_t{2} << 20;

// madvise() advice values, spelled out: older libc headers lack
// MADV_COLLAPSE (Linux >= 6.1).
constexpr int kMadvHugepage = 14;  // MADV_HUGEPAGE
constexpr int kMadvCollapse = 25;  // MADV_COLLAPSE

// The first call for a buffer marks its aligned interior MADV_HUGEPAGE and
// collapses it to huge pages now (MADV_COLLAPSE, Linux >= 6.1; it copies the
// pages once, so the first request on a table, e.g. a TF Serving warmup
// request, pays for copying the table); later calls for the same buffer only
// look it up. Contents never change and errors are ignored: it is a hint.
// Disabled by TFCE_HUGE_PAGES=0. Thread-safe; a second thread does not wait for
// a collapse in progress.
void AdviseHugePages(const void* data, int64_t bytes);

// Both buffers of a table: its rows and, for int8, its scales.
void AdviseHugePages(const TableView& table);

// Bytes of tables collapsed to huge pages so far in this process (for tests
// and benchmarks: 0 where the OS cannot do it or it is disabled).
int64_t HugePageBytes();

}  // namespace tfce

#endif  // TFCE_KERNELS_TF_HUGE_PAGES_H_
