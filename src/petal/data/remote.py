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
  calls the reader needs), :func:`records_dataset` (each shard streamed with one request
  into a RAM-backed staging file, several shards at once, then read by ``TFRecordDataset``
  with its CRC checks) and :func:`files_dataset` (one request per image file: the
  per-file path). Both work within the same budget, :data:`PARALLEL_REQUESTS`.

``ObjectServer`` serves any folder, so ``open_source("http://127.0.0.1:PORT/flowers-192")``
reads records exactly as from a bucket.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import ctypes.util
import functools
import http.client
import http.server
import io
import itertools
import json
import logging
import os
import posixpath
import random
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import weakref
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from petal.data import tfdata
from petal.errors import PetalError

log = logging.getLogger(__name__)

# Requests in flight: files fetched at once by the per-file path; shards staged at once
# (read, or downloaded ahead) by the sharded one. The same budget for both, so the
# comparison is about the number of requests, not about parallelism.
PARALLEL_REQUESTS = 8
# Seconds a request may wait for the server: to connect and answer with all its headers, or
# for the next bytes of a body.
TIMEOUT_S = 60.0
# A body still arriving after TIMEOUT_S at less than this average rate is a stalled store
# (a socket timeout never fires while a byte comes every few seconds).
MIN_BYTES_PER_S = 16 * 1024
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


# --- server ----------------------------------------------------------------------------------


class ObjectServer:
    """A loopback HTTP object store over a local folder, with per-request latency.

    Use as a context manager::

        with ObjectServer("/tmp/records", latency_ms=20) as server:
            url = server.url("flowers-192")     # http://127.0.0.1:PORT/flowers-192

    Args:
        root: folder to serve, or ``{name: folder}`` to serve several under ``/name/``
            (read only; paths outside them are refused).
        latency_ms: delay before every response, like a cloud store's first-byte latency.
        host: must be a loopback address; nothing else is ever bound.
        port: 0 picks a free port.
        max_concurrent: requests served at once; more get 503 (bounded resource use).
        idle_timeout: seconds without a request after which the server stops itself.
    """

    def __init__(
        self,
        root,
        latency_ms: float = 0.0,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_concurrent: int = 64,
        idle_timeout: float = 300.0,
    ):
        if host not in _LOOPBACK:
            raise PetalError(
                f"ObjectServer only binds loopback (127.0.0.1). Received: host={host!r}"
            )
        if latency_ms < 0:
            raise PetalError(f"latency_ms must be >= 0. Received: latency_ms={latency_ms}")
        mounts = root if isinstance(root, dict) else {"": root}
        self.mounts = {
            name.strip("/"): os.path.abspath(os.fspath(path)) for name, path in mounts.items()
        }
        for path in self.mounts.values():
            if not os.path.isdir(path):
                raise PetalError(f"ObjectServer can only serve folders. Received: root={root!r}")
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
        serve = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="petal-object-server",
            daemon=True,
        )
        watch = threading.Thread(
            target=self._watchdog, name="petal-object-server-idle", daemon=True
        )
        self._threads = [serve, watch]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        if not self._stopped.is_set():
            self._stopped.set()
            if self._threads and self._threads[0].is_alive():
                # Waits for the serving loop to end: without one, for ever.
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
        """Local path of ``key``, or None when it is outside every served folder."""
        key = key.lstrip("/")
        if "" in self.mounts:
            base, rest = self.mounts[""], key
        else:
            name, _, rest = key.partition("/")
            if name not in self.mounts:
                return None
            base = self.mounts[name]
        # Normalise away ".." and refuse anything that leaves the folder; symlinks inside
        # it are followed (they are the owner's choice, like a bucket's contents).
        path = os.path.normpath(os.path.join(base, rest))
        if path != base and not path.startswith(base + os.sep):
            return None
        return path


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        # A client that went away mid-answer (a reader dropped, a timeout) is not the
        # server's error: quiet, like the request log. Anything else keeps its traceback.
        err = sys.exc_info()[1]
        if isinstance(err, (ConnectionError, TimeoutError)):
            log.debug("object server: %s dropped the connection: %s", client_address, err)
            return
        super().handle_error(request, client_address)


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
            # Zero-copy from the page cache to the socket: the store should not be the
            # bottleneck of what it measures.
            self.connection.sendfile(f, offset=start, count=length)
        store._touch(sent=length)

    def _reply(self, status, body, ctype, head):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)


