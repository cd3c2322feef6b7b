"""TrainConfig, presets and config loading: preset < file < flags < --set (no TensorFlow)."""

from __future__ import annotations

import json
import re

import pytest

from petal.errors import PetalError
from petal.training.config import (
    TrainConfig,
    apply_overrides,
    config_from_json,
    get_preset,
    list_presets,
    load_config,
    parse_overrides,
    preset_doc,
    save_config,
)


def test_every_preset_is_valid_and_documented():
    names = list_presets()
    for required in (
        "codelab-squeezenet",
        "codelab-xception",
        "codelab-convnet",
        "codelab-dense",
        "quick",
        "squeezenet-plus",
    ):
        assert required in names
    for name in names:
        cfg = get_preset(name).validate()
        assert cfg.preset == name
        assert len(preset_doc(name)) > 20, name


def test_codelab_presets_follow_the_codelab():
    sq = get_preset("codelab-squeezenet")
    assert (sq.model, sq.image_size, sq.epochs, sq.batch_size) == ("squeezenet", 192, 35, 16)
    assert sq.single_device_batch_size == 32
    assert (sq.optimizer, sq.learning_rate, sq.schedule, sq.augment) == (
        "adam",
        1e-3,
        "constant",
        "codelab",
    )
    assert sq.cache is True
    xc = get_preset("codelab-xception")
    assert (xc.model, xc.weights, xc.image_size, xc.epochs) == ("xception", "imagenet", 331, 12)
    assert xc.schedule == "codelab_ramp" and xc.fine_tune == "all"
    # rampup_epochs: the codelab's for the replicas (5, 7 on a TPU pod).
    assert "rampup_epochs" not in xc.schedule_options and xc.schedule_options["decay"] == 0.8
    # The codelab feeds /255 pixels (codelab.md 1.3), not the [-1, 1] of the weights.
    assert xc.normalization == "unit"
    conv = get_preset("codelab-convnet")
    assert (conv.model, conv.epochs, conv.single_device_batch_size, conv.augment) == (
        "convnet",
        20,
        32,
        "none",
    )
    assert get_preset("codelab-dense").model == "dense"
    plus = get_preset("squeezenet-plus")
    assert (plus.optimizer, plus.schedule, plus.label_smoothing) == ("adamw", "warmup_cosine", 0.1)


def test_presets_are_fresh_copies():
    a = get_preset("quick")
    a.schedule_options["warmup_epochs"] = 99
    assert get_preset("quick").schedule_options["warmup_epochs"] != 99


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(PetalError, match="codelab-squeezenet.*quick"):
        get_preset("nope")


def test_parse_overrides_json_values_and_strings():
    got = parse_overrides(
        [
            "epochs=3",
            "learning_rate=1e-4",
            "cache=false",
            "weights=null",
            "augment=flip+crop",
            "schedule_options.warmup_epochs=2",
        ]
    )
    assert got == {
        "epochs": 3,
        "learning_rate": 1e-4,
        "cache": False,
        "weights": None,
        "augment": "flip+crop",
        "schedule_options.warmup_epochs": 2,
    }
    with pytest.raises(PetalError, match="key=value"):
        parse_overrides(["epochs"])


def test_set_takes_a_path_or_name_that_looks_like_a_number_as_text():
    """``--set data=2024`` (a records folder named 2024) was read as the number 2024 and
    refused as "data must be a string or null", which named no fix."""
    got = parse_overrides(["data=2024", "weights=1.50", "classes=3", "epochs=3"])
    assert got == {"data": "2024", "weights": "1.50", "classes": "3", "epochs": 3}
    assert parse_overrides(["cache=false", "data=null"]) == {"cache": False, "data": None}
    assert load_config("quick", None, ["data=2024"]).data == "2024"


def test_set_takes_numbers_as_python_writes_them():
    """JSON refuses ``.001``, ``5.`` and ``+1``: they were taken as strings, and refused as
    "learning_rate must be a number or null"."""
    cfg = load_config(
        "quick",
        None,
        ["learning_rate=.001", "epochs=+3", "label_smoothing=0.", "shuffle_buffer=1_000",
         "momentum=.5e-0", "schedule_options.warmup_epochs=.5"],
    )
    assert (cfg.learning_rate, cfg.epochs, cfg.label_smoothing, cfg.shuffle_buffer,
            cfg.momentum) == (0.001, 3, 0.0, 1000, 0.5)
    assert cfg.schedule_options == {"warmup_epochs": 0.5}
    assert load_config("quick", None, ["learning_rate=5."]).learning_rate == 5.0
    assert load_config("quick", None, ["epochs=4."]).epochs == 4
    # Words float() would take, and things that only start like numbers, stay strings.
    assert parse_overrides(["a=nan", "b=inf", "c=1__0", "d=1.2.3", "e=+", "f=."]) == {
        "a": "nan", "b": "inf", "c": "1__0", "d": "1.2.3", "e": "+", "f": "."
    }
    with pytest.raises(PetalError, match=r"^momentum must be in \[0, 1\]\. Received: "):
        load_config("quick", None, ["momentum=-.5"])


