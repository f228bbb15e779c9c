"""Contracts, pipeline defaults and the resolved definition of a join (docs/spec.md §2, §6).

Guarantees:
- ``load_contracts`` reads YAML with a safe loader from a local path or any path Beam's
  FileSystems read; a bad file raises ``ContractsError`` whose message names the file, the
  contract (by name or position) and the field. The document must be JSON: a key repeated
  in a mapping (YAML would keep the last one silently), a non-string key, a date, bytes, a
  set, NaN or an infinity anywhere is refused, as is nesting too deep to read. A schema must
  be valid draft 2020-12 and every ``$ref`` in it must resolve within it: an unresolvable or
  remote reference, or a ``$ref`` cycle, is refused here, at load, and nothing is ever fetched
  (``fanin.contracts.schemas``).
- ``Catalog.definition`` resolves each of ``required``, ``optional``, ``deadline_s``,
  ``allow_partial``, ``fail_fast`` from the open, else the contract, else the defaults; and
  ``close_trigger``, ``retention_s`` and ``schemas`` from the contract, else the defaults. Equal
  inputs give equal (immutable) ``Definition`` objects; up to 4,096 distinct inputs are
  cached (then the cache starts again), so equal inputs usually give the same object.
"""

from __future__ import annotations

import bisect
import math
import os
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fanin.contracts.jsonvalue import MAX_INT_DIGITS
from fanin.contracts.messages import Seconds
from fanin.contracts.parsing import is_utf8
from fanin.contracts.schemas import check_schema, validator_for
from fanin.contracts.timefmt import duration_ms

__all__ = [
    "BranchTree",
    "Catalog",
    "Contract",
    "ContractsError",
    "Definition",
    "JoinDefaults",
    "load_contracts",
    "parse_contracts",
]

CloseTrigger = Literal["eager", "watermark"]


class ContractsError(ValueError):
    """The contracts file is unreadable or breaks docs/spec.md §6."""


