"""@tool: a plain function becomes a tool whose schema and validation come from one pydantic model."""
from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import pytest

from hermes.tools import (
    AT_MOST_ONCE,
    IDEMPOTENT,
    Tool,
    ToolContext,
    function_tool,
    handle_function_call,
    load_toolsets,
    parse_docstring,
    registry,
    tool,
)

CTX = ToolContext(task_id="task-1", tool_call_id="call-1", idempotency_key="s:t:call-1", session_id="s",
                  turn_id="t")


def _call(made: Tool, arguments: dict[str, Any]) -> str:
    return made.handler(arguments, CTX)


# ---------------------------------------------------------------- the schema
def forecast(city: str, ctx: ToolContext, units: Literal["c", "f"] = "c",
             days: Annotated[int, pydantic.Field(ge=1, le=7)] = 1, tags: list[str] | None = None) -> dict:
    """Tell the weather forecast
    for a city.

    More text that is not the description.

    Args:
        city: The city's name,
            as people write it.
        units (str): Celsius or Fahrenheit.
        days: How many days ahead.

    Returns:
        The forecast.
    """
    return {"city": city, "units": units, "days": days, "tags": tags, "key": ctx.idempotency_key}


def test_the_schema_comes_from_the_hints_and_the_docstring() -> None:
    made = function_tool(forecast, policy=IDEMPOTENT, parallel_safe=True)
    assert (made.name, made.policy, made.parallel_safe) == ("forecast", IDEMPOTENT, True)
    assert made.description == "Tell the weather forecast for a city."
    schema = made.parameters
    assert schema["type"] == "object" and schema["required"] == ["city"]
    assert schema["additionalProperties"] is False
    assert list(schema["properties"]) == ["city", "units", "days", "tags"]  # no ctx: it is not an argument
    assert schema["properties"]["city"] == {"type": "string", "description": "The city's name, as people write it."}
    assert schema["properties"]["units"] == {"type": "string", "enum": ["c", "f"], "default": "c",
                                             "description": "Celsius or Fahrenheit."}
    assert schema["properties"]["days"] == {"type": "integer", "minimum": 1, "maximum": 7, "default": 1,
                                            "description": "How many days ahead."}
    assert "description" not in schema["properties"]["tags"]  # not in Args:
    assert made.definition() == {"type": "function", "function": {
        "name": "forecast", "description": made.description, "parameters": schema}}
    json.dumps(made.definition())  # what is sent to the model is JSON


def test_the_arguments_are_validated_converted_and_passed_with_the_context() -> None:
    made = function_tool(forecast)
    out = json.loads(_call(made, {"city": "Oslo", "days": "3", "tags": ["sea"]}))
    assert out == {"city": "Oslo", "units": "c", "days": 3, "tags": ["sea"], "key": "s:t:call-1"}


@pytest.mark.parametrize(("arguments", "says"), [
    ({}, "city: Field required"),
    ({"city": 5}, "city: Input should be a valid string"),
    ({"city": "Oslo", "days": 9}, "days: Input should be less than or equal to 7"),
    ({"city": "Oslo", "units": "kelvin"}, "units: Input should be 'c' or 'f'"),
    ({"city": "Oslo", "when": "now"}, "when: Extra inputs are not permitted"),
    ({"city": "Oslo", "ctx": {}}, "ctx: Extra inputs are not permitted"),
])
def test_invalid_arguments_make_an_error_result_and_the_function_does_not_run(arguments: dict[str, Any],
                                                                              says: str) -> None:
    ran: list[dict[str, Any]] = []

    def book(city: str, units: Literal["c", "f"] = "c", days: Annotated[int, pydantic.Field(ge=1, le=7)] = 1,
             ) -> str:
        """Book a trip."""
        ran.append({"city": city})
        return "booked"

    result = json.loads(_call(function_tool(book), arguments))
    assert ran == []
    assert says in result["error"], result
    assert result["error"].startswith("invalid arguments for 'book': ") and "The tool was not run" in result["error"]


def test_through_the_dispatcher_too() -> None:
    calls: list[int] = []

    @tool(policy=IDEMPOTENT)
    def td_count(n: int) -> dict:
        """Count."""
        calls.append(n)
        return {"n": n}

    assert handle_function_call("td_count", {"n": "4"}, "task") == '{"n": 4}'
    assert "invalid arguments" in json.loads(handle_function_call("td_count", {"n": "four"}, "task"))["error"]
    assert calls == [4]


class Point(pydantic.BaseModel):
    x: int
    y: int


@pytest.mark.parametrize(("returned", "text"), [
    ("plain text", "plain text"),
    ({"a": [1, 2], "b": "\u00e9"}, '{"a": [1, 2], "b": "\u00e9"}'),
    ([1, "two"], '[1, "two"]'),
    (None, "null"),
    (3.5, "3.5"),
    (Point(x=1, y=2), '{"x": 1, "y": 2}'),
])
def test_the_return_value_is_the_result_text(returned: Any, text: str) -> None:
    def give() -> Any:
        """Give."""
        return returned

    assert _call(function_tool(give), {}) == text


