"""Discovery: deterministic, extension-filtered, loud on bad trees."""

from __future__ import annotations

import os

import pytest

from petal.data.folders import IMAGE_EXTENSIONS, find_images, read_bytes, some_names
from petal.errors import PetalError


def _touch(path, data: bytes = b"x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "src"
    for rel in [
        "tulips/b.jpg",
        "tulips/A.JPG",
        "tulips/sub/c.png",
        "daisy/z.webp",
        "daisy/y.jpeg",
        "daisy/notes.txt",
        "roses/x.gif",
        "roses/w.BMP",
        "loose.jpg",  # directly in the root: no class
        ".hidden/q.jpg",  # never a class
    ]:
        _touch(root / rel)
    (root / "empty").mkdir()
    return root


def test_classes_and_files_are_sorted(tree):
    folder = find_images(tree)
    assert folder.classes == ("daisy", "roses", "tulips")  # "empty" has no images
    assert [f.relpath for f in folder.files] == [
        "daisy/y.jpeg",
        "daisy/z.webp",
        "roses/w.BMP",
        "roses/x.gif",
        "tulips/A.JPG",
        "tulips/b.jpg",
        "tulips/sub/c.png",
    ]
    assert [f.label for f in folder.files] == [0, 0, 1, 1, 2, 2, 2]
    assert folder.files[0].path == os.path.join(str(tree), "daisy", "y.jpeg")
    assert folder.per_class() == {"daisy": 2, "roses": 2, "tulips": 3}
    assert folder.ignored == (".hidden/", "daisy/notes.txt", "loose.jpg")
    assert folder.hidden() == [".hidden/"] and folder.unclassified_images() == ["loose.jpg"]


def test_hidden_entries_are_never_read_and_listed(tree):
    """Notebook checkpoints inside a class, macOS metadata files and folders: never classes
    nor images (torchvision's ImageFolder makes ``.ipynb_checkpoints`` a class)."""
    _touch(tree / "daisy" / ".ipynb_checkpoints" / "y-checkpoint.jpeg")
    _touch(tree / "daisy" / "._y.jpeg", b"Mac OS X        \x00\x05\x16\x07")
    _touch(tree / "daisy" / ".DS_Store")
    _touch(tree / "__MACOSX" / "daisy" / "._y.jpeg")
    _touch(tree / "._loose.jpg")
    folder = find_images(tree)
    assert folder.classes == ("daisy", "roses", "tulips")
    assert [f.relpath for f in folder.files if f.label == 0] == ["daisy/y.jpeg", "daisy/z.webp"]
    assert folder.hidden() == [
        "._loose.jpg",
        ".hidden/",
        "__MACOSX/",
        "daisy/._y.jpeg",
        "daisy/.ipynb_checkpoints/",
    ]
    assert "daisy/.DS_Store" in folder.ignored  # ignored, but not worth a warning
    assert folder.unclassified_images() == ["loose.jpg"]
    with pytest.raises(PetalError, match=r"Class '\.hidden' in --classes is a hidden folder"):
        find_images(tree, "daisy,.hidden")
    # daisy left out by --classes: its hidden entries were warned of (rename them), which
    # would convert nothing.
    assert find_images(tree, "roses,tulips").hidden() == ["._loose.jpg", ".hidden/", "__MACOSX/"]


def test_a_folder_whose_photos_are_all_hidden_says_so(tmp_path):
    """The error named the extensions petal reads, not the hidden photos it left out."""
    _touch(tmp_path / "a" / ".x.jpg")
    _touch(tmp_path / "b" / ".ipynb_checkpoints" / "y.jpg")
    with pytest.raises(PetalError, match=r"^No images found under .*\(case-insensitive\); 2 "
                       r"hidden folder\(s\) or image file\(s\) are not read \(a/\.x\.jpg, "
                       r"b/\.ipynb_checkpoints/\): rename any that hold photos\.$"):
        find_images(tmp_path)


def test_discovery_is_repeatable(tree):
    first, second = find_images(tree), find_images(str(tree) + "/")
    assert first.files == second.files and first.classes == second.classes


def test_explicit_classes_set_order_and_subset(tree):
    folder = find_images(tree, "tulips, daisy")
    assert folder.classes == ("tulips", "daisy")
    assert {f.relpath.split("/")[0]: f.label for f in folder.files} == {"tulips": 0, "daisy": 1}
    assert "roses/x.gif" in folder.ignored


def test_unknown_class_lists_the_found_ones(tree):
    with pytest.raises(PetalError, match=r"Unknown class 'lilies'.*daisy, roses, tulips"):
        find_images(tree, ["daisy", "lilies"])


@pytest.mark.parametrize("classes", ["daisy,daisy", "daisy,,roses"])
def test_malformed_class_lists(tree, classes):
    with pytest.raises(PetalError, match="--classes"):
        find_images(tree, classes)


@pytest.mark.parametrize(
    ("classes", "match"),
    [
        (5, r"^classes must be a list or tuple of class names in index order, or a "
            r"comma-separated string \(a set has no order\)\. Received: classes=5$"),
        # A set's order, so the class indices, changed with PYTHONHASHSEED.
        ({"daisy", "roses"}, r"\(a set has no order\)\. Received: classes=\{"),
        (iter(["daisy", "roses"]), r"\(a set has no order\)\. Received: classes=<"),
        (["daisy", None], r"^classes must hold names \(strings\)\. Received: "),
    ],
)  # fmt: skip
def test_class_lists_of_the_wrong_type_are_named(tree, classes, match):
    with pytest.raises(PetalError, match=match):
        find_images(tree, classes)


def test_empty_explicit_class(tree):
    with pytest.raises(PetalError, match="'empty' holds no images"):
        find_images(tree, ["daisy", "empty"])


def test_missing_source(tmp_path):
    with pytest.raises(PetalError, match="does not exist"):
        find_images(tmp_path / "nope")


def test_source_is_a_file(tmp_path):
    _touch(tmp_path / "a.jpg")
    with pytest.raises(PetalError, match="not a file. Received"):
        find_images(tmp_path / "a.jpg")
    _touch(tmp_path / "flower_photos.tgz")
    with pytest.raises(
        PetalError,
        match=r"not a file; it is an archive: extract it first \(e.g. `tar xf .*flower_photos.tgz`\)",
    ):
        find_images(tmp_path / "flower_photos.tgz")


def test_empty_tree_names_the_extensions(tmp_path):
    _touch(tmp_path / "daisy" / "readme.txt")
    with pytest.raises(PetalError, match="No images found") as err:
        find_images(tmp_path)
    assert all(ext in str(err.value) for ext in IMAGE_EXTENSIONS)


def test_images_directly_in_the_root_say_so_and_the_fix(tmp_path):
    """Not "No images found" for a folder of 2 photos and no class sub-folders."""
    _touch(tmp_path / "b.jpg")
    _touch(tmp_path / "a.png")
    _touch(tmp_path / ".git" / "x.jpg")
    with pytest.raises(
        PetalError,
        match=r"holds 2 image file\(s\) directly but no class sub-folders; move each class's "
        r"images into a sub-folder named after the class \(e.g. .*/CLASS/a.png\)",
    ):
        find_images(tmp_path)


def test_single_class(tmp_path):
    _touch(tmp_path / "daisy" / "a.jpg")
    with pytest.raises(PetalError, match="only one class"):
        find_images(tmp_path)
    _touch(tmp_path / "roses" / "b.jpg")
    with pytest.raises(PetalError, match=r"^--classes picks one class \('roses'\) of the 2"):
        find_images(tmp_path, ["roses"])


def test_a_source_one_level_too_high_names_the_folder_meant(tmp_path):
    """``data/`` holding the extracted ``flower_photos/CLASS/`` is one class of everything."""
    for rel in ("flower_photos/daisy/a.jpg", "flower_photos/roses/b.jpg", "flower_photos/x.jpg"):
        _touch(tmp_path / rel)
    with pytest.raises(
        PetalError,
        match=r"only one class \('flower_photos'\).*; its images lie in 2 sub-folders of "
        rf"flower_photos: did you mean source={tmp_path}/flower_photos\?$",
    ):
        find_images(tmp_path)


def test_dangling_link_and_unicode_names_are_candidates(tmp_path):
    _touch(tmp_path / "a" / "été en fleur.jpg")
    _touch(tmp_path / "b" / "b.jpg")
    (tmp_path / "b" / "gone.jpg").symlink_to(tmp_path / "missing.jpg")
    folder = find_images(tmp_path)
    assert [f.relpath for f in folder.files] == ["a/été en fleur.jpg", "b/b.jpg", "b/gone.jpg"]
    with pytest.raises(OSError):
        read_bytes(folder.files[2].path)


def test_a_folder_that_cannot_be_listed_is_named(tmp_path, monkeypatch):
    from petal.data import folders

    _touch(tmp_path / "a" / "a.jpg")
    _touch(tmp_path / "b" / "locked" / "b.jpg")
    listing = folders._list_local

    def no_permission(path):
        if path.endswith("locked"):
            raise PermissionError(13, "Permission denied", path)
        return listing(path)

    monkeypatch.setattr(folders, "_list_local", no_permission)
    with pytest.raises(PetalError, match=rf"^Cannot list {tmp_path}/b/locked, a folder in the "
                       rf"source {tmp_path} \(Permission denied\); fix its permissions, or move "
                       "it out of the source.$"):
        find_images(tmp_path)


def test_read_bytes_refuses_special_files(tmp_path):
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)  # reading would block forever
    with pytest.raises(OSError, match="not a regular file"):
        read_bytes(str(fifo))


