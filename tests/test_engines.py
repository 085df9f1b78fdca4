"""Each registered engine is a module that satisfies the Engine protocol (engines/base.py): every member present, each
function with the protocol's parameters, so a tool can call any member of any engine the same way."""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

import pytest

from quanteval import engines
from quanteval.engines.base import Engine, EngineDefaults, EngineName


def _members(protocol: type) -> dict[str, Any]:
    """The protocol's members, its bases' (EngineDefaults) included: functions, and data members by annotation."""
    found: dict[str, Any] = {}
    for cls in reversed(protocol.__mro__):
        if cls in (Engine, EngineDefaults):
            found.update({name: type(None) for name in vars(cls).get("__annotations__", {})})
            found.update({name: value for name, value in vars(cls).items() if inspect.isfunction(value) and not name.startswith("_")})
    return found


MEMBERS = _members(Engine)


def _mismatch(member: str, expected: inspect.Signature, actual: inspect.Signature) -> str | None:
    """Why `actual` cannot be called as the protocol calls `expected` (positionally or by keyword), or None. An
    implementation may add parameters of its own after the protocol's, with defaults, and give defaults the protocol
    does not; it may not leave out a default the protocol gives."""
    wanted = list(expected.parameters.values())[1:]  # the protocol's self: the module itself
    given = list(actual.parameters.values())
    if [(p.name, p.kind) for p in given[:len(wanted)]] != [(p.name, p.kind) for p in wanted]:
        return f"{member}{actual}: the protocol's parameters are {member}({', '.join(p.name for p in wanted)})"
    if extra := [p.name for p in given[len(wanted):] if p.default is p.empty]:
        return f"{member}{actual}: {extra} beyond the protocol's parameters, without a default"
    if lacking := [w.name for w, g in zip(wanted, given, strict=False) if w.default is not w.empty and g.default is g.empty]:
        return f"{member}{actual}: no default for {lacking}, which the protocol gives one"
    return None


def test_the_protocol_lists_the_members_the_tools_call():
    assert {"name", "owns", "validate", "launch", "refresh", "shell_spliced", "task_form", "evaluation_problems"} <= set(MEMBERS)
    assert set(engines.OPTIONAL) == set(_members(EngineDefaults))


@pytest.mark.parametrize("engine", engines.registered(), ids=lambda engine: engine.name)
def test_each_registered_engine_module_satisfies_the_engine_protocol(engine):
    assert isinstance(engine, types.ModuleType)
    assert engine.name in typing.get_args(EngineName)
    problems = []
    for member, declared in MEMBERS.items():
        if not hasattr(engine, member):
            problems.append(f"{member}: missing")
        elif inspect.isfunction(declared):
            found = getattr(engine, member)
            if not callable(found):
                problems.append(f"{member}: not a function")
            elif reason := _mismatch(member, inspect.signature(declared), inspect.signature(found)):
                problems.append(reason)
    assert problems == [], f"{engine.__name__} does not satisfy Engine"
    assert isinstance(engine.shell_spliced, tuple) and all(isinstance(key, str) for key in engine.shell_spliced)
    assert isinstance(engine.writes_placement_host, bool) and isinstance(engine.placement_native, bool)


def test_a_module_that_leaves_an_optional_member_out_gets_its_default_bound_to_it():
    bare = types.ModuleType("bare_engine")
    bare.name = "nel"  # type: ignore[attr-defined]
    engine = engines.with_defaults(bare)
    assert engine.shell_spliced == () and engine.placement_native is False
    assert engine.command_presets({"a": 1}) == {} and engine.placement_key("execution.partition") == "execution.partition"
    assert engine.env_var_needs({"x": "host:HF_TOKEN"}) == {"HF_TOKEN": ["x"]}
    with pytest.raises(NotImplementedError, match="nel gives no form"):  # the default gets the module as self
        engine.task_form("nemo_skills.ns_gpqa")
    own = types.ModuleType("own_engine")
    own.shell_spliced = ("a.*",)  # type: ignore[attr-defined]
    assert engines.with_defaults(own).shell_spliced == ("a.*",)  # a member the module has is its own


def test_the_mismatch_check_catches_a_forwarding_gap():
    """What the protocol test would say of an engine function that drops a parameter, renames one or lacks a default."""
    protocol = inspect.signature(EngineDefaults.task_form)
    assert _mismatch("task_form", protocol, inspect.signature(lambda qualified_name, repeats=1: None)) is None
    assert _mismatch("task_form", protocol, inspect.signature(lambda qualified_name, repeats=1, extra=0: None)) is None
    assert "parameters are" in _mismatch("task_form", protocol, inspect.signature(lambda nel_task, repeats=1: None))
    assert "without a default" in _mismatch("task_form", protocol, inspect.signature(_needs_more))
    assert "no default" in _mismatch("task_form", protocol, inspect.signature(lambda qualified_name, repeats: None))


def _needs_more(qualified_name: str, repeats: int = 1, *, more: int) -> None:
    """A function with a parameter beyond the protocol's that has no default."""


def test_an_unknown_engine_name_is_refused_with_the_known_ones():
    """A typo must not run as another engine (it used to become NEL 0.2.6); a record without a name is the default's."""
    with pytest.raises(engines.ToolError, match="unknown engine 'nel-nxt': the known ones are nel-next, nel"):
        engines.by_name("nel-nxt")
    assert engines.by_name(None).name == engines.by_name("nel").name == "nel"  # records made before engines were recorded
    assert engines.by_name("nel-next").name == "nel-next"
    assert set(typing.get_args(EngineName)) == {engine.name for engine in engines.registered()}