# --- client ----------------------------------------------------------------------------------


def requote(url: str) -> str:
    """``url`` with what may not stand in a URL (spaces, non-ASCII letters, control
    characters, quotes) percent-encoded; escapes already there, and the characters that
    give a URL its structure, are kept. ``http.client`` refuses the former outright."""
    return urllib.parse.quote(url, safe="!#$%&'()*+,/:;=?@[]~")


def key_url(root: str, key: str) -> str:
    """The URL of object ``key`` (a listing's relative name, as stored) under ``root``:
    every character of the name that means something in a URL is encoded (a ``#`` in a
    file name began a fragment, and the request lost the rest of the name)."""
    return f"{root.rstrip('/')}/{urllib.parse.quote(key, safe='/')}"


class _HeaderIO(io.RawIOBase):
    """A socket's reads that must all end by ``deadline`` (``time.monotonic()``): each waits
    at most what is left of it. :meth:`end` lifts it (a body's reads wait ``TIMEOUT_S`` each:
    :func:`_copy_body` watches their rate)."""

    def __init__(self, sock, deadline: float):
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)  # as http.client reads it
        self.deadline: float | None = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, b):
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            self._sock.settimeout(left)
        return self._raw.readinto(b)

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        self._raw.close()
        super().close()

    def end(self) -> None:
        if self.deadline is not None:
            self.deadline = None
            with contextlib.suppress(OSError):  # closed already: nothing more to read
                self._sock.settimeout(TIMEOUT_S)


class _BoundedResponse(http.client.HTTPResponse):
    """A response whose status line and headers must have come by ``deadline``."""

    def __init__(self, sock, *args, deadline: float, **kwargs):
        super().__init__(sock, *args, **kwargs)
        self.fp.close()  # nothing read yet: the same socket, read through _HeaderIO
        self._header_io = _HeaderIO(sock, deadline)
        self.fp = io.BufferedReader(self._header_io)

    def begin(self):
        try:
            super().begin()
        finally:
            self._header_io.end()


class _Bounded:
    """An HTTP connection whose request, from connecting to the answer's last header, ends
    within ``TIMEOUT_S``: a socket timeout bounds each read alone, so a server that sent a
    header line every few seconds held the request forever."""

    _deadline = 0.0

    def putrequest(self, *args, **kwargs):
        self._deadline = time.monotonic() + TIMEOUT_S  # before connecting
        super().putrequest(*args, **kwargs)

    def response_class(self, sock, *args, **kwargs):  # as http.client makes its response
        return _BoundedResponse(sock, *args, deadline=self._deadline, **kwargs)


class _HTTPConnection(_Bounded, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_Bounded, http.client.HTTPSConnection):
    pass


class _BoundedOpen:
    """A urllib handler that opens its requests with :class:`_Bounded` connections."""

    def do_open(self, http_class, req, **kwargs):
        https = issubclass(http_class, http.client.HTTPSConnection)
        return super().do_open(_HTTPSConnection if https else _HTTPConnection, req, **kwargs)


class _HTTPHandler(_BoundedOpen, urllib.request.HTTPHandler):
    pass


class _HTTPSHandler(_BoundedOpen, urllib.request.HTTPSHandler):
    pass


_OPENER = urllib.request.build_opener(_HTTPHandler, _HTTPSHandler)


def _request(
    url: str,
    *,
    method: str = "GET",
    byte_range: tuple[int, int] | None = None,
    retries: int = 3,
    size: int | None = None,
) -> bytes:
    """One HTTP request; retries 503 (server busy) a few times. ``size``: the body's size
    known beforehand (:func:`_copy_body`)."""
    headers = {}
    if byte_range is not None:
        headers["Range"] = f"bytes={byte_range[0]}-{byte_range[1]}"
    for attempt in range(retries + 1):
        req = urllib.request.Request(requote(url), method=method, headers=headers)
        try:
            with _OPENER.open(req, timeout=TIMEOUT_S) as resp:
                body = io.BytesIO()
                _copy_body(resp, url, body.write, size=size)
                return body.getvalue()
        except urllib.error.HTTPError as err:
            if err.code == 503 and attempt < retries:
                time.sleep(0.05 * (attempt + 1))
                continue
            if err.code == 404:
                raise FileNotFoundError(f"Not found: {url}") from err
            # A redirect loop's reason runs over three lines.
            reason = str(err.reason).strip().splitlines()[0] if str(err.reason).strip() else ""
            raise PetalError(f"HTTP {err.code} reading {url}: {reason}") from err
        except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
            raise _read_error(url, err) from err
    raise PetalError(f"Server stayed busy reading {url}")