def test_symlinked_folders_are_followed_without_cycles(tmp_path, small_flowers):
    root = tmp_path / "src"
    root.mkdir()
    (root / "daisy").symlink_to(small_flowers / "daisy", target_is_directory=True)
    _touch(root / "roses" / "a.png")
    (root / "roses" / "again").symlink_to(root / "roses", target_is_directory=True)
    folder = find_images(root)
    assert folder.per_class() == {"daisy": 12, "roses": 1}
    # The link back to its own folder is not followed, and is listed rather than dropped.
    assert "roses/again/" in folder.ignored
    assert folder.loops() == ["roses/again/"] and folder.other_files() == []
    assert "1 link(s) back to a folder holding them, not followed (roses/again/)" in (
        folder.unread_note()
    )


def test_a_class_folder_linking_to_another_class_lists_both(tmp_path):
    # The link sorts before its target: a guard against visiting a folder twice once made
    # the link the class and left the real "roses" empty, so it vanished without a word.
    root = tmp_path / "src"
    _touch(root / "roses" / "a.png")
    _touch(root / "tulips" / "b.png")
    (root / "a_roses").symlink_to(root / "roses", target_is_directory=True)
    folder = find_images(root)
    assert folder.per_class() == {"a_roses": 1, "roses": 1, "tulips": 1}
    assert [f.relpath for f in folder.files] == ["a_roses/a.png", "roses/a.png", "tulips/b.png"]


