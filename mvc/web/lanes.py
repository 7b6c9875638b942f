"""The commit graph's lanes, as ``mvc log --graph`` (mvc/cli/graph.py) places them.

Vocabulary:

- a **lane** (column) waits for one commit: the parent of a commit drawn
  above it. A commit takes the first lane waiting for it (or a new lane
  at the right); other lanes waiting for it fold into it; its first parent
  takes its lane and further parents new lanes just right of it.
- a **row** is one commit: the lane of its node, and the **segments**
  drawn in its band: (from lane, from "top" or "mid", to lane, to "mid"
  or "bottom"), mid being the node's height. A lane leaving a row at the
  bottom enters the next row at the top in the same place.

Parents outside the listed commits (a range's boundary) end their lane at
the node, so a range or a filtered list draws no lane that never closes.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    lane: int  # the node's column
    width: int  # columns in use in this row's band
    segments: tuple  # (from_lane, from_end, to_lane, to_end), ends "top" / "mid" / "bottom"


def layout(commits) -> list:
    """A Row per commit, for commits in topological order, newest first."""
    listed = {c.id for c in commits}
    lanes, rows = [], []
    for c in commits:
        entered = c.id in lanes
        if not entered:
            lanes.append(c.id)
        here = lanes.index(c.id)
        parents = [p for p in c.parents if p in listed]
        after, segments = [], []
        for j, waiting in enumerate(lanes):
            if waiting == c.id:
                if j != here or entered:
                    segments.append((j, "top", here, "mid"))
                if j == here and parents:
                    after.append(parents[0])
                    segments.append((here, "mid", len(after) - 1, "bottom"))
                    for p in parents[1:]:
                        if p not in lanes and p not in after:
                            after.append(p)
                            segments.append((here, "mid", len(after) - 1, "bottom"))
                continue
            after.append(waiting)
            segments.append((j, "top", len(after) - 1, "bottom"))
        for p in parents[1:]:  # a merge parent another lane already waits for: join that lane
            if p in lanes and p != c.id:
                segments.append((here, "mid", after.index(p), "bottom"))
        rows.append(Row(here, max(len(lanes), len(after)), tuple(segments)))
        lanes = after
    return rows
