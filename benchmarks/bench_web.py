"""mvc serve: the history page of a 10,000-commit repository, and the diff page of two
large checkpoints answered from chunk ids.

    python benchmarks/bench_web.py [--commits 10000] [--diff-mib 1024] [--rounds 5] [--keep DIR]

History: a repository of COMMITS commits (each with ~90 context fields, as the
Checkpointer records, on four branches) is served; the page is fetched over HTTP:
the first page right after the server started (its walk made at start), the last
page, the first page after a new commit (only the new commit walked) and after a
ref moved back (the whole walk made again).
Time and bytes are printed; best of --rounds, interleaved.

Diff: two checkpoints of DIFF_MIB MiB each, the second with a few rows changed in a
quarter of the tensors; the diff page from chunk ids (the default) against the page
with the norms (which reads the tensors), and the chunk reads each made.
"""

import argparse
import os
import sys
import tempfile
import threading
import time
import urllib.request

import torch

import mvc
from mvc.web import Server, View


def context(i: int) -> dict:
    """About 90 fields, shaped like the Checkpointer's."""
    return {"hardware": {f"f{k}": k for k in range(12)}, "software": {f"pkg{k}": f"1.{k}.{i % 7}" for k in range(20)},
            "optimizer": {"lr": 3e-4 * (1 + i % 3), "betas": [0.9, 0.95], "weight_decay": 0.1},
            "data": {"step": i, "epoch": i // 1000, "seen": i * 512},
            "timing": {f"t{k}": 0.01 * k + i * 1e-6 for k in range(20)},
            "loss": {f"s{k}": 1.0 / (i + k + 1) for k in range(20)}, "code": {"git": f"{i:040x}"}}


def build_history(path, n: int) -> None:
    repo = mvc.Repository.init(path)
    w = torch.zeros(256)
    branches = ["main", "exp-a", "exp-b", "exp-c"]
    t0 = time.perf_counter()
    for i in range(n):
        if i % 100 == 0:
            w = w + 1
        branch = branches[(i // 7) % 4] if i > 50 else "main"
        if branch != "main" and branch not in {b.name for b in repo.branches()}:
            repo.create_branch(branch, "main")
        repo.commit({"w": w, "i": i}, f"step {i}", step=i, branch=branch,
                    metrics={"loss": 1.0 / (i + 1), "acc": i / n, "grad_norm": 1.0 + i % 5}, context=context(i))
        if (i + 1) % 2000 == 0:
            print(f"  built {i + 1} commits in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    repo.close()


def get(address: str) -> tuple:
    t = time.perf_counter()
    with urllib.request.urlopen(address, timeout=600) as r:
        data = r.read()
        assert r.status == 200
    return time.perf_counter() - t, len(data)


def serve(repo):
    t = time.perf_counter()
    server = Server(View(repo), "127.0.0.1", 0, quiet=True)
    started = time.perf_counter() - t
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.url.rstrip("/"), started


def bench_history(path, n: int, rounds: int) -> None:
    repo = mvc.Repository.open(path)
    best = {}
    for _ in range(rounds):
        server, base, started = serve(repo)
        figures = {"server start (walks the history)": (started, 0), "first page": get(base + "/"),
                   "last page (100 commits)": get(base + f"/?start={n - 100}"), "first page again": get(base + "/")}
        # a training run commits: only the new commit is walked, and goes in front
        repo.commit({"w": torch.zeros(256), "i": -1}, "new", step=n, branch="exp-a", context=context(n))
        figures["first page after a new commit"] = get(base + "/")
        tip = repo.resolve("exp-c")
        repo.create_branch("exp-c", "exp-c~5", force=True)  # a branch moved back: the whole walk again
        figures["first page after a branch moved back"] = get(base + "/")
        repo.create_branch("exp-c", tip, force=True)
        server.shutdown()
        server.server_close()
        for name, (secs, size) in figures.items():
            best[name] = (min(secs, best.get(name, (secs, 0))[0]), size)
    repo.close()
    print(f"history of {n} commits (4 branches, ~90 context fields each); best of {rounds}:")
    for name, (secs, size) in best.items():
        print(f"  {name:<36} {secs * 1000:8.1f} ms" + (f"  {size / 1024:7.1f} KiB" if size else ""))


class CountingReads:
    """Counts chunk reads of one repository's chunk store (calls and bytes asked for)."""

    def __init__(self, repo):
        self.calls = self.bytes = 0
        store, real = repo.chunks, repo.chunks.read

        def read(requests, *args, **kwargs):
            self.calls += 1
            self.bytes += sum(len(memoryview(r.buffer)) for r in requests)
            return real(requests, *args, **kwargs)
        store.read = read


def bench_diff(path, mib: int, rounds: int) -> None:
    repo = mvc.Repository.init(path)
    n_tensors = 16
    rows = mib * (1 << 20) // n_tensors // (1024 * 4)
    torch.manual_seed(0)
    state = {f"model.layers.{i}.weight": torch.randn(rows, 1024) for i in range(n_tensors)}
    a = repo.commit(state, "a")
    for i in range(0, n_tensors, 4):
        state[f"model.layers.{i}.weight"][:8] += 0.01  # a few rows of a quarter of the tensors
    b = repo.commit(state, "b")
    del state
    counter = CountingReads(repo)
    server, base, _ = serve(repo)
    best = {}
    for _ in range(rounds):
        for name, query in (("diff page from chunk ids", ""), ("diff page with norms (reads tensors)", "&numbers=1")):
            before = counter.calls, counter.bytes
            secs, size = get(base + f"/diff?a={a.id}&b={b.id}{query}")
            read = counter.calls - before[0], counter.bytes - before[1]
            if name not in best or secs < best[name][0]:
                best[name] = (secs, size, read)
    server.shutdown()
    server.server_close()
    repo.close()
    print(f"diff of two {mib} MiB checkpoints ({n_tensors} tensors, 4 with 8 rows changed); best of {rounds}:")
    for name, (secs, size, (calls, nbytes)) in best.items():
        print(f"  {name:<38} {secs * 1000:9.1f} ms  {size / 1024:6.1f} KiB page  "
              f"{calls} chunk reads, {nbytes / (1 << 20):.1f} MiB read")
    ids, full = best["diff page from chunk ids"][0], best["diff page with norms (reads tensors)"][0]
    print(f"  ratio chunk ids / norms: {ids / full:.4f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=10000)
    parser.add_argument("--diff-mib", type=int, default=1024, help="0: no diff benchmark")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", default=None, help="Build (or reuse) the history repository here.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        history = args.keep or os.path.join(tmp, "history")
        if not os.path.isdir(os.path.join(history, ".mvc")):
            print(f"building {args.commits} commits ...", file=sys.stderr)
            build_history(history, args.commits)
        bench_history(history, args.commits, args.rounds)
        if args.diff_mib:
            bench_diff(os.path.join(tmp, "diff"), args.diff_mib, args.rounds)


if __name__ == "__main__":
    main()