# --- remote paths that cannot be read --------------------------------------------------------------


def _unreachable(path):
    import tensorflow as tf

    raise tf.errors.FailedPreconditionError(
        None,
        None,
        "Error executing an HTTP request: libcurl code 6 meaning 'Could not resolve hostname'"
        f"\n\t when reading metadata of {path}",
    )


def test_unsupported_scheme_is_one_line_listing_the_supported():
    with pytest.raises(PetalError) as info:
        find_images("s3://bucket/flowers")
    message = str(info.value)
    assert "s3://bucket/flowers" in message and "s3:// are not supported" in message
    assert "local paths" in message and "gs://" in message and "\n" not in message


def test_unreachable_store_is_one_line(monkeypatch):
    import tensorflow as tf

    monkeypatch.setattr(tf.io.gfile, "exists", _unreachable)
    with pytest.raises(PetalError) as info:
        find_images("gs://petal-no-bucket/flowers")
    message = str(info.value)
    assert message.startswith("Cannot reach gs://petal-no-bucket/flowers (")
    assert "Could not resolve hostname" in message and "\n" not in message


def test_a_class_folder_whose_name_is_not_utf8_is_named_with_the_fix(tmp_path):
    """Class names are stored as UTF-8 text: the split crashed on such a folder."""
    _touch(tmp_path / os.fsdecode(b"\xe9t\xe9") / "a.jpg")
    _touch(tmp_path / "b" / "b.jpg")
    with pytest.raises(PetalError) as caught:
        find_images(tmp_path)
    assert str(caught.value) == (
        f"The name of the class folder {tmp_path}/\\xe9t\\xe9 is not valid UTF-8, and class "
        "names are stored as UTF-8 text: rename the folder (e.g. with convmv) and run again."
    )


def test_names_in_messages_are_printable(tmp_path):
    """A newline in a found name split an error; an escape sequence reached the terminal."""
    _touch(tmp_path / "a\x1b[2J" / "x.jpg")
    _touch(tmp_path / "b\nc" / "x.jpg")
    with pytest.raises(PetalError, match=r"Found classes: a\\x1b\[2J, b\\nc\.$"):
        find_images(tmp_path, ["lilies"])
    assert some_names(["x\ny", "é", os.fsdecode(b"\xff")]) == "x\\ny, é, \\xff"