def _read_error(url: str, err: BaseException) -> PetalError:
    """The one-line error for a request to ``url`` that failed below HTTP: the connection
    could not be made, timed out, or was closed or reset by the server."""
    if isinstance(err, urllib.error.URLError) and not isinstance(err.reason, TimeoutError):
        return PetalError(f"Cannot reach {url}: {err.reason}")
    cause = err.reason if isinstance(err, urllib.error.URLError) else err
    if isinstance(cause, TimeoutError):
        reason = f"timed out after {TIMEOUT_S:g} s"
    elif isinstance(cause, http.client.RemoteDisconnected):
        reason = "the server closed the connection without answering"
    elif isinstance(cause, ConnectionResetError):
        reason = "the server reset the connection"
    elif isinstance(cause, http.client.HTTPException):
        # BadStatusLine and the like: something answered, but not HTTP.
        text = str(cause).strip()
        reason = f"not an HTTP answer ({type(cause).__name__}{': ' + text if text else ''})"
    else:
        reason = str(cause).strip().splitlines()[0] if str(cause).strip() else repr(cause)
    return PetalError(f"Cannot read {url}: {reason}")


def get_bytes(url: str) -> bytes:
    """The whole object at ``url`` (one request), checked against its listed size (see
    :data:`LISTED_SIZES`) when the response gives none."""
    return _request(url, size=LISTED_SIZES.get(url))


def object_size(url: str) -> int:
    """Size of the object at ``url`` from a HEAD request."""
    req = urllib.request.Request(requote(url), method="HEAD")
    try:
        with _OPENER.open(req, timeout=TIMEOUT_S) as resp:
            return int(resp.headers["Content-Length"])
    except urllib.error.HTTPError as err:
        if err.code == 404:
            raise FileNotFoundError(f"Not found: {url}") from err
        raise PetalError(f"HTTP {err.code} reading {url}: {err.reason}") from err
    except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
        raise _read_error(url, err) from err


def list_objects(url: str) -> dict[str, int]:
    """``{relative key: size}`` of every object under ``url`` (recursive, one request)."""
    listing = url.rstrip("/") + "/?list"
    try:
        body = _request(listing)
    except FileNotFoundError:
        return {}
    try:
        answer = json.loads(body.decode("utf-8"))
    except ValueError:  # an HTML index, as python -m http.server answers
        answer, why = None, "something that is not JSON"
    else:
        why = "JSON of another shape"
    out: dict[str, int] = {}
    try:
        for o in answer["objects"]:
            key, size = o["key"], int(o["size"])
            if not isinstance(key, str) or not key or size < 0:
                raise ValueError(o)
            out[key] = size
    except (ValueError, TypeError, KeyError, AttributeError):
        raise PetalError(
            f'{listing} did not answer with a JSON listing ({{"objects": [{{"key", "size"}}]}}; '
            f"it answered {why}): petal reads http folders from stores that list a folder's "
            "objects that way, as petal.data.remote.ObjectServer does; copy the data to a "
            "local disk or gs:// to read it from elsewhere."
        ) from None
    LISTED_SIZES.update((key_url(url, key), size) for key, size in out.items())
    return out


