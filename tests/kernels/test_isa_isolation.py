"""Loading the op library never runs an instruction the CPU may lack.

Reads the machine code of the op library this process uses: every function
that contains an AVX (VEX/EVEX-encoded) instruction must belong to the AVX2
or AVX-512 kernel file, and every function with an SSE4.1 instruction to an
SSE4.1-or-later kernel file. Those are only called through the dispatch
table after CPUID+XCR0 said yes, so a CPU without them never executes them
(no SIGILL at load, in static initialisers, or in shared inline code). The
kernel objects also export nothing but their entry points: no weak (COMDAT)
symbol a linker could pick an ISA-compiled copy of."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from tf_compressed_embedding import _loader

from repo_paths import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))
import kernel_objects  # noqa: E402

SSE41_ONLY = re.compile(
    r"^(pmovsx|pmovzx|pblendvb|blendvp|blendp|pblendw|ptest|round[ps][sd]|"
    r"pmulld|pcmpeqq|pextr[bdq]|pinsr[bdq]|pmaxs[bd]|pmaxu[wd]|pmins[bd]|"
    r"pminu[wd]|dpp[sd]|mpsadbw|phminposuw|packusdw|pmuldq|insertps|"
    r"extractps|movntdqa)")
AVX_FUNCTION = re.compile(r"Avx2|Avx512|avx2::|avx512::")
SSE41_FUNCTION = re.compile(r"Sse\b|sse::|Avx2|Avx512|avx2::|avx512::")

pytestmark = pytest.mark.skipif(shutil.which("objdump") is None or
                                shutil.which("nm") is None,
                                reason="needs binutils")


def instructions(library):
    """{function name: [(mnemonic, operands)]} from objdump."""
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C",
                              library], capture_output=True, text=True,
                             check=True).stdout
    functions, current = {}, None
    for line in listing.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            current = functions.setdefault(header.group(1), [])
            continue
        insn = re.match(r"^\s+[0-9a-f]+:\s+([a-z][a-z0-9]*)\s*(.*)$", line)
        if insn and current is not None:
            current.append((insn.group(1), insn.group(2)))
    return functions


def functions_using(library):
    """{function name: set of instruction mnemonics} from objdump."""
    return {f: {op for op, _ in insns}
            for f, insns in instructions(library).items()}


def test_avx_and_sse41_only_inside_their_kernel_files():
    functions = functions_using(_loader.library_path())
    avx = {f for f, ops in functions.items() if any(o.startswith("v") for o in ops)}
    sse41 = {f for f, ops in functions.items() if any(SSE41_ONLY.match(o) for o in ops)}
    assert avx, "expected AVX code in the AVX2/AVX-512 kernels"
    assert sorted(f for f in avx if not AVX_FUNCTION.search(f)) == []
    assert sorted(f for f in sse41 if not SSE41_FUNCTION.search(f)) == []


def test_kernel_objects_export_only_their_entry_points(tmp_path):
    for obj in kernel_objects.compile_kernels(str(tmp_path), opt="-O2"):
        isa = re.match(r"kernel_(\w+)\.cc\.o", os.path.basename(obj)).group(1)
        symbols = subprocess.run(["nm", "-C", "--defined-only", obj],
                                 capture_output=True, text=True,
                                 check=True).stdout.splitlines()
        exported = sorted(s.split(" ", 2)[2] for s in symbols
                          if s.split(" ")[1] not in "tbdrn")
        assert exported == [f"tfce::{isa}::Lookup(tfce::LookupArgs const&)",
                            f"tfce::{isa}::Pool(tfce::PoolArgs const&)"], obj


@pytest.mark.parametrize("isa_struct", ["Sse", "Avx2", "Avx512"])
@pytest.mark.parametrize("kernel", ["Pool", "Lookup"])
def test_simd_kernels_prefetch(isa_struct, kernel):
    """Each ISA's pooling and lookup code issues software prefetches. GCC
    deletes every call to an out-of-line function that only prefetches (it
    sees no effect), which once took prefetching out of the pool kernels
    without any test noticing."""
    namespace = isa_struct.lower() + "::"
    functions = functions_using(_loader.library_path())
    mine = {f: ops for f, ops in functions.items()
            if kernel in f and (isa_struct in f or namespace + kernel in f)}
    assert mine, f"no {kernel} functions of {isa_struct} found"
    assert any("prefetcht0" in ops for ops in mine.values()), sorted(mine)


@pytest.mark.parametrize("isa_struct", ["Sse", "Avx2", "Avx512"])
def test_int8_pool_kernels_prefetch_scales(isa_struct):
    """The int8_split pooling code prefetches each upcoming row's scale as
    well as its row: a prefetch indexed by id * 4 into the float scales (the row
    prefetches are byte addressed). The scale prefetch was once dropped from
    every pool kernel (an out-of-line helper again) while the lookup kept
    it."""
    functions = instructions(_loader.library_path())
    int8_pool = {f: insns for f, insns in functions.items()
                 if "Pool" in f and isa_struct in f and "Int8SplitRows" in f}
    assert int8_pool, f"no int8 pool functions of {isa_struct} found"
    scale_prefetches = {f for f, insns in int8_pool.items()
                        if any(op == "prefetcht0" and args.endswith(",4)")
                               for op, args in insns)}
    row_prefetches = {f for f, insns in int8_pool.items()
                      if any(op == "prefetcht0" for op, _ in insns)}
    assert row_prefetches and scale_prefetches == row_prefetches, (
        sorted(row_prefetches - scale_prefetches))


@pytest.mark.parametrize("isa_struct", ["Sse", "Avx2", "Avx512"])
@pytest.mark.parametrize("rows", ["Int8RowwiseRows", "Int4RowwiseRows"])
def test_rowwise_pool_kernels_prefetch_records(isa_struct, rows):
    """The rowwise formats' pooling code prefetches the upcoming records
    (their scales, and int4's biases, are inline: no second prefetch): every
    bag driver of the format (PoolEachBag, one per dim kind and id width)
    holds a prefetch."""
    functions = instructions(_loader.library_path())
    drivers = {f: insns for f, insns in functions.items()
               if "PoolEachBag" in f and isa_struct in f and rows in f}
    assert drivers, f"no {rows} pool functions of {isa_struct} found"
    without = sorted(f for f, insns in drivers.items()
                     if not any(op == "prefetcht0" for op, _ in insns))
    assert without == []


def test_batched_tile_runner_prefetches_across_tiles():
    """The batched op's tile runner (RunPoolTiles) requests the next tiles'
    first rows, the row prefetch and a split table's scale prefetch, while
    it pools the current tile. Its prefetch helper was an out-of-line
    function, so GCC deleted every call to it and the runner shipped
    without a single prefetch."""
    functions = instructions(_loader.library_path())
    runner = {f: insns for f, insns in functions.items()
              if f.startswith("tfce::RunPoolTiles(")}
    assert runner, "RunPoolTiles not found"
    prefetches = [args for insns in runner.values()
                  for op, args in insns if op == "prefetcht0"]
    assert any(not a.endswith(",4)") for a in prefetches), prefetches
    assert any(a.endswith(",4)") for a in prefetches), prefetches
