"""The stale-fake guard: every fake of verl's or our classes in the unit tests (tests/fakes.py) against the real class.

Each registered fake: the attributes it defines exist on the real class (methods: the real one accepts the positional
arguments the fake's callers pass, i.e. the fake takes no more required ones than the real), and it carries every
class-level setting the real class declares in verl_pipe, unless it says which it leaves out. Every ``class Fake...``
of the unit tests is registered. Fails on a stale fake before the test that uses it fails obscurely in CI."""

import importlib
import inspect
import re
from pathlib import Path

import pytest

from tests.fakes import FAKES, has_attribute, instance_attributes, settings_of, stand_in

TESTS = Path(__file__).resolve().parent
FAKE_CLASS = re.compile(r"^class (_?Fake\w*)\b", re.M)  # module-level (a fake inside a test function is local)


def _modules_with_fakes() -> list[str]:
    return sorted(f"tests.{p.stem}" for p in TESTS.glob("test_*.py") if FAKE_CLASS.search(p.read_text()))


def _registered() -> dict:
    for name in _modules_with_fakes():
        importlib.import_module(name)
    return dict(FAKES)


def test_every_fake_class_of_the_unit_tests_is_registered():
    registered = {(c.__module__, c.__qualname__.split(".<locals>.")[-1]) for c in _registered()}
    missing = [f"{m}.{n}" for m in _modules_with_fakes()
               for n in FAKE_CLASS.findall((TESTS / f"{m.split('.')[-1]}.py").read_text())
               if (m, n) not in registered]
    assert not missing, f"fakes not registered with tests.fakes.fake_of: {missing}"


def _defined(fake: type) -> dict[str, object]:
    """What the fake defines itself: its class body's names (no dunders) and what its methods set on ``self``."""
    own = {n: v for n, v in vars(fake).items() if not n.startswith("__")}
    for name in set(instance_attributes(fake)) - set(own):
        own[name] = None
    return own


def _unbound(real_fn, fake_fn) -> list[str]:
    """The real method's required parameters the fake cannot take (by name, or through *args / **kwargs)."""
    try:
        real = list(inspect.signature(real_fn).parameters.values())[1:]  # after self
        fake = inspect.signature(fake_fn).parameters
    except (TypeError, ValueError):
        return []
    var_pos = any(p.kind == p.VAR_POSITIONAL for p in fake.values())
    var_kw = any(p.kind == p.VAR_KEYWORD for p in fake.values())
    fake_positional = [p for p in list(fake.values())[1:] if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    out = []
    for i, p in enumerate(real):
        if p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in fake:
            continue
        positional = p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        if positional and (var_pos or i < len(fake_positional)) or p.kind != p.POSITIONAL_ONLY and var_kw:
            continue  # passed by position, or by name into **kwargs
        out.append(p.name)
    return out


@pytest.mark.parametrize("fake", sorted(_registered(), key=lambda c: c.__qualname__), ids=lambda c: c.__qualname__)
def test_a_fake_matches_its_real_class(fake):
    real, unused, extra, why = FAKES[fake]
    if real is None:
        assert why, f"{fake.__qualname__}: registered without a real class and without saying why"
        return
    problems = []
    for name, value in _defined(fake).items():
        if name in extra:
            continue
        if not has_attribute(real, name):
            problems.append(f"{name}: not an attribute of {real.__qualname__}")
            continue
        real_value = getattr(real, name, None)
        if inspect.isfunction(value) and (inspect.isfunction(real_value) or inspect.ismethod(real_value)):
            unbound = _unbound(real_value, value)
            if unbound:
                problems.append(f"{name}: the fake cannot take {real.__qualname__}.{name}'s {unbound}")
    defined = set(_defined(fake)) | {n for n in dir(fake) if not n.startswith("__")}
    for name in settings_of(real):
        if name not in defined and name not in unused:
            problems.append(f"{name}: a setting of {real.__qualname__} the fake lacks (add it, or name it in unused=)")
    for name in unused:
        if name not in settings_of(real):
            problems.append(f"unused={name!r}: not a setting of {real.__qualname__} (any more)")
    assert not problems, f"{fake.__module__}.{fake.__qualname__} stands in for {real.__module__}." \
                         f"{real.__qualname__}: " + "; ".join(problems)


def test_stand_ins_carry_the_real_settings_and_refuse_unknown_names():
    from verl_pipe.rollout.agent_worker import PipeAgentLoopWorker

    worker = stand_in(PipeAgentLoopWorker, _postprocess=None)
    assert worker.score_by_group is False and worker.catch_reward_errors is False and worker.reward_timeout_s is None
    with pytest.raises(AttributeError, match=r"\['score_by_grup'\] are not attributes"):
        stand_in(PipeAgentLoopWorker, score_by_grup=True)
    assert stand_in(PipeAgentLoopWorker, extra={"calls": []}).calls == []
