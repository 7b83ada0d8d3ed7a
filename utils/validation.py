"""The checks every layer applies to what a learner types: counts and stage boundaries.

One place, so that ``True`` is never a count, ``2.5`` never a layer index, and every error
says what the value means and what to change.
"""

from __future__ import annotations

from collections.abc import Sequence


def count(name: str, value: object, *, minimum: int = 1, meaning: str = "") -> int:
    """`value` as an int >= `minimum`, or an error naming it.

    Accepts Python and numpy integers and integral floats such as ``8.0`` (they come out of
    numpy sweeps); rejects booleans, which are ints to Python but never a count to a reader.
    """
    what = f"{name} ({meaning})" if meaning else name
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif not isinstance(value, int) and hasattr(value, "__index__"):
        value = value.__index__()
    if not isinstance(value, int):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be at least {minimum}, got {value}")
    return value


def boundaries(parts: Sequence[int], *, n_layers: int, num_stages: int) -> list[int]:
    """Stage boundaries ``[0, b1, ..., n_layers]`` checked and returned as a list of ints.

    Valid means ``num_stages + 1`` integers (no floats, no booleans) from 0 to `n_layers`,
    strictly increasing, so that every stage owns at least one layer.
    """
    if num_stages > n_layers:
        raise ValueError(f"{num_stages} stages need at least {num_stages} layers, the model has "
                         f"{n_layers}: every stage needs a layer")
    if isinstance(parts, (str, bytes)) or not hasattr(parts, "__len__"):
        raise ValueError(f"boundaries must be a list of ints like [0, ..., {n_layers}], got {parts!r}")
    out = []
    for i, b in enumerate(parts):
        if isinstance(b, bool) or isinstance(b, float) or not hasattr(b, "__index__"):
            raise ValueError(f"boundary [{i}] = {b!r} is not an integer layer index "
                             f"(boundaries are layer numbers such as [0, 2, {n_layers}])")
        out.append(b.__index__())
    if len(out) != num_stages + 1:
        raise ValueError(f"boundaries {out} have {len(out)} entries; {num_stages} stages need "
                         f"{num_stages + 1} boundaries [0, ..., {n_layers}]")
    if out[0] != 0:
        raise ValueError(f"boundaries {out} must start at 0 (the first layer)")
    if out[-1] != n_layers:
        raise ValueError(f"boundaries {out} must end at {n_layers} (the layer count): they must cover "
                         "every layer")
    for s in range(num_stages):
        if out[s + 1] <= out[s]:
            raise ValueError(f"boundaries {out} are not strictly increasing: stage {s} would own "
                             "no layers")
    return out