def test_same_place_reads_a_urls_scheme_and_host_in_any_case_but_not_its_path():
    from petal.data.folders import same_place

    assert same_place("HTTP://127.0.0.1:8000/Data/", "http://127.0.0.1:8000/Data")
    assert same_place("http://Store.Example:80/a", "http://store.example:80/a/")
    assert same_place("GS://bucket/flowers", "gs://bucket/flowers")
    assert not same_place("http://store.example/Data", "http://store.example/data")
    assert not same_place("gs://bucket/a", "gs://bucket/b")


def test_a_link_in_a_class_folder_back_to_the_source_is_a_loop(tree):
    """It was followed: every other class's photos were filed under that class too (and a
    loose image in the source both listed as unclassified and written under the class)."""
    (tree / "daisy" / "up").symlink_to("..", target_is_directory=True)
    found = find_images(str(tree))
    assert found.loops() == ["daisy/up/"]
    daisy = [f.relpath for f in found.files if found.classes[f.label] == "daisy"]
    assert daisy == ["daisy/y.jpeg", "daisy/z.webp"]


@pytest.mark.parametrize(
    ("given", "fix"),
    [
        ("./daisy", "pass the folder's name ('daisy')"),
        ("daisy/", "pass the folder's name ('daisy')"),
        (".", "pass the class folders' names"),
        ("..", "pass the class folders' names"),
    ],
)
def test_a_path_in_classes_is_told_to_be_a_name(tree, given, fix):
    """'./daisy' was called a hidden folder name, with the fix "rename the folder"."""
    with pytest.raises(PetalError) as info:
        find_images(tree, [given, "roses"])
    assert str(info.value) == (
        f"Class {given!r} in --classes is a path, not a class name: --classes takes the names "
        f"of sub-folders of {tree}; {fix}. Found classes: daisy, roses, tulips."
    )
    with pytest.raises(PetalError, match=r"^Class '\.hidden' in --classes is a hidden folder"):
        find_images(tree, [".hidden", "roses"])


def test_a_class_folder_link_that_leads_nowhere_is_named(tree, tmp_path):
    """A class folder linked to an unmounted disk vanished: counted as an ignored file, named
    nowhere (and --classes called it an unknown sub-folder)."""
    (tree / "lilies").symlink_to(tmp_path / "unmounted" / "lilies", target_is_directory=True)
    (tree / "daisy" / "2019").symlink_to(tmp_path / "unmounted" / "2019")
    (tree / "gone.jpg").symlink_to(tmp_path / "unmounted" / "gone.jpg")
    folder = find_images(tree)
    assert folder.classes == ("daisy", "roses", "tulips")
    assert folder.broken == ("daisy/2019", "gone.jpg", "lilies")
    # Named once, as a broken link, not as an image in no class or a file of another type.
    assert folder.unclassified_images() == ["loose.jpg"]
    assert folder.other_files() == ["daisy/notes.txt"]
    assert "3 link(s) leading nowhere (a missing or unmounted target) (daisy/2019, gone.jpg, " in (
        folder.unread_note()
    )
    assert find_images(tree, "daisy,roses").broken == ("daisy/2019", "gone.jpg", "lilies")
    assert find_images(tree, "roses,tulips").broken == ("gone.jpg", "lilies")  # daisy left out
    lilies = (
        r"^Class 'lilies' in --classes is a link that leads nowhere \(.*/src/lilies -> "
        r".*/unmounted/lilies\); mount or fix its target and run again\. Found classes: "
        r"daisy, roses, tulips\.$"
    )
    with pytest.raises(PetalError, match=lilies):
        find_images(tree, "lilies,daisy")
    for name in ("daisy", "roses"):
        (tree / name).rename(tmp_path / name)
    with pytest.raises(PetalError, match=r"^Found only one class \('tulips'\) .*; 2 link\(s\) in "
                       r"the source lead nowhere \(gone.jpg, lilies\): mount or fix their "
                       r"targets\.$"):  # fmt: skip
        find_images(tree)


