"""The state walk of a Python job: the model's, optimizer's and extras' state
dicts as a flat table of tensors plus a JSON skeleton for everything else.

The checkpoint writer and the state transfer copy tensor memory straight out
of the entries, so the walk must hand back the tensors the model and optimizer
are training, never copies: a snapshot is then one memcpy per tensor and costs
no extra memory. The skeleton keeps the non-tensor leaves (learning rates,
Adam's betas, a scheduler's epoch) tagged so that they read back as the same
Python values, which `load_state_dict` needs to see unchanged.
"""

import collections
import functools
import inspect
import json
import math
from typing import Dict, List, NamedTuple, Tuple

import torch

from ._errors import StateError

# The names the checkpoint manifest uses; one table both ways so that the two
# directions cannot drift apart.
_DTYPE_NAMES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
}
_DTYPES_BY_NAME = {name: dtype for dtype, name in _DTYPE_NAMES.items()}

_TAG = "$t"
_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


class StateEntry(NamedTuple):
    """One tensor leaf: `name` is its path, `array` the manifest array it is
    stored in ("model", "optim", "extra"), `role` what it is to the model
    ("parameter", "buffer", "optimizer", "extra"), `tensor` the live tensor."""

    name: str
    array: str
    role: str
    tensor: torch.Tensor


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise StateError(f"{dtype}: troupe checkpoints only "
                         f"{', '.join(_DTYPE_NAMES.values())} tensors") from None


def torch_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES_BY_NAME[name]
    except KeyError:
        raise StateError(f"unknown tensor dtype {name!r} in the checkpoint") from None


def _segment(key) -> str:
    # '%' first, so that an encoded '/' is not encoded twice; the name stays
    # readable while '/' keeps meaning "one level down".
    return str(key).replace("%", "%25").replace("/", "%2F")


def _describe(value) -> str:
    if inspect.isroutine(value) or isinstance(value, functools.partial):
        return "a function"
    return f"a {type(value).__module__}.{type(value).__qualname__} object"


class _Walker:
    def __init__(self):
        self.entries: List[StateEntry] = []
        self._names = set()

    def tree(self, value, path: str, array: str, role_of):
        """Returns the skeleton of `value`, appending its tensors to entries.
        `role_of(tensor)` classifies a tensor of this subtree."""
        if isinstance(value, torch.Tensor):
            return self._tensor(value, path, array, role_of)
        kind = type(value)
        if value is None or kind in (bool, int, str):
            return value
        if kind is float:
            if math.isfinite(value):
                return value
            return {_TAG: "float", "v": "nan" if math.isnan(value)
                    else ("inf" if value > 0 else "-inf")}
        if kind is list:
            return [self.tree(v, f"{path}/{i}", array, role_of)
                    for i, v in enumerate(value)]
        if kind is tuple:
            return {_TAG: "tuple", "v": [self.tree(v, f"{path}/{i}", array, role_of)
                                         for i, v in enumerate(value)]}
        if isinstance(value, dict):
            return self._dict(value, path, array, role_of)
        raise StateError(f"{path}: {_describe(value)} cannot be checkpointed; "
                         f"keep the state in numbers or tensors")

    def _dict(self, value, path, array, role_of):
        children = [(key, self.tree(v, f"{path}/{_segment(key)}", array, role_of))
                    for key, v in value.items()]
        # A plain JSON object only where it cannot be mistaken for a tag on
        # the way back: string keys and none of them the tag itself.
        if all(type(key) is str for key, _ in children) and _TAG not in value:
            return {key: child for key, child in children}
        return {_TAG: "dict",
                "k": [self._key(key, f"{path}/{_segment(key)}") for key, _ in children],
                "v": [child for _, child in children]}

    def _key(self, key, path):
        if isinstance(key, torch.Tensor):
            raise StateError(f"{path}: a tensor as a dictionary key cannot be "
                             f"checkpointed")
        return self.tree(key, path, "", None)

    def _tensor(self, t, path, array, role_of):
        if role_of is None:
            raise StateError(f"{path}: a tensor cannot be a dictionary key")
        if t.layout != torch.strided:
            raise StateError(f"{path}: a {t.layout} tensor cannot be checkpointed; "
                             f"troupe checkpoints dense tensors only")
        if t.device.type != "cpu":
            raise StateError(f"{path}: a tensor on {t.device} cannot be checkpointed; "
                             f"troupe's Python frontend keeps its state on the CPU")
        if t.dtype not in _DTYPE_NAMES:
            raise StateError(f"{path}: a {t.dtype} tensor cannot be checkpointed; "
                             f"troupe checkpoints {', '.join(_DTYPE_NAMES.values())}")
        if not t.is_contiguous():
            # Copying it would break the promise that entries are the live
            # memory; the snapshot copies bytes in storage order.
            raise StateError(f"{path}: a non-contiguous tensor cannot be "
                             f"checkpointed; make it contiguous where it is created")
        if path in self._names:
            raise StateError(f"{path}: two leaves of the state have this name "
                             f"(keys that read the same as text)")
        self._names.add(path)
        self.entries.append(StateEntry(path, array, role_of(t), t))
        return {_TAG: "tensor", "name": path}