# The size of each object a listing gave, by URL: get_bytes checks a body sent without a
# Content-Length against it (a photo cut part-way, closing the connection, passed as a
# short file and was then called corrupt: --skip-corrupt dropped it without a word).
LISTED_SIZES: dict[str, int] = {}


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
        # Matched by name, returned as URLs (a name's "#" encoded, as key_url does).
        return sorted(
            key_url(base, key)
            for key in self._listing(base)
            if fnmatch.fnmatchcase(posixpath.join(base, key), pattern)
        )

    def read_bytes(self, path, size: int = -1):
        """The bytes of ``path``; with ``size``, its first ``size`` bytes at most (one
        request for a range, where the server takes one)."""
        if size < 0:
            return get_bytes(path)
        return _request(path, byte_range=(0, size - 1))[:size]

    def sizes(self, folder):
        return {k: v for k, v in self._listing(folder).items() if "/" not in k}

    def listed_size(self, path: str) -> int | None:
        """The size of ``path`` in a listing read already (no request), or None."""
        for folder, listing in self._listings.items():
            if path.startswith(folder + "/"):
                # The listing's names as stored; the path's as key_url encoded them.
                key = urllib.parse.unquote(path[len(folder) + 1 :])
                if key in listing:
                    return listing[key]
        return None


# --- tf.data readers -------------------------------------------------------------------------


def _staging_dir() -> str:
    """A private folder for shards being read (RAM-backed /dev/shm when there is one)."""
    global _STAGING
    if _STAGING is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        _STAGING = tempfile.mkdtemp(prefix="petal-remote-", dir=base)
        atexit.register(shutil.rmtree, _STAGING, True)
    return _STAGING


_STAGING: str | None = None


# Redirects followed per object, as urllib does for the other requests.
MAX_REDIRECTS = 5


def download_to_file(
    url: str, path: str, *, size: int | None = None, block: int = 1 << 20
) -> int:
    """Stream the object at ``url`` into ``path`` with one request (following redirects);
    returns its size.

    ``size``: the object's size known beforehand (its records folder's manifest, or the
    store's listing). A body of another size fails, naming the URL: a connection closed
    part-way through a body with no ``Content-Length`` (chunked, or ended by the close)
    reads as its end, and would pass as a short file.
    """
    target, redirects, attempt = url, 0, 0
    while True:
        parts = urllib.parse.urlsplit(requote(target))
        conn_cls = _HTTPSConnection if parts.scheme == "https" else _HTTPConnection
        conn = conn_cls(parts.hostname, parts.port, timeout=TIMEOUT_S)
        try:
            conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
            resp = conn.getresponse()
            if resp.status == 503 and attempt < 3:
                resp.read()
                attempt += 1
                time.sleep(0.05 * attempt)
                continue
            if resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location"):
                resp.read()
                redirects += 1
                if redirects > MAX_REDIRECTS:
                    raise PetalError(f"More than {MAX_REDIRECTS} redirects reading {url}")
                target = urllib.parse.urljoin(target, resp.getheader("Location"))
                continue
            if resp.status == 404:
                raise FileNotFoundError(f"Not found: {url}")
            if resp.status == 503:
                raise PetalError(f"Server stayed busy reading {url}")
            if resp.status != 200:
                raise PetalError(f"HTTP {resp.status} reading {url}: {resp.reason}")
            with open(path, "wb") as f:
                return _copy_body(resp, url, f.write, block, size=size)
        except (OSError, http.client.HTTPException) as err:
            if isinstance(err, FileNotFoundError):
                raise
            raise _read_error(url, err) from err
        finally:
            conn.close()


def _copy_body(resp, url: str, write, block: int = 1 << 20, *, size: int | None = None) -> int:
    """Copies a response's body to ``write``; returns its size.

    A body shorter than its ``Content-Length`` or than ``size`` (the size known beforehand),
    a chunked body cut part-way (the connection closed: Python reads that as the end, or
    raises ``IncompleteRead``) and one that keeps trickling in (no socket timeout fires while
    a byte comes every few seconds) fail here, naming the URL, instead of passing as a short
    or never-ending file.
    """
    length = resp.getheader("Content-Length")
    expected = int(length) if length is not None and length.isdigit() else size
    copied = 0
    start = time.monotonic()
    while True:
        # read1: what has arrived, up to block (readinto waits for a full block, so a
        # trickle was checked only at its end).
        try:
            chunk = resp.read1(block)
        except http.client.IncompleteRead:
            raise _closed_error(url, copied, expected) from None
        if not chunk:
            break
        write(chunk)
        copied += len(chunk)
        elapsed = time.monotonic() - start
        if elapsed > TIMEOUT_S and copied < MIN_BYTES_PER_S * elapsed:
            raise PetalError(
                f"The store is stalling: {copied:,} bytes of {url} in {elapsed:.0f} s"
            )
    if expected is not None and copied < expected:
        raise _closed_error(url, copied, expected)
    if size is not None and copied != size:
        # All it promised came, but not the size known beforehand: the object changed.
        raise PetalError(
            f"{url} is {copied:,} bytes on the store, not the {size:,} its manifest or "
            "listing gave: it changed while being read"
        )
    return copied


