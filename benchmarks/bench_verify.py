"""What verifying every object read costs: ``log`` over many commits and a 1 GiB load.

Run ``python benchmarks/bench_verify.py [--commits 10000] [--size-mb 1024]``.
Every commit, tree and tensor object mvc reads from the index is re-hashed
(BLAKE3) and matched with its id. This prints, side by side in one run,
best of ``--repeat`` rounds:

- ``repo.log()`` over ``--commits`` commits vs the same walk building the
  same records without re-hashing the commit objects (what mvc did before
  every read was verified);
- ``repo.load()`` of a ``--size-mb`` state vs the objects-unverified cost,
  measured as the load minus the time to re-hash its tree and tensor
  objects (chunks were always verified).
"""

import argparse
import tempfile
import time

import torch

import mvc
from mvc.objects import CommitObject, TensorObject, TreeObject, object_id
from mvc.traverse import walk
from mvc.objects import TensorLeaf


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def unverified_log(repo) -> list:
    """``repo.log()`` as it was before objects were verified: the same records, no re-hash."""
    commits = []
    with repo.index.read() as txn:
        oid = repo.refs.head(txn)[1]
        while oid is not None:
            obj = CommitObject.decode(txn.get("commits", oid))
            commits.append(mvc.commits.to_commit(oid, obj, pruned=txn.pruned(oid) is not None))
            oid = obj.parents[0] if obj.parents else None
    return commits


def object_hashing(repo) -> None:
    with repo.index.read() as txn:
        oid = repo.refs.head(txn)[1]
        commit = txn.get("commits", oid)
        object_id(commit)
        tree_bytes = txn.get("trees", CommitObject.decode(commit).tree)
        object_id(tree_bytes)
        for _, leaf in walk(TreeObject.decode(tree_bytes).root):
            if isinstance(leaf, TensorLeaf):
                object_id(txn.get("tensors", leaf.id))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--commits", type=int, default=10000)
    p.add_argument("--size-mb", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        repo = mvc.Repository.init(d + "/log")
        with repo.index.write() as txn:  # many commits fast: records only, as a long run's history
            parent = None
            for i in range(args.commits):
                tree = repo.objects.put(txn, "trees", TreeObject({"step": i}).encode())
                obj = CommitObject(tree, (parent,) if parent else (), f"step {i}", "bench", i, i, 0,
                                   {"loss": 1.0 / (i + 1)}, {"lr": 3e-4, "batch_size": 512})
                parent = repo.objects.put(txn, "commits", obj.encode())
            repo.refs.set_if_equals(txn, None, None, parent, "bench")
        verified = best(lambda: list(repo.log()), args.repeat)
        plain = best(lambda: unverified_log(repo), args.repeat)
        print(f"log of {args.commits} commits: verified {verified:.3f}s, unverified walk {plain:.3f}s, "
              f"ratio {verified / plain:.2f}")
        repo.close()
        repo = mvc.Repository.init(d + "/load")
        n = max(1, args.size_mb // 16)
        state = {f"layer{i}.weight": torch.randn(4 << 20) for i in range(n)}  # 16 MiB each
        repo.commit(state, "state")
        load = best(lambda: repo.load(), args.repeat)
        hashing = best(lambda: object_hashing(repo), args.repeat)
        print(f"load of {n * 16} MiB ({n} tensors): {load:.3f}s, of which verifying objects {hashing * 1e3:.2f} ms "
              f"({hashing / load * 100:.3f}%)")
        repo.close()


if __name__ == "__main__":
    main()
