"""The source SavedModel: its MetaGraph, checkpoint, signatures, and where each
captured variable of a signature lives in the checkpoint.

The model is loaded graph-only (`experimental_skip_checkpoint`), so no table
is ever held in memory whole; values are read from the checkpoint on demand.
"""
import dataclasses
import os
import re

import tensorflow as tf
from tensorflow.core.framework import variable_pb2
from tensorflow.core.protobuf import saved_model_pb2, trackable_object_graph_pb2

from export_tools.checkpoint_io import CheckpointReader, VariableLocation
from export_tools.errors import ExportError, tf_error_message

SERVE_TAG = "serve"
_TF1_VARIABLE_COLLECTIONS = ("variables", "local_variables", "model_variables",
                             "trainable_variables")


@dataclasses.dataclass
class Capture:
    """One captured input of a signature function, as a placeholder of its graph."""
    placeholder: str
    external: object                  # the eager tensor / handle captured
    location: VariableLocation = None  # for variables: where the value lives
    owner: object = None              # for other resources (tables): their trackable


def _first_line(error):
    """TF's message of `error` on one line (see tf_error_message)."""
    return tf_error_message(error) or type(error).__name__


class SourceModel:
    """A SavedModel directory opened for reading (never written)."""

    def __init__(self, path, tags=(SERVE_TAG,)):
        self.path = path
        pb_path = os.path.join(path, "saved_model.pb")
        if not os.path.isdir(path):
            raise ExportError(f"{path}: no such directory")
        if not os.path.exists(pb_path):
            raise ExportError(f"{path} is not a SavedModel: saved_model.pb is missing")
        self.saved_model = saved_model_pb2.SavedModel()
        try:
            with open(pb_path, "rb") as f:
                self.saved_model.ParseFromString(f.read())
        except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError and others
            raise ExportError(f"{pb_path} is corrupt: {_first_line(e)}") from e
        matching = [m for m in self.saved_model.meta_graphs
                    if set(tags) <= set(m.meta_info_def.tags)]
        if not matching:
            found = [sorted(m.meta_info_def.tags) for m in self.saved_model.meta_graphs]
            raise ExportError(f"{pb_path} has no MetaGraph tagged {sorted(tags)} "
                              f"(tag sets present: {found})")
        self.meta_graph = matching[0]
        self.tags = list(tags)
        self.signature_defs = dict(self.meta_graph.signature_def)
        self.is_tf2 = len(self.meta_graph.object_graph_def.nodes) > 0
        self.checkpoint_prefix = os.path.join(path, "variables", "variables")
        if not os.path.exists(self.checkpoint_prefix + ".index"):
            raise ExportError(f"{path}: the variables index "
                              f"variables/variables.index is missing")
        self.checkpoint = CheckpointReader(self.checkpoint_prefix)
        self._tf1_variables = self._read_tf1_variable_defs()
        self._object_graph = self._read_object_graph() if self.is_tf2 else None
        try:
            self.loaded = tf.saved_model.load(
                path, tags=self.tags,
                options=tf.saved_model.LoadOptions(experimental_skip_checkpoint=True))
        except Exception as e:  # noqa: BLE001 - TF raises many types here
            raise ExportError(f"TensorFlow cannot load {path}: {_first_line(e)}") from e
        self._trackables = None
        self._graph_tables = {}

    def graph_table(self, op_name, key_dtype, value_dtype):
        """A `StaticHashTable` holding what TF1 in-graph table `op_name`
        (a `HashTableV2` node, filled by the model's table initializer when
        TF loaded it) holds. The output model owns it, so its contents are
        restored at load by TF2's resource initialization instead of the
        TF1 `table_initializer` collection, which the rewritten signatures
        no longer run. One per node, whichever signatures use it."""
        if op_name not in self._graph_tables:
            try:
                handle = self.loaded.prune(feeds=[], fetches=[op_name + ":0"])()[0]
                keys, values = tf.raw_ops.LookupTableExportV2(
                    table_handle=handle, Tkeys=key_dtype, Tvalues=value_dtype)
            except Exception as e:  # noqa: BLE001 - TF raises many types here
                raise ExportError(
                    f"lookup table {op_name!r}: its contents cannot be read from "
                    f"the loaded model ({_first_line(e)}); the model's table "
                    f"initializer did not run or the table is not a hash table") from e
            self._graph_tables[op_name] = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(keys, values),
                default_value=tf.zeros([], value_dtype))
        return self._graph_tables[op_name]

    def _read_tf1_variable_defs(self):
        found = {}
        for collection in _TF1_VARIABLE_COLLECTIONS:
            if collection in self.meta_graph.collection_def:
                for raw in self.meta_graph.collection_def[collection].bytes_list.value:
                    var_def = variable_pb2.VariableDef()
                    var_def.ParseFromString(raw)
                    found[var_def.variable_name.split(":")[0]] = var_def
        return found

    def _read_object_graph(self):
        key = "_CHECKPOINTABLE_OBJECT_GRAPH"
        if key not in self.checkpoint.shapes:
            raise ExportError(f"{self.checkpoint_prefix}: the checkpoint has no "
                              f"object graph")
        graph = trackable_object_graph_pb2.TrackableObjectGraph()
        graph.ParseFromString(self.checkpoint.read(key))
        return graph

    def signature_keys(self):
        return sorted(self.loaded.signatures.keys())

    def _signature_function_name(self, key):
        nodes = self.meta_graph.object_graph_def.nodes
        for child in nodes[0].children:
            if child.local_name == "signatures":
                for sig in nodes[child.node_id].children:
                    if sig.local_name == key:
                        return nodes[sig.node_id].bare_concrete_function \
                            .concrete_function_name
        raise ExportError(f"signature {key!r} has no function in the object graph")

    def _tf2_locations(self, key):
        """A location (or None) for each capture of signature `key`, in capture order."""
        nodes = self.meta_graph.object_graph_def.nodes
        function = self.meta_graph.object_graph_def.concrete_functions[
            self._signature_function_name(key)]
        locations = []
        for node_id in function.bound_inputs:
            attrs = [a for a in self._object_graph.nodes[node_id].attributes
                     if a.name == "VARIABLE_VALUE"]
            if not attrs:
                locations.append(None)  # a table, asset or captured constant
                continue
            key = attrs[0].checkpoint_key
            name = nodes[node_id].variable.name
            if not name or re.fullmatch(r"Variable(_\d+)?", name):
                # An unnamed tf.Variable: its object path says more.
                name = key.split("/.ATTRIBUTES/")[0]
            location = self.checkpoint.location(key, name)
            self._check_declared(location, nodes[node_id].variable)
            locations.append(location)
        return locations

    @staticmethod
    def _check_declared(location, saved_variable):
        """Refuses a checkpoint tensor whose dtype or shape is not the one the
        graph declares for its variable (TF would fail at restore, or a
        kernel would read the tensor as the wrong type)."""
        declared_dtype = tf.as_dtype(saved_variable.dtype)
        declared = tf.TensorShape(saved_variable.shape)
        if declared_dtype != location.dtype or not declared.is_compatible_with(
                location.shape):
            raise ExportError(
                f"variable {location.name!r} is declared {declared_dtype.name}"
                f"{declared.as_list() if declared.rank is not None else '[?]'} in the "
                f"graph but stored as {location.dtype.name}{list(location.shape)} "
                f"in the checkpoint (key {location.key!r}): the SavedModel is "
                f"inconsistent")

    def tf1_location(self, op_name):
        """The checkpoint location of TF1 variable `op_name` (a partition maps
        into its full variable through save_slice_info)."""
        var_def = self._tf1_variables.get(op_name)
        if var_def is not None and var_def.HasField("save_slice_info_def"):
            info = var_def.save_slice_info_def
            if info.full_name not in self.checkpoint.shapes:
                raise ExportError(f"the checkpoint has no variable {info.full_name!r} "
                                  f"(holding partition {op_name!r})")
            return VariableLocation(op_name, info.full_name, tuple(info.full_shape),
                                    tuple(info.var_offset), tuple(info.var_shape),
                                    tf.as_dtype(self.checkpoint.dtypes[info.full_name]))
        return self.checkpoint.location(op_name)

    def _owner_of(self, handle):
        if self._trackables is None:
            self._trackables = list(tf.train.TrackableView(self.loaded).descendants())
        for trackable in self._trackables:
            if getattr(trackable, "resource_handle", None) is handle:
                return trackable
        return None

    def captures(self, key, function):
        """[Capture] for every captured input of signature `key`'s function."""
        captured = list(function.graph.captures)
        if self.is_tf2:
            locations = self._tf2_locations(key)
        else:
            by_handle = {id(v.handle): v for v in function.variables}
            locations = [self.tf1_location(by_handle[id(ext)].name.split(":")[0])
                         if id(ext) in by_handle else None for ext, _ in captured]
        self._refuse_shared_bindings(key, locations)
        if len(locations) != len(captured):
            raise ExportError(
                f"signature {key!r}: {len(captured)} captures but the object "
                f"graph binds {len(locations)}; the SavedModel is inconsistent")
        result = []
        for (external, internal), location in zip(captured, locations):
            capture = Capture(internal.op.name, external, location)
            if location is None and external.dtype == tf.resource:
                capture.owner = self._owner_of(external)
                if capture.owner is None:
                    raise ExportError(f"signature {key!r}: captured resource "
                                      f"{internal.op.name!r} is neither a variable nor "
                                      f"owned by a trackable object")
            result.append(capture)
        return result

    @staticmethod
    def _refuse_shared_bindings(key, locations):
        """Refuses the broken ShardedVariable case: several captured shard handles
        bound to one saved variable (TF itself restores none of the shards right)."""
        seen = set()
        for loc in locations:
            if loc is None:
                continue
            if (loc.key, loc.offset) in seen:
                raise ExportError(
                    f"signature {key!r} binds several variable shards to the one saved "
                    f"variable {loc.key!r}: a ShardedVariable SavedModel saved from a "
                    f"pre-traced concrete function, which TensorFlow itself restores "
                    f"wrongly; re-export it passing the tf.function to "
                    f"tf.saved_model.save")
            seen.add((loc.key, loc.offset))
