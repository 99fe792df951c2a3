"""The op library's rules, made from the one source table (sources.bzl)."""

load(":sources.bzl", "KERNEL_SOURCES")

def _stem(source):
    """"core/kernel_avx2.cc" -> "kernel_avx2"."""
    return source.split("/")[-1][:-len(".cc")]

def plain_sources(directory):
    """The table's sources in `directory` that get no flags of their own."""
    return [s for s, flags in KERNEL_SOURCES.items() if not flags and s.startswith(directory + "/")]

def kernel_variant_libraries(name, copts, deps):
    """One cc_library per source with flags of its own (the scalar reference
    and one file per ISA: its flags, and only it, get them), and `name`, a
    cc_library that links them all.

    Every library here is compiled with -fvisibility=hidden, so its symbols
    cannot cross a shared-library boundary: linkstatic = 1 (no per-library
    .so, which Bazel would otherwise make for cc_test's dynamic linking
    mode), always linked into one binary or .so.
    """
    variants = []
    for source, flags in KERNEL_SOURCES.items():
        if not flags:
            if not source.startswith("core/") and not source.startswith("tf/"):
                fail("%s: a source without flags of its own belongs in core/ or tf/" % source)
            continue
        native.cc_library(
            name = _stem(source),
            srcs = [source],
            copts = copts + flags,
            linkstatic = 1,
            alwayslink = 1,
            deps = deps,
        )
        variants.append(":" + _stem(source))
    native.cc_library(
        name = name,
        linkstatic = 1,
        deps = variants,
    )