def test_precedence_preset_file_flags_set(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"preset": "quick", "epochs": 4, "batch_size": 8, "seed": 1}))
    cfg = load_config(
        None,
        path,
        ["batch_size=4", "schedule_options.warmup_epochs=0"],
        batch_size=16,
        epochs=None,
        model=None,
    )
    assert cfg.preset == "quick"  # from the file
    assert cfg.image_size == get_preset("quick").image_size  # from the preset
    assert cfg.epochs == 4  # file (the flag was not given)
    assert cfg.batch_size == 4  # --set beats the flag, which beat the file
    assert cfg.seed == 1
    assert cfg.schedule_options == {"warmup_epochs": 0}
    # The same preset named twice is one; another is refused (test at the end of this file).
    assert load_config("quick", path).epochs == 4


def test_weights_none_and_imagenet_are_read_in_any_case(tmp_path):
    """`--weights none` meant no weights, but `--set weights=none` (or a config file's
    "none") was taken for a file named none, and `--weights IMAGENET` for one named
    IMAGENET: both failed as files not found."""
    quick = get_preset("quick")
    for value, meant in (("none", None), ("None", None), ("IMAGENET", "imagenet")):
        assert apply_overrides(quick, {"weights": value}, "--set").weights == meant
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"weights": "NONE"}))
    assert load_config(preset="quick", config_file=path).weights is None
    assert load_config(preset="quick", weights="ImageNet").weights == "imagenet"  # a flag


def test_named_choices_are_read_in_any_case():
    """cache=RAM and weights=NONE were taken, but optimizer=Adam (Keras' own spelling),
    normalization=Unit, fine_tune=Head_then_all and class_weight=none were refused."""
    cfg = load_config("quick", overrides=["optimizer=Adam", "normalization=Unit",
                                          "class_weight=Balanced", "schedule=Constant"])
    assert (cfg.optimizer, cfg.normalization, cfg.class_weight, cfg.schedule) == (
        "adam", "unit", "balanced", "constant")
    assert load_config("quick", overrides=["class_weight=none"]).class_weight is None
    with pytest.raises(PetalError, match=r"Unknown optimizer 'Adamm' \(did you mean 'adam'\?\); "
                       r"valid: adam, adamw, sgd, rmsprop\. Received: optimizer='Adamm'$"):
        load_config("quick", overrides=["optimizer=Adamm"])


def test_set_preset_is_refused():
    with pytest.raises(PetalError, match=r"preset is chosen with --preset NAME, which sets every "
                       r"field; --set preset=\.\.\. would only rename the run"):
        load_config("quick", overrides=["preset=codelab-squeezenet"])


def test_paths_as_path_objects_and_one_override_as_a_string(tmp_path):
    cfg = get_preset("quick").replace(data=tmp_path / "records", weights=tmp_path / "w.h5")
    assert cfg.data == str(tmp_path / "records") and cfg.weights == str(tmp_path / "w.h5")
    assert load_config("quick", overrides="epochs=2").epochs == 2  # was read per character


def test_a_batch_size_or_schedule_given_replaces_what_belonged_to_the_presets():
    """codelab-squeezenet trains at 32 on one device: --batch-size 8 was ignored there (and
    codelab-dense's 128 refused a small dataset, telling the user to lower batch_size);
    --set schedule=constant failed on the preset schedule's warm-up option."""
    cfg = load_config("codelab-squeezenet", batch_size=8)
    assert (cfg.batch_size, cfg.single_device_batch_size) == (8, None)
    assert load_config("codelab-squeezenet").single_device_batch_size == 32
    both = load_config("codelab-dense", overrides=["batch_size=8", "single_device_batch_size=16"])
    assert (both.batch_size, both.single_device_batch_size) == (8, 16)
    assert load_config("quick", overrides=["schedule=constant"]).schedule_options == {}
    assert load_config(
        "quick", overrides=["schedule=constant", "schedule_options.lr=0.1"]
    ).schedule_options == {"lr": 0.1}
    # The same schedule keeps its options.
    kept = load_config("quick", overrides=["schedule=warmup_cosine"]).schedule_options
    assert kept == get_preset("quick").schedule_options


def test_a_presets_normalization_stays_with_its_model(tmp_path):
    """codelab-xception's [0, 1] pixels (the codelab's, for xception) carried over to
    --model mobilenet_v2 (whose weights learned [-1, 1]) and efficientnet_v2_b0 (0..255)."""
    assert load_config("codelab-xception").normalization == "unit"
    assert load_config("codelab-xception", model="xception").normalization == "unit"
    assert load_config("codelab-xception", model="mobilenet_v2").normalization is None
    assert load_config("codelab-xception", overrides=["model=efficientnet_v2_b0"]).normalization \
        is None
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"preset": "codelab-xception", "model": "mobilenet_v2"}))
    assert load_config(None, path).normalization is None
    # Asked for, it stays.
    kept = load_config("codelab-xception", overrides=["normalization=unit"], model="mobilenet_v2")
    assert kept.normalization == "unit"
    path.write_text(json.dumps({"model": "mobilenet_v2", "normalization": "unit"}))
    assert load_config("codelab-xception", path).normalization == "unit"
    # A resumed run's config is no preset: what it saved stays.
    base = get_preset("codelab-xception")
    assert load_config(None, None, ["model=mobilenet_v2"], base=base).normalization == "unit"


