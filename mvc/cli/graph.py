"""``log --graph``: the columns Git draws beside each commit.

Each column waits for one commit (the parent of a commit drawn above it). A
commit takes the first column waiting for it; other columns waiting for it
(branches that forked there) fold into it with a ``|/`` line, as in Git. A
merge commit opens a column for each further parent with a ``|\\`` line.
"""


def layout(commits) -> list:
    """[(graph text for the commit line, graph text for its other lines, fold
    lines after it, the line opening a merge's columns or "")] for commits in
    topological order, newest first."""
    columns, rows = [], []
    for c in commits:
        if c.id not in columns:
            columns.append(c.id)
        here = columns.index(c.id)
        head = " ".join("*" if i == here else "|" for i in range(len(columns)))
        folds = []
        for j in reversed([i for i, x in enumerate(columns) if x == c.id and i != here]):
            folds.append(_fold(j, len(columns)))
            del columns[j]
        parents, spread = list(c.parents), ""
        if parents:
            columns[here] = parents[0]
            opened = list(dict.fromkeys(p for p in parents[1:] if p not in columns))
            if opened:
                spread = _spread(here, len(opened), len(columns) - here - 1)
            columns[here + 1:here + 1] = opened
        else:
            del columns[here]
        body = " ".join("|" for _ in columns) if columns else ""
        rows.append((head, body, folds, spread))
    return rows


def _spread(here: int, opened: int, right: int) -> str:
    """Column ``here`` opens ``opened`` columns to its right; the ``right``
    columns beyond it move over by as many."""
    return "| " * here + "|\\" + " \\" * (opened - 1 + right)


def _fold(j: int, width: int) -> str:
    """Column ``j`` joins column ``j - 1``; the columns right of it move one left."""
    return " ".join(["|"] * (j - 1)) + (" " if j > 1 else "") + "|/" + " /" * (width - j - 1)