def test_classes_with_spaces_around_or_a_comma_in_their_names(tmp_path):
    """--classes strips the names and splits on commas: " spaced " could not be selected,
    and the refusal listed it unquoted (" Found classes:  spaced , a,b, c")."""
    for name in (" spaced ", "a,b", "c"):
        _touch(tmp_path / name / "1.jpg")
    assert find_images(tmp_path, " spaced ,c").classes == (" spaced ", "c")
    assert find_images(tmp_path, "c, spaced").classes == ("c", " spaced ")
    assert find_images(tmp_path, [" spaced ", "a,b"]).classes == (" spaced ", "a,b")
    with pytest.raises(PetalError) as info:
        find_images(tmp_path, " spaced ,a,b")
    assert str(info.value) == (
        f"Unknown class 'a' in --classes: no such sub-folder of {tmp_path}. Found classes: "
        "' spaced ', 'a,b', 'c'. A class name holding a comma ('a,b') cannot be given in "
        "--classes, where commas separate the names: rename the folder, or leave out "
        "--classes to read every class folder."
    )


def test_a_link_to_a_folder_above_the_source_is_a_loop_not_read(tmp_path):
    """`a/up -> ../..` was followed: the photos beside the source were filed under `a` (and a
    link to / walked the whole disk). A link to a folder elsewhere is still followed."""
    root = tmp_path / "src"
    _touch(root / "a" / "1.jpg")
    _touch(root / "b" / "2.jpg")
    _touch(tmp_path / "other" / "stranger.jpg")
    (root / "a" / "up").symlink_to("../..", target_is_directory=True)
    (root / "a" / "root").symlink_to("/", target_is_directory=True)
    (root / "b" / "more").symlink_to(tmp_path / "other", target_is_directory=True)
    folder = find_images(root)
    assert [f.relpath for f in folder.files] == ["a/1.jpg", "b/2.jpg", "b/more/stranger.jpg"]
    assert folder.loops() == ["a/root/", "a/up/"] and folder.ignored == ("a/root/", "a/up/")
    # A source reached through a link: a link to the folder holding that link is a loop too.
    view = tmp_path / "view"
    view.mkdir()
    (view / "src").symlink_to(root, target_is_directory=True)
    (root / "b" / "view").symlink_to(view, target_is_directory=True)
    assert find_images(view / "src").loops() == ["a/root/", "a/up/", "b/view/"]


def test_predict_does_not_follow_a_link_to_a_folder_above_the_one_given(tmp_path):
    """`petal predict RUN odd/a` with `odd/a/loop -> ..` predicted odd/b's images too."""
    from petal.evaluation.predict import expand_images

    _touch(tmp_path / "odd" / "a" / "1.jpg")
    _touch(tmp_path / "odd" / "b" / "2.jpg")
    (tmp_path / "odd" / "a" / "loop").symlink_to("..", target_is_directory=True)
    warnings: list[str] = []
    folder = tmp_path / "odd" / "a"
    assert expand_images([folder], warn=warnings.append) == [folder / "1.jpg"]
    assert warnings == [
        f"1 folder link(s) under {folder} lead back to a folder that holds them and are not "
        f"followed: {folder}/loop/ (images in {folder} are predicted once, where they lie; none "
        "above it)"
    ]


def test_a_link_in_the_source_back_to_it_is_a_listed_loop(small_flowers, tmp_path):
    """`again -> .` beside the class folders was counted among ignored_files alone: no
    warning, not in folder_loops."""
    import json

    from petal.data import convert

    root = tmp_path / "src"
    for cls in ("daisy", "roses"):
        (root / cls).mkdir(parents=True)
        first = sorted((small_flowers / cls).iterdir())[0]
        (root / cls / first.name).symlink_to(first.resolve())
    (root / "again").symlink_to(".", target_is_directory=True)
    (root / "again2").symlink_to("../src", target_is_directory=True)
    folder = find_images(root)
    assert folder.classes == ("daisy", "roses") and len(folder.files) == 2
    assert folder.loops() == ["again/", "again2/"] and folder.empty == ()
    assert "2 link(s) back to a folder holding them, not followed (again/, again2/)" in (
        folder.unread_note()
    )
    convert(root, tmp_path / "records", image_size=16, val_fraction=0, workers=1, progress=False)
    manifest = json.loads((tmp_path / "records" / "manifest.json").read_text())
    assert manifest["images_found"] == manifest["written"] == 2
    assert manifest["ignored_files"] == 2
    assert manifest["folder_loops"] == ["again/", "again2/"] and manifest["empty_folders"] == []