def test_models_and_reserved_names_work_as_parameters() -> None:
    def place(point: Point, json: bool = False, model_config: str = "x", copy: int = 0) -> str:
        """Place a point."""
        return f"{point.x},{point.y},{json},{model_config},{copy}"

    made = function_tool(place)
    assert set(made.parameters["properties"]) == {"point", "json", "model_config", "copy"}
    assert _call(made, {"point": {"x": 1, "y": "2"}, "json": True, "copy": 3}) == "1,2,True,x,3"
    assert "point.y" in _call(made, {"point": {"x": 1}})


def test_an_optional_context_parameter_is_the_context_too() -> None:
    def who(ctx: ToolContext | None = None) -> str:
        """Who calls."""
        assert ctx is not None
        return f"{ctx.session_id}/{ctx.turn_id}/{ctx.tool_call_id}"

    made = function_tool(who)
    assert made.parameters["properties"] == {}
    assert _call(made, {}) == "s/t/call-1"


def test_a_tools_own_exception_becomes_the_dispatchers_error_result() -> None:
    @tool
    def td_fails(reason: str) -> str:
        """Always fails."""
        raise RuntimeError(reason)

    result = json.loads(handle_function_call("td_fails", {"reason": "disk on fire"}, "task"))
    assert result == {"error": "tool 'td_fails' failed: RuntimeError: disk on fire"}


# ---------------------------------------------------------------- the decorator
def test_bare_and_called_forms_register_and_return_the_function() -> None:
    @tool
    def td_bare(x: int) -> int:
        """Bare."""
        return x + 1

    @tool(policy="idempotent", parallel_safe=True, name="td_renamed")
    def td_called(x: int) -> int:
        """Called."""
        return x * 2

    assert td_bare(1) == 2 and td_called(2) == 4  # still plain functions
    assert isinstance(td_bare.tool, Tool) and td_bare.tool.policy == AT_MOST_ONCE and not td_bare.tool.parallel_safe
    assert registry.get("td_bare") is td_bare.tool
    assert registry.get("td_renamed") is td_called.tool and registry.get("td_called") is None
    assert registry.policy("td_renamed") == IDEMPOTENT and registry.parallel_safe("td_renamed")
    assert "test_tool_decorator" in registry.toolsets()


def test_a_bad_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="policy must be one of idempotent, at_most_once, not 'twice'"):
        tool(policy="twice")


def _untyped(x):  # type: ignore[no-untyped-def]
    """No hints."""


def _star(*args: int) -> None:
    """Star."""


def _kwargs(**kwargs: int) -> None:
    """Kwargs."""


def _positional(x: int, /) -> None:
    """Positional."""


async def _async(x: int) -> None:
    """Async."""


def _two_contexts(a: ToolContext, b: ToolContext) -> None:
    """Two."""


def _unschemable(x: Callable[[int], int]) -> None:
    """A callable cannot be sent as JSON."""


@pytest.mark.parametrize(("func", "says"), [
    (_untyped, "needs a type hint"),
    (_star, "*args"),
    (_kwargs, "**kwargs"),
    (_positional, "positional-only"),
    (_async, "async"),
    (_two_contexts, "only one parameter"),
    (_unschemable, "no JSON schema"),
    (len, "plain function"),
])
def test_functions_that_cannot_be_tools_are_refused_at_decoration(func: Callable[..., Any], says: str) -> None:
    with pytest.raises(TypeError, match=says.replace("*", r"\*")):
        function_tool(func)


def test_a_bad_tool_name_is_refused() -> None:
    def f() -> None:
        """F."""

    with pytest.raises(TypeError, match="tool name"):
        function_tool(f, name="has space")


def test_a_name_that_another_toolset_has_is_refused() -> None:
    def read_file(path: str) -> str:  # the built-in files toolset has one
        """Shadow."""
        return path

    with pytest.raises(ValueError, match="already exists"):
        tool(read_file)
    assert registry.get("read_file").description.startswith("Read a text file")


# ---------------------------------------------------------------- the docstring
def test_docstring_parsing() -> None:
    doc = """Summary line
    continued.

    Details.

    Args:
        a: First.
        b (int, optional): Second,
            longer.
        *rest: Ignored star.

    Raises:
        ValueError: never a parameter.
    """
    assert parse_docstring(doc) == ("Summary line continued.", {"a": "First.", "b": "Second, longer.",
                                                                "rest": "Ignored star."})
    assert parse_docstring(None) == ("", {})
    assert parse_docstring("Only a line.") == ("Only a line.", {})
    assert parse_docstring("Args:\n    x: X.") == ("", {"x": "X."})


# ---------------------------------------------------------------- toolsets of modules
@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str], str]:
    """Write a module under a package unique to this test; returns its dotted name."""
    package = f"tdpkg_{tmp_path.name.replace('-', '_')}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, source: str) -> str:
        (tmp_path / package / f"{name}.py").write_text(textwrap.dedent(source))
        return f"{package}.{name}"

    return write