def _identity(t: torch.Tensor):
    return (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)


def _model_roles(model: torch.nn.Module):
    # The state dict detaches its tensors, so they are matched to the
    # parameters by the memory they share; tied weights then count as a
    # parameter under every name they appear as.
    trainable = {_identity(p) for p in model.parameters()
                 if p.requires_grad and p.numel() > 0}
    return lambda t: "parameter" if t.numel() > 0 and _identity(t) in trainable else "buffer"


def walk(model, optimizer, extras) -> Tuple[List[StateEntry], str]:
    """The tensors of the job's state (live, in walk order) and the skeleton
    of its tree as deterministic JSON."""
    walker = _Walker()
    extras = extras or {}
    skeleton = {
        "model": walker.tree(model.state_dict(keep_vars=False), "model", "model",
                             _model_roles(model)),
        "optim": walker.tree(optimizer.state_dict(), "optim", "optim",
                             lambda t: "optimizer"),
    }
    extra_skeletons = {}
    for name, obj in extras.items():
        path = f"extras/{_segment(name)}"
        if type(name) is not str:
            raise StateError(f"{path}: an extra's name must be a string")
        if not callable(getattr(obj, "state_dict", None)):
            raise StateError(f"{path}: an extra needs state_dict() and load_state_dict()")
        extra_skeletons[name] = walker.tree(obj.state_dict(), path, "extra",
                                            lambda t: "extra")
    skeleton["extras"] = extra_skeletons
    text = json.dumps(skeleton, sort_keys=False, separators=(",", ":"), allow_nan=False)
    return walker.entries, text


def rebuild(skeleton_json: str, tensors: Dict[str, torch.Tensor]):
    """The tree `walk` described, with the named tensors put back in place
    (the tensors themselves, not copies)."""

    def node(value):
        if isinstance(value, list):
            return [node(v) for v in value]
        if not isinstance(value, dict):
            return value
        tag = value.get(_TAG)
        if tag is None:
            return {k: node(v) for k, v in value.items()}
        if tag == "tensor":
            try:
                return tensors[value["name"]]
            except KeyError:
                raise StateError(f"{value['name']}: the skeleton names this tensor "
                                 f"but the checkpoint holds none by that name") from None
        if tag == "float":
            return _NONFINITE[value["v"]]
        if tag == "tuple":
            return tuple(node(v) for v in value["v"])
        if tag == "dict":
            return {_hashable(node(k)): node(v) for k, v in zip(value["k"], value["v"])}
        raise StateError(f"unknown tag {tag!r} in the state skeleton")

    return node(json.loads(skeleton_json))


def _hashable(key):
    # Lists never come from a key (they are unhashable), but a damaged or
    # foreign skeleton could say so; refuse it with our error, not a TypeError.
    try:
        hash(key)
    except TypeError:
        raise StateError(f"an unhashable dictionary key {key!r} in the state "
                         f"skeleton") from None
    return key


def load(model, optimizer, extras, tree) -> None:
    """Puts a rebuilt tree back into the job's objects, in the order that lets
    a scheduler's state land on an optimizer whose groups are already restored."""
    extras = extras or {}
    saved = tree.get("extras", {})
    if set(saved) != set(extras):
        missing = sorted(set(extras) - set(saved))
        unknown = sorted(set(saved) - set(extras))
        raise StateError(f"extras differ from the checkpoint's: missing there "
                         f"{missing}, unknown here {unknown}")
    model_state = collections.OrderedDict(tree["model"])
    # The version metadata of each module is not in the skeleton; the live
    # model's is the right one since the checkpoint came from the same code.
    model_state._metadata = getattr(model.state_dict(), "_metadata", None)
    model.load_state_dict(model_state, strict=True)
    optimizer.load_state_dict(tree["optim"])
    for name, obj in extras.items():
        obj.load_state_dict(saved[name])
