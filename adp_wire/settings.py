"""Settings read from untrusted key/value input, checked by pydantic, with errors that name the
field and the fix.

Used by the plugin's ``adapter_params`` and by the gateway's YAML config, so both give the same
errors. A model subclasses :class:`Settings` (strict, frozen, unknown keys refused) and declares
its fields with plain types, ``Literal`` choices, ``Field(ge=...)`` bounds, :data:`ByteSize`
(accepts ``64GiB``) and :data:`OneOrMany` lists (a single value counts as a list of one).
:func:`build` checks a mapping against a model and turns pydantic's ``ValidationError`` into one
:class:`~adp_wire.errors.ConfigError` line: where, which field (``tenants[1].quota``), what is
wrong and what would be accepted.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from adp_wire.errors import ConfigError
from adp_wire.units import parse_size

__all__ = ["ByteSize", "OneOrMany", "Settings", "build", "checked", "describe", "explain"]

M = TypeVar("M", bound=BaseModel)


class Settings(BaseModel):
    """Base of every settings model: no coercion (``"10"`` is not a number), no unknown keys,
    no changes after construction. Ints are accepted where a float is expected; NaN and the
    infinities are not (a timeout of ``inf`` would break the promise that every op ends)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid", allow_inf_nan=False)

    # Keys a release took away, each with what to do instead: refused with that line rather
    # than as an unknown key, so an old config says what changed.
    retired: ClassVar[dict[str, str]] = {}


# parse_size starts its message with the field name; build() puts the whole path there instead.
_FIELD = "<size>"


def _size(value: object) -> object:
    if value is None:
        return None
    try:
        return parse_size(value, _FIELD)  # type: ignore[arg-type]  # it checks the type itself
    except ConfigError as exc:
        reason = str(exc).removeprefix(f"{_FIELD}: ")
        raise PydanticCustomError("size", "{reason}", {"reason": reason}) from None


def _one_or_many(value: object) -> object:
    return [value] if isinstance(value, str | int) and not isinstance(value, bool) else value


# A number of bytes, written as 4096, 512MiB or 64GiB (adp_wire.units).
ByteSize = Annotated[int, BeforeValidator(_size)]
_T = TypeVar("_T")
# A list; a single value stands for a list of one (``data_dirs: /data``).
OneOrMany = Annotated[list[_T], BeforeValidator(_one_or_many)]


def checked(problem: Callable[[Any], str | None]) -> AfterValidator:
    """A field check beyond its type and bounds: ``problem(value)`` says what is wrong with
    the value and how to fix it, or None; its words become the field's error line."""

    def check(value: Any) -> Any:
        reason = problem(value)
        if reason is not None:
            raise PydanticCustomError("value", "{reason}", {"reason": reason})
        return value

    return AfterValidator(check)


