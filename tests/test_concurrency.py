"""Many real processes committing to one branch at once: compare-and-swap loses nothing."""

import json
import subprocess
import sys

import pytest
import torch


PROCESSES = 4
COMMITS = 25

# Commits COMMITS tiny states to main once told "go"; reports what landed and how many conflicted.
WRITER = r"""
import json, sys, torch, mvc
root, worker, rebase = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
repo = mvc.Repository.open(root)
print("ready", flush=True)
sys.stdin.readline()
landed, conflicts = [], 0
for i in range(int(sys.argv[4])):
    state = {"worker": torch.tensor([worker, i]), "w": torch.full((40,), float(worker * 1000 + i))}
    try:
        landed.append(repo.commit(state, f"w{worker} #{i}", step=i, branch="main", rebase=rebase).id)
    except mvc.RefConflict:
        conflicts += 1
print(json.dumps({"landed": landed, "conflicts": conflicts}), flush=True)
"""


def run_writers(repo, rebase: bool) -> list:
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(repo.root), str(w), "1" if rebase else "0",
                               str(COMMITS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for w in range(PROCESSES)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:  # release them together
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, "a writer died: only RefConflict is an expected failure"
        results.append(json.loads(out))
    return results


def check_history(repo, landed: list) -> list:
    chain = list(repo.log("main"))
    assert len(chain) == len(landed) and {c.id for c in chain} == set(landed)
    assert chain[-1].parents == ()
    for c in chain:
        worker, i = (int(x) for x in repo.load(c.id)["worker"])
        assert c.message == f"w{worker} #{i}"
    return chain


@pytest.mark.parametrize("rebase", [False, True], ids=["cas", "rebase"])
def test_concurrent_commits_to_one_branch_lose_nothing(repo, rebase):
    results = run_writers(repo, rebase)
    landed = [cid for r in results for cid in r["landed"]]
    conflicts = sum(r["conflicts"] for r in results)
    assert len(landed) + conflicts == PROCESSES * COMMITS
    check_history(repo, landed)
    if rebase:
        assert conflicts == 0 and len(landed) == PROCESSES * COMMITS
    state = repo.load("main")
    worker, i = (int(x) for x in state["worker"])
    assert torch.equal(state["w"], torch.full((40,), float(worker * 1000 + i)))
