"""Inputs generated for verification when the user gives none: valid for the
signature as the graph shows it, not just for its dtypes.

- Integer inputs that feed a table's lookups get ids in [0, rows) of the
  smallest such table, including 0 and rows-1.
- Inputs that are keys of a lookup table (`StaticHashTable`, `StringLookup`,
  vocabulary feature columns: `LookupTableFindV2`) are drawn from the keys
  the table holds, read from the loaded table itself (sorted, so every run
  draws the same), plus one key it does not hold (its default row).
- Composite inputs are generated whole. A `tf.function` with a
  `RaggedTensorSpec` or `SparseTensorSpec` argument is saved with the
  components as separate inputs (`ids`, `ids_1`, ...), which the signature's
  inner function marks by giving them one `_user_specified_name`; inputs
  named `X_row_splits` / `X_row_lengths` next to `X_values` (or `X`) are the
  hand-written form of the same. Row splits start at 0, never decrease and
  end at the values' length (with an empty row); sparse indices are in
  bounds, unique and in row-major order.
- A string input parsed by `ParseExampleV2` (`tf.io.parse_example`, the
  estimator-era `inputs` signature of serialized `tf.Example`s) gets
  serialized Examples holding every feature the parse asks for, each
  feature's values chosen as above from the lookups its parsed tensor
  feeds (vocabulary keys, ids in range).
- Other float inputs get values in [0, 1), bools 0/1, other strings words
  no table holds.
"""
import dataclasses
import re

import numpy as np
import tensorflow as tf

from export_tools.errors import ExportError
from export_tools.graph_edit import node_name, output_index

DEFAULT_BATCH = 4
DEFAULT_UNKNOWN_DIM = 3
MAX_BAG = 3               # ragged rows and sparse rows hold 0..MAX_BAG values
UNKNOWN_KEY = "tfce-verify-unknown-key"
_CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")
_FIND_OPS = ("LookupTableFindV2", "LookupTableFind")
_PARSE_OPS = ("ParseExampleV2",)
_NAMED_PART = re.compile(r"^(?P<prefix>.*?)(?P<sep>[_./-]?)(?P<part>row_splits|row_lengths)$")


@dataclasses.dataclass
class RaggedInput:
    """values + one row partition per ragged dimension, outermost first."""
    values: str
    partitions: list      # input names
    kind: str = "row_splits"  # or "row_lengths" (one level)


@dataclasses.dataclass
class SparseInput:
    indices: str
    values: str
    dense_shape: str


def id_bounds(analysis, tables):
    """{source: rows} for the sources feeding the ids of `tables`
    (placeholder -> rows), found by walking the lookups' id tensors upwards;
    a source is an input name or a parsed Example feature (see
    _ancestor_inputs)."""
    by_placeholder = _inputs_by_placeholder(analysis)
    bounds = {}
    for placeholder, rows in tables.items():
        uses = analysis.uses[placeholder]
        id_tensors = [g.ids for g in uses.gathers] + [
            t for p in uses.pooled for t in (p.ids if isinstance(p.ids, tuple) else (p.ids,))]
        for key in _ancestor_inputs(analysis.editor, id_tensors, by_placeholder):
            bounds[key] = min(bounds.get(key, rows), rows)
    return bounds


def table_keys(analysis):
    """{source: np.ndarray of keys} for the sources (as in id_bounds)
    feeding the keys of a lookup table captured by the signature, read from
    the loaded table."""
    editor = analysis.editor
    by_placeholder = _inputs_by_placeholder(analysis)
    keys = {}
    for node in _nodes(editor, _FIND_OPS):
        handle = node_name(editor.through_identity(node.input[0]))
        capture = analysis.captures.get(handle)
        if capture is None or capture.external.dtype != tf.resource:
            continue
        try:
            exported, _ = tf.raw_ops.LookupTableExportV2(
                table_handle=capture.external, Tkeys=node.attr["Tin"].type,
                Tvalues=node.attr["Tout"].type)
        except (tf.errors.OpError, TypeError, ValueError):
            continue  # not an exportable table (e.g. a hashed bucket op)
        # Sorted: a hash table exports in an order that differs between
        # processes, and the inputs (what --dtype auto measures on) must not.
        values = np.unique(exported.numpy().reshape(-1))
        if not values.size:
            continue
        for key in _ancestor_inputs(editor, [node.input[1]], by_placeholder):
            keys[key] = np.unique(np.concatenate([keys[key], values])) if key in keys \
                else values
    return keys


