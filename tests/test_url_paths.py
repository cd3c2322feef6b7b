"""URLs where petal writes or reads on a local disk only (run folders, evaluations, exports,
config and weights files) are refused in one line, before any work: a Path made the local
folder ``gs:/bucket/run`` of ``gs://bucket/run`` and the command went on into it."""

import os

import pytest

from petal import cli
from petal.errors import PetalError


def test_refuse_url_names_the_option_the_value_and_the_copy_to_make():
    from petal.data.folders import refuse_url

    refuse_url(None, "--out", "exports")
    refuse_url("runs/a", "--workdir", "run folders")
    refuse_url("/tmp/gs:/b", "--workdir", "run folders")  # a local path, however odd
    with pytest.raises(PetalError) as err:
        refuse_url("gs://bucket/run", "--workdir", "run folders")
    text = str(err.value)
    assert text.startswith("--workdir gs://bucket/run is a URL: petal writes run folders on a")
    assert "copy it to gs://bucket/run afterwards (gcloud storage cp -r" in text
    with pytest.raises(PetalError, match=r"^--weights S3://b/w\.h5 is a URL: petal reads") as err:
        refuse_url("S3://b/w.h5", "--weights", "weights files", reads=True, folder=False)
    assert "(aws s3 cp)" in str(err.value)  # a file: no --recursive
    with pytest.raises(PetalError, match=r"^--out http://host/e is a URL"):
        refuse_url("http://host/e", "--out", "evaluations")


@pytest.mark.parametrize(
    "argv, shown",
    [
        (["train", "--data", "small", "--workdir", "gs://bucket/run"], "--workdir gs://bucket/run"),
        (["train", "--resume", "--workdir", "gs://bucket/run"], "--workdir gs://bucket/run"),
        (["train", "--config", "gs://b/c.json"], "--config gs://b/c.json"),
        (["train", "--weights", "gs://b/w.weights.h5"], "--weights gs://b/w.weights.h5"),
        (["evaluate", "gs://bucket/run"], "WORKDIR gs://bucket/run"),
        (["evaluate", "run", "--out", "http://127.0.0.1:1/ev"], "--out http://127.0.0.1:1/ev"),
        (["predict", "s3://b/run", "a.jpg"], "WORKDIR s3://b/run"),
        (["export", "gs://bucket/run"], "WORKDIR gs://bucket/run"),
        (["export", "run", "--out", "gs://b/exp"], "--out gs://b/exp"),
        (["report", "gs://b/run"], "WORKDIR gs://b/run"),
        (["demo", "--workdir", "gs://b/demo"], "--workdir gs://b/demo"),
        (["bench", "input", "records", "--json", "gs://b/r.json"], "--json gs://b/r.json"),
    ],
)
def test_commands_refuse_a_url_for_a_local_path_before_any_work(
    argv, shown, tmp_path, monkeypatch, capsys
):
    def no_work():
        raise AssertionError("TensorFlow started: the URL was not refused first")

    monkeypatch.setattr(cli, "start_tensorflow_quietly", no_work)
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"petal {argv[0]}: error: {shown} is a URL: petal ")
    assert err.count("\n") == 1
    assert os.listdir(tmp_path) == []  # no local gs:/ or http:/ folder


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--data", "gs://b/records", "--workdir", "runs/a", "--weights", "imagenet"],
        ["evaluate", "runs/a", "--data", "http://127.0.0.1:1/records", "--out", "runs/a/ev"],
        ["convert", "gs://b/photos", "gs://b/records"],
        ["bench", "input", "gs://b/records"],
    ],
)
def test_data_may_still_be_a_url(argv):
    cli.refuse_urls(cli.build_parser().parse_args(argv))


def test_train_refuses_a_url_workdir_before_reading_the_data(tmp_path, monkeypatch):
    from petal.training.config import get_preset
    from petal.training.loop import train

    monkeypatch.chdir(tmp_path)
    config = get_preset("quick").replace(data=str(tmp_path / "records"), epochs=1)
    with pytest.raises(PetalError, match=r"^workdir gs://b/run is a URL: petal writes run"):
        train(config, "gs://b/run", log=lambda line: None)
    assert os.listdir(tmp_path) == []


def _resume(path):
    from petal.training.loop import resume_config

    return resume_config(path)


def _config_file(path):
    from petal.training.config import load_config

    return load_config("quick", path)


def _weights(path):
    from petal.training.config import load_config

    return load_config("quick", weights=path)


def _export_out(path):
    from petal.evaluation.export import export

    return export("run", path)


def _export_run(path):
    from petal.evaluation.export import export

    return export(path)


