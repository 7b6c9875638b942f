"""The soak: a seeded random driver of mvc's verbs, checked against an oracle of every committed state.

Vocabulary:

- **sid**: a state's seed. ``make_state(sid)`` is a small checkpoint whose
  blocks change at different rates with the sid (one 64-byte chunk each), so
  states share chunks the way neighbouring checkpoints do and the same sid
  commits the same bytes again (deduplication against old entries).
- **oracle**: every commit the soak made (its id, parents and the exact
  state it holds), the refs each repository must have, and the commits that
  a gc may legally have pruned. Merged states are computed here with plain
  torch (mvc.merge's documented arithmetic), not read back.
- **side**: one repository the soak drives: ``a`` (made here, pushes to a
  folder remote and to S3), ``b`` (a clone of the folder remote that commits
  and pushes too, so pushes race and get rejected) and ``lazy`` (a lazy clone
  of S3, cloned again now and then, loaded from and evicted).
- **kill**: an operation run in a real process (tests/soak_child.py) and
  SIGKILLed at a random moment; afterwards each ref is where the oracle
  says or where the killed operation could legally have put it.

``Soak(seed, ops, root, s3=(url, endpoint) or None).run()`` raises
``SoakFailure`` naming the seed, the operation and the trace of the last
operations. Every check compares bytes: a load that returns anything but
the committed state fails the soak, whatever the operations before it.
"""

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import torch

import mvc

SMALL_CHUNK = 64
BLOCKS, BLOCK = 12, 16  # "w": 12 float32 blocks of 64 bytes, one chunk each
BRANCHES = ("main", "dev", "exp", "x", "y")
TAGS = ("v1", "v2", "rel")
CHILD = Path(__file__).with_name("soak_child.py")
CHILD_TIMEOUT_S = 120
# How long a killed operation is let run before the kill, at most (seconds); kills land at a
# uniform moment in it, so some land before, inside and after the operation's write.
KILL_WINDOW_S = {"commit": 0.25, "gc": 0.4, "repack": 0.4, "push": 0.6, "fetch": 0.5}


class SoakFailure(AssertionError):
    pass


# -- states -----------------------------------------------------------------

def make_state(sid: int) -> dict:
    """The checkpoint of seed ``sid``: block j of "w" changes every 2**(j % 4) sids, "b" every
    third, "frozen" never, "emb", "mask" and "codes" in a few elements every sid; "extra" only
    on every seventh sid (a key set a merge refuses)."""
    blocks = [torch.randn(BLOCK, generator=torch.Generator().manual_seed(1000 * j + (sid >> (j % 4))))
              for j in range(BLOCKS)]
    state = {"model": {"w": torch.cat(blocks),
                       "b": torch.randn(40, generator=torch.Generator().manual_seed(sid // 3)).to(torch.bfloat16),
                       "frozen": torch.ones(24)},
             "counter": torch.tensor([sid, sid * 3, -sid], dtype=torch.int64),
             "step": sid, "cfg": {"lr": 1e-3 * (1 + sid % 5), "name": f"run-{sid % 3}"}}
    emb = torch.randn(256, generator=torch.Generator().manual_seed(7))
    for i in range(3):  # a few rows a step, as training touches an embedding: repack's deltas pay
        emb[(sid * 37 + i * 91) % 256] = float(sid + i)
    # one-byte dtypes: with 64-byte chunks only their planes are long enough for zstd, so these
    # are what repack re-encodes here (mostly zeros: grouped; a few bytes a sid: deltas)
    mask = torch.zeros(256, dtype=torch.uint8)
    mask[(sid * 5) % 256] = 1
    codes = torch.randint(0, 256, (256,), generator=torch.Generator().manual_seed(11), dtype=torch.uint8)
    codes[(sid * 13) % 256] = sid % 256
    codes[(sid * 29 + 7) % 256] = (sid * 3) % 256
    state["model"]["emb"], state["mask"], state["codes"] = emb, mask, codes
    if sid % 7 == 0:
        state["model"]["extra"] = torch.full((8,), float(sid))
    return state


def shape_of(state) -> object:
    """Keys, dtypes and shapes: what a merge checks its inputs agree on."""
    if isinstance(state, dict):
        return tuple((k, shape_of(v)) for k, v in sorted(state.items(), key=lambda kv: str(kv[0])))
    if isinstance(state, torch.Tensor):
        return (str(state.dtype), tuple(state.shape))
    return "value"


def linear(a, b):
    """mvc.merge's ``linear`` with weights (1, 1) of two states (its module docstring's arithmetic):
    float tensors in float32 (float64 in float64), x0*w0 + x1*w1, divided by the weights' sum, the
    first input's value where both agree; everything else from the first input."""
    if isinstance(a, dict):
        return {k: linear(a[k], b[k]) for k in a}
    if isinstance(a, torch.Tensor) and a.is_floating_point():
        up = torch.float64 if a.dtype == torch.float64 else torch.float32
        x0, x1 = a.to(up), b.to(up)
        acc = (x0 * 1.0 + x1 * 1.0) / 2.0
        return torch.where(x0 == x1, x0, acc).to(a.dtype)
    return a


def same(a, b) -> bool:
    """Bit for bit: dtype, shape and bytes of tensors, type and value of everything else."""
    if isinstance(a, torch.Tensor):
        raw = (lambda t: t.contiguous().view(-1).view(torch.uint8).tolist())  # noqa: E731
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and raw(a) == raw(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def flip_bit(path: Path, offset: int) -> None:
    """Flip the 0x10 bit of the byte at ``offset`` of ``path`` in place (twice: as it was)."""
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))


class RemoteFiles:
    """The pack files of a remote, behind mvc's back: a folder remote's files or an S3 prefix's
    objects (boto3, with the credentials the environment holds)."""

    def __init__(self, url: str, endpoint=None):
        self.url, self.endpoint = url, endpoint
        if url.startswith("s3://"):
            import boto3
            self.bucket, _, self.prefix = url[len("s3://"):].partition("/")
            self.client = boto3.client("s3", endpoint_url=endpoint)

    def packs(self, folder: str) -> list:
        """Keys (``FOLDER/NAME.pack``) of the non-empty packs in ``folder``."""
        if not self.url.startswith("s3://"):
            return sorted(f"{folder}/{p.name}" for p in (Path(self.url) / folder).glob("*.pack")
                          if p.stat().st_size > 0)
        answer = self.client.list_objects_v2(Bucket=self.bucket, Prefix=f"{self.prefix}/{folder}/")
        return sorted(o["Key"][len(self.prefix) + 1:] for o in answer.get("Contents", [])
                      if o["Key"].endswith(".pack") and o["Size"] > 0)

    def read(self, key: str) -> bytes:
        if not self.url.startswith("s3://"):
            return (Path(self.url) / key).read_bytes()
        return self.client.get_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}")["Body"].read()

    def write(self, key: str, data: bytes) -> None:
        if not self.url.startswith("s3://"):
            path = Path(self.url) / key
            if path.exists():
                os.chmod(path, 0o644)
            path.write_bytes(data)
            return
        self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}", Body=data)