def test_replace_with_another_model_drops_what_was_chosen_for_the_old_one():
    """get_preset("codelab-xception").replace(model="mobilenet_v2"), the README's way to
    build a config in Python, kept xception's [0, 1] pixels for ImageNet weights that
    learned [-1, 1]; --model on the command line drops them."""
    xception = get_preset("codelab-xception")
    assert xception.replace(model="mobilenet_v2").normalization is None
    assert xception.replace(epochs=3).normalization == "unit"  # the same model: kept
    assert xception.replace(model="mobilenet_v2", normalization="unit").normalization == "unit"
    plus = get_preset("squeezenet-plus")
    assert plus.replace(model="dense").model_options == {}
    assert plus.replace(model="squeezenet").model_options == plus.model_options
    kept = plus.replace(model="squeezenet_separable", **{"model_options.stem_stride": 1})
    assert kept.model_options == {"stem_stride": 1}


def test_base_config_is_used_without_a_preset():
    base = get_preset("quick").replace(epochs=3)
    assert load_config(None, None, ["epochs=5"], base=base).epochs == 5
    assert load_config(None, None, [], base=base).image_size == base.image_size


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"epochs": 0}, "epochs must be a positive integer"),
        # Past int64 a traceback from TensorFlow's tensor conversion.
        ({"eval_batch_size": 10**20}, r"^eval_batch_size must be a positive integer \(at most "
                                      r"2147483647\)\. Received: eval_batch_size=10{20}$"),
        ({"shuffle_buffer": 10**12}, r"shuffle_buffer must be a positive integer \(at most"),
        # --set augment= (its value left out) trained with no augmentation, without a word.
        ({"augment": " "}, r"^augment is empty; pass a recipe .* or 'none' for no augmentation"),
        ({"epochs": "3"}, "epochs must be a whole number"),
        ({"batch_size": 2.5}, "batch_size must be a whole number"),
        ({"optimizer": "lion"}, "Unknown optimizer 'lion'; valid: adam, adamw"),
        ({"schedule": "step"}, "Unknown schedule"),
        ({"class_weight": "inverse"}, "Unknown class_weight"),
        ({"fine_tune": "head_then_all", "head_epochs": 2}, "pretrained weights"),
        ({"fine_tune": "head_then_all", "weights": "imagenet", "head_epochs": 40}, "head_epochs"),
        # Checked before the head trains (it failed after, as a schedule's peak_lr).
        ({"fine_tune": "head_then_all", "weights": "imagenet", "head_epochs": 1,
          "fine_tune_lr_factor": -1}, r"fine_tune_lr_factor .* must be a positive number"),
        ({"fine_tune": "head_then_all", "weights": "imagenet", "head_epochs": 1,
          "fine_tune_lr_factor": 0.0}, r"must be a positive number\. Received: "
                                       r"fine_tune_lr_factor=0\.0"),
        ({"head_epochs": 1}, "only used with fine_tune"),
        # The full phase unfroze the backbone regardless.
        ({"fine_tune": "head_then_all", "weights": "imagenet", "head_epochs": 1,
          "model_options": {"backbone_trainable": False}},
         r"^fine_tune='head_then_all' unfreezes the backbone after head_epochs, which "
         r"model_options\.backbone_trainable=false forbids: drop that option, or use "
         r"fine_tune='all'"),
        ({"label_smoothing": 1.0}, "label_smoothing"),
        ({"learning_rate": None}, "codelab_ramp"),
        ({"cache": "sometimes"}, "cache must be"),
        # Before TensorFlow is involved: Keras raised a traceback for momentum, and took a
        # negative weight decay or clipnorm without a word.
        ({"optimizer": "sgd", "momentum": 2.0}, r"momentum must be in \[0, 1\]"),
        ({"optimizer": "adamw", "weight_decay": -1.0}, "weight_decay must be >= 0"),
        # Keras' Adam and RMSprop have no decoupled decay: it was ignored without a word.
        ({"optimizer": "adam", "weight_decay": 0.05}, r"optimizer 'adam' takes no weight decay"),
        ({"weight_decay": float("nan")}, r"weight_decay must be a finite number >= 0 \(e"),
        ({"clipnorm": -1.0}, "clipnorm must be > 0, or null"),
        ({"learning_rate": float("inf")}, r"learning_rate must be a finite number > 0 \(e"),
        ({"classes": "daisy,,roses"}, "comma-separated non-empty names"),
        ({"classes": "daisy,daisy"}, "names 'daisy' twice"),
        ({"classes": [1, 2]}, r"^classes must be a string or null"),
    ],
)
def test_bad_values_name_the_field(values, match):
    with pytest.raises(PetalError, match=match):
        apply_overrides(TrainConfig(), values).validate()


