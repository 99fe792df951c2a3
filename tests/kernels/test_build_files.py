"""Both builds compile exactly the one source table, kernels/sources.bzl, with
its per-file flags, and no build sets an ISA flag globally.

The table is read by setup.py and load()ed by kernels/BUILD, so what can
still go wrong is a build dropping, adding or re-flagging a source on its
way from the table to the compiler: these tests look at what each build
actually compiles (setup.py's compile commands, Bazel's expanded rules)."""
import ast
import glob
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from repo_paths import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))
import kernel_objects  # noqa: E402

ISA_FLAG = re.compile(r"-m(sse|avx|fma|f16c)")
TABLE = kernel_objects.op_library_sources()
TABLE_FLAGS = {flag for flags in TABLE.values() for flag in flags}
# The flags kernels/BUILD gives every file (setup.py's common flags).
BAZEL_COMMON_COPTS = ["-O3", "-fvisibility=hidden"]


def test_every_kernel_source_is_in_the_table():
    on_disk = {os.path.relpath(p, ROOT) for p in
               glob.glob(os.path.join(ROOT, "kernels", "**", "*.cc"),
                         recursive=True)}
    assert on_disk == set(TABLE)


def test_isa_flags_only_on_kernel_variant_files():
    for source, flags in TABLE.items():
        if any(ISA_FLAG.match(f) for f in flags):
            assert source.startswith("kernels/core/kernel_"), source


def test_setup_py_compiles_the_table_with_its_flags(tmp_path):
    """`setup.py build_ext` with TFCE_BUILD_DRY_RUN=1 prints every compile
    command."""
    result = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--build-temp",
         str(tmp_path / "tmp"), "--build-lib", str(tmp_path / "lib")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
             "TFCE_BUILD_DRY_RUN": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    compiled = {}
    for line in (result.stdout + result.stderr).splitlines():
        words = line.split()
        if "-c" not in words:
            continue
        source = words[words.index("-c") + 1]
        if source.startswith("kernels/"):
            assert source not in compiled, f"{source} compiled twice"
            compiled[source] = [w for w in words if w in TABLE_FLAGS]
    assert compiled == TABLE


def bazel_rules():
    """{name: (srcs, copts)} of the cc_library rules of //kernels, as Bazel
    expands them (after the macros)."""
    script = os.path.join(ROOT, "tools", "bazelisk_offline.sh")
    result = subprocess.run(
        [script, "query", "--output=xml", "kind(cc_library, //kernels:all)"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "TFCE_NO_INSTALL": "1"})
    if result.returncode != 0 and "bazelisk_offline:" in result.stderr:
        pytest.skip("no offline Bazel: " + result.stderr.strip()[-300:])
    assert result.returncode == 0, result.stderr[-4000:]
    rules = {}
    for rule in ET.fromstring(result.stdout).iter("rule"):
        lists = {lst.get("name"): lst for lst in rule.findall("list")}
        srcs = [e.get("value") for e in lists["srcs"]] if "srcs" in lists else []
        copts = [e.get("value") for e in lists["copts"]] if "copts" in lists else []
        rules[rule.get("name")] = (srcs, copts)
    return rules


@pytest.mark.skipif(shutil.which("npm") is None and shutil.which("bazelisk") is None,
                    reason="needs bazelisk")
def test_bazel_compiles_the_table_with_its_flags():
    compiled = {}
    for name, (srcs, copts) in bazel_rules().items():
        for label in srcs:
            if not label.endswith(".cc"):
                continue
            source = "kernels/" + label.split(":", 1)[1]
            assert source not in compiled, f"{source} in two rules"
            assert copts[:len(BAZEL_COMMON_COPTS)] == BAZEL_COMMON_COPTS, name
            compiled[source] = copts[len(BAZEL_COMMON_COPTS):]
    assert compiled == TABLE


def code_without_docs(path):
    """The Python code of path with docstrings and comments removed."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            body.pop(0)
    return ast.unparse(tree)


def starlark_without_comments(path):
    return "".join(line for line in open(os.path.join(ROOT, path))
                   if not line.lstrip().startswith("#"))


def test_no_global_isa_flags():
    assert not ISA_FLAG.search(code_without_docs("setup.py")), "setup.py"
    assert not ISA_FLAG.search(code_without_docs("tools/configure_bazel.py"))
    for path in (".bazelrc", "kernels/BUILD", "kernels/build_defs.bzl"):
        assert not ISA_FLAG.search(starlark_without_comments(path)), path
