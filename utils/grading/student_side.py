"""What the grader runs in the student's kernel while a check is judged: plain data in and out.

A check runs in the judge (`judge_process`), never here. When it calls one of the task's
functions, the grader executes ``Entry.call(...)`` in the kernel as a cell of its own (not
kept in the kernel's input history): the arguments arrive as `codec` text, the student's
function runs (with the lab's banned library functions swapped for a refusal while it does),
and the result (or the exception's builtin type and message) goes back as one display output
of type `REPLY_MIME`. ``Entry.describe`` tells the judge which task names exist and sends the
values of those that are not callable.

Nothing here is trusted, and nothing here trusts the student's namespace:

* **Reached without a name.** The grader's cells find `Entry` as the first class of that
  name in this module among ``object``'s subclasses (`ENTRY_EXPRESSION`), a path made of
  literals and attributes of builtin types only: no name is looked up in the student's globals, so
  rebinding ``__import__``, ``__builtins__`` or anything else there changes nothing. The
  grader arms it (`arm`) before any student cell runs, so a look-alike class a submission
  defines later comes after it in that list.
* **Its helpers captured when it was defined.** The functions it relies on (the codec, the
  ban's code swap `check_api.CodeSwap`, ``callable``) are default arguments, bound when this module was imported;
  the reply channel and the student's namespace are taken when it is armed and kept in a
  closure: replacing them in this module, in `codec`, `check_api` or in ``builtins``
  afterwards does not reach a check. The entry's classes refuse attribute assignment.
* **Bans last until the reply is sent**, so nothing that runs on the way out can call a
  banned function.
* **Signed replies.** `arm` receives a random token from the grader; every reply carries it
  and a self-check of the entry's functions (their code, defaults). A reply without the
  token, or one saying the entry was altered, is a tampered kernel: the grader fails the
  check and flags the submission for review. Getting the token or altering the entry takes
  introspection that the review signs flag (``__subclasses__``, ``__kwdefaults__``,
  ``__code__``, ``gc``, ``ctypes``, ``__setattr__``).

The student can still fabricate results for their own functions; the judge compares them
with values it computed itself.
"""

from __future__ import annotations

import builtins
from typing import Any

from . import codec
from .check_api import CodeSwap, _ReadOnly
from .kernel_output import REPLY_MIME

MESSAGE_CHARS = 2000
ENTRY_EXPRESSION = ("[c for c in ().__class__.__base__.__subclasses__() "
                    "if c.__module__ == 'utils.grading.student_side' and c.__name__ == 'Entry'][0]")
"""How the grader's cells reach `Entry` without looking up any name in the student's namespace."""


def _builtin_types(error: BaseException, *, _builtins=builtins, _getattr=getattr) -> list[str]:
    """The builtin exception classes `error` is an instance of, most specific first."""
    return [k.__name__ for k in type(error).__mro__
            if _getattr(_builtins, k.__name__, None) is k and issubclass(k, BaseException)]


def _make_entry() -> type:
    """`Entry`, with its state (the grader's token, the reply channel, the student's
    namespace, the entry's functions as armed) in this closure: no module attribute holds it."""
    armed: dict[str, Any] = {}

    def fingerprint() -> dict[str, tuple]:
        functions = {name: value.__func__ for name, value in vars(Entry).items() if isinstance(value, staticmethod)}
        functions.update({f"CodeSwap.{name}": getattr(CodeSwap, name) for name in ("__init__", "__enter__", "__exit__")})
        return {name: (f.__code__, f.__defaults__, tuple((f.__kwdefaults__ or {}).items()))
                for name, f in functions.items()}

    def reply(payload: dict) -> None:
        now = fingerprint()
        changed = sorted(k for k in set(now) | set(armed["functions"]) if now.get(k) != armed["functions"].get(k))
        tampered = f"the grader's entry point was altered in the kernel: {', '.join(changed)}" if changed else ""
        armed["publish"]({REPLY_MIME: {**payload, "token": armed["token"], "tampered": tampered}})

    class Entry(metaclass=_ReadOnly):
        """The grader's entry point in the kernel (see the module doc); reached through
        `ENTRY_EXPRESSION`, never through a name."""

        @staticmethod
        def arm(token: str) -> None:
            """Called by the grader once, before any student cell: keep its token, the
            reply channel, the student's namespace and the entry's functions as they are."""
            from IPython import get_ipython
            from IPython.display import publish_display_data

            if armed:
                raise RuntimeError("the grader's entry point is armed already")
            shell = get_ipython()
            if shell is None:
                raise RuntimeError("student_side runs inside an IPython kernel")
            armed.update(token=str(token), publish=publish_display_data, namespace=shell.user_ns,
                         functions=fingerprint())

        @staticmethod
        def call(name: str, arguments: str, forbid: list[str] | None = None, message: str = "", *,
                 _decode=codec.decode, _encode=codec.encode, _encode_error=codec.EncodeError,
                 _forbidden=CodeSwap, _types=_builtin_types, _callable=callable, _str=str, _id=id,
                 _type=type) -> None:
            """Call the student's `name` with `arguments` (codec text of ``[args, kwargs]``),
            the functions in `forbid` refused meanwhile, and reply with the result or the
            exception. The reply is sent before the ban ends: nothing that runs on the way
            out (a patched display channel) can call a banned function."""
            namespace = armed["namespace"]
            function = namespace.get(name)
            if not _callable(function):
                reply({"missing": True})
                return
            refs = {_id(v): k for k, v in namespace.items() if _callable(v) and not k.startswith("_")}

            def resolve(ref: str):
                if ref not in namespace:
                    raise ValueError(f"{ref} is not defined in the kernel")
                return namespace[ref]

            args, kwargs = _decode(arguments, resolve=resolve)
            with _forbidden(forbid or [], message):
                try:
                    result = function(*args, **kwargs)
                except (KeyboardInterrupt, SystemExit):
                    raise  # the grader's interrupt after a timeout: the cell must end as interrupted
                except BaseException as error:  # what the student's code raised: its type and message
                    reply({"raised": _types(error), "type": _type(error).__qualname__,
                           "message": _str(error)[:MESSAGE_CHARS]})
                    return
                try:
                    text = _encode(result, refs=refs)
                except _encode_error as error:
                    reply({"unsendable": _str(error)})
                    return
                reply({"value": text})

        @staticmethod
        def describe(names: list[str], *, _encode=codec.encode, _encode_error=codec.EncodeError,
                     _callable=callable, _str=str) -> None:
            """For each of `names`: callable, missing, or its value as codec text."""
            namespace = armed["namespace"]
            found: dict[str, dict] = {}
            for name in names:
                if name not in namespace:
                    found[name] = {"kind": "missing"}
                elif _callable(namespace[name]):
                    found[name] = {"kind": "callable"}
                else:
                    try:
                        found[name] = {"kind": "value", "value": _encode(namespace[name])}
                    except _encode_error as error:
                        found[name] = {"kind": "unsendable", "why": _str(error)}
            reply({"names": found})

    return Entry


Entry = _make_entry()
