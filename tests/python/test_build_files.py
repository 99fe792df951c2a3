"""setup.py and kernels/BUILD must build the same sources with the same
per-file flags (two build systems, one truth), and no build sets an ISA flag
globally."""
import ast
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import kernel_objects  # noqa: E402

ISA_FLAG = re.compile(r"-m(sse|avx|fma|f16c)")


def bazel_libraries():
    """{source: copts beyond TFCE_COPTS} for every cc_library in kernels/BUILD."""
    text = open(os.path.join(ROOT, "kernels", "BUILD")).read()
    libraries = {}
    for block in re.findall(r"cc_library\((.*?)\n\)", text, re.S):
        srcs = re.search(r"srcs = \[(.*?)\]", block, re.S)
        if not srcs:
            continue
        copts = re.search(r"copts = TFCE_COPTS(?: \+ \[(.*?)\])?", block, re.S)
        extra = re.findall(r'"([^"]+)"', copts.group(1) or "") if copts else []
        for src in re.findall(r'"([^"]+\.cc)"', srcs.group(1)):
            libraries["kernels/" + src] = extra
    return libraries


def test_same_sources_and_per_file_flags():
    assert bazel_libraries() == kernel_objects.op_library_sources()


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


def test_no_global_isa_flags():
    setup_code = code_without_docs("setup.py")
    table = re.search(r"OP_LIBRARY_SOURCES = \{.*?\}", setup_code, re.S).group(0)
    assert not ISA_FLAG.search(setup_code.replace(table, "")), "setup.py"
    assert not ISA_FLAG.search(code_without_docs("tools/configure_bazel.py"))
    bazelrc = [l for l in open(os.path.join(ROOT, ".bazelrc"))
               if not l.lstrip().startswith("#")]
    assert not ISA_FLAG.search("".join(bazelrc)), ".bazelrc"
