"""A user message's content: text, or a list of OpenAI chat content parts (multimodal).

A turn's user message is a ``str`` or a non-empty list of parts, each either

    {"type": "text", "text": str}                       or
    {"type": "image_url", "image_url": {"url": str}}

and nothing else (no other part type, no other key). The runtime stores a list as given (the
store's ``content_kind`` 'json'), sends it to the model as given, and reads it back as a list.
The shape is checked with pydantic (`check_user_content`), so a caller gets one line saying what
is wrong instead of a model endpoint's 400 in the middle of a turn.
"""
from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from pydantic import TypeAdapter

UserContent = Union[str, list[dict[str, Any]]]

PARTS_HELP = ('a JSON string, or a non-empty list of content parts: {"type": "text", "text": "..."} or '
              '{"type": "image_url", "image_url": {"url": "..."}}')


@functools.cache
def _parts_adapter() -> "TypeAdapter[Any]":
    """The pydantic validator of a list of parts, built on first use: every target's record imports
    this module (for the helpers below), and only a process given a list needs pydantic's models."""
    from typing import Annotated, Literal

    from pydantic import BaseModel, ConfigDict, Field, StrictStr, TypeAdapter

    class _Strict(BaseModel):
        # strict: a number is no str; forbid: a key the wire format does not have is a mistake to
        # report, never something to drop silently (the model would be sent less than was written).
        model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    class TextPart(_Strict):
        type: Literal["text"]
        text: StrictStr

    class ImageURL(_Strict):
        url: StrictStr

    class ImagePart(_Strict):
        type: Literal["image_url"]
        image_url: ImageURL

    part = Annotated[Union[TextPart, ImagePart], Field(discriminator="type")]
    return TypeAdapter(Annotated[list[part], Field(min_length=1)])  # type: ignore[valid-type]


def _where(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a reader finds it: "part 2" or "part 2, image_url.url" (counted
    from 1). The discriminated union's locations read (index, tag, *keys); the tag is the part's
    "type", which the reader wrote, so it is left out."""
    if not loc or not isinstance(loc[0], int):
        return "the list"
    keys = [str(k) for k in loc[2:]]
    return f"part {loc[0] + 1}" + (f", {'.'.join(keys)}" if keys else "")


def check_user_content(value: Any) -> UserContent:
    """`value` if it is a user message's content (module docstring); ValueError, one line, if not.

    The value itself is returned, not a copy rebuilt from the parsed model: what the caller
    wrote is exactly what is stored and sent (key order, and every character of every string).
    """
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ValueError(f"expected {PARTS_HELP}; got a JSON {_json_type(value)}")
    if not value:
        raise ValueError(f"expected {PARTS_HELP}; got an empty list")
    from pydantic import ValidationError

    try:
        _parts_adapter().validate_python(value)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        raise ValueError(f"expected {PARTS_HELP}; {_where(tuple(error['loc']))}: {error['msg']}") from None
    return value


def parse_user_content(text: str) -> UserContent:
    """The user message that the JSON document `text` holds (see `check_user_content`)."""
    try:
        value = json.loads(text)
    except ValueError as exc:  # JSONDecodeError, or a number too long to convert
        raise ValueError(f"not JSON ({exc})") from None
    except RecursionError:
        raise ValueError("not JSON this runtime can read (nested too deeply)") from None
    return check_user_content(value)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def content_text(content: Any) -> str:
    """The text of a message's content: a str as it is, a list's text parts joined (images left out)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content
                       if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str))
    return str(content)


def has_images(content: Any) -> bool:
    """Whether a list content holds any image part."""
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "image_url" for p in content)