def composite_inputs(analysis):
    """[RaggedInput | SparseInput] among the signature's inputs."""
    specs = dict(zip(analysis.input_names, analysis.input_specs))
    found = _flattened_composites(analysis, specs)
    taken = {n for c in found for n in _members(c)}
    for name in analysis.input_names:
        match = _NAMED_PART.match(name)
        if not match or name in taken or not _is_index_vector(specs[name]):
            continue
        prefix, sep = match["prefix"], match["sep"] or "_"
        for values in (f"{prefix}{sep}values", f"{prefix}_values", prefix):
            if values in specs and values not in taken and specs[values].shape.rank:
                found.append(RaggedInput(values, [name], match["part"]))
                taken.update((values, name))
                break
    return found


def generate_inputs(analysis, bounds, keys, composites, seed=0):
    """A feed for one signature (see the module docstring)."""
    rng = np.random.default_rng(seed)
    specs = dict(zip(analysis.input_names, analysis.input_specs))

    def values(name, leading):
        spec = specs[name]
        dims = spec.shape.as_list() if spec.shape.rank is not None else [None]
        shape = [leading] + [d if d is not None else DEFAULT_UNKNOWN_DIM
                             for d in dims[1:]]
        return _values(rng, spec.dtype, shape, bounds.get(name), keys.get(name),
                       analysis.key, name)

    feed = {}
    # One row structure per signature: ids and their weights come as two
    # composites that must agree (TF checks it), and any two may be combined.
    lengths = [_lengths(rng, DEFAULT_BATCH)] + [
        _lengths(rng, DEFAULT_BATCH * MAX_BAG ** level) for level in (1, 2, 3)]
    cells = {}
    for composite in composites:
        if isinstance(composite, SparseInput):
            feed.update(_sparse(rng, composite, specs, values, cells))
        else:
            feed.update(_ragged(composite, specs, values, lengths))
    serialized = _serialized_inputs(analysis)
    for name in analysis.input_names:
        if name in feed:
            continue
        dims = specs[name].shape.as_list() if specs[name].shape.rank is not None \
            else [DEFAULT_BATCH]
        leading = dims[0] if dims and dims[0] is not None else DEFAULT_BATCH
        if name in serialized and specs[name].dtype == tf.string:
            shape = [1] if not dims else [leading] + [
                d or 1 for d in dims[1:]]
            feed[name] = _examples(rng, int(np.prod(shape)), serialized[name],
                                   bounds, keys, analysis.key, name
                                   ).reshape(shape if dims else ())
        elif not dims:  # a scalar input
            feed[name] = values(name, 1).reshape(())
        else:
            feed[name] = values(name, leading)
    return feed


# -------------------------------------------------------------- details --

def _nodes(editor, ops):
    return (n for n in editor.graph_def.node if n.op in ops)


def _inputs_by_placeholder(analysis):
    return dict(zip((node_name(t) for t in analysis.input_tensors),
                    analysis.input_names))


def _ancestor_inputs(editor, tensors, by_placeholder):
    """The sources among the ancestors of `tensors`: signature input names,
    and `(parse node, feature key)` for a tensor parsed out of serialized
    Examples (the walk stops there: the serialized input is not the ids)."""
    found, seen, stack = [], set(), [t for t in tensors if not t.startswith("^")]
    while stack:
        tensor = stack.pop()
        name = node_name(tensor)
        if tensor in seen or name not in editor.nodes:
            continue
        seen.add(tensor)
        node = editor.nodes[name]
        if name in by_placeholder:
            found.append(by_placeholder[name])
        elif node.op in _PARSE_OPS:
            feature = _parsed_features(editor, node).get(output_index(tensor))
            if feature is not None:
                found.append((name, feature.key))
            continue
        stack.extend(i for i in node.input if not i.startswith("^"))
    return found


@dataclasses.dataclass
class ParsedFeature:
    """One feature a ParseExampleV2 node reads from each Example."""
    key: str
    kind: str             # "sparse" (VarLen), "dense" (FixedLen) or "ragged"
    dtype: tf.DType
    count: int = 0        # values per Example, for dense features


