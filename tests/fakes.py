"""Stand-ins for verl's and our classes in unit tests, kept honest against the real classes (tests/test_fakes.py).

Twice a fresh-clone CI failed on a stand-in the code had outgrown (the driver microbenchmark's worker without the new
``score_by_group``, a ``FakeTrainer`` without ``actor_non_tensor_keys``): nothing compared the stand-in with the class
it stands in for. Here:

- ``@fake_of(Real)`` registers a fake class; the guard test checks that every attribute it defines exists on ``Real``
  (a rename or removal there leaves a stale name here; methods: the real one takes what the fake's callers pass),
  and that it carries every class-level setting ``Real`` declares in verl_pipe (``settings_of``: knobs such as
  ``actor_non_tensor_keys`` that code reads off the object), unless the fake names it in ``unused`` (read by no code
  the tests of that fake run);
- ``stand_in(Real, **attrs)`` builds a namespace object for ``Real``: its verl_pipe settings (and a pydantic model's
  field defaults) first, so a new setting reaches it by itself, then ``attrs``, each of which must be an attribute of
  ``Real`` (``extra`` holds test-only ones).
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import textwrap
from types import SimpleNamespace

FAKES: dict[type, tuple[type | None, tuple[str, ...], tuple[str, ...], str]] = {}


def fake_of(real: type | None, unused: tuple[str, ...] = (), extra: tuple[str, ...] = (), why: str = ""):
    """Registers the decorated class as a fake of ``real`` (None: a third-party object with no Python class to check,
    e.g. a Ray ObjectRef; ``why`` says so). ``unused``: settings of ``real`` the fake leaves out (no code its tests
    run reads them); ``extra``: the fake's own test bookkeeping (not attributes of ``real``)."""
    def register(cls):
        FAKES[cls] = (real, tuple(unused), tuple(extra), why)
        return cls
    return register


def _ours(cls) -> bool:
    return (getattr(cls, "__module__", "") or "").startswith("verl_pipe")


def settings_of(real: type) -> dict[str, object]:
    return copy.deepcopy(_settings_of(real))


@functools.lru_cache(maxsize=None)
def _settings_of(real: type) -> dict[str, object]:
    """``real``'s class-level settings declared in verl_pipe (itself and its verl_pipe bases): public or private
    non-callable class attributes, no dunders; a pydantic model's fields with their defaults."""
    out: dict[str, object] = {}
    fields = getattr(real, "model_fields", None)
    if fields:
        for name, field in fields.items():
            if not field.is_required():
                out[name] = copy.deepcopy(field.get_default(call_default_factory=True))
    for base in reversed(real.__mro__):
        if not _ours(base):
            continue
        for name, value in vars(base).items():
            if name.startswith("__") or callable(value) or isinstance(value, (property, staticmethod, classmethod)):
                continue
            out[name] = value
    return out


@functools.lru_cache(maxsize=None)
def instance_attributes(real: type) -> frozenset[str]:
    """Names assigned on ``self`` anywhere in ``real``'s methods and its bases' (verl's too), read from the source."""
    names: set[str] = set()
    for base in real.__mro__:
        if base is object:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
        except (OSError, TypeError, SyntaxError):
            continue
        (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef)] or [None]
        methods = [n for n in (cls.body if cls else []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in (sub for m in methods for sub in ast.walk(m)):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for t in targets:
                for sub in ([t] if not isinstance(t, ast.Tuple) else t.elts):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                        names.add(sub.attr)
    return frozenset(names)


def has_attribute(real: type, name: str) -> bool:
    return hasattr(real, name) or name in (getattr(real, "model_fields", None) or {}) \
        or name in instance_attributes(real)


def stand_in(real: type, extra: dict | None = None, **attrs) -> SimpleNamespace:
    """A namespace standing in for an instance of ``real``: its settings (``settings_of``), then ``attrs`` (each an
    attribute of ``real``: AttributeError otherwise), then ``extra`` (test-only)."""
    unknown = sorted(k for k in attrs if not has_attribute(real, k))
    if unknown:
        raise AttributeError(f"stand-in for {real.__module__}.{real.__qualname__}: {unknown} are not attributes of "
                             "the real class (renamed there? pass test-only ones as extra=)")
    return SimpleNamespace(**{**settings_of(real), **attrs, **(extra or {})})