def _closed_error(url: str, size: int, expected: int | None) -> PetalError:
    """The error for a body that ended after ``size`` bytes of ``expected`` (None: unknown)."""
    of = f" of {expected:,}" if expected is not None else ""
    return PetalError(f"The connection closed after {size:,}{of} bytes reading {url}")


class StoreErrors:
    """Failed requests of remote streams, in order (shared across pipelines).

    A request that fails inside a tf.data stream ends the stream: TensorFlow's error names
    neither the URL nor the cause, and ``ignore_errors`` (``skip_corrupt``) would end the
    stream without a word, leaving the rest unread as if it were corrupt. Each failure is
    kept here: :func:`store_error` turns the first one since a mark into the error to show.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.messages: list[str] = []

    def add(self, err: BaseException) -> None:
        text = str(err).strip().splitlines()
        message = text[0] if text else type(err).__name__
        if isinstance(err, FileNotFoundError):
            message = f"HTTP 404 ({message})"
        with self._lock:
            self.messages.append(message)

    def mark(self) -> int:
        return len(self.messages)


STORE_ERRORS = StoreErrors()


def store_error(mark: int, action: str) -> PetalError | None:
    """The error for the first request that failed since ``mark`` (:meth:`StoreErrors.mark`
    taken before ``action`` read anything), or None."""
    if len(STORE_ERRORS.messages) <= mark:
        return None
    first = STORE_ERRORS.messages[mark].rstrip(".")
    return PetalError(
        f"Reading the store failed: {first}. The data were not read to the end (nothing was "
        f"counted as corrupt): check the store and the network, then {action} again."
    )


# glibc's largest adaptive thresholds (its defaults grow up to these): buffers up to 32 MB
# come from the heap and are reused, and up to 64 MB of free heap stays with the process.
_MMAP_THRESHOLD = 32 << 20
_TRIM_THRESHOLD = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)


def restore_malloc_thresholds() -> bool:
    """Undoes what TensorFlow's first ``Dataset.from_generator`` iterator does to the process.

    That iterator sets glibc's ``M_TRIM_THRESHOLD`` to 128 KB ("Memory patch applied" in
    TensorFlow's log), which also ends glibc's adaptive mmap threshold: from then on every
    buffer over 128 KB (each batch of images) is mapped and unmapped afresh, page by page,
    and every tf.data pipeline of the process turns float32 batches out about 3x slower
    (cached images 11,645 -> 3,403 images/s; see benchmarks/README.md, session 23). Called
    when a remote reader's generator starts (after TensorFlow's patch): it sets the
    thresholds the adaptive ones grow to. True when set; False where there is no glibc.
    """
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )


@functools.cache
def _mallopt():
    """glibc's ``mallopt``, looked up once (each remote pass calls it), or None."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


def _prefetched(
    items, fetch, *, parallel: int, shuffle_seed=None, repeat: bool = False, reshuffle=False
):
    """A generator factory: ``fetch(item)`` run ``parallel`` at a time, yielded in order.

    Python threads, not ``tf.py_function``s in a parallel map: TensorFlow runs Python
    functions one at a time, which would serialise the requests. Each pass over ``items``
    (an epoch) has its own order when ``shuffle_seed`` is given; with ``repeat`` the passes
    never end and the next epoch's first requests start while this one is still read;
    without it, ``reshuffle`` gives each call (a pass of ``repeat()``) the next pass's order.
    """
    orders = _pass_orders(len(items), shuffle_seed, repeat, reshuffle)

    def generate():
        restore_malloc_thresholds()
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            pending: collections.deque = collections.deque()
            for i in orders():
                pending.append(pool.submit(fetch, items[i]))
                if len(pending) >= parallel:
                    yield _result(pending.popleft())
            while pending:
                yield _result(pending.popleft())

    return _ends_at_exit(generate)


