"""``log --graph``: the lines Git draws beside each commit.

Vocabulary:

- a **column** waits for one commit: the parent of a commit drawn above it.
  Columns are two characters wide; a commit's node is a ``*`` in its column.
- the **targets** of a line say, for each character position, which column
  of the next commit the edge there leads to (-1: nothing there). An edge
  whose position is not yet its column's moves left by one position a line
  (``/``), or along ``_`` when it has several columns to cross, so lines
  that share a parent **collapse** into one over the lines that follow.
- each commit is drawn in **states**: lines that widen the columns right of
  an octopus merge before its node (``pre-commit``), the node's line
  (``commit``), the line that fans a merge out to its parents
  (``post-merge``), lines that collapse columns (``collapsing``), and then
  plain ``|`` lines (``padding``) for as long as the commit's text needs.

Only parents that are listed themselves get an edge (Git's "interesting"
parents): a range's boundary or a log along first parents draws no column
that never ends. The drawing is Git's (``git log --graph --date-order``):
an octopus merge is ``*-.`` with its edges fanned out ``|\\ \\``, a merge
whose first parent waits to its left is drawn skewed (``|/|\\``), and
columns cross one at a time.
"""

PADDING, PRE_COMMIT, COMMIT, POST_MERGE, COLLAPSING = range(5)