def build(model: type[M], values: Any, where: str, root: str = "") -> M:
    """Return ``model`` checked from ``values``. ``where`` starts every error line (a file, or
    who reads the settings); ``root`` names the mapping within it (``adapter_params``)."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: {root or 'settings'}: expected a mapping, got {values!r}")
    try:
        return model.model_validate(dict(values))
    except ValidationError as exc:
        # A mistyped key often explains the other errors (a value missing, say): it goes first.
        errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
        message = _union_refused(model, errors, root) or explain(model, errors[0], root)
        raise ConfigError(f"{where}: {message}") from exc


def explain(model: type[BaseModel], error: ErrorDetails, root: str = "") -> str:
    """One pydantic error as ``field: what is wrong[: the fix]``."""
    loc, kind, value = error["loc"], error["type"], error.get("input")
    name = _path(root, loc)
    if kind in ("extra_forbidden", "missing"):
        mapping = _path(root, loc[:-1])
        lead = f"{mapping}: " if mapping else ""
        if kind == "missing":
            return f"{lead}missing key {loc[-1]!r}"
        retired = _retired(model, loc[:-1]).get(str(loc[-1]))
        if retired is not None:
            return f"{lead}{loc[-1]!r} is no longer a setting: {retired}"
        return f"{lead}unknown key {loc[-1]!r}{_suggest(str(loc[-1]), model, loc[:-1])}"
    ctx = error.get("ctx", {})
    if kind in ("greater_than_equal", "greater_than"):
        word = "at least" if kind == "greater_than_equal" else "more than"
        return f"{name}: must be {word} {ctx.get('ge', ctx.get('gt'))}, got {value!r}"
    if kind in ("less_than_equal", "less_than"):
        word = "at most" if kind == "less_than_equal" else "less than"
        return f"{name}: must be {word} {ctx.get('le', ctx.get('lt'))}, got {value!r}"
    if kind == "literal_error":
        return f"{name}: {value!r} is not a choice: write {ctx['expected']}"
    if kind in ("size", "value"):  # our own validators' messages (_size, checked)
        return f"{name}: {error['msg']}"
    expected = _EXPECTED.get(kind, error["msg"].lower())
    if kind == "list_type" and loc and isinstance(loc[-1], str):
        expected = _list_of(_model_at(model, loc[:-1]).model_fields[loc[-1]].annotation)
    got = "null" if value is None else f"{_kind_of(value)} {value!r}"
    return f"{name}: expected {expected}, got {got}{_unquote(kind, value)}"


def _union_refused(model: type[BaseModel], errors: list[ErrorDetails], root: str) -> str | None:
    """Where the first error is one member of a union field refusing the value (pydantic
    tries each: ``write_budget: str | int | None`` gives errors at ``write_budget.str`` and
    ``write_budget.int``), one line at the field naming what any member takes; else None."""
    loc = errors[0]["loc"]
    if len(loc) < 2 or not isinstance(loc[-2], str):
        return None
    try:
        annotation = _model_at(model, loc[:-2]).model_fields[loc[-2]].annotation
    except (KeyError, StopIteration):
        return None
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return None
    tried = [e for e in errors if e["loc"][:-1] == loc[:-1]]
    expected = " or ".join(dict.fromkeys(_EXPECTED.get(e["type"], e["msg"]) for e in tried))
    value = errors[0].get("input")
    got = "null" if value is None else f"{_kind_of(value)} {value!r}"
    return f"{_path(root, loc[:-1])}: expected {expected}, got {got}"


def _retired(model: type[BaseModel], loc: tuple[int | str, ...]) -> dict[str, str]:
    holder = _model_at(model, loc)
    return holder.retired if issubclass(holder, Settings) else {}


def _suggest(key: str, model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """'; did you mean X?' when a known key is close, then every key the mapping accepts."""
    known = sorted(_model_at(model, loc).model_fields)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} (accepted: {', '.join(known)})"


_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "finite_number": "a finite number",
    "string_type": "a string",
    "bool_type": "true or false",
    "list_type": "a list",
    "model_type": "a mapping",
    "dict_type": "a mapping",
}


def _unquote(kind: str, value: object) -> str:
    """The fix for the commonest type error: a number or boolean written as a string."""
    if not isinstance(value, str) or kind not in ("int_type", "float_type", "bool_type"):
        return ""
    if kind == "bool_type":
        return ": write it without quotes" if value.lower() in ("true", "false") else ""
    try:
        (int if kind == "int_type" else float)(value)
    except ValueError:
        return ""
    return ": write it without quotes"


def _kind_of(value: object) -> str:
    kinds = {bool: "boolean", str: "string", float: "number", int: "integer", dict: "mapping"}
    return kinds.get(type(value), type(value).__name__)


def _list_of(annotation: Any) -> str:
    """``list[int] | None`` -> "a list of int"; a list of settings is "a list of mappings"."""
    lists = [t for t in _flatten(annotation) if typing.get_origin(t) is list]
    if not lists:
        return "a list"
    item = typing.get_args(lists[0])[0]
    return "a list of mappings" if _is_model(item) else f"a list of {_type_name(item)}"


def _path(root: str, loc: tuple[int | str, ...]) -> str:
    path = root
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel]:
    """The settings model that holds the field at ``loc`` + one more key."""
    for part in loc:
        if isinstance(part, str):
            annotation = model.model_fields[part].annotation
            model = next(t for t in _flatten(annotation) if _is_model(t))
    return model


def _flatten(annotation: Any) -> list[Any]:
    """``list[Tenant] | None`` -> [list[Tenant], Tenant, None]: the types it is made of."""
    out = [annotation]
    for arg in typing.get_args(annotation):
        out.extend(_flatten(arg))
    return out


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def describe(model: type[BaseModel]) -> dict[str, tuple[str, Any]]:
    """Map each field to (type name, default), for docs and the manifest test."""
    return {
        name: (
            _type_name(info.annotation, info.metadata),
            info.get_default(call_default_factory=True),
        )
        for name, info in model.model_fields.items()
    }


def _type_name(annotation: Any, metadata: list[Any] | None = None) -> str:
    if any(getattr(m, "func", None) is _size for m in metadata or ()):
        return "size"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _type_name(args[0], list(annotation.__metadata__))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    if origin is typing.Literal:
        return " | ".join(map(repr, args))
    if _is_model(annotation):
        return "mapping"
    return "null" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))
