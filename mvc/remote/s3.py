"""An S3 bucket (AWS S3 or any S3-compatible store) through boto3.

This is the only module that imports boto3. Why boto3: it reads the
standard AWS configuration chain (``AWS_*`` environment variables,
``~/.aws/config`` and ``credentials`` profiles, instance roles) exactly as
every other AWS tool does, speaks to any S3-compatible endpoint, and
retries throttling, 5xx answers and dropped connections with backoff
(botocore's "standard" retry mode).

Large objects go up in parts, several at once (multipart upload); bodies
are sent with a CRC32 checksum the server verifies and without a SHA-256
payload signature (the signature's hash pass costs more than the upload on
loopback, and every byte is BLAKE3-verified on the way back anyway).
"""

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, IncompleteReadError, NoCredentialsError

from ..errors import (BadInput, NotFound, PreconditionFailed, RemoteCorrupt, RemoteError, RemoteUnreachable,
                      UntrustedAnswer)
from .backend import Bucket, check_key, notify, scatter

PART_BYTES = 16 << 20  # multipart part size
# Objects up to this size go up in one PUT, so a pack (``layout.PACK_BYTES``
# of records plus its trailer) is one request instead of five (create, three
# parts, complete). Measured here, 1 GiB first pushes to SeaweedFS, rounds
# interleaved: single PUTs were faster when the local packs were in the page
# cache (6 of 6 rounds, 8.79 s against 9.54 s on average) and the same right
# after the commit that wrote them (3 rounds, 9.73 s against 9.65 s). Larger
# objects (a bigger pack-size knob) go up in parts.
SINGLE_PUT_BYTES = 48 << 20
PART_THREADS = 4
# Retries are mvc's own, not botocore's, so each one can be shown ("waiting for
# server, retry 2/5") and all of them fit a deadline: a server that stopped
# answering fails a command in under a minute, not after botocore's default
# 60 s read timeout times its attempts (425 s were seen).
ATTEMPTS = 5  # tries of one request, the first included (MVC_REMOTE_ATTEMPTS)
DEADLINE_S = 35.0  # no retry starts later than this after the first try (MVC_REMOTE_TIMEOUT)
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 15.0  # silence on an open connection before a try counts as failed
# so a command gives up within DEADLINE_S + CONNECT_TIMEOUT_S + READ_TIMEOUT_S = 55 s: the deadline is
# the command's (S3Bucket._call), a push whose server was SIGSTOPped mid-transfer failed after 51 s
TRANSIENT = {"RequestTimeout", "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable", "SlowDown",
             "Throttling", "ThrottlingException", "RequestLimitExceeded", "500", "502", "503", "504"}


def _setting(name: str, default, kind, low, high):
    """A number from the environment; BadInput (one line) when it is not one in [low, high]."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise BadInput(f"{name}={raw!r} is not valid: give a number from {low} to {high}")
    return value


# One boto3 session per process (and per AWS configuration in the environment):
# a new session loads botocore's service models again, 80-170 ms per bucket
# opened here, where a client from a loaded session takes about 10 ms.
# Creating clients from one session is not thread-safe, hence the lock.
_SESSIONS: dict = {}
_SESSIONS_LOCK = threading.Lock()


def _client(endpoint_url: Optional[str], config: Config):
    key = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    with _SESSIONS_LOCK:
        session = _SESSIONS.get(key)
        if session is None:
            session = _SESSIONS[key] = boto3.session.Session()
        return session.client("s3", endpoint_url=endpoint_url or None, config=config)


def _content_range(answer: dict) -> Optional[tuple]:
    """(first, last, total or None) of a ranged answer's Content-Range, or None if it has none."""
    text = answer.get("ContentRange") or ""
    unit, _, rest = text.partition(" ")
    span, _, total = rest.partition("/")
    first, _, last = span.partition("-")
    if unit != "bytes" or not first.isdigit() or not last.isdigit():
        return None
    return int(first), int(last), int(total) if total.isdigit() else None


def _join(prefix: str, key: str) -> str:
    return f"{prefix}/{key}" if prefix else key