def _parsed_features(editor, node):
    """{output index: ParsedFeature} of a ParseExampleV2 node; its outputs
    are sparse indices, values, shapes (num_sparse each), dense values,
    ragged values, ragged splits."""
    def keys(index):
        value = editor.const_value(node.input[index])
        return [] if value is None else [k.decode() for k in value.reshape(-1)]

    sparse, dense, ragged = keys(2), keys(3), keys(4)
    sparse_types = list(node.attr["sparse_types"].list.type)
    dense_types = list(node.attr["Tdense"].list.type)
    ragged_types = list(node.attr["ragged_value_types"].list.type)
    shapes = [[max(1, d.size) for d in shape.dim]
              for shape in node.attr["dense_shapes"].list.shape]
    n_sparse = len(sparse)
    features = {}
    for i, key in enumerate(sparse):
        feature = ParsedFeature(key, "sparse", tf.as_dtype(sparse_types[i]))
        for block in range(3):  # indices, values, shapes all come from `key`
            features[block * n_sparse + i] = feature
    first_dense = 3 * n_sparse
    for j, key in enumerate(dense):
        features[first_dense + j] = ParsedFeature(
            key, "dense", tf.as_dtype(dense_types[j]),
            int(np.prod(shapes[j])) if j < len(shapes) else 1)
    first_ragged = first_dense + len(dense)
    for r, key in enumerate(ragged):
        feature = ParsedFeature(key, "ragged", tf.as_dtype(ragged_types[r]))
        features[first_ragged + r] = feature
        features[first_ragged + len(ragged) + r] = feature
    return features


def _serialized_inputs(analysis):
    """{input name: [(parse node name, {output: ParsedFeature})]} for the
    string inputs that ParseExampleV2 nodes parse."""
    editor = analysis.editor
    by_placeholder = _inputs_by_placeholder(analysis)
    parsed = {}
    for node in _nodes(editor, _PARSE_OPS):
        for name in _ancestor_inputs(editor, [node.input[0]], by_placeholder):
            if isinstance(name, str):
                parsed.setdefault(name, []).append(
                    (node.name, _parsed_features(editor, node)))
    return parsed


def _examples(rng, count, parses, bounds, keys, signature, name):
    """`count` serialized tf.Examples carrying every feature of `parses`."""
    features = {}
    for node, by_output in parses:
        for feature in by_output.values():
            features.setdefault(feature.key, (node, feature))
    lengths = {k: _lengths(rng, count) for k in features}
    examples = []
    for b in range(count):
        example = tf.train.Example()
        for key, (node, feature) in sorted(features.items()):
            n = feature.count if feature.kind == "dense" else int(lengths[key][b])
            values = _values(rng, feature.dtype, [n], bounds.get((node, key)),
                             keys.get((node, key)), signature, f"{name}[{key!r}]")
            target = example.features.feature[key]
            if feature.dtype == tf.string:
                target.bytes_list.value.extend(values.tolist())
            elif feature.dtype.is_integer:
                target.int64_list.value.extend(int(v) for v in values)
            else:
                target.float_list.value.extend(float(v) for v in values)
        examples.append(example.SerializeToString())
    return np.array(examples, dtype=object)


def _is_index_vector(spec):
    return spec.dtype.is_integer and spec.shape.rank == 1


def _members(composite):
    if isinstance(composite, SparseInput):
        return (composite.indices, composite.values, composite.dense_shape)
    return (composite.values, *composite.partitions)


def _flattened_composites(analysis, specs):
    """Composites that TF flattened into separate signature inputs: the
    inner function's consecutive arguments sharing a _user_specified_name."""
    graph = analysis.function.graph
    by_tensor = dict(zip(analysis.input_tensors, analysis.input_names))
    library = {f.signature.name: f
               for f in graph.as_graph_def().library.function}
    found = []
    for op in graph.get_operations():
        if op.type not in _CALL_OPS:
            continue
        fdef = library.get(op.get_attr("f").name)
        if fdef is None:
            continue
        groups = []  # [(user name, [input names])]
        for i, tensor in enumerate(op.inputs):
            while tensor.op.type == "Identity":
                tensor = tensor.op.inputs[0]
            name = by_tensor.get(tensor.name)
            user = fdef.arg_attr[i].attr["_user_specified_name"].s \
                if i in fdef.arg_attr else b""
            if name is None or not user:
                groups.append((None, []))
            elif groups and groups[-1][0] == user:
                groups[-1][1].append(name)
            else:
                groups.append((user, [name]))
        for _, names in groups:
            composite = _classify(names, specs)
            if composite is not None:
                found.append(composite)
    return found