# Whether this process made a Dataset.from_generator over a store. Tearing one down while
# its generator has a call in flight can deadlock on the GIL (seen after a failed request:
# petal evaluate printed its error and never exited), so the command leaves without that
# teardown (petal.cli.main), and a library caller's generators end at exit
# (_end_generators).
GENERATORS_MADE = False
# Set at exit: each generator over a store ends at its next call (see _ends_at_exit).
_EXITING = threading.Event()
# Each live generator over a store: whether a call of it is running. No lock: setting and
# popping an item are atomic, and a generator's clean-up can run in the middle of any code
# that allocates (the garbage collector ends one held in a reference cycle), where a lock
# held by the same thread would wait for ever.
_IN_CALL: dict[object, bool] = {}
_END = object()


def _ends_at_exit(generate):
    """``generate`` (a generator function for ``Dataset.from_generator``), ending at its
    next call once the process exits (:func:`_end_generators`), and saying whether a call
    is running."""

    @functools.wraps(generate)
    def ending(*args):
        inner, token = generate(*args), object()
        try:
            while not _EXITING.is_set():
                _IN_CALL[token] = True
                try:
                    item = next(inner, _END)
                finally:
                    _IN_CALL[token] = False
                if item is _END:
                    return
                yield item
        finally:
            _IN_CALL.pop(token, None)
            inner.close()

    return ending


@atexit.register
def _end_generators(limit_s: float = 10.0, idle_s: float = 0.2) -> None:
    """At exit, before the interpreter tears down a script's live iterators: ends the
    generators over a store, waiting (GIL released) until each has ended or none has had a
    call running for ``idle_s``, at most ``limit_s``. A library caller's process hung at
    exit, now and then, when the teardown met a generator's call in flight (the GIL)."""
    if not GENERATORS_MADE:
        return
    _EXITING.set()
    deadline, idle_since = time.monotonic() + limit_s, None
    while time.monotonic() < deadline:
        running = list(_IN_CALL.values())  # a copy made in C: no clean-up runs in it
        if not running:
            return
        now = time.monotonic()
        idle_since = None if any(running) else (idle_since or now)
        if idle_since is not None and now - idle_since >= idle_s:
            return
        time.sleep(0.01)