def test_unknown_key_lists_valid_keys(tmp_path):
    with pytest.raises(PetalError, match="Unknown config key 'epoch'.*Valid keys: preset"):
        load_config("quick", None, ["epoch=3"])
    # A typo is answered with the key meant, ahead of the list of all 38.
    for typo, meant in (("epoch", "epochs"), ("lerning_rate", "learning_rate"),
                        ("batchsize", "batch_size"), ("Epochs", "epochs")):  # fmt: skip
        with pytest.raises(PetalError, match=rf"'{typo}' \(from --set\); did you mean '{meant}'\?"):
            load_config("quick", None, [f"{typo}=3"])
    with pytest.raises(PetalError) as err:
        load_config("quick", None, ["colour=3"])
    assert "did you mean" not in str(err.value)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PetalError, match="not valid JSON"):
        load_config(None, bad)
    with pytest.raises(PetalError, match="not found"):
        load_config(None, tmp_path / "missing.json")
    # Not UTF-8 (a UnicodeDecodeError traceback): the same one line, with the fix.
    bad.write_bytes(b"\xff\xfe{}")
    with pytest.raises(PetalError, match=r"Config file .*bad.json is not valid JSON: 'utf-8' "
                       r"codec can't decode .*\. Pass a JSON file of TrainConfig fields"):
        load_config(None, bad)
    # A run's damaged config.json says what mends it.
    from petal.training.loop import resume_config

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text('{"epochs": ')
    with pytest.raises(PetalError, match=r"is not valid JSON: .*\. The run's config.json is "
                       r"damaged: restore it, or start again with --overwrite\.$"):
        resume_config(tmp_path / "run")


def test_int_given_for_float_and_integral_float_for_int():
    cfg = apply_overrides(TrainConfig(), {"learning_rate": 1, "epochs": 3.0})
    assert cfg.learning_rate == 1.0 and isinstance(cfg.learning_rate, float)
    assert cfg.epochs == 3 and isinstance(cfg.epochs, int)


def test_saved_config_round_trips(tmp_path):
    cfg = get_preset("squeezenet-plus").replace(data="/some/records")
    save_config(cfg, tmp_path / "config.json", classes=["a", "b"])
    assert json.loads((tmp_path / "config.json").read_text())["resolved"]["classes"] == ["a", "b"]
    assert config_from_json(tmp_path / "config.json") == cfg


def test_a_runs_config_json_is_a_config_file(tmp_path):
    """A run's own config.json starts another run (its resolved facts are not fields); on
    a resumed run a file naming another preset is refused, as --resume --preset is."""
    cfg = get_preset("squeezenet-plus").replace(data="/some/records", epochs=7)
    save_config(cfg, tmp_path / "config.json", classes=["a", "b"], val_count=12)
    assert load_config(None, tmp_path / "config.json") == cfg
    assert load_config(None, tmp_path / "config.json", ["epochs=9"]).epochs == 9
    base = get_preset("quick")
    assert load_config(None, tmp_path / "config.json", base=cfg) == cfg
    with pytest.raises(PetalError, match=r"names preset 'squeezenet-plus'.*run being resumed "
                       r"is 'quick'"):
        load_config(None, tmp_path / "config.json", base=base)


def test_train_cli_flags_reach_the_config(monkeypatch, tmp_path):
    from petal import cli
    from petal.training import loop

    seen = {}
    monkeypatch.setattr(
        loop, "train", lambda config, workdir, **kw: seen.update(config=config, workdir=workdir, **kw)
    )
    argv = ["train", "--preset", "squeezenet-plus", "--data", str(tmp_path), "--workdir",
            str(tmp_path / "run"), "--epochs", "3", "--skip-corrupt", "--overwrite"]
    assert cli.main(argv) == 0
    cfg = seen["config"]
    assert cfg.skip_corrupt and cfg.epochs == 3 and seen["overwrite"] and not seen["resume"]
    assert cfg.model_options == {"any_size": True, "stem_stride": 2}
    assert cli.main(argv[:-2]) == 0 and not seen["config"].skip_corrupt
    # --weights none, in any case, drops a preset's ImageNet weights; --set still wins.
    xception = ["train", "--preset", "codelab-xception", "--data", str(tmp_path), "--workdir",
                str(tmp_path / "x")]  # fmt: skip
    assert cli.main([*xception, "--weights", "NONE"]) == 0 and seen["config"].weights is None
    assert cli.main([*xception, "--weights", "none", "--set", "weights=imagenet"]) == 0
    assert seen["config"].weights == "imagenet"


