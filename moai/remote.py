"""Object storage through fsspec: opening a URL's filesystem, listing objects, and one-line errors.

Any fsspec URL works (`s3://`, `gs://`, `hf://`, `https://`, `memory://`); the protocol's package
must be installed (`s3fs` ships with moai; gcsfs for gs://: `pip install 'moai[gcs]'`). `storage_options` are the
filesystem's own keyword arguments (`endpoint_url` for an S3-compatible store, `anon`, `profile`,
`region_name`); credentials never go there: they come from where the client library looks
(`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, `AWS_PROFILE`, ~/.aws/credentials, instance roles;
`GOOGLE_APPLICATION_CREDENTIALS`; `HF_TOKEN`), so no config, manifest, log or artifact holds them.

S3 clients retry a refused or unreachable endpoint for a minute by default; here a request is
tried twice with a 5 s connect timeout, so wrong credentials, a missing bucket or an unreachable
endpoint is one `MoaiError` line in seconds, naming the URL and the fix.
"""

from __future__ import annotations

import base64
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from moai.errors import MoaiError

log = logging.getLogger(__name__)

# storage_options keys that would hold a credential: refused in configs (moai.config)
SECRET_KEYS = frozenset(
    {
        "key",
        "secret",
        "token",
        "password",
        "username",
        "access_key",
        "secret_key",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "session_token",
        "client_secret",
    }
)
_GLOB = re.compile(r"[*?\[]")


def is_url(path: str) -> bool:
    """Whether a path is a URL of a remote filesystem (not a local path, not file://)."""
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.isidentifier() and scheme != "file"


def secret_keys(options: dict[str, Any], where: str) -> list[str]:
    """The settings among `options` (and its nested dicts) that would hold a credential."""
    found = []
    for k, v in options.items():
        if k.lower() == "token" and v == "anon":
            continue  # gcsfs's "no credentials" (a public bucket, an emulator), as s3fs's `anon: true`
        if k.lower() in SECRET_KEYS:
            found.append(f"{where}.{k}")
        elif isinstance(v, dict):
            found += secret_keys(v, f"{where}.{k}")
    return found


def refuse_secrets(options: dict[str, Any], where: str) -> None:
    """`ValueError` (a config error) if storage options hold a credential: configs are copied into
    manifests and run records, so credentials come from the environment or a named profile."""
    found = secret_keys(options, where)
    if found:
        raise ValueError(
            f"{found[0]}: credentials do not go in a config (it is copied into run records); set them in the "
            "environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE; GOOGLE_APPLICATION_CREDENTIALS; "
            f"HF_TOKEN) or name a profile with {where}.profile"
        )


_FILESYSTEMS: dict[tuple[str, str, tuple[str | None, ...]], Any] = {}
# what the client libraries read credentials and endpoints from: a change gives a new client
_CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "STORAGE_EMULATOR_HOST",
    "HF_TOKEN",
)


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> Any:
    """The fsspec filesystem of `url`, with requests that fail in seconds rather than minutes.

    One client per protocol, options and credentials in the environment, kept for the process:
    an S3 client takes ~0.1-0.2 s to set up, and a run asks for one per stage and per source.
    """
    import json

    protocol = url.split("://", 1)[0]
    cache_key = (
        protocol,
        json.dumps(storage_options or {}, sort_keys=True, default=str),
        tuple(os.environ.get(v) for v in _CREDENTIAL_VARIABLES),
    )
    if cache_key not in _FILESYSTEMS:
        _FILESYSTEMS[cache_key] = _new_filesystem(url, protocol, dict(storage_options or {}))
    return _FILESYSTEMS[cache_key]


