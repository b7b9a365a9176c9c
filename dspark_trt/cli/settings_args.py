"""argparse options generated from a settings dataclass (``serving.settings``): one option per field with a
flag, its default, help text, value parser, metavar and choices taken from the field's ``Setting``.

    add_settings(parser, RepositorySettings)                             all flags on the parser
    add_settings(parser, ServeOptions, groups={"endpoints": "endpoints", "model": "model …", …})
    settings_values(RepositorySettings, args)                           {field: value} back from the namespace
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

from ..serving.settings import SettingError, setting_of

__all__ = ["add_settings", "settings_values", "changed_flags"]


def _argparse_type(parse):
    """``parse`` for argparse: a ``SettingError`` becomes argparse's error with its own message; another
    ValueError stays argparse's "invalid <parse> value"."""
    def convert(text: str):
        try:
            return parse(text)
        except SettingError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = parse.__name__
    return convert


class _Many(argparse.Action):
    """Each occurrence adds its value to a tuple (argparse's "append" would add to the default's list)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, self.dest)
        setattr(namespace, self.dest, (given if given is not self.default else ()) + (values,))


def _flagged(cls):
    for f in fields(cls):
        s = setting_of(f)
        if s is not None and s.flag is not None:
            yield f, s


def add_settings(parser: argparse.ArgumentParser, cls, *, groups: dict[str, str] | None = None,
                 choices: dict[str, tuple[str, ...]] | None = None) -> None:
    """Add an option for each flagged field of ``cls``. ``groups``: setting group → argument group title (one
    argparse group per title, in this order; a field whose group is absent gets no option); without it, every
    option goes on ``parser``. ``choices``: narrower choices for some fields (by name)."""
    made: dict[str, argparse._ArgumentGroup] = {}
    if groups is not None:
        for title in groups.values():
            made.setdefault(title, parser.add_argument_group(title))
    order = list(groups or {})
    flagged = sorted(_flagged(cls), key=lambda fs: order.index(fs[1].group) if fs[1].group in order else 0)
    for f, s in flagged:  # group by group (the usage line follows), fields in their order within one
        if groups is None:
            target = parser
        elif s.group in groups:
            target = made[groups[s.group]]
        else:
            continue
        if isinstance(f.default, bool):  # a switch: the flag flips the default
            target.add_argument(s.flag, dest=f.name, action="store_false" if f.default else "store_true",
                                help=s.help)
        elif s.many:  # given several times: a tuple of the values (the default when not given)
            target.add_argument(s.flag, dest=f.name, action=_Many, default=f.default, help=s.help,
                                metavar=s.metavar, type=_argparse_type(s.parse) if s.parse is not None else None)
        else:
            default = None if f.default is MISSING else f.default
            named = choices.get(f.name, s.choices) if choices else s.choices
            metavar = s.metavar or (None if named else s.flag.lstrip("-").upper().replace("-", "_"))
            target.add_argument(s.flag, dest=f.name, default=default, help=s.help, metavar=metavar,
                                type=_argparse_type(s.parse) if s.parse is not None else None,
                                choices=named)
        if s.off is not None:
            target.add_argument(s.off[0], dest=f"{f.name}__off", action="store_true", help=s.off[1])


def settings_values(cls, args: argparse.Namespace) -> dict:
    """The flagged fields of ``cls`` that ``args`` holds, by name (an ``off`` flag given: None)."""
    out = {}
    for f, s in _flagged(cls):
        if hasattr(args, f.name):
            off = s.off is not None and getattr(args, f"{f.name}__off", False)
            out[f.name] = None if off else getattr(args, f.name)
    return out


def changed_flags(cls, args: argparse.Namespace) -> list[str]:
    """The flags of ``cls``'s fields whose value in ``args`` is not the field's default."""
    return [s.flag for f, s in _flagged(cls) if hasattr(args, f.name) and getattr(args, f.name) != f.default]