@pytest.mark.parametrize("key", ["name", "num_classes", "image_size", "weights", "log"])
def test_model_options_that_are_create_models_own_arguments_are_refused(key):
    # They reached create_model twice: a TypeError traceback from petal train.
    with pytest.raises(PetalError, match=rf"^model_options\.{key} is not a model option"):
        get_preset("quick").replace(model_options={key: 1}).validate()


@pytest.mark.parametrize(
    "values, match",
    [
        ({"learning_rate": "x"}, r"^learning_rate must be a number or null\. Received: "
                                 r"learning_rate='x'$"),
        ({"momentum": "0.9"}, r"^momentum must be a number\. Received: momentum='0\.9'$"),
        ({"seed": "1"}, r"^seed must be a whole number\. Received: seed='1'$"),
        ({"label_smoothing": None}, r"^label_smoothing must be a number\."),
        ({"clipnorm": True}, r"^clipnorm must be a number or null\."),
        ({"model": 3}, r"^model must be a string\. Received: model=3$"),
    ],
)  # fmt: skip
def test_a_config_built_in_python_is_checked_for_types(values, match):
    # Built without apply_overrides: the type of each field was never checked, and a string
    # for a number failed as a TypeError from a comparison.
    with pytest.raises(PetalError, match=match):
        TrainConfig(**values).validate()
    assert TrainConfig(learning_rate=1, momentum=0).validate().learning_rate == 1  # ints pass


def test_the_train_workdir_defaults_to_the_config_files_preset(monkeypatch, tmp_path):
    from petal import cli
    from petal.training import loop

    seen = {}
    monkeypatch.setattr(loop, "train", lambda config, workdir, **kw: seen.update(workdir=workdir))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quick.json").write_text(json.dumps({"preset": "quick", "epochs": 2}))
    assert cli.main(["train", "--config", "quick.json", "--data", str(tmp_path)]) == 0
    assert seen["workdir"] == "runs/quick"
    assert cli.main(["train", "--data", str(tmp_path)]) == 0
    assert seen["workdir"] == "runs/default"
    (tmp_path / "fields.json").write_text(json.dumps({"epochs": 2}))  # names no preset
    assert cli.main(["train", "--preset", "codelab-convnet", "--config", "fields.json"]) == 0
    assert seen["workdir"] == "runs/codelab-convnet"


def test_set_takes_true_and_false_in_any_case_and_names_what_a_field_takes():
    # "--set deterministic=True" was refused as "must be bool", and cache=1 as "str or bool"
    # where cache's own check says "'auto', true or false".
    assert load_config("quick", None, ["deterministic=True"]).deterministic is True
    assert load_config("quick", None, ["cache=FALSE"]).cache is False
    assert load_config("quick", None, ["cache=auto"]).cache == "auto"
    with pytest.raises(PetalError, match=r"^deterministic must be true or false \(from --set\)"):
        load_config("quick", None, ["deterministic=yes"])
    with pytest.raises(PetalError, match=r"^cache must be 'auto', 'ram', 'disk', 'off', true "
                       r"\(ram\) or false \(off\) \(from --set\)"):  # fmt: skip
        load_config("quick", None, ["cache=1"])
    # The modes petal.data takes (train refused them: disk could not be chosen).
    for mode in ("ram", "Disk", "off"):
        assert load_config("quick", None, [f"cache={mode}"]).cache == mode
    with pytest.raises(PetalError, match=r"^cache must be .*Received: cache='./kept'$"):
        load_config("quick", None, ["cache=./kept"])


def test_a_run_config_that_is_no_json_object_is_named_with_its_fix(tmp_path):
    from petal.training.config import config_from_json

    path = tmp_path / "config.json"
    path.write_text("[1, 2]")
    with pytest.raises(PetalError) as err:
        config_from_json(path)
    assert str(err.value) == (
        f"Config file {path} holds a list, not a JSON object of TrainConfig fields. The run's "
        "config.json is damaged: restore it, or start again with --overwrite."
    )
    path.write_text("true")
    with pytest.raises(PetalError, match=r"holds true or false, not a JSON object .* Pass a JSON"):
        load_config(None, path)


def test_classes_come_from_the_command_line_a_json_list_or_set(monkeypatch, tmp_path):
    from petal import cli
    from petal.training import loop

    seen = {}
    monkeypatch.setattr(loop, "train", lambda config, workdir, **kw: seen.update(config=config))
    argv = ["train", "--preset", "quick", "--data", str(tmp_path), "--workdir",
            str(tmp_path / "run"), "--classes", "roses,daisy"]  # fmt: skip
    assert cli.main(argv) == 0 and seen["config"].classes == "roses,daisy"
    assert load_config("quick", None, ["classes=a,b"]).classes == "a,b"
    (tmp_path / "c.json").write_text('{"classes": ["tulips", "roses"]}')
    assert load_config("quick", tmp_path / "c.json").classes == "tulips,roses"
    assert TrainConfig().classes is None


