"""``log --graph``: the columns Git draws beside each commit.

Each column waits for one commit (the parent of a commit drawn above it). When
a commit's parent is one another column already waits for (branches that forked
there), its column folds into that one with a ``|/`` line right after it, as in
Git. A merge commit opens a column for each further parent with a ``|\\`` line.
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
        rows.append((head, body, _fold_waiting(columns), spread))
    return rows


def _fold_waiting(columns: list) -> list:
    """Fold columns that now wait for the same commit into the first of them, as Git draws
    a fork: the ``|/`` line comes right after the commit whose parent another column
    already waits for, before that parent's own line. Changes ``columns``."""
    folds = []
    for target in list(dict.fromkeys(columns)):
        waiting = [i for i, x in enumerate(columns) if x == target]
        for j in reversed(waiting[1:]):
            folds.append(_fold(j, len(columns)))
            del columns[j]
    return folds


def _spread(here: int, opened: int, right: int) -> str:
    """Column ``here`` opens ``opened`` columns to its right; the ``right``
    columns beyond it move over by as many."""
    return "| " * here + "|\\" + " \\" * (opened - 1 + right)


def _fold(j: int, width: int) -> str:
    """Column ``j`` joins column ``j - 1``; the columns right of it move one left."""
    return " ".join(["|"] * (j - 1)) + (" " if j > 1 else "") + "|/" + " /" * (width - j - 1)