# -- the fork server ------------------------------------------------------------

class Children:
    """tests/soak_child.py and the lines it and its children print."""

    def __init__(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(CHILD.parent), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([sys.executable, str(CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.lines = queue.Queue()
        self.early = []
        self.running = None  # the pid of the child started and not yet reaped
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def start(self, **cmd) -> int:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        seen = self.until(lambda line: line.startswith("pid "))
        self.early = seen[:-1]  # the child may print before the server names it
        self.running = int(seen[-1].split()[1])
        return self.running

    def until(self, done) -> list:
        seen, self.early = self.early, []
        while True:
            line = self.lines.get(timeout=CHILD_TIMEOUT_S)
            if line is None:
                raise SoakFailure(f"the soak's fork server died: {seen}")
            seen.append(line)
            if done(line):
                return seen

    def finish(self, pid: int) -> list:
        """The lines of child ``pid`` until it is reaped; SoakFailure if it crashed."""
        seen = self.until(lambda line: line.startswith(f"reaped {pid} "))
        self.running = None
        status = int(seen[-1].split()[2])
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            raise SoakFailure(f"child {pid} failed (status {status}; its traceback is on stderr): {seen}")
        return seen

    def kill(self, pid: int) -> tuple:
        """SIGKILL child ``pid``: (its lines, whether the kill or its own end came first)."""
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        seen = self.until(lambda line: line.startswith(f"reaped {pid} "))
        self.running = None
        status = int(seen[-1].split()[2])
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        if not killed and not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            raise SoakFailure(f"child {pid} failed (status {status}; its traceback is on stderr): {seen}")
        return seen, killed

    def run(self, **cmd) -> list:
        return self.finish(self.start(**cmd))

    def close(self):
        if self.running is not None:  # a soak that failed meanwhile: its child goes too
            try:
                os.kill(self.running, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=CHILD_TIMEOUT_S)
        except Exception:
            self.proc.kill()
            self.proc.wait()


# -- the oracle -------------------------------------------------------------------

class Side:
    """One repository the soak drives and the refs it must have."""

    def __init__(self, name: str, repo):
        self.name, self.repo = name, repo
        self.branches, self.tags = {}, {}  # name -> hex id
        self.head = "main"  # the branch HEAD is on
        self.alias = {}  # the soak's name of a remote ("fold", "s3") -> this repository's ("origin")

    def remote(self, name: str) -> str:
        return self.alias.get(name, name)

    @property
    def root(self) -> Path:
        return self.repo.root

    def reopen(self):
        self.repo.close()
        self.repo = mvc.Repository.open(self.root)


class Soak:
    """One seeded soak in folder ``root``: ``run()`` draws ``ops`` operations (``_ops``), checks the
    refs after each, everything every 25 (``_check_everything``) and at the end, and returns how
    often each operation ran; SoakFailure names the seed and the last operations."""

    def __init__(self, seed: int, ops: int, root, s3=None, log=None, paranoid: bool = False):
        self.seed, self.ops, self.root = seed, ops, Path(root)
        self.s3 = s3  # (url, endpoint) of a fresh S3 prefix, or None
        self.rng = random.Random(seed)
        self.log = log or (lambda line: None)
        self.paranoid = paranoid  # fsck everything after every operation (to find the one that broke it)
        self.states, self.parents = {}, {}  # hex id -> state, -> parent ids
        self.prunable = set()  # commits some gc (here or on a remote) may have pruned
        self.remote_tips = {"fold": {}, "s3": {}}  # remote -> branch -> id, as last pushed or fetched
        self.sides = {}
        self.trace = deque(maxlen=40)
        self.counts = {}
        self.kills = 0
        self.landed_kills = 0  # kills that came before the child's end
        self.took = {}  # kind of killed operation -> seconds such a child took to run to its end
        self.sid = 1000 * (seed % 1000)
        self.children = None
        self.step = 0

    # -- running -------------------------------------------------------------------

    def run(self):
        self.children = Children()
        try:
            self._setup()
            ops = self._ops()
            names, weights = zip(*[(name, w) for name, (w, _) in ops.items()])
            for self.step in range(self.ops):
                name = self.rng.choices(names, weights)[0]
                self.counts[name] = self.counts.get(name, 0) + 1
                try:
                    ops[name][1]()
                    self._check_refs()
                    if self.paranoid:
                        for side in self.sides.values():
                            self._fsck(side)
                        self._check_remotes()
                    if self.step % 25 == 24:
                        self._check_everything(sample=40)
                except SoakFailure:
                    raise
                except Exception as exc:
                    raise self.failure(f"{name}: {type(exc).__name__}: {exc}") from exc
            self._check_everything()
        finally:
            self.children.close()
            for side in self.sides.values():
                side.repo.close()
        return self.counts

    def failure(self, what: str) -> SoakFailure:
        trace = "\n  ".join(self.trace)
        return SoakFailure(f"soak seed {self.seed}, operation {self.step}: {what}\n"
                           f"reproduce: MVC_SOAK_SEED={self.seed} MVC_SOAK_OPS={self.ops} "
                           f"python -m pytest tests/test_soak.py -x\nlast operations:\n  {trace}")

    def did(self, line: str) -> None:
        self.trace.append(f"{self.step}: {line}")
        self.log(f"{self.step}: {line}")

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            raise self.failure(what)

    def _ops(self) -> dict:
        """{name: (weight, operation)}: what the soak draws from at each step."""
        return {
            "commit": (20, self.op_commit), "branch": (6, self.op_branch), "checkout": (4, self.op_checkout),
            "delete_branch": (3, self.op_delete_branch), "tag": (4, self.op_tag), "merge": (4, self.op_merge),
            "repack": (3, self.op_repack), "expire_reflog": (2, self.op_expire_reflog), "gc": (4, self.op_gc),
            "push": (8, self.op_push), "fetch": (4, self.op_fetch), "pull": (3, self.op_pull),
            "cli": (4, self.op_cli), "load": (6, self.op_load),
            "kill": (8, self.op_kill), "concurrent": (4, self.op_concurrent),
            "remote_gc": (2, self.op_remote_gc), "remote_check": (2, self.op_remote_check),
            "lazy_clone": (1, self.op_lazy_clone), "lazy_load": (4, self.op_lazy_load), "evict": (3, self.op_evict),
            "repair": (2, self.op_repair), "damage": (3, self.op_damage), "damage_remote": (2, self.op_damage_remote),
        }

    def _setup(self):
        a = Side("a", mvc.Repository.init(self.root / "a", chunk_size=SMALL_CHUNK))
        self.sides["a"] = a
        a.repo.remotes.add("fold", str(self.root / "fold"))
        if self.s3:
            a.repo.remotes.add("s3", self.s3[0], self.s3[1])
        self._commit(a, "main")
        self._push(a, "fold", "main")
        if self.s3:
            self._push(a, "s3", "main")
        b = mvc.Repository.clone(str(self.root / "fold"), self.root / "b")
        self.sides["b"] = Side("b", b)
        self.sides["b"].alias = {"fold": "origin"}
        self.sides["b"].branches = {"main": self.remote_tips["fold"]["main"]}
        self.op_lazy_clone()

    # -- oracle helpers -----------------------------------------------------------

    def new_sid(self) -> int:
        # mostly new states, sometimes an old one again (the same bytes, committed anew)
        if self.states and self.rng.random() < 0.15:
            return self.rng.choice([s["step"] for s in self.states.values() if isinstance(s.get("step"), int)])
        self.sid += 1
        return self.sid

    def record(self, cid: str, state: dict, parents: tuple) -> None:
        if cid in self.states:
            self.expect(same(self.states[cid], state) and self.parents[cid] == parents,
                        f"commit {cid} came back with other content")
        self.states[cid], self.parents[cid] = state, parents

    def ancestors(self, cid) -> set:
        seen, todo = set(), [cid]
        while todo:
            c = todo.pop()
            if c is None or c in seen:
                continue
            seen.add(c)
            todo.extend(self.parents.get(c, ()))
        return seen

    def reachable(self, side) -> set:
        out = set()
        for cid in list(side.branches.values()) + list(side.tags.values()):
            out |= self.ancestors(cid)
        return out

    def editable(self):
        """The repository an operation works in: mostly ``a``, else the full or the lazy clone."""
        return self.sides[self.rng.choice(("a", "a", "b", "lazy"))]

    def pick_commit(self, side):
        known = sorted(self.reachable(side) - self.prunable)
        return self.rng.choice(known) if known else None

    # -- operations -------------------------------------------------------------------

    def _commit(self, side, branch, sid=None):
        sid = self.new_sid() if sid is None else sid
        state = make_state(sid)
        parent = side.branches.get(branch)
        c = side.repo.commit(state, f"sid {sid}", step=sid, branch=branch)
        self.did(f"{side.name}: commit sid {sid} on {branch} -> {c.id[:12]}")
        self.expect(c.parents == ((parent,) if parent else ()), f"commit {c.id} has parents {c.parents}, not {parent}")
        self.record(c.id, state, c.parents)
        side.branches[branch] = c.id
        return c.id

    def op_commit(self):
        side = self.editable()
        branch = side.head if self.rng.random() < 0.7 else self.rng.choice(BRANCHES)
        self._commit(side, branch)

    def op_branch(self):
        side = self.editable()
        name, target = self.rng.choice(BRANCHES), self.pick_commit(side)
        if target is None:
            return
        exists = name in side.branches
        if name == side.head:
            return  # moving HEAD's branch under it is what checkout and commit do
        self.did(f"{side.name}: branch {name} {target[:12]} (force={exists})")
        side.repo.create_branch(name, target, force=exists)
        side.branches[name] = target

    def op_checkout(self):
        side = self.editable()
        if self.rng.random() < 0.3:
            name = self.rng.choice(BRANCHES)
            target = self.pick_commit(side)
            if name in side.branches or target is None:
                return
            self.did(f"{side.name}: checkout -b {name} {target[:12]}")
            side.repo.checkout(target, new_branch=name)
            side.branches[name] = target
        else:
            name = self.rng.choice(sorted(side.branches))
            self.did(f"{side.name}: checkout {name}")
            side.repo.checkout(name)
        side.head = name

    def op_delete_branch(self):
        side = self.editable()
        names = sorted(n for n in side.branches if n != side.head)
        if not names:
            return
        name = self.rng.choice(names)
        self.did(f"{side.name}: delete branch {name}")
        side.repo.delete_branch(name, force=True)
        del side.branches[name]

    def op_tag(self):
        side = self.editable()
        name = self.rng.choice(TAGS)
        if name in side.tags and self.rng.random() < 0.4:
            self.did(f"{side.name}: delete tag {name}")
            side.repo.delete_tag(name, force=True)
            del side.tags[name]
            return
        target = self.pick_commit(side)
        if target is None:
            return
        self.did(f"{side.name}: tag {name} {target[:12]}")
        side.repo.create_tag(name, target, force=name in side.tags, protect=False)
        side.tags[name] = target

    def op_merge(self):
        side = self.editable()
        mine = side.branches.get(side.head)
        others = sorted(n for n in side.branches if n != side.head)
        if mine is None or not others:
            return
        other = self.rng.choice(others)
        theirs = side.branches[other]
        a, b = self.states[mine], self.states[theirs]
        self.did(f"{side.name}: merge {side.head} {other} ({mine[:12]} + {theirs[:12]})")
        if shape_of(a) != shape_of(b):
            try:
                side.repo.merge([mine, theirs], strategy="linear", weights=[1.0, 1.0])
            except mvc.MergeMismatch:
                return
            raise self.failure("a merge of states with other keys went through")
        merged = side.repo.merge([mine, theirs], strategy="linear", weights=[1.0, 1.0])
        cid = merged.commit.id if hasattr(merged, "commit") else merged.id
        parents = self.oracle_merge_parents(mine, theirs)
        got = side.repo.get_commit(cid)
        self.expect(got.parents == parents, f"merge {cid} has parents {got.parents}, expected {parents}")
        self.record(cid, linear(a, b), got.parents)
        side.branches[side.head] = cid

    def oracle_merge_parents(self, mine, theirs):
        if mine == theirs or theirs in self.ancestors(mine):
            return (mine,)
        return (mine, theirs)

    def op_expire_reflog(self):
        """Forget the reflog: what only a deleted branch reached is then unreachable for repack too."""
        side = self.editable()
        self.did(f"{side.name}: reflog expire --all")
        side.repo.reflog.expire(older_than=0)

    def op_repack(self):
        side = self.editable()
        self.did(f"{side.name}: repack")
        side.repo.repack()

    def _retention(self, side) -> dict:
        """A retention policy for gc, or none."""
        roll = self.rng.random()
        if roll < 0.4:
            return {}
        policy = {"keep_last": self.rng.randint(1, 4)}
        if roll < 0.6 and side.head in side.branches:
            policy["branch"] = side.head
        return policy

    def op_gc(self):
        side = self.editable()
        policy = self._retention(side)
        expire = 0 if self.rng.random() < 0.5 else None
        self.did(f"{side.name}: gc {policy} expire_reflog={expire}")
        report = side.repo.gc(expire_reflog=expire, grace=0, **policy)
        self.expect(not (set(report.pruned) & {*side.branches.values(), *side.tags.values()}),
                    f"gc pruned a tip: {report.pruned}")
        self.prunable |= set(report.pruned)

    def _push(self, side, remote, branch):
        tip = side.branches[branch]
        before = self.remote_tips[remote].get(branch)
        try:
            side.repo.remotes.push(side.remote(remote), (branch,))
        except (mvc.errors.RefRejected, mvc.errors.PrunedOnRemote) as exc:
            self.did(f"{side.name}: push {remote} {branch} {tip[:12]} rejected ({type(exc).__name__})")
            self._learn(side, remote)
            theirs = self.remote_tips[remote].get(branch)
            self.expect(isinstance(exc, mvc.errors.PrunedOnRemote) or
                        (theirs is not None and theirs not in self.ancestors(tip)),
                        f"push of {branch} at {tip} was rejected though {remote} has it at {theirs}: {exc}")
            return False
        self.did(f"{side.name}: push {remote} {branch} {tip[:12]}")
        self.expect(before is None or before in self.ancestors(tip) or tip in self.ancestors(before),
                    f"push moved {remote}/{branch} from {before} to {tip}, not a fast-forward")
        if before is None or before in self.ancestors(tip):
            self.remote_tips[remote][branch] = tip
        return True

    def remotes_of(self, side):
        if side.name == "a":
            return ["fold"] + (["s3"] if self.s3 else [])
        return ["fold"] if side.name == "b" else [self.lazy_remote()]

    def lazy_remote(self):
        return "s3" if self.s3 else "fold"

    def op_push(self):
        side = self.editable()
        remote = self.rng.choice(self.remotes_of(side))
        branch = self.rng.choice(sorted(side.branches))
        self._push(side, remote, branch)
        self._learn(side, remote)

    def _learn(self, side, remote):
        """Fetch from ``remote`` into ``side`` and check its tracking refs against the oracle."""
        report = side.repo.remotes.fetch(side.remote(remote))
        tracking = self._tracking(side, remote)
        for branch, cid in tracking.items():
            known = self.remote_tips[remote].get(branch)
            self.expect(cid in self.states, f"{remote}/{branch} is at {cid}, a commit the soak never made")
            self.expect(known is None or known == cid or known in self.ancestors(cid),
                        f"{remote}/{branch} went back from {known} to {cid}")
            self.remote_tips[remote][branch] = cid
        return report

    def op_fetch(self):
        side = self.editable()
        remote = self.rng.choice(self.remotes_of(side))
        self.did(f"{side.name}: fetch {remote}")
        self._learn(side, remote)

    def op_pull(self):
        side = self.editable()
        remote = self.rng.choice(self.remotes_of(side))
        branch = side.head
        mine = side.branches.get(branch)
        self.did(f"{side.name}: pull {remote} {branch}")
        try:
            report = side.repo.remotes.pull(side.remote(remote), branch)
        except mvc.errors.Diverged:
            theirs = self.remote_tips[remote].get(branch)
            self.expect(mine is not None and theirs is not None and mine not in self.ancestors(theirs)
                        and theirs not in self.ancestors(mine), "pull said diverged")
            return
        except mvc.BadInput:
            self.expect(branch not in self._tracking(side, remote), "pull refused a branch the remote has")
            return
        self._learn(side, remote)
        theirs = self.remote_tips[remote].get(branch)
        if report.status == "fast-forward":
            self.expect(mine is None or mine in self.ancestors(theirs), "pull fast-forwarded across history")
            side.branches[branch] = theirs
        self.expect(side.repo.resolve(branch) == side.branches[branch], f"pull left {branch} elsewhere")

    def _tracking(self, side, remote) -> dict:
        prefix = side.remote(remote) + "/"
        return {r.name[len(prefix):]: r.id for r in side.repo.remotes.branches() if r.name.startswith(prefix)}

    def op_cli(self):
        """Ref moves and reads through the CLI (click's runner, in this process)."""
        side = self.editable()
        roll = self.rng.random()
        if roll < 0.4:
            name, target = self.rng.choice(TAGS), self.pick_commit(side)
            if target is None:
                return
            args = ["tag", name, target] + (["--force"] if name in side.tags else [])
            self._cli(side, args)
            side.tags[name] = target
        elif roll < 0.5:
            names = sorted(side.branches)
            old, new = self.rng.choice(names), self.rng.choice(BRANCHES)
            if old == new:
                return
            self._cli(side, ["branch", "-m", old, new] + (["--force"] if new in side.branches else []))
            side.branches[new] = side.branches.pop(old)
            if side.head == old:
                side.head = new
        elif roll < 0.6:
            keep = self.rng.randint(1, 4)
            out = self._cli(side, ["gc", "--keep-last", keep, "--grace", 0, "--json"])
            pruned = set(json.loads(out)["pruned"])
            self.expect(not (pruned & {*side.branches.values(), *side.tags.values()}), f"gc pruned a tip: {pruned}")
            self.prunable |= pruned
        elif roll < 0.7:
            out = self._cli(side, ["log", "--json"])
            self.expect(side.branches.get(side.head, "") in out, "mvc log --json does not show HEAD's tip")
        else:
            self._cli(side, ["fsck"])

    def _cli(self, side, args) -> str:
        from click.testing import CliRunner
        from mvc.cli import main
        args = [str(a) for a in args]
        self.did(f"{side.name}: mvc {' '.join(args)}")
        result = CliRunner().invoke(main, ["-C", str(side.root), *args])
        self.expect(result.exit_code == 0 and result.exception is None or isinstance(result.exception, SystemExit),
                    f"mvc {' '.join(args)} exited {result.exit_code}: {result.output}{result.stderr}")
        return result.output

    def op_load(self):
        side = self.editable()
        target = self.pick_commit(side)
        if target is not None:
            self._load(side, target, must=True)

    def _load(self, side, cid, must: bool):
        """Load ``cid`` in ``side``: the committed state bit for bit, or (unless ``must``) an error
        that says it is gone or damaged."""
        try:
            got = side.repo.load(cid)
        except mvc.CommitPruned:
            self.expect(cid in self.prunable, f"{side.name}: {cid} says pruned, and no gc pruned it")
            return
        except (mvc.ObjectNotFound, mvc.UnknownRevision, mvc.CorruptObject) as exc:
            # a commit nothing reaches may be gone, or hold a chunk a flipped bit damaged (fsck
            # rightly says nothing of it): an error, never other bytes
            self.expect(not must, f"{side.name}: {cid} does not load: {type(exc).__name__}: {exc}")
            return
        self.expect(same(got, self.states[cid]), f"{side.name}: {cid} loads other bytes than were committed")

    def op_remote_gc(self):
        remote = self.rng.choice(["fold"] + (["s3"] if self.s3 else []))
        side = self.sides["a"]
        # Retention only on the folder remote: the lazy clone and the evicting cache read S3, and a
        # remote's retention pruning what a cache's own refs need is a policy, not a fault.
        policy = {"keep_last": self.rng.randint(1, 3)} if remote == "fold" and self.rng.random() < 0.5 else {}
        self.did(f"a: gc --remote {remote} {policy}")
        try:
            report = side.repo.remotes.gc(remote, grace=0, **policy)
        except mvc.errors.RemoteBusy:
            return
        self.prunable |= set(report.pruned)

    def op_remote_check(self):
        remote = self.rng.choice(["fold"] + (["s3"] if self.s3 else []))
        self.did(f"a: fsck --remote {remote}")
        report = self.sides["a"].repo.remotes.fsck(remote)
        self.expect(report.ok, f"fsck --remote {remote}: {report}")

    def op_lazy_clone(self):
        remote = self.lazy_remote()
        url, endpoint = (self.s3 if remote == "s3" else (str(self.root / "fold"), None))
        old = self.sides.pop("lazy", None)
        if old is not None:
            old.repo.close()
        path = self.root / f"lazy{self.step}"
        self.did(f"clone --lazy {remote} -> {path.name}")
        repo = mvc.Repository.clone(url, path, lazy=True, endpoint_url=endpoint)
        side = Side("lazy", repo)
        side.alias = {remote: "origin"}
        side.head = repo.head().branch
        side.branches = {side.head: repo.resolve(f"origin/{side.head}")}
        self.sides["lazy"] = side
        tracking = {r.name.split("/", 1)[1]: r.id for r in repo.remotes.branches()}
        for branch, cid in tracking.items():
            self.expect(cid in self.states, f"the lazy clone's {branch} is at {cid}, a commit the soak never made")

    def op_lazy_load(self):
        side = self.sides["lazy"]
        if self.rng.random() < 0.3:
            self.did("lazy: fetch")
            side.repo.remotes.fetch()
        tracking = [r.id for r in side.repo.remotes.branches()]
        known = sorted((set().union(*(self.ancestors(c) for c in tracking)) if tracking else set())
                       | self.reachable(side))
        if not known:
            return
        cid = self.rng.choice(known)
        self.did(f"lazy: load {cid[:12]}")
        self._load(side, cid, must=cid not in self.prunable)

    def op_evict(self):
        side = self.sides["lazy"] if self.rng.random() < 0.6 else self.sides["a"]
        if side.name == "a" and self.s3 is None:
            return
        if side.name == "a" and self.rng.random() < 0.8:
            return  # the main repository keeps its data local most of the time
        if side.name == "a" and side.repo.cache.remote() is None:
            self.did("a: config cache.remote s3")
            side.repo.config("cache.remote", "s3")
            side.reopen()
        self.did(f"{side.name}: evict 0")
        side.repo.cache.evict(0)

    def op_repair(self):
        side = self.sides[self.rng.choice(("a", "lazy"))]
        self.did(f"{side.name}: repair")
        side.repo.cache.repair()

    # -- damage ---------------------------------------------------------------------------

    def _flip(self, folder: Path):
        """Flip one bit of a random byte of a random pack in ``folder``: (file, offset) or None."""
        files = sorted(p for p in folder.glob("*.pack") if p.stat().st_size > 0)
        if not files:
            return None
        path = self.rng.choice(files)
        offset = self.rng.randrange(path.stat().st_size)
        flip_bit(path, offset)
        return path, offset

    def op_damage(self):
        """A flipped bit in a local pack: fsck finds it or it harms nothing; what a remote holds
        is repaired from there, bit for bit; a lost copy is put back as it was."""
        side = self.sides[self.rng.choice(("a", "b", "lazy"))]
        hit = self._flip(side.root / ".mvc" / "packs")
        if hit is None:
            return
        path, offset = hit
        self.did(f"{side.name}: flip a bit of {path.name} at {offset}")
        report = side.repo.fsck()
        if report.ok:
            self.did("   fsck finds nothing (loads will tell whether that was right)")
            return
        if report.lost:
            self.did(f"   lost (no remote copy): {[(d.kind, d.object) for d in report.lost]}; flipped back")
            flip_bit(path, offset)
            self._fsck(side)
            return
        self.did(f"{side.name}: fsck --repair ({[(d.kind, d.object, d.remotes) for d in report.damage]})")
        repaired = side.repo.cache.repair()
        if repaired.unrepaired:
            # the remote's last listing held a copy, but the remote no longer has it (its retention
            # pruned it since): the repair must then say the damage is lost, and it is put back
            self.did(f"   unrepaired: {len(repaired.unrepaired)}; lost: {len(repaired.after.lost)}")
            self.expect(repaired.after.lost and len(repaired.after.lost) == len(repaired.after.damage),
                        f"{side.name}: repair left {repaired.unrepaired}, and fsck after it says they are "
                        f"not lost: {repaired.after.damage}")
            flip_bit(path, offset)
            self._fsck(side)
            return
        self.expect(repaired.after.ok, f"{side.name}: repair said done, fsck after: {repaired.after.damage}")

    def op_damage_remote(self):
        """A flipped bit in a pack of a remote: a repair from a clone that holds the data heals it
        (and says so only when it did); otherwise every pack is put back as it was."""
        remote = self.rng.choice(["fold"] + (["s3"] if self.s3 else []))
        files = RemoteFiles(*(self.s3 if remote == "s3" else (str(self.root / "fold"), None)))
        keys = files.packs(self.rng.choice(("packs", "objects")))
        if not keys:
            return
        original = {key: files.read(key) for key in keys}
        key = self.rng.choice(keys)
        offset = self.rng.randrange(len(original[key]))
        data = bytearray(original[key])
        data[offset] ^= 0x10
        files.write(key, bytes(data))
        self.did(f"{remote}: flip a bit of {key} at {offset}")
        a = self.sides["a"]
        after = a.repo.remotes.fsck(remote)
        if after.ok:
            self.did("   fsck --remote finds nothing (fetches and clones will tell whether that was right)")
            return
        for side in (a, self.sides["b"] if remote == "fold" else self.sides["lazy"]):
            self.did(f"{side.name}: remote repair {remote}")
            try:
                repaired = side.repo.remotes.repair(side.remote(remote))
            except mvc.errors.RemoteBusy:
                continue
            after = a.repo.remotes.fsck(remote)
            self.did(f"   repair ok={repaired.ok} unrepaired={len(repaired.unrepaired)}, "
                     f"removed {len(repaired.packs_removed)}, fsck --remote ok={after.ok}")
            self.expect(after.ok or not repaired.ok,
                        f"{side.name}: remote repair said ok, but fsck --remote finds {after.problems}")
            if after.ok:
                break
        if not after.ok:
            for key, data in original.items():  # every pack of the folder as it was before the flip
                files.write(key, data)
            after = a.repo.remotes.fsck(remote)
            self.expect(after.ok, f"{remote} is still damaged after its packs were put back: {after.problems}")

    # -- kills ---------------------------------------------------------------------------

    def op_kill(self):
        side = self.sides["a"]
        kind = self.rng.choice(("commit", "commit", "commit", "gc", "repack", "push", "fetch"))
        if kind == "commit":
            self._kill_commit(side, self.rng.choice([side.head] + list(BRANCHES)))
        elif kind == "gc":
            keep_last = self.rng.randint(1, 4)
            would = set(side.repo.gc(keep_last=keep_last, dry_run=True).pruned)
            self.did(f"a: kill gc keep_last={keep_last} (may prune {len(would)})")
            self._kill("gc", root=str(side.root), keep_last=keep_last)
            self.prunable |= would
        elif kind == "repack":
            self.did(f"a: kill repack")
            self._kill("repack", root=str(side.root))
        elif kind == "push":
            remote = self.rng.choice(self.remotes_of(side))
            branch = self.rng.choice(sorted(side.branches))
            tip, before = side.branches[branch], self.remote_tips[remote].get(branch)
            self.did(f"a: kill push {remote} {branch} {tip[:12]}")
            self._kill("push", root=str(side.root), remote=remote, branch=branch)
            self._learn(side, remote)
            after = self.remote_tips[remote].get(branch)
            self.expect(after in (before, tip) or (before is not None and tip in self.ancestors(before)),
                        f"a killed push of {branch} left {remote}/{branch} at {after}, neither {before} nor {tip}")
        else:
            remote = self.rng.choice(self.remotes_of(side))
            self.did(f"a: kill fetch {remote}")
            self._kill("fetch", root=str(side.root), remote=remote)
            self._learn(side, remote)
        self.kills += 1
        self._fsck(side, after_kill=True)

    def _kill_commit(self, side, branch, during=None):
        """Commit a new state to ``branch`` in a child, SIGKILLed at a random moment (while this
        process runs ``during``, if given): ``branch`` stays where it was or gains that commit."""
        sid = self.new_sid()
        before = side.branches.get(branch)
        self.did(f"a: kill commit sid {sid} on {branch}")
        lines, killed = self._kill("commit", during, root=str(side.root), branch=branch, sid=sid)
        landed = [line.split()[1] for line in lines if line.startswith("landed ")]
        now = self._converge(side, branch, before)
        if now != before:
            self.expect(now is not None and self.parents.get(now) is None, f"{branch} moved to {now}")
            got = side.repo.get_commit(now)
            self.expect(got.parents == ((before,) if before else ()),
                        f"the killed commit on {branch} has parents {got.parents}, not {before}")
            self.record(now, make_state(sid), got.parents)
            side.branches[branch] = now
        self.expect(not landed or landed[0] == now, f"the commit landed ({landed}) but {branch} is at {now}")

    def op_concurrent(self):
        """A commit in a child that is SIGKILLed at a random moment while this process, on the
        same repository, runs gc (with its grace: a writer's unindexed pack is young), repack,
        a push, a load or a commit to another branch."""
        side = self.sides["a"]
        branch = self.rng.choice(BRANCHES)
        others = sorted(b for b in side.branches if b != branch)
        kind = self.rng.choice(("gc", "repack", "push", "load", "commit"))
        if kind in ("push", "commit") and not others:
            return
        other = self.rng.choice(others) if others else None

        def during():
            self.did(f"   meanwhile a: {kind} {other or ''}")
            if kind == "gc":
                side.repo.gc()
            elif kind == "repack":
                side.repo.repack()
            elif kind == "push":
                self._push(side, self.rng.choice(self.remotes_of(side)), other)
            elif kind == "load":
                target = self.pick_commit(side)
                if target is not None:
                    self._load(side, target, must=True)
            else:
                self._commit(side, other)
        self._kill_commit(side, branch, during)
        self.kills += 1
        self._fsck(side, after_kill=True)

    def _kill(self, kind, during=None, **cmd):
        """Run ``kind`` in a child and SIGKILL it at a uniform moment of the time such children
        took when they ran to their end (learnt as the soak goes), or a little after."""
        window = self.took.get(kind, KILL_WINDOW_S[kind])
        delay = self.rng.uniform(0, 1.2 * window)
        started = time.monotonic()
        pid = self.children.start(op=kind, **cmd)
        if during is not None:
            during()
        time.sleep(max(0.0, delay - (time.monotonic() - started)))
        lines, killed = self.children.kill(pid)
        self.landed_kills += killed
        if not killed:  # it ran to its end: how long that takes, for the next window
            self.took[kind] = 0.5 * window + 0.5 * (time.monotonic() - started)
        self.did(f"   of {window:.3f}")
        errors = [line for line in lines if line.startswith("error ")]
        acceptable = ("RefRejected", "PrunedOnRemote", "LockHeld", "GcLockBusy", "RemoteBusy")
        self.expect(all(e.split()[1] in acceptable for e in errors), f"the child's operation failed: {errors}")
        self.did(f"   {'killed' if killed else 'finished'}: {[line for line in lines if not line.startswith('pid')]}")
        return lines, killed

    def _converge(self, side, branch, before):
        """Where ``branch`` is after a kill, as a process that never had the repository open sees it.

        Both must agree (issue 39 item 3: a SIGKILLed commit was invisible to a process that had the
        repository open, and visible to a new one)."""
        lines = self.children.run(op="tip", root=str(side.root), rev=f"heads/{branch}")
        fresh = [line.split()[1] for line in lines if line.startswith("tip ")]
        self.expect(len(fresh) == 1, f"a new process cannot read {branch} after the kill: {lines}")
        fresh = fresh[0]
        fresh = None if fresh == "-" else fresh
        try:
            mine = side.repo.resolve(f"heads/{branch}")
        except mvc.UnknownRevision:
            mine = None
        self.expect(mine == fresh, f"issue 39 item 3: after a killed commit, {branch} is at {mine} in the open "
                    f"repository and at {fresh} in a new process")
        return fresh

    # -- checks ------------------------------------------------------------------------------

    def _check_refs(self):
        for side in self.sides.values():
            branches = {r.name: r.id for r in side.repo.branches()}
            tags = {r.name: r.id for r in side.repo.tags()}
            self.expect(branches == side.branches, f"{side.name}: branches {branches}, expected {side.branches}")
            self.expect(tags == side.tags, f"{side.name}: tags {tags}, expected {side.tags}")
            self.expect(side.repo.head().branch == side.head, f"{side.name}: HEAD on {side.repo.head().branch}")

    def _fsck(self, side, after_kill=False):
        report = side.repo.fsck()
        self.expect(report.ok, f"{side.name}: fsck{' after a kill' if after_kill else ''} found damage: "
                               f"{[(d.kind, d.object, d.detail, d.refs) for d in report.damage]}")

    def _check_everything(self, sample=None):
        """Commits the oracle knows, in every repository: the committed state bit for bit if its
        refs reach it and no gc could have pruned it; else that or an error, never other bytes.
        ``sample``: load at most that many commits a repository (and every ref's tip), else all."""
        self.did("check everything")
        for side in self.sides.values():
            self._fsck(side)
            reach = self.reachable(side)
            ids = sorted(self.states)
            if sample is not None and len(ids) > sample:
                tips = {*side.branches.values(), *side.tags.values()}
                ids = sorted(tips | set(self.rng.sample(ids, sample)))
            for cid in ids:
                self._load(side, cid, must=cid in reach and cid not in self.prunable)
        self._check_remotes()

    def _check_remotes(self):
        for remote in ["fold"] + (["s3"] if self.s3 else []):
            report = self.sides["a"].repo.remotes.fsck(remote)
            self.expect(report.ok, f"fsck --remote {remote}: {report}")