class Contract(BaseModel):
    """One entry of the contracts file; omitted fields fall back to the pipeline defaults."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    required: list[str] | None = None
    optional: list[str] | None = None
    deadline_s: Seconds | None = Field(default=None, gt=0, allow_inf_nan=False)
    allow_partial: bool | None = None
    fail_fast: bool | None = None
    close_trigger: CloseTrigger | None = None
    retention_s: Seconds | None = Field(default=None, ge=0, allow_inf_nan=False)
    schemas: dict[str, Any] = Field(default_factory=dict)  # each an object or a boolean

    @field_validator("required", "optional")
    @classmethod
    def _branch_names(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not name for name in value):
            raise ValueError("branch names must be non-empty strings")
        return value

    @field_validator("schemas")
    @classmethod
    def _valid_schemas(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, schema in value.items():
            if not isinstance(schema, (dict, bool)):  # one word, not one per union member
                raise ValueError(f"schema for key {key!r}: a JSON Schema is an object or "
                                 f"true/false, not {_json_kind(schema)}")
            try:
                check_schema(schema)
            except ValueError as exc:
                raise ValueError(f"schema for key {key!r}: {exc}") from None
        return value

    @model_validator(mode="after")
    def _disjoint(self) -> Contract:
        both = set(self.required or ()) & set(self.optional or ())
        if both:
            raise ValueError(f"branches both required and optional: {sorted(both)}")
        return self


def _json_kind(value: Any) -> str:
    """JSON's name for what YAML gave (a contracts file holds JSON's values only)."""
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "a number"
    return "an array" if isinstance(value, list) else "a string"


@dataclass(frozen=True)
class JoinDefaults:
    """Pipeline-wide defaults of docs/spec.md §2, each settable by a command-line option."""

    deadline_s: float = 30.0
    allow_partial: bool = False
    fail_fast: bool = False
    close_trigger: CloseTrigger = "eager"
    retention_s: float = 604800.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.deadline_s) and self.deadline_s > 0):
            raise ValueError("deadline_s must be a finite number > 0")
        if not (math.isfinite(self.retention_s) and self.retention_s >= 0):
            raise ValueError("retention_s must be a finite number >= 0")
        if self.close_trigger not in ("eager", "watermark"):
            raise ValueError("close_trigger must be 'eager' or 'watermark'")


class BranchTree:
    """The declared branches by path (docs/spec.md §3: ``a`` covers ``a`` and ``a/...``).

    ``get(path)``: the declared branches equal to ``path`` or below it (``path/...``), sorted;
    None when there are none. Holds the names once, sorted (O(total length) memory; an index of
    every prefix took the square of a name's length: a 160 KB open of one 80,000-character
    path took 1.75 GB), and answers by bisection in O(log n + answer)."""

    __slots__ = ("_names", "_set")

    def __init__(self, branches: frozenset[str]) -> None:
        self._names = tuple(sorted(branches))
        self._set = branches

    def get(self, path: str) -> tuple[str, ...] | None:
        names = self._names
        if not path:  # names are never empty, nor is a prefix of one
            return None
        lo = bisect.bisect_left(names, path + "/")
        hi = bisect.bisect_left(names, path + "0", lo)  # "0" sorts right after "/"
        found = ((path,) if path in self._set else ()) + names[lo:hi]
        return found or None


@dataclass(frozen=True, eq=False)
class Definition:
    """The resolved definition of one join. ``required is None`` means the join is undefined."""

    contract: str | None
    required: frozenset[str] | None
    optional: frozenset[str]
    deadline_ms: int
    allow_partial: bool
    fail_fast: bool
    close_trigger: CloseTrigger
    retention_ms: int
    validators: Mapping[str, Any]
    # path -> declared branches equal to it or below it (for pruning by path prefix)
    under: BranchTree = field(default_factory=lambda: BranchTree(frozenset()))
    # declared branch -> 1 if required, 0 if optional
    role: Mapping[str, int] = field(default_factory=dict)
    required_sorted: tuple[str, ...] = ()
    optional_sorted: tuple[str, ...] = ()


class Catalog:
    """The contracts by name plus the defaults; resolves and caches join definitions."""

    def __init__(self, contracts: Mapping[str, Contract] | None = None,
                 defaults: JoinDefaults | None = None) -> None:
        self.contracts: dict[str, Contract] = dict(contracts or {})
        self.defaults = defaults or JoinDefaults()
        self._definitions: dict[tuple[Any, ...], Definition] = {}
        self._validators: dict[str, dict[str, Any]] = {
            name: {key: validator_for(schema) for key, schema in contract.schemas.items()}
            for name, contract in self.contracts.items()
        }

    def __reduce__(self) -> tuple[Any, ...]:
        return (Catalog, (self.contracts, self.defaults))

    def definition(self, contract: str | None, required: tuple[str, ...] | None,
                   optional: tuple[str, ...] | None, deadline_ms: int | None,
                   allow_partial: bool | None, fail_fast: bool | None) -> Definition:
        """Resolve open fields (None = not given) against the contract and the defaults."""
        cache_key = (contract, required, optional, deadline_ms, allow_partial, fail_fast)
        found = self._definitions.get(cache_key)
        if found is not None:
            return found
        spec = self.contracts.get(contract) if contract else None
        dflt = self.defaults

        def pick(open_value: Any, name: str, default: Any) -> Any:
            if open_value is not None:
                return open_value
            value = getattr(spec, name) if spec is not None else None
            return default if value is None else value

        req = pick(required, "required", None)
        req_set = None if req is None else frozenset(req)
        opt_set = frozenset(pick(optional, "optional", ())) - (req_set or frozenset())
        deadline = deadline_ms if deadline_ms is not None else \
            duration_ms(pick(None, "deadline_s", dflt.deadline_s))
        definition = Definition(
            contract=contract,
            required=req_set,
            optional=opt_set,
            deadline_ms=max(deadline, 0),
            allow_partial=pick(allow_partial, "allow_partial", dflt.allow_partial),
            fail_fast=pick(fail_fast, "fail_fast", dflt.fail_fast),
            close_trigger=pick(None, "close_trigger", dflt.close_trigger),
            retention_ms=duration_ms(pick(None, "retention_s", dflt.retention_s)),
            validators=self._validators.get(contract, {}) if contract else {},
            under=BranchTree((req_set or frozenset()) | opt_set),
            role={**dict.fromkeys(opt_set, 0), **dict.fromkeys(req_set or (), 1)},
            required_sorted=tuple(sorted(req_set or ())),
            optional_sorted=tuple(sorted(opt_set)),
        )
        if len(self._definitions) > 4096:
            self._definitions.clear()
        self._definitions[cache_key] = definition
        return definition


def _described(error: Any) -> str:
    """One pydantic error as ``field F: what`` (the contract as a whole: ``what``), without
    pydantic's "Value error, " before a validator's own words."""
    context = error.get("ctx") or {}
    message = str(context["error"]) if error["type"] == "value_error" and "error" in context \
        else error["msg"]
    where = ".".join(str(part) for part in error["loc"])
    return f"field {where}: {message}" if where else message


class _JSONLoader(yaml.SafeLoader):  # type: ignore[misc]  # yaml has no stubs here
    """YAML's safe loader that refuses a key repeated in one mapping (merge keys ``<<``
    excepted: their keys may be overridden, as YAML defines), with the scalars of YAML 1.2's
    core schema, JSON's: only ``true``/``false`` are booleans (YAML 1.1 also read ``yes``,
    ``no``, ``on``, ``off``), ``010`` is ten (1.1: eight), ``1:30`` and ``2026-01-01`` are
    strings (1.1: 90 and a date) and ``1e5`` a number (1.1: a string, also in a JSON file)."""

    yaml_implicit_resolvers = {
        first: [(tag, regex) for tag, regex in resolvers
                if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int",
                               "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp",
                               "tag:yaml.org,2002:value")]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


_JSONLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"))
_JSONLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789"))
_JSONLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def _construct_int(loader: _JSONLoader, node: yaml.ScalarNode) -> int:
    """YAML 1.2's integers: decimal (a leading zero is not octal), ``0o`` octal, ``0x`` hex."""
    text = loader.construct_scalar(node)
    if text.startswith(("0o", "0x")):
        value = int(text[2:], 8 if text[1] == "o" else 16)
        if value.bit_length() <= MAX_INT_DIGITS * 10 // 3:  # as many digits, about
            return value
    elif len(text.lstrip("+-")) <= MAX_INT_DIGITS:
        return int(text, 10)
    raise ValueError(f"Exceeds the limit ({MAX_INT_DIGITS} digits) for integer string "
                     "conversion")  # named on load; whatever this process's own limit


_JSONLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)

def _construct_str(loader: _JSONLoader, node: yaml.ScalarNode) -> str:
    """A string, its escaped UTF-16 surrogate pairs (``"\\ud83d\\ude42"``, as JSON writes a
    character beyond the BMP) read as the one character they spell, as a JSON reader does
    (YAML's reader made them two lone surrogates); a lone surrogate stays, and is refused
    after the load (``_not_json``)."""
    text: str = loader.construct_scalar(node)
    if is_utf8(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


_JSONLoader.add_constructor("tag:yaml.org,2002:str", _construct_str)


def _construct_mapping(loader: _JSONLoader, node: yaml.MappingNode) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):
            continue  # a list as a key: refused as a non-string key after the load
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"repeated key {key!r}", key_node.start_mark)
        seen.add(key)
    yield from loader.construct_yaml_map(node)


_JSONLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _not_json(value: Any, path: str, seen: set[int]) -> str | None:
    """Where ``value`` holds something JSON cannot (None if nothing): ``path: what``. A
    container YAML shares by alias is looked at once (``seen``: ids of those looked at)."""
    if not isinstance(value, (dict, list)):
        return _not_json_scalar(value, path)
    if id(value) in seen:
        return None
    seen.add(id(value))
    if isinstance(value, list):
        items = ((f"{path}[{i}]", item) for i, item in enumerate(value))
    else:
        for key in value:
            if not isinstance(key, str) or not is_utf8(key):
                what = "is not a string" if not isinstance(key, str) else \
                    "holds a lone surrogate, not text"
                return f"{path or '(top)'}: key {key!r} {what}"
        items = ((f"{path}.{key}" if path else key, item) for key, item in value.items())
    for where, item in items:
        found = _not_json(item, where, seen)
        if found:
            return found
    return None


def _not_json_scalar(value: Any, path: str) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{path}: {value!r} is not a JSON number"
    if isinstance(value, str) and not is_utf8(value):
        return f"{path}: {value!r} holds a lone surrogate, not text"
    if value is not None and not isinstance(value, (str, int, float, bool)):
        return f"{path}: a {type(value).__name__} is not a JSON value"
    return None


