"""What importing the package does: nothing heavy, and the ops and the Keras
layer registered whichever of the package, TensorFlow and Keras comes
first. Each case runs in a fresh interpreter (imports are process-wide)."""
import os
import subprocess
import sys

import pytest

from repo_paths import ROOT as REPO

REGISTERED = (
    "import sys\n"
    "from tensorflow.python.framework import op_def_registry\n"
    "import keras\n"
    "ops = [op_def_registry.get(n) is not None for n in\n"
    "       ('CompressedEmbeddingLookup', 'FusedDecodeAxpy',\n"
    "        'BatchedFusedDecodeAxpy')]\n"
    "layer = keras.saving.get_registered_object(\n"
    "    'tf_compressed_embedding>CompressedEmbedding')\n"
    "print('ops', all(ops), 'layer', layer is not None)\n")


def run(code, **env):
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        timeout=300, cwd=REPO, env={**os.environ, **env}, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("module", [
    "tf_compressed_embedding",
    "tf_compressed_embedding.quantization",
    "export_tools.options",
])
def test_light_imports_do_not_import_tensorflow(module):
    out = run(f"import sys, {module}\n"
              f"print(sorted(m for m in ('tensorflow', 'keras') "
              f"if m in sys.modules))")
    assert out.strip() == "[]"


def test_cli_help_does_not_import_tensorflow():
    out = run("import sys, contextlib, io\n"
              "from export_tools import cli\n"
              "with contextlib.redirect_stdout(io.StringIO()) as help_text:\n"
              "    try:\n"
              "        cli.build_parser().parse_args(['--help'])\n"
              "    except SystemExit:\n"
              "        pass\n"
              "print('int8' in help_text.getvalue(), 'tensorflow' in sys.modules)")
    assert out.split() == ["True", "False"]


@pytest.mark.parametrize("first", [
    "import tf_compressed_embedding\nimport tensorflow\n",
    "import tensorflow\nimport tf_compressed_embedding\n",
    "import tf_compressed_embedding\nimport keras\n",
    "import keras\nimport tf_compressed_embedding\n",
    # The first import of TensorFlow is the package's own, from each of the
    # modules that import it.
    "import tf_compressed_embedding as t\nt.supported_isas()\n",
    "import tf_compressed_embedding as t\nt.OpLibraryError\n",
    "import tf_compressed_embedding as t\nt.quantize\n",
    "from tf_compressed_embedding import ops\n",
    "from tf_compressed_embedding.keras import CompressedEmbedding\n",
    "from tf_compressed_embedding import layers\n",
])
def test_ops_and_layer_are_registered_in_any_import_order(first):
    assert run(first + REGISTERED).split() == ["ops", "True", "layer", "True"]


def test_registering_never_breaks_importing_tensorflow(tmp_path):
    # A library that cannot load: `import tensorflow` still works, and the
    # first op call (or load_ops) says why.
    out = run("import tf_compressed_embedding as tfce\n"
              "import tensorflow\n"
              "try:\n"
              "    tfce.load_ops()\n"
              "except tfce.OpLibraryError as e:\n"
              "    print('refused:', e)\n",
              TFCE_OPS_LIBRARY=str(tmp_path / "missing.so"))
    assert out.startswith("refused:") and "op library is not built" in out


def test_fused_export_without_the_library_is_refused(tmp_path):
    out = run("from export_tools import ExportError, compress_saved_model\n"
              "try:\n"
              f"    compress_saved_model({str(tmp_path / 'model')!r}, "
              f"{str(tmp_path / 'out')!r}, dtype='int8', ops='fused')\n"
              "except ExportError as e:\n"
              "    print('refused:', e)\n",
              TFCE_OPS_LIBRARY=str(tmp_path / "missing.so"))
    assert "--ops fused needs the op library" in out
    assert not (tmp_path / "out").exists()


def test_version_has_one_home():
    import tf_compressed_embedding as tfce
    from tf_compressed_embedding import version

    assert tfce.__version__ == version.__version__
    with open(os.path.join(REPO, "pyproject.toml")) as f:
        pyproject = f.read()
    assert "tf_compressed_embedding.version.__version__" in pyproject
    assert "\nversion =" not in pyproject.split("[project]")[1].split("\n[")[0]


def _imports_between_modules(package):
    """{module: {modules of `package` it imports}}, from every import
    statement (at any depth) of the package's files."""
    import ast

    graph = {}
    root = os.path.join(REPO, *package.split("."))
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
            module = rel[:-len(".__init__")] if rel.endswith(".__init__") else rel
            targets = set()
            with open(path) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    targets |= {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module:
                    targets.add(node.module)
                    targets |= {f"{node.module}.{a.name}" for a in node.names}
            graph[module] = targets
    return {m: {t for t in ts if t in graph and t != m} for m, ts in graph.items()}


@pytest.mark.parametrize("package", ["tf_compressed_embedding", "export_tools"])
def test_no_import_circle(package):
    graph = _imports_between_modules(package)
    # A package's __init__ re-exporting its submodules is not a circle.
    graph = {m: {t for t in ts if not m.startswith(t + ".")}
             for m, ts in graph.items()}
    state = {}

    def visit(module, path):
        if state.get(module) == "done":
            return
        assert state.get(module) != "open", " -> ".join(path + [module])
        state[module] = "open"
        for target in sorted(graph[module]):
            visit(target, path + [module])
        state[module] = "done"

    for module in sorted(graph):
        visit(module, [])
