"""Reading over HTTP, and a loopback object store with a latency knob to measure it.

The codelab's central claim is that per-file reads from cloud storage are slow (it saw
about 8 images/s from GCS) and that shards fix it: object stores charge a round trip
per request, so throughput is set by requests, not bytes. This module lets us measure
that honestly on one machine:

- :class:`ObjectServer`: a small threaded HTTP object server (stdlib only) that serves a
  local folder on **127.0.0.1 only**, answers ``GET`` (with ``Range``), ``HEAD`` and a JSON
  listing (``GET /prefix/?list``), waits ``latency_ms`` before every response, bounds the
  number of concurrent requests and stops itself after ``idle_timeout`` seconds unused.
- petal's remote-read path for ``http://`` sources: :class:`HttpFS` (the few file-system
  calls the reader needs), :func:`records_dataset` (shards fetched whole, several at once and
  in parallel byte ranges, into TensorFlow's in-memory file system, then read by
  ``TFRecordDataset`` with its CRC checks) and :func:`fetch_pair` (one request per image
  file: the per-file path).

``ObjectServer`` serves any folder, so ``open_source("http://127.0.0.1:PORT/flowers-192")``
reads records exactly as from a bucket.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import os
import posixpath
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

from petal.errors import PetalError

log = logging.getLogger(__name__)

# Concurrent requests of the per-file path, and shards downloaded at once: the same budget
# for both, so the comparison is about the number of requests, not about parallelism.
PARALLEL_REQUESTS = 8
# Shards are fetched in byte ranges of this size, in parallel, like cloud storage clients do.
CHUNK_BYTES = 8 << 20
TIMEOUT_S = 60.0
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


# --- server ----------------------------------------------------------------------------------


class ObjectServer:
    """A loopback HTTP object store over a local folder, with per-request latency.

    Use as a context manager::

        with ObjectServer("/tmp/records", latency_ms=20) as server:
            url = server.url("flowers-192")     # http://127.0.0.1:PORT/flowers-192

    Args:
        root: folder to serve (read only; paths outside it are refused).
        latency_ms: delay before every response, like a cloud store's first-byte latency.
        host: must be a loopback address; nothing else is ever bound.
        port: 0 picks a free port.
        max_concurrent: requests served at once; more get 503 (bounded resource use).
        idle_timeout: seconds without a request after which the server stops itself.
    """

    def __init__(self, root, latency_ms: float = 0.0, *, host: str = "127.0.0.1", port: int = 0,
                 max_concurrent: int = 64, idle_timeout: float = 300.0):
        if host not in _LOOPBACK:
            raise PetalError(f"ObjectServer only binds loopback (127.0.0.1). Received: host={host!r}")
        if latency_ms < 0:
            raise PetalError(f"latency_ms must be >= 0. Received: latency_ms={latency_ms}")
        self.root = os.path.realpath(os.fspath(root))
        if not os.path.isdir(self.root):
            raise PetalError(f"ObjectServer root is not a folder: {root}")
        self.latency_s = latency_ms / 1000.0
        self.idle_timeout = idle_timeout
        self.requests = 0
        self.bytes_sent = 0
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1" if host == "localhost" else host, port), _Handler)
        self._httpd.store = self
        self._threads: list[threading.Thread] = []
        self._stopped = threading.Event()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def url(self, key: str = "") -> str:
        """``http://127.0.0.1:PORT/key``."""
        return f"http://127.0.0.1:{self.port}/{key.lstrip('/')}".rstrip("/")

    def start(self) -> ObjectServer:
        serve = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                 name="petal-object-server", daemon=True)
        watch = threading.Thread(target=self._watchdog, name="petal-object-server-idle",
                                 daemon=True)
        self._threads = [serve, watch]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        if not self._stopped.is_set():
            self._stopped.set()
            self._httpd.shutdown()
            self._httpd.server_close()

    def __enter__(self) -> ObjectServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _watchdog(self) -> None:
        while not self._stopped.wait(1.0):
            if time.monotonic() - self._last > self.idle_timeout:
                log.info("petal object server idle for %.0f s: stopping", self.idle_timeout)
                self.stop()

    def _touch(self, sent: int = 0) -> None:
        with self._lock:
            self._last = time.monotonic()
            self.requests += 1 if not sent else 0
            self.bytes_sent += sent

    def resolve(self, key: str) -> str | None:
        """Local path of ``key`` inside root, or None when it would escape root."""
        path = os.path.realpath(os.path.join(self.root, key.lstrip("/")))
        if path != self.root and not path.startswith(self.root + os.sep):
            return None
        return path


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = TIMEOUT_S  # a stalled client cannot hold a thread forever

    def log_message(self, fmt, *args):  # quiet: the benchmark makes thousands of requests
        log.debug("object server: " + fmt, *args)

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def _serve(self, head: bool):
        store: ObjectServer = self.server.store
        if not store._slots.acquire(blocking=False):
            self._reply(503, b"busy", "text/plain", head)
            return
        try:
            store._touch()
            if store.latency_s:
                time.sleep(store.latency_s)
            parsed = urllib.parse.urlsplit(self.path)
            key = urllib.parse.unquote(parsed.path)
            path = store.resolve(key)
            if path is None:
                self._reply(403, b"outside the served folder", "text/plain", head)
                return
            if "list" in urllib.parse.parse_qs(parsed.query, keep_blank_values=True):
                self._list(store, path, head)
                return
            if not os.path.isfile(path):
                self._reply(404, b"not found", "text/plain", head)
                return
            self._file(store, path, head)
        finally:
            store._slots.release()

    def _list(self, store, path, head):
        objects = []
        if os.path.isdir(path):
            for folder, dirs, files in os.walk(path):
                dirs.sort()
                for name in sorted(files):
                    full = os.path.join(folder, name)
                    rel = os.path.relpath(full, path).replace(os.sep, "/")
                    objects.append({"key": rel, "size": os.path.getsize(full)})
        body = json.dumps({"objects": objects}).encode()
        self._reply(200, body, "application/json", head)

    def _file(self, store, path, head):
        size = os.path.getsize(path)
        start, end, status = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng[6:].partition("-")
            try:
                start = int(first) if first else max(size - int(last), 0)
                end = min(int(last), size - 1) if (first and last) else size - 1
            except ValueError:
                self._reply(416, b"bad range", "text/plain", head)
                return
            if start > end or start >= size:
                self._reply(416, b"range not satisfiable", "text/plain", head)
                return
            status = 206
        length = end - start + 1
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if head:
            return
        with open(path, "rb") as f:
            f.seek(start)
            left = length
            while left:
                block = f.read(min(left, 1 << 20))
                if not block:
                    break
                self.wfile.write(block)
                left -= len(block)
        store._touch(sent=length)

    def _reply(self, status, body, ctype, head):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)


