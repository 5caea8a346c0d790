"""Command-line flags made from `Settings` fields: a knob's name, type, constraints, default and
meaning are written once, in contract/settings.py.

    add_setting_flag(parser, "max_num_batched_tokens")   -> --max-num-batched-tokens N
    add_setting_flag(parser, "pack_dirs", "--packs")      -> --packs DIR (repeatable)
    settings_from_args(args) -> get_settings() with the flags given applied

A flag left out keeps the setting's value: its SPINF_* variable, else the field's default. A
flag of a list field adds to the list. Each value is checked by the field's own validation
while the command line is parsed, so a bad one is refused there with the field's message.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Annotated, Any, get_args, get_origin

from pydantic import TypeAdapter, ValidationError

from contract.settings import Settings, get_settings


def add_setting_flag(parser: argparse.ArgumentParser, name: str, flag: str | None = None,
                     help: str | None = None, **options) -> None:
    """`--name-with-dashes` (or `flag`) for the field `name`; `options` go to add_argument."""
    field = Settings.model_fields[name]
    source = f"SPINF_{name.upper()}"
    if _is_list(name):
        told = f"repeatable, adds to {source}"
    else:
        told = f"default: {source}, else {field.get_default(call_default_factory=True)}"
    parser.add_argument(
        flag or "--" + name.replace("_", "-"), dest=name, type=_parser_of(name), default=argparse.SUPPRESS,
        action="append" if _is_list(name) else "store", help=f"{help or field.description} ({told})", **options,
    )


def settings_from_args(args: argparse.Namespace, settings: Settings | None = None) -> Settings:
    """`settings` (the process's by default) with every settings flag present in `args` applied."""
    settings = settings or get_settings()
    given = {name: getattr(args, name) for name in Settings.model_fields if name in vars(args)}
    for name, value in given.items():
        if _is_list(name):
            given[name] = [*getattr(settings, name), *value]
    return settings.model_copy(update=given) if given else settings


def _is_list(name: str) -> bool:
    return get_origin(Settings.model_fields[name].annotation) is list


def _parser_of(name: str) -> Callable[[str], Any]:
    """The flag's `type`: the text validated as the field (one item of it, for a list field)."""
    field = Settings.model_fields[name]
    if _is_list(name):
        kind = get_args(field.annotation)[0]
    else:
        kind = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
    adapter = TypeAdapter(kind)

    def parse(text: str):
        try:
            return adapter.validate_python(text)
        except ValidationError as error:
            raise argparse.ArgumentTypeError(error.errors()[0]["msg"]) from None

    return parse