def test_classes_match_a_folder_name_in_another_unicode_form(tmp_path):
    """A folder unzipped on macOS is named in NFD (e + a combining accent): --classes typed
    "rosé" was an unknown class, "Found classes: daisy, rosé" listing one that looks the same."""
    import unicodedata

    nfd = unicodedata.normalize("NFD", "rosé")
    for name in ("daisy", nfd):
        _touch(tmp_path / name / "1.jpg")
    folder = find_images(tmp_path, "rosé,daisy")
    assert folder.classes == (nfd, "daisy")  # the folder's own name, to read its files
    assert folder.files[0].path == str(tmp_path / nfd / "1.jpg")
    assert find_images(tmp_path, [nfd, "daisy"]).classes == (nfd, "daisy")
    with pytest.raises(PetalError, match=r"^--classes names 'rosé' twice"):
        find_images(tmp_path, ["rosé", nfd])
    # Two folders that look the same: which one is meant cannot be told, even typed exactly.
    _touch(tmp_path / "rosé" / "2.jpg")
    for given in ("rosé", nfd):
        with pytest.raises(PetalError) as info:
            find_images(tmp_path, [given, "daisy"])
        assert str(info.value) == (
            f"Class {given!r} in --classes matches 2 sub-folders of {tmp_path} that differ only "
            "in their Unicode form ('rose\\u0301', 'ros\\xe9'): rename or merge them so that "
            "one holds the class."
        )


def test_classes_picking_one_of_several_says_so(tmp_path):
    """--classes tulips on a 5-class source said "Found only one class ('tulips')": it found 5
    and the user picked one."""
    for name in ("daisy", "roses", "tulips"):
        _touch(tmp_path / name / "1.jpg")
    with pytest.raises(PetalError) as info:
        find_images(tmp_path, "tulips")
    assert str(info.value) == (
        f"--classes picks one class ('tulips') of the 3 under {tmp_path}, and a classifier "
        "needs at least two: name two or more in --classes, or leave it out to read every "
        "class folder. Found classes: daisy, roses, tulips."
    )
    assert find_images(tmp_path, "tulips", min_classes=1).classes == ("tulips",)


def test_class_names_in_messages_and_predictions_are_quoted_by_one_rule():
    # Two copies of the rule had drifted: a name starting with a quote was quoted in
    # predictions but not in the classes a message lists.
    from petal.data.folders import _class_names, blurs_in_list
    from petal.evaluation.predict import format_predictions

    assert [blurs_in_list(n) for n in ["a,b", " a", "a ", '"a', "'a", "a'b", "daisy"]] == [
        True, True, True, True, True, False, False,
    ]
    assert _class_names(["'roses", "tulips"]) == "\"'roses\", 'tulips'"
    result = {"file": "x.jpg", "predictions": [{"label": "'roses", "probability": 0.5}]}
    assert format_predictions([result]) == "x.jpg: \"'roses\" 0.500"


def test_a_file_url_is_the_same_place_as_its_local_path(tmp_path):
    # evaluate --data file://ORIGIN scored the training photos without a warning: the URL
    # was compared with the run's local paths as text.
    from petal.data.folders import same_place

    (tmp_path / "photos").mkdir()
    assert same_place(f"file://{tmp_path}/photos/", tmp_path / "photos")
    assert same_place(f"FILE://localhost{tmp_path}/photos", f"file://{tmp_path}/photos")
    assert not same_place(f"file://{tmp_path}/photos", tmp_path)
    assert not same_place(f"gs://b{tmp_path}/photos", tmp_path / "photos")


def test_names_other_than_ascii_are_refused_where_python_decodes_names_otherwise(
    tmp_path, monkeypatch
):
    # Under a Latin-1 locale "rosé" became the class "rosÃ©"; under LANG=C (UTF-8 mode
    # off) convert crashed writing its manifest and train in TensorFlow.
    import petal.data.folders as folders

    for rel in ("rosé/1.jpg", "tulips/2.jpg", "daisy/3.jpg"):
        _touch(tmp_path / rel)
    assert find_images(tmp_path).classes == ("daisy", "rosé", "tulips")  # UTF-8: read
    monkeypatch.setattr(folders.sys, "getfilesystemencoding", lambda: "iso8859-1")
    with pytest.raises(PetalError) as caught:
        find_images(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / 'rosé'}: file names other than ASCII are read only under a UTF-8 "
        "locale, and Python decodes them as iso8859-1 here; run petal with PYTHONUTF8=1 (or "
        "LC_ALL=C.UTF-8)."
    )
    assert find_images(tmp_path, classes="daisy,tulips").classes == ("daisy", "tulips")