def test_a_modules_tools_form_a_toolset_named_after_it(modules: Callable[[str, str], str]) -> None:
    name = modules("weather_kit", '''
        from hermes.tools import tool

        @tool(policy="idempotent", parallel_safe=True)
        def tdm_forecast(city: str) -> str:
            """Forecast."""
            return "sunny in " + city

        @tool
        def tdm_alert(city: str) -> str:
            """Alert."""
            return "alerted " + city
    ''')
    assert load_toolsets(name) == ["weather_kit"]
    assert [t.name for t in registry.tools_in(["weather_kit"])] == ["tdm_forecast", "tdm_alert"]
    assert load_toolsets(f"{name}, files ,{name}") == ["weather_kit", "files"]  # trimmed, no repeats
    assert load_toolsets(["weather_kit"]) == ["weather_kit"]  # loaded once, its toolset is known by name


def test_a_toolset_constant_names_it_even_below_the_functions(modules: Callable[[str, str], str]) -> None:
    name = modules("late_name", '''
        from hermes.tools import tool

        @tool
        def tdm_late(x: int) -> int:
            """Late."""
            return x

        TOOLSET = "tdm_named_late"
    ''')
    assert load_toolsets(name) == ["tdm_named_late"]
    assert [t.name for t in registry.tools_in(["tdm_named_late"])] == ["tdm_late"]
    assert "late_name" not in registry.toolsets()


def test_a_module_registering_tools_by_hand_is_a_toolset_too(modules: Callable[[str, str], str]) -> None:
    name = modules("by_hand", '''
        from hermes.tools import Tool, registry
        TOOLSET = "tdm_by_hand"
        registry.register(Tool("tdm_manual", "Manual.", lambda args, ctx: "ok"), TOOLSET)
    ''')
    assert load_toolsets(name) == ["tdm_by_hand"]


@pytest.mark.parametrize(("source", "says"), [
    (None, "neither a toolset"),
    ("import json\n", "offers no tools"),
    ("import tdm_no_such_dependency\n", "No module named 'tdm_no_such_dependency'"),
    ("def broken(:\n", "SyntaxError"),
    ("raise RuntimeError('boom\\nsecond line')\n", "RuntimeError: boom second line"),
    ("from hermes.tools import tool\n@tool\ndef read_file(path: str) -> str:\n    '''Shadow.'''\n",
     "already exists"),
])
def test_modules_that_cannot_be_toolsets_are_refused_in_one_line(modules: Callable[[str, str], str],
                                                                 source: str | None, says: str) -> None:
    name = modules("bad_one", source) if source is not None else modules("unused", "") + "_missing"
    with pytest.raises(ValueError) as caught:
        load_toolsets(name)
    message = str(caught.value)
    assert says in message and "\n" not in message, message
    assert name in message


@pytest.mark.parametrize("value", ["no such", "../x", "a..b", "1abc"])
def test_names_that_are_no_module_name_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="neither a toolset"):
        load_toolsets(value)


def test_two_toolsets_offering_one_tool_name_are_refused(modules: Callable[[str, str], str]) -> None:
    name = modules("clash", '''
        from hermes.tools import tool

        @tool
        def tdm_lookup(key: str) -> str:
            """Lookup."""
            return key
    ''')
    assert load_toolsets(name, provided={"harness": ["other"]}) == ["clash"]
    with pytest.raises(ValueError, match="both offer a tool named 'tdm_lookup'"):
        load_toolsets(f"harness,{name}", provided={"harness": ["tdm_lookup"]})
    assert load_toolsets("harness", provided={"harness": ["x"]}) == ["harness"]  # provided later by the caller


def test_the_workers_spelling_knows_chaos_without_installing_it(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from worker import chaos_tools
    from worker.ledger import Ledger
    from worker.targets import load_tools

    assert load_tools("chaos") == ["chaos"]
    assert load_tools("chaos,files") == ["chaos", "files"]
    assert load_tools("") == []
    with pytest.raises(ValueError, match="neither a toolset"):
        load_tools("chaos,nonexistent_tool_module_td")
    # The names it checks for clashes are the names install() registers.
    private = type(registry)()
    monkeypatch.setattr(chaos_tools, "registry", private)
    ledger = Ledger(tmp_path / "effects.db")
    try:
        chaos_tools.install(ledger)
    finally:
        ledger.close()
    assert tuple(t.name for t in private.tools_in([chaos_tools.TOOLSET])) == chaos_tools.TOOL_NAMES


def test_a_module_named_like_a_taken_toolset_is_refused_and_changes_nothing(
        modules: Callable[[str, str], str]) -> None:
    before = {t: [x.name for x in registry.tools_in([t])] for t in registry.toolsets()}
    name = modules("files", '''
        from hermes.tools import tool

        @tool
        def tdm_other_file_tool(path: str) -> str:
            """Other."""
            return path
    ''')
    with pytest.raises(ValueError, match="would make toolset 'files'.*TOOLSET"):
        load_toolsets(name)
    assert registry.get("tdm_other_file_tool") is None
    assert {t: [x.name for x in registry.tools_in([t])] for t in registry.toolsets()} == before
