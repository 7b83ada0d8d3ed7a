"""What the grader runs in the student's kernel while a check is judged: plain data in and out.

A check runs in the judge (`judge_process`), never here. When it calls one of the task's
functions, the grader executes ``call(...)`` in the kernel as a cell of its own (not kept in
the kernel's input history): the arguments arrive as `codec` text, the student's function
runs, and the result (or the exception's builtin type and message) goes back as one
display output of type `REPLY_MIME`. `describe` tells the judge which task names exist and
sends the values of those that are not callable.

Nothing here is trusted: the student can replace this module, and then only fabricates
their own results, which the judge compares with values it computed itself.
"""

from __future__ import annotations

import builtins
from typing import Any

from . import codec
from .check_api import forbidding

REPLY_MIME = "application/vnd.workbook.grading-reply+json"
MESSAGE_CHARS = 2000


def _user_namespace() -> dict[str, Any]:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("student_side runs inside an IPython kernel")
    return shell.user_ns


def _reply(payload: dict) -> None:
    from IPython.display import publish_display_data

    publish_display_data({REPLY_MIME: payload})


def _builtin_types(error: BaseException) -> list[str]:
    """The builtin exception classes `error` is an instance of, most specific first."""
    return [k.__name__ for k in type(error).__mro__
            if getattr(builtins, k.__name__, None) is k and issubclass(k, BaseException)]


def call(name: str, arguments: str, forbid: list[str] | None = None, message: str = "") -> None:
    """Call the student's `name` with `arguments` (codec text of ``[args, kwargs]``) and
    reply with the result or the exception."""
    namespace = _user_namespace()
    function = namespace.get(name)
    if not callable(function):
        _reply({"missing": True})
        return
    refs = {id(v): k for k, v in namespace.items() if callable(v) and not k.startswith("_")}

    def resolve(ref: str):
        if ref not in namespace:
            raise ValueError(f"{ref} is not defined in the kernel")
        return namespace[ref]

    args, kwargs = codec.decode(arguments, resolve=resolve)
    try:
        with forbidding(*(forbid or []), message=message):
            result = function(*args, **kwargs)
    except (KeyboardInterrupt, SystemExit):
        raise  # the grader's interrupt after a timeout: the cell must end as interrupted
    except BaseException as error:  # what the student's code raised: its type and message
        _reply({"raised": _builtin_types(error), "type": type(error).__qualname__,
                "message": str(error)[:MESSAGE_CHARS]})
        return
    try:
        text = codec.encode(result, refs=refs)
    except codec.EncodeError as error:
        _reply({"unsendable": str(error)})
        return
    _reply({"value": text})


def describe(names: list[str]) -> None:
    """For each of `names`: callable, missing, or its value as codec text."""
    namespace = _user_namespace()
    found: dict[str, dict] = {}
    for name in names:
        if name not in namespace:
            found[name] = {"kind": "missing"}
        elif callable(namespace[name]):
            found[name] = {"kind": "callable"}
        else:
            try:
                found[name] = {"kind": "value", "value": codec.encode(namespace[name])}
            except codec.EncodeError as error:
                found[name] = {"kind": "unsendable", "why": str(error)}
    _reply({"names": found})