def records_dataset(
    urls,
    counts=None,
    *,
    sizes: dict[str, int] | None = None,
    shuffle_seed=None,
    deterministic=True,
    skip_corrupt=False,
    parallel: int = PARALLEL_REQUESTS,
    repeat: bool = False,
    reshuffle_each_iteration: bool = False,
):
    """Serialized records of remote shards (a tf.data.Dataset of scalar strings).

    Each shard is streamed with one request into a private RAM-backed staging file, then
    read by ``TFRecordDataset`` (CRC-checked and counted against ``counts`` like local
    shards). At most ``parallel`` shards are staged at once, those being read and those
    downloaded ahead together (so at most ``parallel`` shards' bytes in RAM): read once,
    up to ``parallel`` shards are all read at once; otherwise up to half of them are read
    while the next ones download. ``repeat``: endless epochs, downloads running ahead
    across the epoch boundary, at most one epoch ahead (use it when nothing downstream
    needs the end of an epoch). ``reshuffle_each_iteration`` (with ``shuffle_seed``, without
    ``repeat``): each iteration of the dataset, as ``repeat()`` makes one a pass, takes the
    next pass's order, as tf.data's shuffle does; else each takes the first pass's order (a
    cache filled again is filled in the same order). ``sizes``: the bytes of each URL known
    beforehand (:meth:`petal.data.reader.Source.file_bytes`); a download of another size is a failed
    request (see :func:`download_to_file`), not a short shard read as corrupt records.

    A staged file is deleted when its shard has been read, and every file of a pass when
    the pass ends: its iterator dropped or garbage-collected, its last shard taken or a
    download failed (a shard still being read stays readable: the reader holds it open, and
    its RAM is freed when the reader closes it). Nothing is left behind in the staging
    folder, which is removed when the process exits.
    """
    import tensorflow as tf

    from petal.data import reader

    graph = tf.autograph.experimental.do_not_convert  # no Python control flow on tensors
    urls = list(urls)
    expected = dict(zip(urls, counts if counts is not None else [-1] * len(urls), strict=True))
    parallel = max(1, int(parallel))
    if not repeat and len(urls) <= parallel:
        cycle = max(1, len(urls))  # everything at once, read round-robin as local shards are
    else:
        cycle = max(1, min(len(urls), parallel // 2))
    # Repeating few shards, the budget would otherwise fill with copies of the same ones.
    budget = min(parallel, cycle + len(urls)) if repeat else parallel

    global GENERATORS_MADE
    GENERATORS_MADE = True
    paths = tf.data.Dataset.from_generator(
        _staged_shards(
            urls,
            expected,
            sizes=dict(sizes or {}),
            budget=budget,
            shuffle_seed=shuffle_seed,
            repeat=repeat,
            deterministic=deterministic,
            reshuffle=reshuffle_each_iteration,
        ),
        output_signature=(
            tf.TensorSpec([], tf.string),
            tf.TensorSpec([], tf.string),
            tf.TensorSpec([], tf.int64),
        ),
    )

    def one_shard(path, url, count):
        if counts is None:
            records = tf.data.TFRecordDataset(path, buffer_size=1 << 20)
        else:
            records = reader.guarded_records(path, count, skip_corrupt=skip_corrupt, name=url)

        # The end of the shard deletes its file and frees its place in the budget. Scalar
        # strings, like the records, so the records' static shape stays.
        done = (
            tf.data.Dataset.from_tensors(path)
            .map(graph(lambda p: tf.ensure_shape(tf.py_function(_finished, [p], tf.string), [])))
            .filter(graph(lambda _: False))
        )
        return records.concatenate(done)

    # Sequential: it opens each shard as soon as it takes it (a parallel interleave takes
    # shards ahead and opens them later), so a pass that ends can delete every file it
    # staged: those being read stay readable until closed. The downloads are what runs in
    # parallel; reading from RAM is fast.
    ds = paths.interleave(graph(one_shard), cycle_length=cycle, block_length=1)
    return tfdata.untuned(ds)  # no autotune thread: see petal.data.tfdata


class _Staging:
    """The files one pass over :func:`records_dataset` has staged; ``held`` counts the shards
    given to the reader and not yet read to the end."""

    def __init__(self):
        # Re-entrant: the pass's generator closes it from its clean-up, which the garbage
        # collector can run in a download thread that holds the lock (see _IN_CALL).
        self.lock = threading.RLock()
        self.held = 0
        self.files: set[str] = set()
        self.closed = False

    def add(self, path: str) -> None:
        with self.lock:
            if self.closed:
                raise _PassClosed
            self.files.add(path)
        _STAGED[path] = self

    def remove(self, path: str, *, finished: bool = False) -> None:
        with self.lock:
            self.files.discard(path)
            self.held -= 1 if finished else 0
        with contextlib.suppress(OSError):
            os.remove(path)

    def close(self) -> None:
        """Deletes every file of the pass: those downloaded ahead, and those being read (the
        reader has them open and keeps reading; their space is freed when it closes them).
        Downloads still running delete theirs when they end."""
        empty = set()  # made before the lock: nothing allocated under it (see _IN_CALL)
        with self.lock:
            self.closed = True
            paths, self.files = self.files, empty
        for path in paths:
            with contextlib.suppress(OSError):
                os.remove(path)


class _PassClosed(Exception):
    """A download started for a pass that has ended."""


# Staged file -> its pass, for the end-of-shard hook; weak: a pass that has ended has
# deleted its files already. No lock, as for _IN_CALL: it is never iterated, so setting and
# popping an item are atomic.
_STAGED: weakref.WeakValueDictionary[str, _Staging] = weakref.WeakValueDictionary()


def _staged_shards(
    urls, expected, *, sizes, budget, shuffle_seed, repeat, deterministic, reshuffle=False
):
    """A generator factory: ``(staged path, url, count)`` of each shard to read, in the
    order of :func:`_order`; downloads run ahead in threads while the shards held by the
    reader plus those downloading stay within ``budget`` (one always runs, so a shard never
    read to the end cannot stall the rest).

    The pass ends when the reader asks for no more (the iterator dropped or collected, or,
    without ``repeat``, past the last shard) or a download fails: then it deletes every file
    it staged. The reader has opened each shard it was given by then (see
    :func:`records_dataset`), so nothing being read is lost.
    """

    orders = _pass_orders(len(urls), shuffle_seed, repeat, reshuffle)

    def generate():
        restore_malloc_thresholds()
        staging_dir, staging = _staging_dir(), _Staging()

        def fetch(url):
            path = os.path.join(staging_dir, f"{uuid.uuid4().hex}-{posixpath.basename(url)}")
            staging.add(path)
            try:
                download_to_file(url, path, size=sizes.get(url))
            except BaseException:
                staging.remove(path)
                raise
            if staging.closed:
                staging.remove(path)
            return path, url, expected[url]

        order = orders()
        pending: collections.deque = collections.deque()
        pool = ThreadPoolExecutor(max_workers=budget, thread_name_prefix="petal-shards")
        try:
            while True:
                while not pending or len(pending) + staging.held < budget:
                    i = next(order, None)
                    if i is None:
                        break
                    pending.append(pool.submit(fetch, urls[i]))
                if not pending:
                    return
                future = pending[0]
                if not deterministic and not future.done():
                    # Whichever download ends first.
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    future = next(f for f in pending if f in done)
                pending.remove(future)
                item = _result(future)
                with staging.lock:
                    staging.held += 1
                yield item
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            staging.close()

    return _ends_at_exit(generate)


def _pass_orders(n: int, shuffle_seed, repeat: bool, reshuffle: bool):
    """A function that gives, at each call (a generator's pass), :func:`_order`: with
    ``reshuffle`` the next pass's order each call, else the first pass's every time."""
    passes = itertools.count()
    return lambda: _order(n, shuffle_seed, repeat, first_pass=next(passes) if reshuffle else 0)


def _order(n: int, shuffle_seed, repeat: bool, first_pass: int = 0):
    """Indices of ``n`` items, pass after pass from ``first_pass`` when ``repeat``; each pass
    (an epoch) in its own order when ``shuffle_seed`` is given."""
    epoch = first_pass
    while True:
        indices = list(range(n))
        if shuffle_seed is not None:
            random.Random(f"{shuffle_seed}:{epoch}").shuffle(indices)
        yield from indices
        epoch += 1
        if not repeat:
            return


def _result(future):
    try:
        return future.result()
    except Exception as err:
        STORE_ERRORS.add(err)
        raise


def _finished(path) -> bytes:
    """End of a shard: its file is deleted and its place in the budget freed."""
    path = path.numpy().decode("utf-8")
    staging = _STAGED.pop(path, None)
    if staging is not None:
        staging.remove(path, finished=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)
    return b""


def files_dataset(
    urls,
    labels,
    *,
    shuffle_seed=None,
    parallel: int = PARALLEL_REQUESTS,
    repeat: bool = False,
    reshuffle_each_iteration: bool = False,
    with_urls: bool = False,
):
    """``(file bytes, label)`` for each URL, one request per file: the per-file path;
    ``(file bytes, label, URL)`` with ``with_urls`` (a file that does not decode is named).

    ``parallel`` requests are in flight at once; with ``shuffle_seed`` the order changes
    every pass; ``repeat`` and ``reshuffle_each_iteration`` as in :func:`records_dataset`.
    """
    import tensorflow as tf

    global GENERATORS_MADE
    GENERATORS_MADE = True
    items = list(zip(list(urls), [int(v) for v in labels], strict=True))
    signature = (tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int32))
    if with_urls:
        signature += (tf.TensorSpec([], tf.string),)

    def fetch(item):
        url, label = item
        data = get_bytes(url)
        return (data, label, url) if with_urls else (data, label)

    ds = tf.data.Dataset.from_generator(
        _prefetched(
            items,
            fetch,
            parallel=parallel,
            shuffle_seed=shuffle_seed,
            repeat=repeat,
            reshuffle=reshuffle_each_iteration,
        ),
        output_signature=signature,
    )
    return tfdata.untuned(ds)  # no autotune thread: see petal.data.tfdata