class S3Bucket(Bucket):
    def __init__(self, bucket: str, prefix: str = "", endpoint_url: Optional[str] = None):
        self.bucket, self.prefix, self.endpoint = bucket, prefix, endpoint_url
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self.attempts = _setting("MVC_REMOTE_ATTEMPTS", ATTEMPTS, int, 1, 20)
        self.deadline = _setting("MVC_REMOTE_TIMEOUT", DEADLINE_S, float, 1, 3600)
        self._down_since: Optional[float] = None  # monotonic time the server stopped answering (see _call)
        self.away = False  # this command gave up on the server: its deadline or tries are spent
        self._probed = 0.0  # when a request last tried while away
        self._trouble = threading.Lock()
        self.suffix_ranges = True  # until the server answers one wrongly (s3rver gives the first N bytes)
        config = Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=CONNECT_TIMEOUT_S,
                        read_timeout=READ_TIMEOUT_S, max_pool_connections=32,
                        s3={"payload_signing_enabled": False})
        try:
            self.client = _client(endpoint_url, config)
        except (BotoCoreError, ValueError) as exc:
            raise RemoteError(f"cannot set up S3 for {self.url}: {exc}") from None

    # -- errors ---------------------------------------------------------------

    def _call(self, key: str, fn, **kwargs):
        """``fn(Bucket=..., **kwargs)``, tried again on transient failures (shown through
        ``backend.notify``) until ``attempts`` tries or the deadline; RemoteError after.

        The deadline is the command's, not the request's: it runs from the first failure since
        the server last answered, whichever request met it, so a command whose server stopped
        mid-transfer fails within one deadline (a pack upload, then the lease's removal, then
        anything else each waited their own before). Once the command gave up (its deadline or tries
        spent: ``away``), requests fail at once (``_check_away``) until the server answers again."""
        self._check_away()
        for attempt in range(1, self.attempts + 1):
            body = kwargs.get("Body")
            if hasattr(body, "seek"):
                body.seek(0)  # a try that failed may have read part of it
            tried = time.monotonic()
            try:
                answer = fn(Bucket=self.bucket, **kwargs)
                self._down_since, self.away = None, False
                return answer
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
                if code not in TRANSIENT and status not in TRANSIENT:
                    self._down_since, self.away = None, False  # it answered
                    raise self._error(key, exc) from None
                why, last = f"{code or status} from the server", self._error(key, exc)
            except NoCredentialsError:
                raise RemoteError(f"no AWS credentials for {self.url}: set AWS_ACCESS_KEY_ID and "
                                  "AWS_SECRET_ACCESS_KEY, or a profile (AWS_PROFILE, ~/.aws/credentials)") from None
            except (BotoCoreError, OSError) as exc:  # connection refused or reset, timeouts, a body cut short
                why = f"{type(exc).__name__}"
                last = RemoteUnreachable(f"cannot reach {self.endpoint or 'S3'} for {self.url} after {attempt} "
                                         f"tries ({exc}); nothing that was not finished counts: run the command "
                                         "again when it is back", url=self.url, attempts=attempt)
            delay = min(8.0, 0.5 * 2 ** (attempt - 1)) * random.uniform(0.8, 1.2)
            with self._trouble:  # one budget for every request of the command, in every thread
                self._down_since = tried if self._down_since is None else min(self._down_since, tried)
                late = time.monotonic() - self._down_since + delay > self.deadline
                if attempt == self.attempts or self.away or late:
                    self.away, self._probed = True, time.monotonic()
                    raise last
            notify(f"waiting for server {self.endpoint or 'S3'} ({why}), retry {attempt + 1}/{self.attempts}")
            time.sleep(delay)
        raise AssertionError("unreachable")

    def _check_away(self) -> None:
        """RemoteUnreachable at once while this command has given up on the server (``away``): work
        queued behind the request that gave up must not wait its own timeouts. Once a deadline
        later, one request may try again (a bucket that lives long, in a lazy clone, recovers)."""
        with self._trouble:
            if not self.away:
                return
            now = time.monotonic()
            if now - self._probed >= self.deadline:
                self._probed = now  # this request is the one try
                return
        raise RemoteUnreachable(f"{self.endpoint or 'S3'} stopped answering for {self.url} earlier in this command; "
                                "nothing that was not finished counts: run the command again when it is back",
                                url=self.url, attempts=0)

    def _error(self, key: str, exc: ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("NoSuchKey", "404", "NotFound") or (status == 404 and code != "NoSuchBucket"):
            return NotFound(f"{key} is missing from remote {self.url}", key=key)
        if code == "PreconditionFailed" or status == 412:
            return PreconditionFailed(f"{key} on remote {self.url} changed meanwhile", key=key)
        if code == "InvalidRange" or status == 416:  # a ranged read past the end: the object is short
            return RemoteCorrupt(f"{key} on remote {self.url} is shorter than the bytes asked for ({code or status}): "
                                 "it was cut short or emptied", key=key)
        if code == "NoSuchBucket":
            return RemoteError(f"bucket {self.bucket!r} does not exist at {self.endpoint or 'S3'}; create it first")
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403") or status == 403:
            return RemoteError(f"access to {self.url} denied ({code}); check the credentials and the bucket's policy")
        return RemoteError(f"remote {self.url} failed on {key}: {code or status}: "
                           f"{exc.response.get('Error', {}).get('Message', '')}")

    # -- reads ----------------------------------------------------------------

    def _get(self, key: str, byte_range: Optional[str] = None) -> dict:
        kwargs = {"Key": _join(self.prefix, check_key(key))}
        if byte_range:
            kwargs["Range"] = byte_range

        def get_whole(**kw):  # the body is read inside the retried call: a cut-off read is tried again
            answer = self.client.get_object(**kw)
            answer["data"] = answer["Body"].read()
            return answer
        return self._call(key, get_whole, **kwargs)

    def get(self, key: str) -> bytes:
        answer = self._get(key)
        if len(answer["data"]) != answer.get("ContentLength", len(answer["data"])):
            raise UntrustedAnswer(f"{key} on remote {self.url}: the server sent {len(answer['data'])} bytes of "
                                  f"{answer['ContentLength']}", url=self.url, key=key)
        return answer["data"]

    def get_range(self, key: str, start: int, stop: int) -> bytes:
        if stop <= start:
            return b""
        return self._ranged(key, start, stop, self._get(key, f"bytes={start}-{stop - 1}"))

    def get_range_into(self, key: str, start: int, stop: int, sinks: list) -> None:
        if stop <= start:
            return

        def get_into(**kw):  # inside the retried call: a cut-off body is read again from its start
            answer = self.client.get_object(**kw)
            got = _content_range(answer)
            if got is None or got[:2] != (start, stop - 1) or answer.get("ContentLength") != stop - start:
                answer["data"] = answer["Body"].read()  # not the range asked for: judged as get_range does
                return answer
            body = answer["Body"]
            for sink in sinks:
                done = 0
                while done < len(sink):
                    n = body.readinto(sink[done:])
                    if not n:
                        raise IncompleteReadError(actual_bytes=done, expected_bytes=len(sink))
                    done += n
            body.read()  # nothing left: lets the connection go back to the pool, checks the length
            answer["data"] = None
            return answer
        answer = self._call(key, get_into, Key=_join(self.prefix, check_key(key)), Range=f"bytes={start}-{stop - 1}")
        if answer["data"] is not None:
            scatter(self._ranged(key, start, stop, answer), sinks)

    def _ranged(self, key: str, start: int, stop: int, answer: dict) -> bytes:
        """Bytes [start, stop) from the answer to a ranged GET, once its Content-Range and length say so."""
        got = _content_range(answer)
        data = answer["data"]
        if got is None and answer["ResponseMetadata"].get("HTTPStatusCode") == 200 and len(data) >= stop:
            data = data[start:stop]  # a server that ignores Range sends the whole object: take the part asked for
        elif got is None or got[:2] != (start, stop - 1) or len(data) != stop - start:
            if got is not None and got[2] is not None and stop > got[2]:
                raise RemoteCorrupt(f"{key} on remote {self.url} is shorter than expected (asked for bytes "
                                    f"{start}-{stop - 1} of {got[2]}): it was cut short", key=key)
            raise UntrustedAnswer(f"{key} on remote {self.url}: asked for bytes {start}-{stop - 1}, the server "
                                  f"answered {answer.get('ContentRange') or 'no Content-Range'} with "
                                  f"{len(data)} bytes; nothing was used", url=self.url, key=key)
        return data

    def get_tail(self, key: str, n: int) -> tuple:
        if self.suffix_ranges:
            try:
                answer = self._get(key, f"bytes=-{n}")
            except RemoteCorrupt:  # InvalidRange: an empty object has no last bytes to give
                return self._tail_by_size(key, n)
            got, data = _content_range(answer), answer["data"]
            if got is not None and got[2] is not None and got[1] == got[2] - 1 \
                    and got[0] == max(0, got[2] - n) and len(data) == got[1] - got[0] + 1:
                return data, got[2]
            if got is None and answer["ResponseMetadata"].get("HTTPStatusCode") == 200 \
                    and len(data) == answer.get("ContentLength", -1):
                return data[-n:], len(data)  # Range ignored: the whole object came
            # the server mishandles suffix ranges (s3rver answers with the first n bytes):
            # from now on ask for explicit ranges, after learning the size
            self.suffix_ranges = False
        return self._tail_by_size(key, n)

    def _tail_by_size(self, key: str, n: int) -> tuple:
        size = self._call(key, self.client.head_object, Key=_join(self.prefix, check_key(key)))["ContentLength"]
        start = max(0, size - n)
        return (self.get_range(key, start, size) if size else b""), size

    def get_versioned(self, key: str) -> Optional[tuple]:
        try:
            answer = self._get(key)
        except NotFound:
            return None
        return answer["data"], answer["ETag"]

    # -- writes ---------------------------------------------------------------

    def put(self, key: str, data, if_match: Optional[str] = None, if_absent: bool = False) -> str:
        view = memoryview(data).cast("B")
        if len(view) > SINGLE_PUT_BYTES and if_match is None and not if_absent:
            return self._multipart(key, view)
        kwargs = {"Key": _join(self.prefix, check_key(key)), "Body": bytes(view) if len(view) < (1 << 20) else _Body(view)}
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        if if_absent:
            kwargs["IfNoneMatch"] = "*"
        return self._call(key, self.client.put_object, **kwargs)["ETag"]

    def _multipart(self, key: str, view: memoryview) -> str:
        full = _join(self.prefix, check_key(key))
        upload = self._call(key, self.client.create_multipart_upload, Key=full)["UploadId"]
        pieces = [(i + 1, view[off:off + PART_BYTES]) for i, off in enumerate(range(0, len(view), PART_BYTES))]

        def send(piece):
            number, part = piece
            answer = self._call(key, self.client.upload_part, Key=full, UploadId=upload, PartNumber=number,
                                Body=_Body(part))
            return {"PartNumber": number, "ETag": answer["ETag"]}
        try:
            with ThreadPoolExecutor(PART_THREADS) as pool:
                parts = list(pool.map(send, pieces))
            return self._call(key, self.client.complete_multipart_upload, Key=full, UploadId=upload,
                              MultipartUpload={"Parts": parts})["ETag"]
        except BaseException:
            try:  # best effort: an abandoned upload only costs space until the bucket's lifecycle drops it
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload)
            except Exception:
                pass
            raise

    def list(self, prefix: str) -> list:
        return [(key, size) for key, size, _ in self.list_times(prefix)]

    def list_times(self, prefix: str) -> list:
        return [(key, size, when) for key, size, (when, _) in self.list_stamps(prefix)]

    def list_stamps(self, prefix: str) -> list:
        """As the interface's, the stamp being (last-modified time, etag): listings give times in
        whole seconds, and a rewrite within the second changes the etag."""
        out, token = [], None
        full = _join(self.prefix, prefix)
        skip = len(self.prefix) + 1 if self.prefix else 0
        while True:
            kwargs = {"Prefix": full}
            if token:
                kwargs["ContinuationToken"] = token
            answer = self._call(prefix, self.client.list_objects_v2, **kwargs)
            out += [(item["Key"][skip:], item["Size"], (item["LastModified"].timestamp(), str(item.get("ETag", ""))))
                    for item in answer.get("Contents", [])]
            token = answer.get("NextContinuationToken")
            if not answer.get("IsTruncated") or not token:
                return sorted(out)

    def delete(self, key: str) -> None:
        self._call(key, self.client.delete_object, Key=_join(self.prefix, check_key(key)))

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass


class _Body:
    """A read-only file over a memoryview: boto3 streams it (and can rewind it
    to retry) without a copy of the whole object.

    ``read`` hands out views, not copies: the body is read in 16 KiB blocks
    to be sent and in 1 MiB blocks for its CRC32, and a copy of each block
    was a fifth of the client's CPU on an upload here. Every reader (zlib,
    hashlib, the socket) takes a view, and the bytes behind it do not
    change until the upload returned.
    """

    def __init__(self, view: memoryview):
        self.view, self.pos = view, 0

    def read(self, n: int = -1) -> memoryview:
        end = len(self.view) if n is None or n < 0 else min(len(self.view), self.pos + n)
        out = self.view[self.pos:end]
        self.pos = end
        return out

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: len(self.view) + offset}[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def __len__(self) -> int:
        return len(self.view)