def test_codelab_convnet_preset_says_the_batch_it_trains_with():
    """It said "Batch 128 global on any number of replicas"; 2 and 4 replicas get 32 and 64.
    Then it trained one device at 128, the 8-core TPU's batch, where the notebook's `else:
    BATCH_SIZE = 32` takes 32: five times fewer steps."""
    from petal.training.config import get_preset, preset_doc
    from petal.training.loop import _global_batch

    for name in ("codelab-convnet", "codelab-dense"):
        cfg = get_preset(name)
        assert {n: _global_batch(cfg, n) for n in (1, 2, 4, 8)} == {1: 32, 2: 32, 4: 64, 8: 128}
        assert "batch 16 x replicas (32 on one device)" in preset_doc(name)


def test_a_presets_model_options_stay_with_its_model(tmp_path):
    """squeezenet-plus's model_options (any_size, stem_stride) carried over to --model dense,
    whose builder takes neither: "Model 'dense' does not take that option"."""
    plus = get_preset("squeezenet-plus").model_options
    assert plus and load_config("squeezenet-plus", model="squeezenet").model_options == plus
    assert load_config("squeezenet-plus", model="dense").model_options == {}
    assert load_config("squeezenet-plus", overrides=["model=dense"]).model_options == {}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"preset": "squeezenet-plus", "model": "dense"}))
    assert load_config(None, path).model_options == {}
    # Asked for, they stay: all of them, or the keys given one by one.
    kept = load_config("squeezenet-plus", overrides=['model_options={"dropout": 0.1}'],
                       model="mobilenet_v2")
    assert kept.model_options == {"dropout": 0.1}
    kept = load_config("squeezenet-plus", overrides=["model_options.stem_stride=1"],
                       model="squeezenet_separable")
    assert kept.model_options == {"stem_stride": 1}
    # A resumed run's config is no preset: what it saved stays.
    base = get_preset("squeezenet-plus")
    assert load_config(None, None, ["model=dense"], base=base).model_options == plus


@pytest.mark.parametrize("preset", [["quick"], {"name": "quick"}, 3])
def test_a_preset_that_is_no_name_is_unknown(tmp_path, preset):
    """A config file's "preset" as a list or an object raised TypeError: unhashable type."""
    with pytest.raises(PetalError, match=r"^Unknown preset .*; valid presets: default, "):
        get_preset(preset)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"preset": preset}))
    received = re.escape(f"Received: preset={preset!r}")
    with pytest.raises(PetalError, match=rf"^Unknown preset .* {received}$"):
        load_config(None, path)


def test_validate_keeps_the_values_it_converts(tmp_path):
    """validate() converted "false" to check it, then kept the string: tensorboard="false"
    and fused_batch_norm="false" acted as true ("false" is truthy), config.json held the
    string, and skip_corrupt or deterministic "false" failed later. --set's conversions."""
    flags = ("tensorboard", "fused_batch_norm", "skip_corrupt", "deterministic")
    cfg = TrainConfig(**dict.fromkeys(flags, "false"))
    assert cfg.validate() is cfg
    assert {name: getattr(cfg, name) for name in flags} == dict.fromkeys(flags, False)
    save_config(cfg, tmp_path / "config.json")
    saved = json.loads((tmp_path / "config.json").read_text())
    assert {name: saved[name] for name in flags} == dict.fromkeys(flags, False)
    # cache='false' was refused as no "'auto', true or false"; 3.0 as no whole number.
    cfg = TrainConfig(cache="false", jit_compile="True", epochs=3.0).validate()
    assert cfg.cache is False and cfg.jit_compile is True and type(cfg.epochs) is int
    with pytest.raises(PetalError, match=r"^tensorboard must be true or false\. Received: "
                                         r"tensorboard='no'$"):
        TrainConfig(tensorboard="no").validate()


def test_a_config_file_that_is_a_directory_says_so(tmp_path):
    """--config DIR said "Config file not found: DIR"."""
    with pytest.raises(PetalError) as err:
        load_config(None, tmp_path)
    assert str(err.value) == (
        f"Config file {tmp_path} is a directory, not a file. "
        "Pass a JSON file of TrainConfig fields (UTF-8 text)."
    )


def test_an_unknown_key_in_a_config_file_says_to_fix_it_there(tmp_path):
    """A run's config.json with a key added by hand stopped --resume and the retrain with
    "did you mean 'precision'?" and no word of the file holding it; with no close key the
    message ran on ("(from --set) Valid keys")."""
    path = tmp_path / "config.json"
    save_config(TrainConfig(), path, classes=["daisy"])
    values = json.loads(path.read_text())
    path.write_text(json.dumps({**values, "mixed_precision": True}))
    for load in (config_from_json, lambda p: load_config(None, p)):
        with pytest.raises(PetalError, match=re.escape(
            f"Unknown config key 'mixed_precision' (from {path}); did you mean 'precision'? "
            "Rename it in that file, or remove it. Valid keys: preset, data,"
        )):
            load(path)
    path.write_text(json.dumps({**values, "colour": 3}))
    with pytest.raises(PetalError, match=re.escape(
        f"Unknown config key 'colour' (from {path}). Remove it from that file, or rename it "
        "to a valid key. Valid keys: preset, data,"
    )):
        config_from_json(path)
    with pytest.raises(PetalError, match=r"^Unknown config key 'colour' \(from --set\)\. Valid "
                                         r"keys: preset, .*, tensorboard\. Received: colour=3$"):
        load_config("quick", None, ["colour=3"])