def _classify(names, specs):
    if len(names) < 2:
        return None
    first, rest = specs[names[0]], [specs[n] for n in names[1:]]
    if (len(names) == 3 and first.dtype == tf.int64 and first.shape.rank == 2
            and rest[1].dtype == tf.int64 and rest[1].shape.rank == 1):
        return SparseInput(*names)
    if first.shape.rank and all(_is_index_vector(s) for s in rest):
        return RaggedInput(names[0], names[1:])
    return None


def _lengths(rng, rows):
    """Row lengths in [0, MAX_BAG], one row empty and one full when possible."""
    lengths = rng.integers(0, MAX_BAG + 1, rows)
    if rows >= 2:
        lengths[0], lengths[-1] = MAX_BAG, 0
    return lengths


def _ragged(composite, specs, values, lengths):
    """The composite's components, its levels' row lengths taken from
    `lengths` (shared by the signature's ragged inputs)."""
    rows, feed = DEFAULT_BATCH, {}
    for level, name in enumerate(composite.partitions):
        level_lengths = lengths[level][:rows]
        if len(level_lengths) < rows:  # deeper than `lengths` was made for
            level_lengths = np.resize(level_lengths, rows)
        dtype = specs[name].dtype.as_numpy_dtype
        feed[name] = (level_lengths if composite.kind == "row_lengths"
                      else np.concatenate([[0], np.cumsum(level_lengths)])).astype(dtype)
        rows = int(level_lengths.sum())
    feed[composite.values] = values(composite.values, rows)
    return feed


def _sparse(rng, composite, specs, values, cells):
    """The composite's components; the occupied cells are drawn once per
    rank (`cells`, shared by the signature's sparse inputs)."""
    rank = specs[composite.indices].shape.as_list()[1] or 2
    dense_shape = [DEFAULT_BATCH] + [MAX_BAG] * (rank - 1)
    if rank not in cells:
        occupied = rng.integers(0, 2, dense_shape).astype(bool)
        occupied.reshape(DEFAULT_BATCH, -1)[-1] = False  # an empty row
        cells[rank] = np.argwhere(occupied)  # row-major, unique
    return {composite.indices: cells[rank].astype(np.int64),
            composite.values: values(composite.values, len(cells[rank])),
            composite.dense_shape: np.array(dense_shape, np.int64)}


def _values(rng, dtype, shape, high, keys, signature, name):
    if keys is not None:
        picked = keys[rng.integers(0, len(keys), size=shape)] if np.prod(shape) \
            else np.empty(shape, keys.dtype)
        flat = picked.reshape(-1)
        if flat.size >= 2:  # one key the table does not hold: its default row
            flat[-1] = _unknown_key(keys)
        return picked.astype(dtype.as_numpy_dtype) if dtype != tf.string else picked
    if dtype.is_integer:
        high = high or 2
        value = rng.integers(0, high, size=shape)
        flat = value.reshape(-1)
        if flat.size:
            flat[0], flat[-1] = 0, high - 1  # the table's first and last rows
        return value.astype(dtype.as_numpy_dtype)
    if dtype.is_floating:
        return rng.uniform(0, 1, size=shape).astype(dtype.as_numpy_dtype)
    if dtype == tf.bool:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype == tf.string:
        words = np.array([f"{UNKNOWN_KEY}-{i}".encode() for i in range(7)],
                         dtype=object)
        return words[rng.integers(0, len(words), size=shape)]
    raise ExportError(
        f"signature {signature!r} input {name!r} is {dtype.name}: "
        f"verification cannot generate it; pass examples (--examples FILE) "
        f"or --no-verify")


def _unknown_key(keys):
    if keys.dtype.kind in "SOU":
        return UNKNOWN_KEY.encode()
    return keys.max() + 1 if keys.max() < np.iinfo(keys.dtype).max else keys.min() - 1
