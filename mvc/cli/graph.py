"""``log --graph``: the columns Git draws beside each commit.

Each column waits for one commit (the parent of a commit drawn above it). A
commit takes the first column waiting for it; other columns waiting for it
(branches that forked there) fold into it with a ``|/`` line, as in Git.
"""


def layout(commits) -> list:
    """[(graph text for the commit line, graph text for its other lines, fold lines after it)]
    for commits in topological order, newest first."""
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
        parents = list(c.parents)
        if parents:
            columns[here] = parents[0]
            columns[here + 1:here + 1] = [p for p in parents[1:] if p not in columns]
        else:
            del columns[here]
        body = " ".join("|" for _ in columns) if columns else ""
        rows.append((head, body, folds))
    return rows


def _fold(j: int, width: int) -> str:
    """Column ``j`` joins column ``j - 1``; the columns right of it move one left."""
    return " ".join(["|"] * (j - 1)) + (" " if j > 1 else "") + "|/" + " /" * (width - j - 1)