def test_numpy_scalars_in_a_config_are_the_python_numbers_they_hold(tmp_path):
    # A notebook's np.int64 epochs was refused as "not a whole number", and an np.float32
    # in schedule_options was skipped as max_lr (the codelab rule's peak used instead) and
    # crashed writing config.json.
    import dataclasses

    import numpy as np

    from petal.training.config import get_preset, save_config
    from petal.training.loop import _ramp_peak

    cfg = dataclasses.replace(
        get_preset("quick"), epochs=np.int64(2), learning_rate=np.float64(0.5),
        skip_corrupt=np.bool_(True),
        schedule="codelab_ramp",
        schedule_options={"max_lr": np.float32(0.25), "rampup_epochs": np.int64(1)},
    ).validate()
    assert (cfg.epochs, type(cfg.epochs), type(cfg.learning_rate)) == (2, int, float)
    assert cfg.skip_corrupt is True
    assert cfg.schedule_options == {"max_lr": 0.25, "rampup_epochs": 1}
    assert _ramp_peak(cfg, 1) == 0.25
    save_config(cfg, tmp_path / "config.json")
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["schedule_options"] == {"max_lr": 0.25, "rampup_epochs": 1}


def test_a_class_name_holding_a_comma_is_refused_as_one(tmp_path):
    """["daisy, white", "rosé"] drew "classes must be a string or null", though a list of
    names is taken: the comma, which would split the name, was not said."""
    said = (r"^classes name 'daisy, white'{} holds a comma, which separates the names \(as in "
            r"--classes\): rename the class folder, or leave classes out")
    with pytest.raises(PetalError, match=said.format("")):
        get_preset("codelab-dense").replace(data="uni", classes=["daisy, white", "rosé"])
    (tmp_path / "c.json").write_text('{"classes": ["rosé", "daisy, white"]}')
    with pytest.raises(PetalError, match=said.format(re.escape(f" (from {tmp_path / 'c.json'})"))):
        load_config("quick", tmp_path / "c.json")
    assert get_preset("codelab-dense").replace(classes=("daisy", "rosé")).classes == "daisy,rosé"


def test_a_null_learning_rate_names_the_preset_and_the_fix():
    # codelab-xception's learning_rate is null (the codelab's rule): with another schedule the
    # error said "may only be null" about a value the user never set, and named no fix.
    pattern = (r"^learning_rate is null \(preset 'codelab-xception' leaves it so\): the peak "
               r"follows the codelab's rule .* \(--set learning_rate=2e-4, .*\. Received: "
               r"learning_rate=None, schedule='constant'$")
    with pytest.raises(PetalError, match=pattern):
        load_config("codelab-xception", None, ["schedule=constant"])
    assert load_config("codelab-xception", None, ["schedule=constant", "learning_rate=2e-4"])


def test_keys_that_a_run_would_ignore_are_refused():
    # lr_reference_batch scales learning_rate only, and fine_tune_lr_factor is read by
    # head_then_all only: both were accepted and silently ignored.
    with pytest.raises(PetalError, match=r"^lr_reference_batch scales learning_rate, which is "
                                         r"null .*Received: learning_rate=None, "
                                         r"lr_reference_batch=160$"):
        load_config("codelab-xception", None, ["lr_reference_batch=160"])
    assert load_config("codelab-xception", None,
                       ["lr_reference_batch=160", "learning_rate=2e-4"]).lr_reference_batch == 160
    with pytest.raises(PetalError, match=r"^fine_tune_lr_factor is only used with fine_tune="
                                         r"'head_then_all' .*Received: fine_tune_lr_factor=0\.5, "
                                         r"fine_tune='all'$"):
        load_config("codelab-xception", None, ["fine_tune_lr_factor=0.5"])
    assert load_config("codelab-xception", None, ["fine_tune=head_then_all", "head_epochs=2",
                                                  "fine_tune_lr_factor=0.5"])


def test_records_given_as_a_path_made_of_a_url_are_refused():
    # TrainConfig(data=Path("gs://b/rec")) became the local folder gs:/b/rec.
    from pathlib import Path

    with pytest.raises(PetalError) as info:
        get_preset("quick").replace(data=Path("gs://b/rec"))
    assert str(info.value) == ("data gs:/b/rec is a URL that lost a slash (gs://b/rec, as "
                               "pathlib.Path makes it); pass the URL as a string, not a Path.")
    assert get_preset("quick").replace(data=Path("b/rec")).data == "b/rec"


