"""The command reference (docs/commands.md) from the commands' own help: ``python -m mvc.cli.reference``.

Each command's usage line, its help and its options, grouped as ``mvc --help``
groups them, so the reference says what the code does.
"""

import click

from . import main
from .base import COMMAND_GROUPS

HEADER = """# mvc command reference

Every command's usage, help and options, as `mvc COMMAND --help` prints
them, grouped as `mvc --help` groups them. Written by
`python -m mvc.cli.reference > docs/commands.md`; the user guide
(docs/guide.md) shows them at work.
"""


def _sections(group, ctx, path: str) -> list:
    out = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        with click.Context(command, info_name=name, parent=ctx, terminal_width=100) as sub:
            out.append((f"{path} {name}", command.get_help(sub)))
            if isinstance(command, click.Group):
                out += _sections(command, sub, f"{path} {name}")
    return out


def markdown() -> str:
    """The reference as Markdown."""
    with click.Context(main, info_name="mvc", terminal_width=100) as ctx:
        found = _sections(main, ctx, "mvc")
    tops = list(dict.fromkeys(key.split()[1] for key, _ in found))
    grouped = [(title, [n for n in names if n in tops]) for title, names in COMMAND_GROUPS]
    listed = {n for _, names in grouped for n in names}
    grouped.append(("other commands", [n for n in tops if n not in listed]))
    parts = [HEADER]
    for title, names in grouped:
        if names:
            parts.append(f"\n## {title[0].upper() + title[1:]}\n")
        for name in names:  # the command, then its subcommands (mvc bisect start, ...)
            for key, text in found:
                if key.split()[1] == name:
                    parts.append(f"\n### `{key}`\n\n```text\n{text.rstrip()}\n```\n")
    return "".join(parts)


if __name__ == "__main__":
    print(markdown(), end="")