def test_two_class_folders_in_two_unicode_forms_are_refused(tmp_path):
    """"rosé" typed and "rosé" unzipped on macOS (e + a combining accent) became two classes
    that print the same, the photos of one class split between them."""
    import unicodedata

    nfd = unicodedata.normalize("NFD", "rosé")
    for name in ("daisy", nfd, "rosé"):
        _touch(tmp_path / name / "1.jpg")
    with pytest.raises(PetalError) as info:
        find_images(tmp_path)
    assert str(info.value) == (
        f"The class folders 'rose\\u0301', 'ros\\xe9' of {tmp_path} differ only in their "
        "Unicode form, so they would be two classes whose names look the same: rename or merge "
        "them so that one holds the class."
    )
    (tmp_path / nfd / "1.jpg").rename(tmp_path / "daisy" / "2.jpg")
    (tmp_path / nfd).rmdir()
    assert find_images(tmp_path).classes == ("daisy", "rosé")



def test_a_records_folder_is_refused_as_images(tmp_path):
    """`petal convert RECORDS OUT` (or `petal demo --data RECORDS`) said "No images found
    under RECORDS: expected class sub-folders": the folder is converted already."""
    records = tmp_path / "records"
    records.mkdir()
    for name in ("train-00000-of-00002-10.tfrec", "train-00001-of-00002-10.tfrec",
                 "validation-00000-of-00001-5.tfrec", "manifest.json"):
        (records / name).write_bytes(b"x")
    fix = ("not images: it is converted already; train, evaluate or inspect it, or pass a "
           "folder of class sub-folders of images.")
    with pytest.raises(PetalError) as caught:
        find_images(str(records))
    assert str(caught.value) == f"{records} holds records (manifest.json and 3 shard(s)), {fix}"
    (records / "manifest.json").unlink()  # the codelab's shards: no manifest
    (records / "train-00001-of-00002-10.tfrec").rename(records / "flowers00-230.tfrec")
    with pytest.raises(PetalError) as caught:
        find_images(str(records))
    assert str(caught.value) == f"{records} holds records (3 shard(s)), {fix}"
    # Only files the readers take: "train or inspect it" did not hold for these.
    for name in ("train-00000-of-00002-10.tfrec", "validation-00000-of-00001-5.tfrec"):
        (records / name).unlink()
    (records / "flowers00-230.tfrec").rename(records / "data.tfrecord")
    (records / "other.TFREC").write_bytes(b"x")
    with pytest.raises(PetalError, match="^No images found under"):
        find_images(str(records))
    # Beside class folders of images, they are the data set's own files: the folder is read.
    (records / "daisy").mkdir()
    (records / "daisy" / "1.jpg").write_bytes(b"x")
    (records / "tulips").mkdir()
    (records / "tulips" / "1.jpg").write_bytes(b"x")
    assert find_images(str(records)).classes == ("daisy", "tulips")


def test_a_training_run_folder_is_refused_as_data(tmp_path):
    """A run's folder as --data (or convert's SRC) was read as images: its eval/ and plots/
    became classes, and a model trained on the plots."""
    run = tmp_path / "run"
    for sub, name in (("eval", "confusion_matrix.png"), ("plots", "curves.png")):
        (run / sub).mkdir(parents=True)
        (run / sub / name).write_bytes(b"\x89PNG\r\n\x1a\n")
    (run / "config.json").write_text('{"model": "squeezenet", "resolved": {"classes": ["a"]}}')
    (run / "history.csv").write_text("epoch,loss\n")
    with pytest.raises(PetalError) as caught:
        find_images(str(run))
    assert str(caught.value) == (
        f"{run} is the work directory of a `petal train` run (config.json, history.csv), not "
        "data; pass a folder of class sub-folders of images (or, to train or evaluate, a "
        "records folder)."
    )
    # A config.json alone, or one petal train did not write, is a data set's own file: the
    # folder is read.
    (run / "history.csv").unlink()
    assert list(find_images(str(run)).classes) == ["eval", "plots"]
    (run / "history.csv").write_text("epoch,loss\n")
    (run / "config.json").write_text('{"license": "CC-BY"}')
    assert list(find_images(str(run)).classes) == ["eval", "plots"]
