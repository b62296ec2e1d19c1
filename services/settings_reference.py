"""The settings reference, `docs/settings.md`, generated from the services' pydantic settings.

Every `WARMPLANE_*` variable each service reads, with its type, its default and what it means (the field's
docstring). A unit test regenerates it and compares, so the page cannot drift from the code:
`python -m warmplane.services.settings_reference > docs/settings.md` after changing a setting.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import json
import sys
import textwrap
import types
from collections.abc import Iterator
from functools import cache
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from warmplane.services.api.settings import ApiSettings
from warmplane.services.cli.api_client import ApiClientSettings
from warmplane.services.gateway.settings import GatewaySettings
from warmplane.services.planner.settings import PlannerSettings
from warmplane.services.warmer.settings import WarmerSettings
from warmplane.shared.vllm_middleware import VllmEventSettings

SERVICES: dict[str, type[BaseSettings]] = {
    "planner": PlannerSettings,
    "warmer": WarmerSettings,
    "gateway": GatewaySettings,
    "api": ApiSettings,
    "cli (the API commands)": ApiClientSettings,
    "vllm middleware (read by `vllm serve --middleware`)": VllmEventSettings,
}
_HEAD = """# Settings reference

Generated from the code by `python -m warmplane.services.settings_reference > docs/settings.md`; a unit test
fails when this page and the code disagree. Each service reads `WARMPLANE_*` environment variables, nested
with `__`, and refuses to start with a message naming any variable that does not validate (or that it does
not know). A nested group can also be given whole as JSON (`WARMPLANE_KAFKA='{"partitions": 8}'`). Secrets
never print: their defaults show as `(secret)`.
"""


def reference() -> str:
    parts = [_HEAD]
    for service, settings in SERVICES.items():
        prefix = str(settings.model_config.get("env_prefix", ""))
        parts.append(f"\n## {service} (`{settings.__module__}.{settings.__name__}`)\n")
        parts.append("\n| variable | type | default | what |\n|---|---|---|---|\n")
        for name, field, info, owner in _fields(settings, prefix):
            doc = _docstrings(owner).get(field, "")
            parts.append(f"| `{name}` | {_type(info.annotation)} | {_default(info)} | {_cell(doc)} |\n")
    return "".join(parts)


def _fields(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, str, FieldInfo, type[BaseModel]]]:
    """(variable, field name, field, the class declaring it), nested models' fields under
    `<PREFIX><FIELD>__`."""
    for field_name, info in model.model_fields.items():
        name = f"{prefix}{field_name}".upper()
        nested = info.annotation
        if (
            isinstance(nested, type)
            and issubclass(nested, BaseModel)
            and not issubclass(nested, BaseSettings)
        ):
            yield from _fields(nested, f"{name}__")
        else:
            yield name, field_name, info, _declaring(model, field_name)


def _declaring(model: type[BaseModel], field_name: str) -> type[BaseModel]:
    for klass in model.__mro__:
        if field_name in getattr(klass, "__annotations__", {}):
            return klass
    return model


@cache
def _docstrings(klass: type) -> dict[str, str]:
    """What each attribute of a class means, by name: the docstring that follows its declaration (the
    codebase's way of saying it), else the comment lines just above it or the comment ending its line."""
    try:
        source = textwrap.dedent(inspect.getsource(klass))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    tree = ast.parse(source)
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    found: dict[str, str] = {}
    for statement, following in itertools.pairwise([*body, None]):
        if not isinstance(statement, ast.AnnAssign) or not isinstance(statement.target, ast.Name):
            continue
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            text = following.value.value
        else:
            text = _comments(lines, statement.lineno - 1, statement.end_lineno or statement.lineno)
        if text:
            found[statement.target.id] = " ".join(text.split())
    return found


def _comments(lines: list[str], first: int, end: int) -> str:
    """The comment lines right above line index `first`, else the comment that ends line `end` (not a
    linter's `noqa`)."""
    above: list[str] = []
    index = first - 1
    while index >= 0 and lines[index].strip().startswith("#"):
        above.insert(0, lines[index].strip().lstrip("#").strip())
        index -= 1
    if above:
        return " ".join(above)
    _, _, trailing = lines[end - 1].partition("  # ")
    if trailing.startswith("noqa"):  # `noqa: RULE - why`: the why
        return trailing.partition(" - ")[2]
    return trailing


def _type(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Union or isinstance(annotation, types.UnionType):
        return " or ".join(_type(arg) for arg in get_args(annotation))
    if origin is not None and getattr(origin, "__name__", "") == "Annotated":
        return _type(get_args(annotation)[0])
    if origin is not None:
        args = ", ".join(_type(arg) for arg in get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation)).replace("typing.", "")


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    try:
        text = json.dumps(value)
    except TypeError:
        text = str(value)
    return f"`{text}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


if __name__ == "__main__":
    sys.stdout.write(reference())
