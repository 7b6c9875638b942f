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
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from .bucket import Bucket, NotFound, PreconditionFailed, RemoteError, RemoteUnreachable

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
ATTEMPTS = int(os.environ.get("MVC_REMOTE_ATTEMPTS", "6"))  # botocore's attempts, first try included


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


def _join(prefix: str, key: str) -> str:
    return f"{prefix}/{key}" if prefix else key


class S3Bucket(Bucket):
    def __init__(self, bucket: str, prefix: str = "", endpoint_url: Optional[str] = None):
        self.bucket, self.prefix, self.endpoint = bucket, prefix, endpoint_url
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        config = Config(retries={"max_attempts": ATTEMPTS, "mode": "standard"}, connect_timeout=5,
                        read_timeout=60, max_pool_connections=32, s3={"payload_signing_enabled": False})
        try:
            self.client = _client(endpoint_url, config)
        except (BotoCoreError, ValueError) as exc:
            raise RemoteError(f"cannot set up S3 for {self.url}: {exc}") from None

    # -- errors ---------------------------------------------------------------

    def _call(self, key: str, fn, **kwargs):
        try:
            return fn(Bucket=self.bucket, **kwargs)
        except ClientError as exc:
            raise self._error(key, exc) from None
        except NoCredentialsError:
            raise RemoteError(f"no AWS credentials for {self.url}: set AWS_ACCESS_KEY_ID and "
                              "AWS_SECRET_ACCESS_KEY, or a profile (AWS_PROFILE, ~/.aws/credentials)") from None
        except BotoCoreError as exc:  # connection refused or reset, timeouts: after every retry
            raise RemoteUnreachable(f"cannot reach {self.endpoint or 'S3'} for {self.url} ({exc}); nothing "
                                    "that was not finished counts: run the command again when it is back",
                                    url=self.url, attempts=ATTEMPTS) from None

    def _error(self, key: str, exc: ClientError) -> RemoteError:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("NoSuchKey", "404", "NotFound") or (status == 404 and code != "NoSuchBucket"):
            return NotFound(f"{key} is missing from remote {self.url}")
        if code == "PreconditionFailed" or status == 412:
            return PreconditionFailed(f"{key} on remote {self.url} changed meanwhile")
        if code == "NoSuchBucket":
            return RemoteError(f"bucket {self.bucket!r} does not exist at {self.endpoint or 'S3'}; create it first")
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403") or status == 403:
            return RemoteError(f"access to {self.url} denied ({code}); check the credentials and the bucket's policy")
        return RemoteError(f"remote {self.url} failed on {key}: {code or status}: "
                           f"{exc.response.get('Error', {}).get('Message', '')}")

    # -- reads ----------------------------------------------------------------

    def _get(self, key: str, byte_range: Optional[str] = None) -> dict:
        kwargs = {"Key": _join(self.prefix, key)}
        if byte_range:
            kwargs["Range"] = byte_range
        answer = self._call(key, self.client.get_object, **kwargs)
        try:
            answer["data"] = answer["Body"].read()
        except (BotoCoreError, OSError) as exc:
            raise RemoteError(f"reading {key} from {self.url} broke off ({exc}); run the command again") from None
        return answer

    def get(self, key: str) -> bytes:
        return self._get(key)["data"]

    def get_range(self, key: str, start: int, stop: int) -> bytes:
        if stop <= start:
            return b""
        data = self._get(key, f"bytes={start}-{stop - 1}")["data"]
        if len(data) != stop - start:
            raise RemoteError(f"{key} on remote {self.url} is shorter than expected (asked for bytes "
                              f"{start}-{stop - 1}, got {len(data)})")
        return data

    def get_tail(self, key: str, n: int) -> tuple:
        answer = self._get(key, f"bytes=-{n}")
        total = answer.get("ContentRange", "").rpartition("/")[2]
        return answer["data"], int(total) if total.isdigit() else len(answer["data"])

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
        kwargs = {"Key": _join(self.prefix, key), "Body": bytes(view) if len(view) < (1 << 20) else _Body(view)}
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        if if_absent:
            kwargs["IfNoneMatch"] = "*"
        return self._call(key, self.client.put_object, **kwargs)["ETag"]

    def _multipart(self, key: str, view: memoryview) -> str:
        full = _join(self.prefix, key)
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
        out, token = [], None
        full = _join(self.prefix, prefix)
        skip = len(self.prefix) + 1 if self.prefix else 0
        while True:
            kwargs = {"Prefix": full}
            if token:
                kwargs["ContinuationToken"] = token
            answer = self._call(prefix, self.client.list_objects_v2, **kwargs)
            out += [(item["Key"][skip:], item["Size"], item["LastModified"].timestamp())
                    for item in answer.get("Contents", [])]
            token = answer.get("NextContinuationToken")
            if not answer.get("IsTruncated") or not token:
                return sorted(out)

    def delete(self, key: str) -> None:
        self._call(key, self.client.delete_object, Key=_join(self.prefix, key))

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass


class _Body:
    """A read-only file over a memoryview: boto3 streams it (and can rewind it
    to retry) without a copy of the whole object."""

    def __init__(self, view: memoryview):
        self.view, self.pos = view, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.view) if n is None or n < 0 else min(len(self.view), self.pos + n)
        out = bytes(self.view[self.pos:end])
        self.pos = end
        return out

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: len(self.view) + offset}[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def __len__(self) -> int:
        return len(self.view)