@pytest.mark.parametrize(
    "call, shown",
    [
        (_resume, "workdir gs://b/run is a URL: petal reads run folders"),
        (_config_file, "Config file gs://b/run is a URL: petal reads config files"),
        (_weights, "weights gs://b/run is a URL: petal reads weights files"),
        (_export_out, "out gs://b/run is a URL: petal writes exports"),
        (_export_run, "workdir gs://b/run is a URL: petal reads run folders"),
    ],
)
def test_library_entry_points_refuse_urls(call, shown, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PetalError) as err:
        call("gs://b/run")
    assert str(err.value).startswith(shown)
    assert os.listdir(tmp_path) == []


def test_reading_a_run_and_writing_an_evaluation_refuse_urls_in_the_library(
    trained, small_records, tmp_path, monkeypatch
):
    """open_run and check_output_folder (evaluate, predict, report, export's library calls):
    gs://b/run was opened as the local folder gs:/b/run ("is not a petal work directory")."""
    from petal.evaluation.evaluate import evaluate
    from petal.evaluation.report import build_report
    from petal.evaluation.workdir import open_run

    monkeypatch.chdir(tmp_path)
    for call in (lambda: open_run("gs://b/run"), lambda: build_report("gs://b/run")):
        with pytest.raises(PetalError, match=r"^workdir gs://b/run is a URL: petal reads run"):
            call()
    with pytest.raises(PetalError, match=r"^--out gs://b/ev is a URL: petal writes evaluations"):
        evaluate(trained, small_records, out_dir="gs://b/ev", log=lambda line: None)
    assert os.listdir(tmp_path) == []


def test_a_url_made_a_path_is_refused_as_the_url_it_was(
    trained, small_records, tmp_path, monkeypatch
):
    """Path("gs://b/x") is the local path gs:/b/x: train, evaluate, export and convert wrote
    into a folder ./gs:/b/x. Refused as the URL; convert, which writes to gs://, asks for
    the URL as a string."""
    from pathlib import Path

    from petal.data import convert
    from petal.data.folders import refuse_url
    from petal.evaluation.evaluate import evaluate
    from petal.evaluation.export import export
    from petal.training.config import get_preset
    from petal.training.loop import train

    monkeypatch.chdir(tmp_path)
    quiet = lambda line: None  # noqa: E731
    config = get_preset("quick").replace(data=str(small_records), epochs=1)
    lost = "is a URL that lost a slash (gs://b/x, as pathlib.Path makes it)"
    for call, shown in (
        (lambda: train(config, Path("gs://b/x"), log=quiet),
         f"workdir gs:/b/x {lost}: petal writes run folders on a local disk; pass a local "
         "path and copy it to gs://b/x afterwards (gcloud storage cp -r"),
        (lambda: evaluate(trained, small_records, out_dir=Path("gs://b/x"), log=quiet),
         f"--out gs:/b/x {lost}: petal writes evaluations"),
        (lambda: export(trained, Path("gs://b/x")), f"out gs:/b/x {lost}: petal writes exports"),
        (lambda: convert("photos", Path("gs://b/x")),
         f"output gs:/b/x {lost}; pass the URL as a string, not a Path."),
        (lambda: refuse_url("HTTPS:/h/x", "--out", "exports"),
         "--out HTTPS:/h/x is a URL that lost a slash (HTTPS://h/x,"),
        (lambda: refuse_url("s3:", "--workdir", "run folders", reads=True),
         "--workdir s3: is a URL that lost a slash (s3://, as pathlib.Path makes it): petal "
         "reads run folders from a local disk; copy it to a local disk first (aws s3 cp"),
    ):
        with pytest.raises(PetalError) as err:
            call()
        assert str(err.value).startswith(shown), str(err.value)
    assert os.listdir(tmp_path) == []
    refuse_url("gs:b/x", "--out", "exports")  # no URL: a local folder named so
    refuse_url("gsx:/b/x", "--out", "exports")


def test_convert_takes_file_colon_strings_as_local_paths_and_a_file_path_url_keeps_its_slash():
    # `petal convert file:/photos DST` (a folder named "file:") was refused, and the fix
    # for Path("file:///tmp/x") said file://tmp/x, a host "tmp".
    from pathlib import Path

    from petal.data.folders import refuse_url

    refuse_url("file:/photos", "source", "records", urls=True)  # a string: as given
    with pytest.raises(PetalError) as err:
        refuse_url(Path("file:///tmp/x"), "source", "records", urls=True)
    assert str(err.value) == ("source file:/tmp/x is a URL that lost a slash (file:///tmp/x, as "
                              "pathlib.Path makes it); pass the URL as a string, not a Path.")
