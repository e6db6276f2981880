"""A model's config read once with transformers, kept as plain values for later starts.

Importing transformers costs seconds in every process that reads a config (the worker, each
tensor- and pipeline-parallel rank).  ``loader.load_config`` reads a ``config.json`` with
``AutoConfig`` once, writes its ``ConfigSnapshot`` (``write_snapshot``) under
``$RADIXSERVE_CACHE/configs``, keyed by the file's bytes and the transformers and torch versions
(``snapshot_path``), and later reads it back (``read_snapshot``) without transformers.

Contract: an attribute of a snapshot is what transformers' config gives (AttributeError where it
has none), ``to_dict()`` is equal; a name the snapshot could not keep (a method, a value that is
not plain data) raises TypeError, never a silent default.  A model with a non-default RoPE keeps
no snapshot (its rotary reference functions take transformers' config).  A damaged or unreadable
snapshot is read again with transformers.
"""
from __future__ import annotations

import copy
import hashlib
import logging
import os
import pickle
import tempfile
from typing import Any, Optional

import torch

logger = logging.getLogger(__name__)

CONFIG_SNAPSHOT = 1  # the snapshot format (part of the cache key)
_PLAIN = (type(None), bool, int, float, str, torch.dtype)


class ConfigSnapshot:
    """A transformers config as ``AutoConfig`` read it, kept as plain values: every data
    attribute (the instance's, the class's, properties, ``attribute_map`` aliases) and
    ``to_dict()``.  Reading a name gives what the config gives (AttributeError where it has
    none); any other name it has (a method, a value that is not plain data such as
    ``per_layer_config``) raises TypeError, never a silent default."""

    def __init__(self, attrs: dict[str, Any], as_dict: dict[str, Any], left_out: frozenset[str]) -> None:
        self.__dict__.update(attrs)
        self._snapshot_dict = as_dict
        self._snapshot_left_out = left_out

    def __getattr__(self, name: str) -> Any:  # only names the snapshot does not hold
        if name in self.__dict__.get("_snapshot_left_out", ()):
            raise TypeError(f"config: {name} is not in the config snapshot (read the config with transformers)")
        raise AttributeError(name)

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._snapshot_dict)


def _plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_plain(v) for v in value)
    return isinstance(value, dict) and all(_plain(k) and _plain(v) for k, v in value.items())


def snapshot_path(hf_dir: str, root: str) -> Optional[str]:
    """The snapshot's file, named by config.json's bytes and the versions that read it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        with open(os.path.join(hf_dir, "config.json"), "rb") as f:
            h = hashlib.sha256(f.read())
        h.update(f"\0{CONFIG_SNAPSHOT} {version('transformers')} {torch.__version__}".encode())
    except (OSError, PackageNotFoundError):
        return None
    return os.path.join(root, "configs", h.hexdigest()[:32] + ".pkl")


def read_snapshot(path: str, hf_dir: str) -> Optional[ConfigSnapshot]:
    try:
        with open(path, "rb") as f:
            attrs, as_dict, left_out, path_names, path_keys = pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception as e:  # a damaged snapshot is read again with transformers (and rewritten)
        logger.warning("config snapshot %s unreadable (%s); reading the config with transformers", path, e)
        return None
    attrs.update(dict.fromkeys(path_names, str(hf_dir)))  # as AutoConfig names the folder it read
    as_dict.update(dict.fromkeys(path_keys, str(hf_dir)))
    return ConfigSnapshot(attrs, as_dict, left_out)


def write_snapshot(path: str, config: Any, hf_dir: str) -> None:
    """Keep ``config``'s snapshot in ``path`` unless the model needs transformers' config later."""
    from radixserve.model.layers.rotary import rope_parameters

    layer_types = set(getattr(config, "layer_types", None) or ()) | {None}
    if any(rope_parameters(config, t)["rope_type"] != "default" for t in layer_types):
        return
    from transformers.utils import logging as hf_logging

    attrs: dict[str, Any] = {}
    left_out: set[str] = set()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # reading every name reads the deprecated ones too
    try:
        for name in set(dir(config)) | set(getattr(config, "attribute_map", None) or ()):
            if name.startswith("__"):
                continue
            try:
                value = getattr(config, name)
            except AttributeError:
                continue
            except Exception:  # a property that raises: the snapshot raises too
                left_out.add(name)
                continue
            if _plain(value):
                attrs[name] = value
            else:  # methods too: a call the snapshot cannot answer fails loudly
                left_out.add(name)
        as_dict = config.to_dict()
    finally:
        hf_logging.set_verbosity(verbosity)
    if not _plain(as_dict):
        return
    path_names = [k for k, v in attrs.items() if v == str(hf_dir)]
    path_keys = [k for k, v in as_dict.items() if v == str(hf_dir)]
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            pickle.dump((attrs, as_dict, frozenset(left_out), path_names, path_keys), f)
        os.replace(tmp, path)
    except OSError as e:  # a read-only cache: every start reads the config with transformers
        logger.debug("config snapshot not written to %s: %s", path, e)