def _new_filesystem(url: str, protocol: str, options: dict[str, Any]) -> Any:
    import fsspec

    if protocol in ("gs", "gcs"):
        # gcsfs logs a request out of retries (ERROR, with its traceback) before raising the error that
        # moai makes its one line: the CLI showed three `moai: error:` lines for one unreachable endpoint
        _quiet(("gcsfs",), logging.CRITICAL)
    if protocol in ("s3", "s3a"):
        # "Found credentials in environment variables.", at INFO, once per client (a stage each):
        # noise in the stage table
        _quiet(("aiobotocore.credentials", "botocore.credentials"), logging.WARNING)
        # listings are read fresh: a cached one would hide an object changed since (its ETag), or
        # another machine's upload to the remote cache, from this long-lived client
        options.setdefault("use_listings_cache", False)
        config = dict(options.pop("config_kwargs", {}))
        config.setdefault("connect_timeout", 5)
        config.setdefault("retries", {"max_attempts": 2, "mode": "standard"})
        options["config_kwargs"] = config
    try:
        if protocol in ("gs", "gcs") and (options.get("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST")):
            # gcsfs's default filesystem (ExtendedGcsFileSystem, since gcsfs 2026.3) asks the endpoint's
            # gRPC storage-control API for a bucket's layout before reading or writing, again on each call
            # while it gets no answer; an emulator (fake-gcs-server, gcp-storage-emulator) has no such API:
            # writing one object took 83 s and reading it 37 s. An endpoint of one's own gets the JSON-API
            # filesystem, the one gcsfs uses for a standard bucket anyway.
            from gcsfs.core import GCSFileSystem

            fs = GCSFileSystem(skip_instance_cache=True, **options)
        else:
            fs = fsspec.filesystem(protocol, skip_instance_cache=True, **options)
    except ImportError as err:
        package = {"gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}.get(protocol, str(err.name))
        raise MoaiError(f"{url}: reading {protocol}:// needs the package {package}: pip install {package}") from None
    if protocol in ("s3", "s3a"):
        # s3fs's own loop around botocore's (5 by default, with backoff): botocore's two tries are
        # enough, so an endpoint that never answers fails in ~2 x 5 s, not minutes
        fs.retries = 1
    return fs


def _quiet(names: tuple[str, ...], level: int) -> None:
    """These loggers at `level`, unless set already or `-v` (DEBUG) asks for everything."""
    for name in names:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET and not logging.getLogger().isEnabledFor(logging.DEBUG):
            logger.setLevel(level)


def explain(url: str, err: BaseException, doing: str = "read", options: str = "storage_options") -> MoaiError:
    """One line for a failed request on `url`: what the server said, and the fix."""
    text = f"{type(err).__name__}: {err}".replace("\n", " ")
    low = text.lower()
    if isinstance(err, MoaiError):
        return err
    if "nocredentials" in low or "unable to locate credentials" in low:
        fix = (
            "no credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the "
            "environment, or storage_options: {anon: true} for a public bucket"
        )
    elif "bucket does not exist" in low or "nosuchbucket" in low:
        fix = f"the bucket does not exist: create it ({tool_command(url, 'mb')}) or fix the URL"
    elif (
        isinstance(err, PermissionError)
        or "signature" in low
        or "accessdenied" in low
        or "access denied" in low
        or "invalidaccesskeyid" in low
        or "forbidden" in low
    ):
        fix = (
            f"access denied ({_short(text)}): check the credentials in the environment (AWS_ACCESS_KEY_ID, "
            f"AWS_SECRET_ACCESS_KEY, AWS_PROFILE) and that they may {doing} this bucket"
        )
    elif (
        "could not connect" in low
        or "cannot connect to host" in low  # aiohttp's, under gcsfs
        or ("connect" in low and ("refused" in low or "timeout" in low))
        # the server went away in the middle of a response (aiohttp's, under s3fs and gcsfs)
        or "payload is not completed" in low
        or "server disconnected" in low
    ):
        fix = (
            f"cannot reach the endpoint ({_short(text)}): check {options}.endpoint_url and that the "
            "server is up and reachable from this machine"
        )
    elif "repository not found" in low or "revision not found" in low:  # HfFileSystem's
        fix = "no such repository or revision (a private or gated one needs HF_TOKEN in the environment): check the URL"
    elif isinstance(err, FileNotFoundError):
        fix = "no such object: check the URL"
    else:
        fix = _short(text)
    return MoaiError(f"cannot {doing} {url}: {fix}")


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bucket_of(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0]


def tool_command(url: str, action: str) -> str:
    """The command line of the store's own tool for an error's fix: `mb` (make the bucket of `url`)
    or `rm` (remove everything under `url`)."""
    gcs = url.startswith(("gs://", "gcs://"))
    if action == "mb":
        bucket = bucket_of(url)
        return f"gcloud storage buckets create gs://{bucket}" if gcs else f"aws s3 mb s3://{bucket}"
    return f"gcloud storage rm --recursive {url}" if gcs else f"aws s3 rm --recursive {url}"


@dataclass(frozen=True)
class RemoteObject:
    """One object a source URL names, as its listing described it. Like a `Path` where the readers
    need one: `name`, `suffix`, `stem`; `str()` is its URL."""

    url: str
    size: int
    version: str | None  # generation, ETag, version id or content hash from the listing; None: the store gives none
    fs: Any = field(compare=False, repr=False)
    content_md5: str | None = field(default=None, compare=False, repr=False)  # hex, from the listing (_md5)

    def __str__(self) -> str:
        return self.url

    @property
    def name(self) -> str:
        return PurePosixPath(self.url.split("://", 1)[1]).name

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def stem(self) -> str:
        return PurePosixPath(self.name).stem

    def open(self, mode: str = "rb", sequential: bool = True) -> Any:
        """The object's bytes as a file. `sequential`: no cache of fsspec's, each read one ranged
        request of the size asked (convert reads 4 MiB at a time), so memory stays a few reads
        whatever the object's size (fsspec's read-ahead cache peaked at 42 MB reading a 48 MB object,
        uncached 13 MB); random access (parquet) keeps an 8 MiB read-ahead for its small reads."""
        assert mode == "rb", mode
        if sequential and self.url.startswith("hf://"):
            # huggingface_hub's streaming file: one GET read as it arrives (as its own whole-file read
            # does) rather than a ranged request per read; a server that ignores Range (olah's mirrors)
            # gives the right bytes too
            return self.fs.open(self.url, "rb", block_size=0)
        if sequential:
            return self.fs.open(self.url, "rb", cache_type="none")
        return self.fs.open(self.url, "rb", block_size=1 << 23, cache_type="readahead")

    def md5(self) -> str | None:
        """The MD5 of the content, hex, when the listing gives one, else None."""
        return self.content_md5

    def current(self) -> RemoteObject:
        """The object as the store describes it now (after reading: did it change meanwhile?)."""
        try:
            _fresh(self.fs)
            info = self.fs.info(self.url)
        except Exception as err:
            raise explain(self.url, err) from None
        return _object(self.fs, self.url, info)


def _version(info: dict[str, Any]) -> str | None:
    # GCS's generation changes when the bytes do; its etag changes with the metadata too
    for key in ("generation", "ETag", "etag", "VersionId", "version_id", "md5Hash", "sha", "blob_id"):
        if info.get(key):
            return str(info[key])
    lfs = info.get("lfs")
    if isinstance(lfs, dict) and lfs.get("sha256"):
        return str(lfs["sha256"])
    return None


def _md5(info: dict[str, Any]) -> str | None:
    """The content's MD5 as the listing gives it: a single-part S3 upload's ETag (hex), GCS's md5Hash
    (base64; a composite object has none)."""
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
    if re.fullmatch(r"[0-9a-f]{32}", etag):
        return etag
    md5_hash = info.get("md5Hash")
    return base64.b64decode(md5_hash).hex() if md5_hash else None


def _object(fs: Any, url: str, info: dict[str, Any]) -> RemoteObject:
    size = int(info.get("size") or info.get("Size") or 0)
    return RemoteObject(url, size, _version(info), fs, _md5(info))


def _fresh(fs: Any) -> None:
    """Forget the listings `fs` keeps (HfFileSystem always keeps them, with no option as s3fs's
    `use_listings_cache`): a kept one hides an object changed since from this long-lived client."""
    if type(fs).__name__ == "HfFileSystem":
        fs.invalidate_cache()


def list_objects(url: str, storage_options: dict[str, Any] | None = None) -> list[RemoteObject]:
    """The objects `url` names (a glob: `s3://b/p/*.jsonl.zst`), sorted by URL, each with its size and
    version from the listing; [] when it names none."""
    fs = filesystem(url, storage_options)
    protocol = url.split("://", 1)[0]
    try:
        _fresh(fs)
        try:
            found = fs.glob(url, detail=True) if _GLOB.search(url) else {url: fs.info(url)}
        except FileNotFoundError:  # gcsfs: a glob in a bucket that does not exist
            if protocol == "hf":  # HfFileSystem: a repository or revision that does not exist, said so
                raise
            found = {}
        # nothing found: a bucket that does not exist is named as such (a glob in it finds nothing too)
        if not found and protocol in ("s3", "s3a", "gs", "gcs") and not fs.exists(bucket_of(url)):
            raise FileNotFoundError(f"The specified bucket does not exist: {bucket_of(url)}")
    except Exception as err:
        raise explain(url, err) from None
    objects = []
    for name, info in found.items():
        if info.get("type", "file") != "file":
            continue
        full = name if "://" in name else f"{protocol}://{name}"
        objects.append(_object(fs, full, info))
    return sorted(objects, key=lambda o: o.url)
