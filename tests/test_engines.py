"""Each registered engine fills the roles of engines/base.py: every member of each role present (the evaluation
capability where the engine has it), each function with the role's parameters, so a tool can call any member of any
engine the same way; and no role asks more than a caller needs."""

from __future__ import annotations

import inspect
import typing
from typing import Any

import pytest

from quanteval import engines
from quanteval.engines.base import ConfigRole, Evaluation, PlacementRole, RunRole

ROLES = {"config": ConfigRole, "run": RunRole, "placement": PlacementRole, "evaluation": Evaluation}
MAX_MEMBERS = 15


def _members(role: type) -> dict[str, Any]:
    """A role's members: its functions, and its data members by annotation (None)."""
    found: dict[str, Any] = dict.fromkeys(vars(role).get("__annotations__", {}))
    return found | {name: value for name, value in vars(role).items() if inspect.isfunction(value) and not name.startswith("_")}


def _mismatch(member: str, expected: inspect.Signature, actual: inspect.Signature) -> str | None:
    """Why `actual` cannot be called as the role calls `expected` (positionally or by keyword), or None. An
    implementation may add parameters of its own after the role's, with defaults, and give defaults the role does
    not; it may not leave out a default the role gives."""
    wanted = list(expected.parameters.values())[1:]  # the role's self: the module itself
    given = list(actual.parameters.values())
    if [(p.name, p.kind) for p in given[:len(wanted)]] != [(p.name, p.kind) for p in wanted]:
        return f"{member}{actual}: the role's parameters are {member}({', '.join(p.name for p in wanted)})"
    if extra := [p.name for p in given[len(wanted):] if p.default is p.empty]:
        return f"{member}{actual}: {extra} beyond the role's parameters, without a default"
    if lacking := [w.name for w, g in zip(wanted, given, strict=False) if w.default is not w.empty and g.default is g.empty]:
        return f"{member}{actual}: no default for {lacking}, which the role gives one"
    return None


def role_problems(engine: engines.Engine) -> list[str]:
    """What each role of the engine lacks or takes differently from the role's protocol."""
    problems = []
    for attribute, role in ROLES.items():
        if (filled := getattr(engine, attribute)) is None and role is Evaluation:
            continue  # the one optional capability
        for member, declared in _members(role).items():
            if not hasattr(filled, member):
                problems.append(f"{attribute}.{member}: missing")
            elif declared is not None:
                found = getattr(filled, member)
                if not callable(found):
                    problems.append(f"{attribute}.{member}: not a function")
                elif reason := _mismatch(member, inspect.signature(declared), inspect.signature(found)):
                    problems.append(f"{attribute}.{reason}")
    return problems


def test_each_role_asks_at_most_fifteen_members_and_gives_no_defaults():
    counts = {name: len(_members(role)) for name, role in ROLES.items()}
    assert counts == {"config": 15, "run": 14, "placement": 6, "evaluation": 11}
    assert max(counts.values()) <= MAX_MEMBERS
    for role in ROLES.values():  # a data member with a value would be a default every engine silently takes
        assert not set(vars(role).get("__annotations__", {})) & set(vars(role)), role


@pytest.mark.parametrize("engine", engines.registered(), ids=lambda engine: engine.name)
def test_each_registered_engine_fills_its_roles(engine):
    assert role_problems(engine) == [], f"{engine.name} does not fill its roles"
    assert isinstance(engine.config.shell_spliced, tuple) and all(isinstance(key, str) for key in engine.config.shell_spliced)
    assert isinstance(engine.config.host_server_args, tuple)
    assert isinstance(engine.placement.writes_host, bool) and isinstance(engine.placement.native, bool)


def test_only_nel_next_has_the_evaluation_capability_and_only_nel_is_the_placement_form():
    assert [engine.name for engine in engines.registered() if engine.evaluation is not None] == ["nel-next"]
    assert engines.evaluating().name == "nel-next" and engines.placement_form().name == "nel"


def test_the_mismatch_check_catches_a_forwarding_gap():
    """What the role test would say of an engine function that drops a parameter, renames one or lacks a default."""
    role = inspect.signature(Evaluation.task_form)
    assert _mismatch("task_form", role, inspect.signature(lambda qualified_name, repeats=1: None)) is None
    assert _mismatch("task_form", role, inspect.signature(lambda qualified_name, repeats=1, extra=0: None)) is None
    assert "parameters are" in _mismatch("task_form", role, inspect.signature(lambda nel_task, repeats=1: None))
    assert "without a default" in _mismatch("task_form", role, inspect.signature(_needs_more))
    assert "no default" in _mismatch("task_form", role, inspect.signature(lambda qualified_name, repeats: None))


def _needs_more(qualified_name: str, repeats: int = 1, *, more: int) -> None:
    """A function with a parameter beyond the role's that has no default."""


def test_an_unknown_engine_name_is_refused_with_the_known_ones():
    """A typo must not run as another engine (it used to become NEL 0.2.6); a record without a name is the default's."""
    with pytest.raises(engines.ToolError, match="unknown engine 'nel-nxt': the known ones are nel-next, nel"):
        engines.by_name("nel-nxt")
    assert engines.by_name(None).name == engines.by_name("nel").name == "nel"  # records made before engines were recorded
    assert engines.by_name("nel-next").name == "nel-next"
    # the names come from ENGINES alone: each line's engine goes by its line's name, and the tools' schema lists them
    assert [engine.name for engine in engines.registered()] == [name for name, _, _ in engines.ENGINES]
    assert typing.get_args(engines.EngineName) == ("nel", "nel-next")