def _load_document(text: str, origin: str) -> Any:
    """The YAML document of a contracts file, refused (``ContractsError``) unless it is JSON."""
    try:
        document = yaml.load(text, Loader=_JSONLoader)  # noqa: S506 (a SafeLoader)
        problem = _not_json(document, "", set())
    except yaml.MarkedYAMLError as exc:
        where = f" (line {exc.problem_mark.line + 1})" if exc.problem_mark else ""
        what = " ".join(part for part in (exc.context, exc.problem) if part)
        raise ContractsError(f"{origin}: not valid YAML: {what}{where}") from None
    except yaml.YAMLError as exc:
        raise ContractsError(f"{origin}: not valid YAML: {exc}".replace("\n", " ")) from None
    except KeyError as exc:  # an explicit tag's value its constructor cannot read (!!bool x)
        raise ContractsError(f"{origin}: not valid YAML: cannot read {exc} as the value its "
                             "tag names") from None
    except RecursionError:
        raise ContractsError(f"{origin}: nested too deeply") from None
    except ValueError as exc:  # an integer beyond the limit (4,300, or this process's lower)
        limit = re.search(r"\((\d+) digits\)", str(exc))
        reason = (f"an integer of more than {int(limit.group(1)):,} digits" if limit
                  else str(exc).splitlines()[0])
        raise ContractsError(f"{origin}: not valid YAML: {reason}") from None
    if problem:
        raise ContractsError(f"{origin}: not JSON: {problem}")
    most = max(_MAX_EXPANDED, 10 * _size(document, None, shared=False))
    if _size(document, most, shared=True) > most:
        raise ContractsError(f"{origin}: its YAML aliases expand it to more than "
                             f"{most:,} values (an alias repeats what it names)")
    return document


# A contracts file whose aliases make it more than this many values, and more than ten times
# the values it writes out, is refused: a file of 600 bytes with nested aliases expanded to
# 10**6 values and more (the values written are counted whole: a file padded with 10,000 of
# them passed a count that stopped at this limit, and hung the run)
_MAX_EXPANDED = 100_000


def _size(value: Any, limit: int | None, shared: bool) -> int:
    """How many values (containers and scalars) ``value`` holds, counted up to ``limit`` + 1
    (all of them with ``None``); with ``shared``, a container YAML shares by alias counts each
    time it appears."""
    count, stack, seen = 0, [value], set()
    while stack and (limit is None or count <= limit):
        item = stack.pop()
        count += 1
        if isinstance(item, (dict, list)) and (shared or id(item) not in seen):
            seen.add(id(item))
            stack.extend(item.values() if isinstance(item, dict) else item)
    return count


def parse_contracts(text: str, origin: str = "<contracts>") -> dict[str, Contract]:
    """Parse the YAML text of a contracts file into contracts by name."""
    document = _load_document(text, origin)
    if not isinstance(document, dict) or not isinstance(document.get("contracts"), list):
        raise ContractsError(f"{origin}: expected a top-level 'contracts:' list")
    extra = set(document) - {"contracts"}
    if extra:
        raise ContractsError(f"{origin}: unknown top-level field(s) {sorted(extra)}")
    contracts: dict[str, Contract] = {}
    for position, entry in enumerate(document["contracts"], start=1):
        label = f"contract #{position}"
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            label = f"contract {entry['name']!r}"
        if not isinstance(entry, dict):
            raise ContractsError(f"{origin}: {label}: expected a mapping")
        try:
            contract = Contract.model_validate(entry)
        except RecursionError:
            raise ContractsError(f"{origin}: {label}: nested too deeply") from None
        except ValidationError as exc:
            raise ContractsError(f"{origin}: {label}: {_described(exc.errors()[0])}") from None
        if contract.name in contracts:
            raise ContractsError(f"{origin}: {label}: field name: duplicate contract name")
        contracts[contract.name] = contract
    return contracts


def load_contracts(path: str) -> dict[str, Contract]:
    """Read a contracts file from a local path or any Beam filesystem path (gs://...); a
    local path that is not a regular file (a named pipe, a device) is refused unread."""
    if "://" not in path and os.path.exists(path) and not os.path.isfile(path):
        kind = "a folder" if os.path.isdir(path) else "not a regular file"
        raise ContractsError(f"{path}: cannot read contracts file: {kind}")
    try:
        from apache_beam.io.filesystems import FileSystems

        with FileSystems.open(path) as handle:
            raw = handle.read()
    except Exception as exc:  # any filesystem error becomes one clear line
        raise ContractsError(f"{path}: cannot read contracts file: {exc}".split("\n")[0]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ContractsError(f"{path}: contracts file is not UTF-8") from None
    return parse_contracts(text, origin=path)
