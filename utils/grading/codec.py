"""Plain data between the student's kernel and the judge: arguments out, results back.

The judge (`judge_process`) never receives an object from the student's kernel, only JSON
text that this module turns back into values of a fixed set of types. So a returned object
cannot carry behaviour into the judge: an "always equal" object, a float subclass with its
own ``__eq__`` or a list whose ``__len__`` lies arrives as a `StudentObject`, which equals
nothing and has no arithmetic, and the check fails as it should.

Types keep their identity across the trip, because checks test them (``type(got) is
float``): ``1`` and ``1.0`` differ in JSON already; tuples, dicts, numpy scalars and arrays,
`utils.Event` and `utils.Timeline` are tagged. Only exact types are encoded as themselves;
an instance of a subclass becomes a `StudentObject` naming its type.

Both sides import this module: the judge (trusted) and the kernel (the student's). What the
kernel encodes is untrusted text; `decode` only builds the listed types and bounds depth
and size.
"""

from __future__ import annotations

import json
import math
from typing import Any

TAG = "__grading__"
MAX_DEPTH = 64
MAX_ITEMS = 2_000_000
"""Values (list items, dict entries, array elements) one message may hold."""
REPR_CHARS = 200
"""Characters of a `StudentObject`'s repr kept (shown to the instructor, cut)."""


class EncodeError(ValueError):
    """A value too large or too deep to send."""


class StudentObject:
    """A value the codec does not carry: known by its type name and a cut repr only.

    It equals nothing (not even another `StudentObject`), so no check passes on it by
    accident."""

    __slots__ = ("type_name", "text")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, type_name: str, text: str):
        self.type_name, self.text = type_name, text

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<{self.type_name} object from the student's kernel: {self.text}>"


class StudentFunction:
    """A reference to a callable the student's kernel holds (passed back as an argument)."""

    def __init__(self, name: str):
        self.__name__ = self.name = name

    def __repr__(self) -> str:
        return f"<student function {self.name}>"


def _cut(text: str) -> str:
    return text if len(text) <= REPR_CHARS else text[:REPR_CHARS - 3] + "..."


def _describe(value: Any) -> dict:
    try:
        text = repr(value)
    except Exception as error:  # a student's __repr__ may raise: say so, do not propagate
        text = f"<repr failed: {type(error).__name__}>"
    return {TAG: "object", "type": _cut(type(value).__qualname__), "repr": _cut(str(text))}


class _Encoder:
    def __init__(self, refs: dict[int, str] | None):
        self.items = 0
        self.refs = refs or {}

    def count(self, n: int = 1) -> None:
        self.items += n
        if self.items > MAX_ITEMS:
            raise EncodeError(f"more than {MAX_ITEMS} values")

    def __call__(self, value: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise EncodeError(f"nested deeper than {MAX_DEPTH} levels")
        self.count()
        kind = type(value)
        if value is None or kind in (bool, int, str):
            return value
        if kind is float:
            return value if math.isfinite(value) else {TAG: "float", "v": repr(value)}
        if kind is list:
            return [self(v, depth + 1) for v in value]
        if kind is tuple:
            return {TAG: "tuple", "v": [self(v, depth + 1) for v in value]}
        if kind is dict:
            return {TAG: "dict", "v": [[self(k, depth + 1), self(v, depth + 1)] for k, v in value.items()]}
        if kind is StudentFunction:
            return {TAG: "function", "name": value.name}
        if id(value) in self.refs:
            return {TAG: "function", "name": self.refs[id(value)]}
        module = getattr(kind, "__module__", "")
        if module == "numpy":
            return self.numpy(value, kind)
        if module == "utils.timeline" and kind.__name__ in ("Event", "Timeline"):
            data = value.to_dict() if kind.__name__ == "Timeline" else {
                k: getattr(value, k) for k in value.__dataclass_fields__}
            self.count(len(data.get("events", ())))
            return {TAG: kind.__name__, "v": self(data, depth + 1)}
        return _describe(value)

    def numpy(self, value: Any, kind: type) -> Any:
        if kind.__name__ == "ndarray":
            if value.dtype.kind not in "biuf":
                return _describe(value)
            self.count(int(value.size))
            return {TAG: "ndarray", "dtype": value.dtype.str, "shape": list(value.shape),
                    "v": [self(float(v)) if value.dtype.kind == "f" else int(v) for v in value.ravel().tolist()]}
        dtype = getattr(value, "dtype", None)
        if dtype is not None and dtype.kind in "biuf" and getattr(value, "shape", None) == ():
            item = value.item()
            return {TAG: "scalar", "dtype": dtype.str, "v": self(item)}
        return _describe(value)


def encode(value: Any, *, refs: dict[int, str] | None = None) -> str:
    """JSON text of `value` (see the module doc). `refs` maps ``id()`` of callables to the
    names they are sent as. Raises `EncodeError` for values over the bounds."""
    return json.dumps(_Encoder(refs)(value), ensure_ascii=False, allow_nan=False)


class _Decoder:
    def __init__(self, resolve):
        self.items = 0
        self.resolve = resolve

    def __call__(self, data: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError("nested too deep")
        self.items += 1
        if self.items > MAX_ITEMS:
            raise ValueError("too many values")
        if data is None or type(data) in (bool, int, float, str):
            return data
        if type(data) is list:
            return [self(v, depth + 1) for v in data]
        if type(data) is not dict:
            raise ValueError(f"unexpected {type(data).__name__}")
        tag = data.get(TAG)
        if tag == "tuple":
            return tuple(self(v, depth + 1) for v in data["v"])
        if tag == "dict":
            pairs = [(self(k, depth + 1), self(v, depth + 1)) for k, v in data["v"]]
            try:
                return dict(pairs)
            except TypeError:  # an unhashable key: keep what arrived, as an object
                return StudentObject("dict", "a dict with unhashable keys")
        if tag == "float":
            return float(data["v"])
        if tag == "function":
            return self.resolve(str(data["name"]))
        if tag == "object":
            return StudentObject(str(data.get("type", "?")), str(data.get("repr", "")))
        if tag in ("ndarray", "scalar"):
            import numpy as np

            dtype = np.dtype(str(data["dtype"]))
            if dtype.kind not in "biuf":
                raise ValueError(f"unexpected dtype {dtype}")
            if tag == "scalar":
                return dtype.type(self(data["v"], depth + 1))
            return np.array(data["v"], dtype=dtype).reshape([int(n) for n in data["shape"]])
        if tag in ("Event", "Timeline"):
            from utils import timeline

            fields = self(data["v"], depth + 1)
            if tag == "Event":
                return timeline.Event(**fields)
            return timeline.Timeline.from_dict(fields)
        raise ValueError(f"unknown tag {tag!r}")


def decode(text: str | bytes, *, resolve=StudentFunction) -> Any:
    """The value `encode` wrote. `resolve(name)` builds what a function reference becomes
    on this side. Raises ValueError for text that is not what `encode` writes."""
    if not isinstance(text, (str, bytes)):
        raise ValueError(f"not a grading message: {type(text).__name__}")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise ValueError(f"not a grading message: {error}") from None
    try:
        return _Decoder(resolve)(data)
    except (KeyError, TypeError, RecursionError) as error:
        raise ValueError(f"malformed grading message: {error!r}") from None
