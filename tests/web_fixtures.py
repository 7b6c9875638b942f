"""A repository made by a short training run, and a served view of it, for the web tests.

``training_repo`` trains a tiny layered model with the Checkpointer on
main, forks branch ``exp`` with another learning rate, tags a release,
adds a commit whose names are hostile (script tags, quotes, ``../``),
starts a bisect, pushes everything to a folder remote and makes a lazy
clone of it.
"""

import contextlib
import threading
import urllib.error
import urllib.request

import pytest
import torch

import mvc
from mvc.web import Server, View
from mvc_hooks import Checkpointer

HOSTILE = '<script>window.__xss=1</script>"\'../x'
HOSTILE_BRANCH = '<script>window.__xss=2</script>"\''  # ref names may hold no space and no '..'
HOSTILE_TAG = "'><img/src=x/onerror=window.__xss=3>"
HOSTILE_KEY = "../../<b>evil</b>\"'.weight"


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(4, 8)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
        self.head = torch.nn.Linear(8, 2)
        self.layers[0].requires_grad_(False)  # a frozen layer: its chunks stay shared

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def _train(path, branch, lr, steps, seed):
    torch.manual_seed(seed)
    model = Net()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    data = torch.randn(32, 4), torch.randint(0, 2, (32,))
    with Checkpointer(path, model=model, optimizer=opt, branch=branch, every_n_steps=2, chunk_size=64,
                      async_save=False, context={"run": {"lr": lr, "note": HOSTILE}}) as ckpt:
        start = ckpt.resume() if branch else 0
        for step in range(start, start + steps):
            loss = torch.nn.functional.cross_entropy(model(data[0]), data[1])
            opt.zero_grad()
            loss.backward()
            opt.step()
            ckpt.step(step, loss=loss.item(), metrics={"acc": 0.5 + step / 40})
        return ckpt.repo.root


def training_repo(root):
    """(path of the trained repository, path of its lazy clone)."""
    path = root / "run"
    _train(path, None, 0.1, 8, 0)
    with mvc.Repository.open(path) as repo:
        repo.create_tag("v1", "main~1")
        repo.create_branch("exp", "main~2")
    _train(path, "exp", 0.5, 5, 1)
    with mvc.Repository.open(path) as repo:
        repo.checkout("main")
        state = repo.load("main")
        state[HOSTILE_KEY] = torch.arange(16, dtype=torch.float32)
        repo.commit(state, HOSTILE, step=100, metrics={"loss": 0.1, HOSTILE: 1.0},
                    context={"run": {"lr": 0.1, "note": HOSTILE}, HOSTILE: HOSTILE}, branch=HOSTILE_BRANCH,
                    start="main")
        repo.create_tag(HOSTILE_TAG, HOSTILE_BRANCH)
        repo.bisect.start("main", "main~3")
        repo.remotes.add("origin", str(root / "remote"))
        repo.remotes.push(refs=("main", "exp"))  # remote ref names are plainer: the hostile branch stays here
    lazy = mvc.Repository.clone(str(root / "remote"), root / "lazy", lazy=True)
    lazy.close()
    return path, root / "lazy"


@pytest.fixture(scope="session")
def made(tmp_path_factory):
    """The trained repository and its lazy clone, shared by the web test modules."""
    return training_repo(tmp_path_factory.mktemp("web"))


@contextlib.contextmanager
def served(path, host="127.0.0.1", token=None, **options):
    """A Server on ``path`` in a thread (``options``: more of Server's arguments); yields it
    (``.url`` is its address)."""
    repo = mvc.Repository.open(path)
    server = Server(View(repo), host, 0, token=token, quiet=True, **options)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
        repo.close()


def fetch(address, method="GET", headers=None):
    """(status, headers, body) of one request."""
    request = urllib.request.Request(address, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()