class Graph:
    """Draws commits given one at a time in topological order, newest first:
    ``update(commit)``, then ``to_commit()`` (the lines up to and including
    the node's), ``next_line()`` beside each further line of text, and
    ``remainder()`` for the lines the commit still needs."""

    def __init__(self, listed=None):
        self.listed = listed  # ids that are drawn; None: every parent is
        self.commit = None
        self.parents = []
        self.columns, self.new_columns = [], []
        self.targets, self.old_targets = [], []
        self.size = 0  # positions of ``targets`` in use
        self.width = 0
        self.index = self.prev_index = 0  # the node's column, this commit's and the last one's
        self.skew = -1  # 0: a merge's first parent is the column to its left; 1: not
        self.added = self.prev_added = 0  # columns a merge adds right of its node
        self.state = self.prev_state = PADDING
        self.expansion = 0

    # -- placing a commit -------------------------------------------------------------------

    def update(self, commit) -> None:
        """Start drawing ``commit`` (an object with ``id`` and ``parents``)."""
        self.commit = commit.id
        self.parents = [p for p in dict.fromkeys(commit.parents)
                        if self.listed is None or p in self.listed]
        self.prev_index = self.index
        self.columns, self.new_columns = self.new_columns, []
        self.size = 2 * (len(self.columns) + len(self.parents))
        self.targets = [-1] * (self.size + 2)
        self.width, self.prev_added, self.added = 0, self.added, 0
        for i, waiting in enumerate(self.columns + [None]):
            if waiting is None:
                if self.commit in self.columns:
                    break
                waiting = self.commit
            if waiting == self.commit:
                self.index, self.skew = i, -1
                for p in self.parents:
                    self._place(p, i)
                if not self.parents:
                    self.width += 2
            else:
                self._place(waiting, -1)
        while self.size > 1 and self.targets[self.size - 1] < 0:
            self.size -= 1
        self.expansion = 0
        self.state = PRE_COMMIT if self._needs_pre_commit() else COMMIT

    def _place(self, oid: str, node: int) -> None:
        """Put ``oid`` in the next commit's columns and say where its edge starts."""
        if oid in self.new_columns:
            column = self.new_columns.index(oid)
        else:
            column = len(self.new_columns)
            self.new_columns.append(oid)
        if len(self.parents) > 1 and node >= 0 and self.skew == -1:  # a merge's first parent
            distance = node - column
            shift = 2 * distance - 3 if distance > 1 else 1
            self.skew = 0 if distance > 0 else 1
            self.added = len(self.parents) + self.skew - 2
            position = self.width + (self.skew - 1) * shift
            self.width += 2 * self.skew
        elif self.added > 0 and self.width >= 2 and column == self.targets[self.width - 2]:
            position = self.width - 2  # a merge's last edge joins the column just left of it
            self.added = -1
        else:
            position = self.width
            self.width += 2
        self.targets[position] = column

    def _dashed(self) -> int:
        return len(self.parents) + self.skew - 3

    def _needs_pre_commit(self) -> bool:
        return (len(self.parents) >= 3 and self.index < len(self.columns) - 1
                and self.expansion < 2 * self._dashed())

    def _settled(self) -> bool:
        return all(t < 0 or t == i // 2 for i, t in enumerate(self.targets[:self.size]))

    def _move(self, state: int) -> None:
        self.prev_state, self.state = self.state, state

    # -- lines ------------------------------------------------------------------------------

    def to_commit(self) -> list:
        """The lines before the node's (widening an octopus's columns) and the node's own, last."""
        lines = []
        while True:
            is_node = self.state == COMMIT
            lines.append(self.next_line())
            if is_node:
                return lines

    def next_line(self) -> str:
        """The graph beside the next line of text, padded to the commit's width."""
        draw = {PADDING: self._padding_line, PRE_COMMIT: self._pre_commit_line, COMMIT: self._commit_line,
                POST_MERGE: self._post_merge_line, COLLAPSING: self._collapsing_line}[self.state]
        return draw().ljust(self.width)

    def remainder(self) -> list:
        """The lines the commit still needs once its text has ended."""
        lines = []
        while self.state != PADDING:
            lines.append(self.next_line())
        return lines

    def padding(self) -> str:
        """The line between two commits' texts: after ``update``, before ``to_commit``."""
        if self.state != COMMIT:
            return self.next_line()
        cells = []
        for waiting in self.columns:
            wide = waiting == self.commit and len(self.parents) > 2
            cells.append("|" + " " * (2 * (len(self.parents) - 2) if wide else 1))
        self.prev_state = PADDING
        return "".join(cells).ljust(self.width)

    def _padding_line(self) -> str:
        return "| " * len(self.new_columns)

    def _pre_commit_line(self) -> str:
        out, seen = [], False
        for i, waiting in enumerate(self.columns):
            if waiting == self.commit:
                seen = True
                out.append("|" + " " * self.expansion)
            elif seen and self.expansion == 0:
                fanned = self.prev_state == POST_MERGE and self.prev_index < i
                out.append("\\" if fanned else "|")
            else:
                out.append("\\" if seen else "|")
            out.append(" ")
        self.expansion += 1
        if not self._needs_pre_commit():
            self._move(COMMIT)
        return "".join(out)

    def _commit_line(self) -> str:
        out, seen = [], False
        for i, waiting in enumerate(self._with_node()):
            if waiting == self.commit:
                seen = True
                out.append("*")
                if len(self.parents) > 2 and self._dashed() > 0:  # an octopus: *-. or *---. ...
                    out.append("-" * (2 * self._dashed() - 1) + ".")
            elif seen and self.added > 1:
                out.append("\\")
            elif seen and self.added == 1:
                fanned = self.prev_state == POST_MERGE and self.prev_added > 0 and self.prev_index < i
                out.append("\\" if fanned else "|")
            elif (self.prev_state == COLLAPSING and _at(self.old_targets, 2 * i + 1) == i
                  and _at(self.targets, 2 * i) < i):
                out.append("/")
            else:
                out.append("|")
            out.append(" ")
        if len(self.parents) > 1:
            self._move(POST_MERGE)
        else:
            self._move(PADDING if self._settled() else COLLAPSING)
        return "".join(out)

    def _post_merge_line(self) -> str:
        out, seen, first_parent_left = [], False, False
        for i, waiting in enumerate(self._with_node()):
            if waiting == self.commit:
                seen = True
                kind = self.skew
                for j in range(len(self.parents)):
                    out.append("/|\\"[kind])
                    if kind == 2:
                        if self.added > 0 or j < len(self.parents) - 1:
                            out.append(" ")
                    else:
                        kind += 1
                if self.added == 0:
                    out.append(" ")
            elif seen:
                out.append(("\\" if self.added > 0 else "|") + " ")
            else:
                out.append("|")
                if self.skew != 0 or i != self.index - 1:
                    out.append("_" if first_parent_left else " ")
            if waiting == self.parents[0]:
                first_parent_left = True
        self._move(PADDING if self._settled() else COLLAPSING)
        return "".join(out)

    def _collapsing_line(self) -> str:
        self.old_targets, self.targets = self.targets, [-1] * len(self.targets)
        crossing = crossing_to = -1  # the one edge that may move along "_" on this line
        for i in range(self.size):
            target = self.old_targets[i]
            if target < 0:
                continue
            if 2 * target == i:
                self.targets[i] = target
            elif self.targets[i - 1] < 0:
                self.targets[i - 1] = target
                if crossing == -1:
                    crossing, crossing_to = i, target
                    for j in range(2 * target + 3, i - 2, 2):
                        self.targets[j] = target
            elif self.targets[i - 1] != target:  # cross the edge to the left
                self.targets[i - 2] = target
                if crossing == -1:
                    crossing, crossing_to = i - 1, target
                    for j in range(2 * target + 3, i - 2, 2):
                        self.targets[j] = target
        self.old_targets = list(self.targets)
        if self.targets[self.size - 1] < 0:
            self.size -= 1
        out, horizontal = [], False
        for i in range(self.size):
            target = self.targets[i]
            if target < 0:
                out.append(" ")
            elif 2 * target == i:
                out.append("|")
            elif target == crossing_to and i != crossing - 1:
                if i != 2 * target + 3:
                    self.targets[i] = -1
                horizontal = True
                out.append("_")
            else:
                if horizontal and i < crossing:
                    self.targets[i] = -1
                out.append("/")
        if self._settled():
            self._move(PADDING)
        return "".join(out)

    def _with_node(self) -> list:
        """The columns, with the node's own at the right when no column waited for it."""
        return self.columns if self.commit in self.columns else self.columns + [self.commit]


def _at(values: list, i: int) -> int:
    return values[i] if 0 <= i < len(values) else -1
