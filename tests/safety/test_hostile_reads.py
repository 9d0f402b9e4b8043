"""Files the project reads: regular files only, size-capped, depth-limited, names made safe.

Every case ends in one line naming the file, never a hang, a flood or a traceback, and no
error quotes a file's content (a token file linked as order.txt stays secret).
"""

from __future__ import annotations

import io
import json
import os
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from introspect import files
from introspect.cli.dump_diff import _name_map
from introspect.dump.formats import capture_bytes, read_capture, read_dump
from introspect.errors import InputError

SECRET = "ghp_SECRETTOKEN0123456789"


def _within(seconds: float, call):
    """Run ``call`` in a thread; fail (not hang) when it blocks longer than ``seconds``."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"blocked for more than {seconds} s"
    return outcome[0]


def _raises(seconds: float, call, match: str) -> str:
    error = _within(seconds, call)
    assert isinstance(error, InputError), error
    message = str(error)
    assert "\n" not in message
    import re

    assert re.search(match, message), message
    return message


def _npy_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "dump"
    folder.mkdir(parents=True)
    np.save(folder / "a.npy", np.ones((2, 3), dtype=np.float32))
    np.save(folder / "b.npy", np.zeros((2, 3), dtype=np.float32))
    return folder


def test_a_fifo_named_npy_in_a_dump_folder_is_refused_without_blocking(tmp_path):
    folder = _npy_folder(tmp_path)
    os.mkfifo(folder / "c.npy")
    _raises(10, lambda: read_dump(folder), r"c.npy' is a named pipe \(FIFO\)")


def test_a_dump_linked_to_a_device_is_refused(tmp_path):
    for suffix in (".safetensors", ".npz"):
        link = tmp_path / f"zero{suffix}"
        link.symlink_to("/dev/zero")
        _raises(10, lambda link=link: read_dump(link), r"zero.* is a device; give a regular")


def test_a_name_map_linked_to_dev_zero_is_refused_before_reading(tmp_path):
    link = tmp_path / "map.json"
    link.symlink_to("/dev/zero")
    _raises(10, lambda: _name_map(str(link)), r"name map .*map.json' is a device")


def test_a_name_map_nested_100000_deep_is_one_line(tmp_path):
    deep = tmp_path / "map.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    _raises(10, lambda: _name_map(str(deep)), r"nested more than 32 levels")
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"a": "b", "c": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}))
    assert _name_map(str(nested)) == {"a": "b", "c": "[" * 38}  # brackets in strings count not


def test_an_oversized_name_map_or_order_file_is_refused_before_reading(tmp_path):
    big = tmp_path / "map.json"
    with open(big, "wb") as f:
        f.truncate(files.TEXT_LIMIT + 1)  # sparse: costs no disk
    _raises(10, lambda: _name_map(str(big)), r"map.json' is 16,777,217 bytes, more than")
    folder = _npy_folder(tmp_path)
    _raises(10, lambda: read_dump(folder, big), r"order file .* is 16,777,217 bytes")


def test_a_name_map_that_is_not_json_names_the_place_not_the_content(tmp_path):
    bad = tmp_path / "map.json"
    bad.write_text(f'{{"a": {SECRET}}}')
    message = _raises(10, lambda: _name_map(str(bad)), r"is not JSON \(Expecting value at "
                                                       r"line 1, column 7\)")
    assert SECRET not in message


def test_an_order_file_linked_to_a_token_file_never_shows_the_token(tmp_path):
    token = tmp_path / "token"
    token.write_text(SECRET + "\n")
    folder = _npy_folder(tmp_path)
    (folder / "order.txt").symlink_to(token)
    message = _raises(10, lambda: read_dump(folder), r"order.txt': 1 of its 1 lines name no "
                                                     r"tensor of the dump \(the first at line 1\)")
    assert SECRET not in message
    message = _raises(10, lambda: read_dump(_npy_folder(tmp_path / "2"), token),
                      r"order file .*token': 1 of its 1 lines")
    assert SECRET not in message
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe" + SECRET.encode())
    message = _raises(10, lambda: read_dump(_npy_folder(tmp_path / "3"), binary),
                      r"is not UTF-8 text \(byte 0 is not\)")
    assert SECRET not in message


def test_a_stray_file_in_an_npz_archive_is_skipped_with_its_reason(tmp_path):
    buffer = io.BytesIO()
    np.savez(buffer, a=np.ones(3, dtype=np.float32), ids=np.arange(3))
    archive = tmp_path / "port.npz"
    with open(archive, "wb") as f:
        f.write(buffer.getvalue())
    with zipfile.ZipFile(archive, "a") as z:
        z.writestr("README.txt", "not an array")
        z.writestr("flags.npy", b"\x93NUMPY garbage")
    dump = read_dump(archive)
    assert list(dump.values) == ["a"] and list(dump.integers) == ["ids"]
    assert dump.skipped == {"README.txt": "not a .npy array", "flags": "not a .npy array"}
    assert torch.equal(dump.values["a"], torch.ones(3))


def test_an_npz_declaring_a_huge_tensor_is_refused_before_inflating(tmp_path):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (2**40,)})
    archive = tmp_path / "bomb.npz"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("big.npy", header.getvalue() + b"\0" * 4096)
    _raises(10, lambda: read_dump(archive), r"tensor 'big' of shape \(1099511627776,\) needs "
                                            r"4,398,046,511,104 bytes, more than half")


def test_names_of_any_bytes_are_made_printable(tmp_path):
    folder = tmp_path / "dump"
    folder.mkdir()
    raw = os.fsencode(str(folder)) + b"/layer\xff\x1b[2J.npy"
    with open(raw, "wb") as f:
        np.save(f, np.ones(2, dtype=np.float32))
    buffer = tmp_path / "keys.npz"
    np.savez(buffer, **{"x\n|y\u202e": np.ones(2, dtype=np.float32)})
    assert list(read_dump(folder).values) == ["layer\\xff\\x1b[2J"]
    assert list(read_dump(buffer).values) == ["x\\n|y\\u202e"]
    for name in [*read_dump(folder).values, *read_dump(buffer).values]:
        assert name.isprintable() and name.encode("utf-8")


def test_two_names_alike_once_escaped_are_refused(tmp_path):
    archive = tmp_path / "twins.npz"
    np.savez(archive, **{"a\n": np.ones(1, dtype=np.float32),
                         "a\\n": np.ones(1, dtype=np.float32)})
    _raises(10, lambda: read_dump(archive), r"two tensors are named 'a\\\\n' once shown")


def _tiny_capture_bytes() -> bytes:
    import introspect
    from introspect.dump import capture
    from introspect.models.load import load_model

    loaded = load_model("bert-tiny")
    return capture_bytes(capture(loaded.model, introspect.tokenize(loaded.tokenizer),
                                 select="layers"))


@pytest.fixture(scope="module")
def tiny_capture_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("capture") / "ref.safetensors"
    path.write_bytes(_tiny_capture_bytes())
    return path


def _with_metadata(source: Path, target: Path, **changes: str) -> Path:
    from safetensors import safe_open

    from introspect.dump.formats import safetensors_bytes

    with safe_open(str(source), framework="pt") as handle:
        metadata = dict(handle.metadata())
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
    target.write_bytes(safetensors_bytes(tensors, {**metadata, **changes}))
    return target


def test_a_capture_with_damaged_metadata_says_capture(tiny_capture_file, tmp_path):
    for i, changes in enumerate([{"entries": "[{"}, {"entries": '[{"name": 3}]'},
                                 {"noise": '{"a": "x"}'}, {"entries": "[" * 5000}]):
        damaged = _with_metadata(tiny_capture_file, tmp_path / f"bad{i}.safetensors", **changes)
        _raises(10, lambda damaged=damaged: read_capture(damaged),
                r"^capture .*bad\d.safetensors': its metadata is damaged \(.*\); capture it again")
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(tiny_capture_file.read_bytes()[:200])
    _raises(10, lambda: read_capture(truncated), r"^cannot read capture .*cut.safetensors'")


def test_a_dump_with_a_non_utf8_file_name_diffs_and_writes_its_reports(
        tiny_capture_file, tmp_path, capsys):
    from introspect.cli.main import main

    capture = read_capture(tiny_capture_file)
    folder = tmp_path / "dump"
    folder.mkdir()
    for i, entry in enumerate(capture.entries):
        raw = os.fsencode(str(folder)) + f"/t{i}".encode() + b"\xff\xfe.npy"
        with open(raw, "wb") as f:
            np.save(f, capture.values[entry.name].numpy())
    out = tmp_path / "rep"
    code = main(["diff", "--reference-dump", str(tiny_capture_file), "--candidate-dump",
                 str(folder), "--out", str(out), "--json", str(tmp_path / "d.json")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Traceback" not in captured.err
    report = json.loads((tmp_path / "d.json").read_text(encoding="utf-8"))
    names = {row.get("candidate_node") for row in report["nodes"]}
    assert "t0\\xff\\xfe" in names
    assert (out / "diff.md").read_text(encoding="utf-8")