def test_refusals_of_saved_settings_name_the_setting_that_keeps_the_run():
    # A run saved before these were refused resumes with the value named: the message said
    # "drop it" (how?) or gave a rate that lr_reference_batch then scaled 4x.
    with pytest.raises(PetalError, match=r"drop it \(--set lr_reference_batch=null; the rule's "
                       r"rate stays\)"):  # fmt: skip
        load_config("codelab-xception", None, ["lr_reference_batch=32"])
    with pytest.raises(PetalError, match=r"drop it \(--set fine_tune_lr_factor=0\.1, the "
                       r"default\)"):  # fmt: skip
        load_config("codelab-xception", None, ["fine_tune_lr_factor=0.5"])


def test_a_schedule_or_model_option_given_as_a_field_is_answered_with_its_dict_key(tmp_path):
    """--set warmup_epochs=1 said "did you mean 'head_epochs'?" (any_size: 'image_size'),
    which was refused in turn; dropout, bn_frozen and min_lr got no hint."""
    for key, meant in (("warmup_epochs", "schedule_options.warmup_epochs"),
                       ("rampup_epochs", "schedule_options.rampup_epochs"),
                       ("total_epochs", "schedule_options.total_epochs"),
                       ("min_lr", "schedule_options.min_lr"),
                       ("any_size", "model_options.any_size"),
                       ("bn_frozen", "model_options.bn_frozen"),
                       ("dropout", "model_options.dropout"),
                       ("peak_lr", "learning_rate")):  # fmt: skip
        with pytest.raises(PetalError, match=rf"^Unknown config key '{key}' \(from --set\); "
                           rf"did you mean '{meant}'\? Valid keys: "):
            load_config("quick", None, [f"{key}=1"])
        assert load_config("quick", None, [f"{meant}=1"])  # followed, it is taken
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"warmup_epochs": 1}))
    with pytest.raises(PetalError, match=rf"^Unknown config key 'warmup_epochs' \(from "
                       rf"{re.escape(str(path))}\); did you mean 'schedule_options.warmup_epochs'"
                       r"\? Rename it in that file"):
        load_config(None, path)


def test_a_preset_other_than_the_config_files_is_refused(tmp_path, capsys):
    """--preset codelab-squeezenet --config RUN/config.json (preset quick) trained quick's
    values and named the run codelab-squeezenet (config.json, metrics.json, runs/...)."""
    from petal import cli

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**get_preset("quick").to_dict(), "data": str(tmp_path)}))
    refused = (
        f"Config file {path} names preset 'quick', but --preset is 'codelab-squeezenet': drop "
        "--preset to run the file's, or edit the file's preset key (drop it to change fields "
        "of --preset's only)."
    )
    with pytest.raises(PetalError) as caught:
        load_config("codelab-squeezenet", path)
    assert str(caught.value) == refused
    assert cli.main(["train", "--preset", "codelab-squeezenet", "--config", str(path)]) == 2
    assert capsys.readouterr().err == f"petal train: error: {refused}\n"
    assert load_config(None, path).preset == "quick"


def test_an_infinite_or_nan_float_setting_is_named_as_no_finite_number():
    """--set learning_rate=1e400 (inf) said "learning_rate must be > 0. Received:
    learning_rate=inf", which reads as met; clipnorm, weight_decay and fine_tune_lr_factor
    too."""
    for key, wanted in (("learning_rate", r"> 0 \(e\.g\. 1e-3\)"),
                        ("clipnorm", r"> 0 \(e\.g\. 1\.0\), or null for no clipping"),
                        ("weight_decay", r">= 0 \(e\.g\. 0\.05; 0: none\)"),
                        ("momentum", r"in \[0, 1\] \(e\.g\. 0\.9\)"),
                        ("label_smoothing", r"in \[0, 1\) \(e\.g\. 0\.1\)"),
                        ("fine_tune_lr_factor", r"> 0 \(e\.g\. 0\.1\)")):  # fmt: skip
        for value, said in (("1e400", "inf"), ("-1e400", "-inf"), ("NaN", "nan")):
            with pytest.raises(PetalError, match=rf"^{key} must be a finite number {wanted}\. "
                               rf"Received: {key}={said}$"):
                load_config("quick", None, [f"{key}={value}"])


def test_an_unknown_preset_in_a_config_file_names_the_file(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"preset": "quik"}))
    with pytest.raises(PetalError, match=rf"^Unknown preset 'quik' \(from {re.escape(str(path))}"
                       r"\); valid presets: default, .* Received: preset='quik'$"):
        load_config(None, path)


def test_a_null_augment_is_answered_with_recipes_to_give():
    """--set augment=null said "augment must be a string", without the 'none' meant."""
    with pytest.raises(PetalError, match=r"^augment must be a recipe \(e\.g\. 'none', 'codelab' "
                       r"or 'flip\+saturation'\) \(from --set\)\. Received: augment=None$"):
        load_config("quick", None, ["augment=null"])
    assert load_config("quick", None, ["augment=none"]).augment == "none"
