"""docs/commands.md, the command reference, names every command there is (it is written by
``python -m mvc.cli.reference`` from the commands' own help)."""

import re
from pathlib import Path

from mvc.cli.reference import markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "commands.md"


def _headings(text: str) -> set:
    return set(re.findall(r"^### `(mvc [^`]+)`$", text, re.M))


def test_the_reference_has_every_command_and_subcommand():
    made = _headings(markdown())
    assert {"mvc init", "mvc log", "mvc bisect start", "mvc remote add", "mvc cache pin", "mvc serve"} <= made
    assert _headings(DOC.read_text()) == made, "run: python -m mvc.cli.reference > docs/commands.md"