# --- client ----------------------------------------------------------------------------------


def _request(url: str, *, method: str = "GET", byte_range: tuple[int, int] | None = None,
             retries: int = 3) -> bytes:
    """One HTTP request; retries 503 (server busy) a few times."""
    headers = {}
    if byte_range is not None:
        headers["Range"] = f"bytes={byte_range[0]}-{byte_range[1]}"
    for attempt in range(retries + 1):
        req = urllib.request.Request(url, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
                return resp.read()
        except urllib.error.HTTPError as err:
            if err.code == 503 and attempt < retries:
                time.sleep(0.05 * (attempt + 1))
                continue
            if err.code == 404:
                raise FileNotFoundError(f"Not found: {url}") from err
            raise PetalError(f"HTTP {err.code} reading {url}: {err.reason}") from err
        except urllib.error.URLError as err:
            raise PetalError(f"Cannot reach {url}: {err.reason}") from err
    raise PetalError(f"Server stayed busy reading {url}")


def get_bytes(url: str) -> bytes:
    """The whole object at ``url`` (one request)."""
    return _request(url)


def object_size(url: str) -> int:
    """Size of the object at ``url`` from a HEAD request."""
    req = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            return int(resp.headers["Content-Length"])
    except urllib.error.HTTPError as err:
        if err.code == 404:
            raise FileNotFoundError(f"Not found: {url}") from err
        raise PetalError(f"HTTP {err.code} reading {url}: {err.reason}") from err
    except urllib.error.URLError as err:
        raise PetalError(f"Cannot reach {url}: {err.reason}") from err


def list_objects(url: str) -> dict[str, int]:
    """``{relative key: size}`` of every object under ``url`` (recursive, one request)."""
    try:
        body = _request(url.rstrip("/") + "/?list")
    except FileNotFoundError:
        return {}
    return {o["key"]: int(o["size"]) for o in json.loads(body.decode("utf-8"))["objects"]}


class HttpFS:
    """The file-system calls :mod:`petal.data.reader` needs, over :class:`ObjectServer`'s API."""

    def __init__(self):
        self._listings: dict[str, dict[str, int]] = {}

    def _listing(self, folder: str) -> dict[str, int]:
        folder = folder.rstrip("/")
        if folder not in self._listings:
            self._listings[folder] = list_objects(folder)
        return self._listings[folder]

    def exists(self, path):
        if self._listing(path):
            return True
        try:
            object_size(path)
            return True
        except FileNotFoundError:
            return False

    def isdir(self, path):
        return bool(self._listing(path))

    def listdir(self, path):
        return sorted({key.split("/", 1)[0] for key in self._listing(path)})

    def glob(self, pattern):
        import fnmatch

        base = pattern[: min(pattern.find(c) for c in "*?[" if c in pattern)]
        base = base.rsplit("/", 1)[0]
        return sorted(
            posixpath.join(base, key)
            for key in self._listing(base)
            if fnmatch.fnmatchcase(posixpath.join(base, key), pattern)
        )

    def read_bytes(self, path):
        return get_bytes(path)

    def sizes(self, folder):
        return {k: v for k, v in self._listing(folder).items() if "/" not in k}


# --- tf.data readers -------------------------------------------------------------------------

_RAM_ROOT = "ram://petal-remote"


def download_shard(url: str, *, chunk_bytes: int = CHUNK_BYTES, parallel: int = 4) -> bytes:
    """A whole shard, in parallel byte ranges when it is larger than one chunk."""
    size = object_size(url)
    if size <= chunk_bytes:
        return get_bytes(url)
    ranges = [(s, min(s + chunk_bytes, size) - 1) for s in range(0, size, chunk_bytes)]
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        parts = list(pool.map(lambda r: _request(url, byte_range=r), ranges))
    return b"".join(parts)


def _fetch_to_ram(url) -> bytes:
    import tensorflow as tf

    url = url.numpy().decode("utf-8")
    data = download_shard(url)
    path = f"{_RAM_ROOT}/{uuid.uuid4().hex}-{posixpath.basename(url)}"
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(data)
    return path.encode()


def _delete_ram(path) -> bytes:
    import tensorflow as tf

    with contextlib.suppress(tf.errors.NotFoundError):
        tf.io.gfile.remove(path.numpy().decode("utf-8"))
    return b""


def records_dataset(urls, counts=None, *, shuffle_seed=None, deterministic=True,
                    skip_corrupt=False, parallel: int = PARALLEL_REQUESTS):
    """Serialized records of remote shards (a tf.data.Dataset of scalar strings).

    Each shard is downloaded whole (parallel byte ranges) into TensorFlow's in-memory file
    system, read by ``TFRecordDataset`` (CRC-checked, and counted against ``counts`` like
    local shards), then deleted; up to ``parallel`` shards are in flight at once.
    """
    import tensorflow as tf

    from petal.data import reader

    urls = list(urls)
    if counts is None:
        counts = [-1] * len(urls)
    ds = tf.data.Dataset.from_tensor_slices((urls, tf.constant(counts, tf.int64)))
    if shuffle_seed is not None and len(urls) > 1:
        ds = ds.shuffle(len(urls), seed=shuffle_seed, reshuffle_each_iteration=True)

    def one_shard(url, count):
        path = tf.py_function(_fetch_to_ram, [url], tf.string)
        path.set_shape([])
        if counts[0] == -1:
            records = tf.data.TFRecordDataset(path)
        else:
            records = reader.guarded_records(path, count, skip_corrupt=skip_corrupt, name=url)
        cleanup = (
            tf.data.Dataset.from_tensors(path)
            .map(lambda p: tf.py_function(_delete_ram, [p], tf.string))
            .filter(lambda _: False)
        )
        return records.concatenate(cleanup)

    return ds.interleave(
        one_shard,
        cycle_length=max(1, min(len(urls), parallel)),
        block_length=1,
        num_parallel_calls=max(1, min(len(urls), parallel)),
        deterministic=deterministic,
    )


def _fetch_one(url) -> bytes:
    return get_bytes(url.numpy().decode("utf-8"))


def fetch_pair(url, label):
    """``(url, label) -> (file bytes, label)`` with one HTTP request: the per-file path."""
    import tensorflow as tf

    data = tf.py_function(_fetch_one, [url], tf.string)
    data.set_shape([])
    return data, label
