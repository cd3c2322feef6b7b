"""Remote reads: the loopback object server and petal's http:// read path."""

from __future__ import annotations

import shutil
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import image_ids
from petal.data import remote
from petal.data.pipeline import eval_dataset, train_dataset
from petal.data.reader import open_source
from petal.errors import PetalError


def test_server_get_range_list_and_refusals(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "secret.txt").write_text("no")
    with remote.ObjectServer({"data": tmp_path / "a"}) as server:
        url = server.url("data/x.bin")
        assert server.url().startswith("http://127.0.0.1:")
        assert remote.get_bytes(url) == bytes(range(256)) * 4
        assert remote._request(url, byte_range=(10, 19)) == bytes(range(10, 20))
        assert remote.object_size(url) == 1024
        assert remote.list_objects(server.url("data")) == {"x.bin": 1024}
        with pytest.raises(FileNotFoundError):
            remote.get_bytes(server.url("data/missing.bin"))
        for escape in ("data/../secret.txt", "secret.txt"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(server.url("") + "/" + escape, timeout=10)
            assert err.value.code in (403, 404)
    with pytest.raises(PetalError, match="loopback"):
        remote.ObjectServer(tmp_path, host="0.0.0.0")


def test_latency_is_per_request(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    with remote.ObjectServer(tmp_path, latency_ms=30) as server:
        start = time.perf_counter()
        for _ in range(3):
            remote.get_bytes(server.url("f"))
        assert time.perf_counter() - start >= 0.09
        assert server.requests == 3


def test_server_stops_itself_when_idle(tmp_path):
    server = remote.ObjectServer(tmp_path, idle_timeout=0.5).start()
    try:
        deadline = time.time() + 10
        while not server._stopped.is_set() and time.time() < deadline:
            time.sleep(0.2)
        assert server._stopped.is_set()
    finally:
        server.stop()


def test_records_over_http_match_local(make_records):
    folder = make_records(counts={"train": [7, 6], "validation": [5, 4]})
    with remote.ObjectServer({"records": folder}, latency_ms=1) as server:
        src = open_source(server.url("records"))
        assert src.kind == "records" and src.remote and src.count("validation") == 9
        ids = image_ids(eval_dataset(src, batch_size=4, normalization="raw"))
        assert ids == image_ids(eval_dataset(str(folder), batch_size=4, normalization="raw"))
        assert sorted(ids) == list(range(13, 22))
        train = train_dataset(src, batch_size=13, augment=None, normalization="raw", seed=0)
        assert all(sorted(image_ids([batch])) == list(range(13)) for batch in train.take(2))


def test_corrupt_remote_shard_names_the_url(make_records):
    folder = make_records(counts={"train": [7], "validation": [5]})
    path = folder / "validation-00000-of-00001-5.tfrec"
    data = bytearray(path.read_bytes())
    data[-30] ^= 0xFF  # inside the last record's pixels: a CRC failure at record 4
    path.write_bytes(bytes(data))
    with remote.ObjectServer({"records": folder}) as server:
        src = open_source(server.url("records"))
        with pytest.raises(Exception, match=r"http://127\.0\.0\.1:\d+/records/validation-00000"):
            list(eval_dataset(src, batch_size=2))


def test_image_folder_over_http_one_request_per_file(small_flowers, tmp_path):
    # Hidden entries are not read over http either, as in a local folder.
    images = tmp_path / "images"
    shutil.copytree(small_flowers, images, symlinks=False)
    photo = next((images / "daisy").iterdir()).read_bytes()
    (images / "__MACOSX" / "daisy").mkdir(parents=True)
    (images / "__MACOSX" / "daisy" / "._a.jpg").write_bytes(b"Mac OS X")
    (images / "daisy" / ".ipynb_checkpoints").mkdir()
    (images / "daisy" / ".ipynb_checkpoints" / "a-checkpoint.jpg").write_bytes(photo)
    with remote.ObjectServer({"images": images}) as server:
        src = open_source(server.url("images"))
        assert src.kind == "folder" and src.count("all") == 60
        assert src.classes == open_source(str(small_flowers)).classes
        before = server.requests
        ds = eval_dataset(src, batch_size=8, image_size=16, label_mode="sparse")
        labels = np.concatenate([y.numpy() for _, y in ds])
        assert len(labels) == src.count("validation")
        assert server.requests - before == src.count("validation")
