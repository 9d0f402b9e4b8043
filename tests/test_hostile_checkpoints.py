"""Hostile and broken checkpoints: one line and exit 2, never a traceback, never code run.

Each case breaks a bert-tiny-sized checkpoint one way. It must be refused with the same
one-line message by the HF loader (``load_model``), the CLI (``--model`` and
``--candidate-model``, through both the HF and the from-scratch loaders) and, where the
from-scratch loader reads the same file, by ``scratch.BertModel.from_pretrained``; the
Python API raises ``InputError``. A few cases also run the real CLI in a fresh process.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from introspect import scratch
from introspect.cli.main import main
from introspect.cli.refusal import one_line
from introspect.errors import InputError
from introspect.models.load import load_model

ROOT = Path(__file__).parents[1]
TINY = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64)


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("good")
    scratch.BertModel(scratch.BertConfig(**TINY)).save_pretrained(folder)
    return folder


def _config(folder: Path, **changes: object) -> None:
    values = json.loads((folder / "config.json").read_text())
    values.update(changes)
    (folder / "config.json").write_text(json.dumps(values))


def _weights(folder: Path) -> Path:
    return folder / "model.safetensors"


def _truncate(folder: Path) -> None:
    data = _weights(folder).read_bytes()
    _weights(folder).write_bytes(data[: len(data) // 2])


def _pickled_bin(payload: object) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        _weights(folder).unlink()
        with open(folder / "pytorch_model.bin", "wb") as f:
            torch.save({"embeddings.word_embeddings.weight": torch.zeros(2), "x": payload}, f)
    return make


class RunsCode:
    """Unpickling this would create a marker file: proof that code ran."""

    def __reduce__(self):
        return (os.system, (f"touch {ROOT}/tests/.pickle-ran",))


def _raw_pickle(folder: Path) -> None:
    _weights(folder).unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(RunsCode()))


def _device_config(folder: Path) -> None:
    zero = folder / "zero"
    try:
        os.mknod(zero, 0o666 | stat.S_IFCHR, os.makedev(1, 5))  # a replica of /dev/zero
    except OSError as e:
        pytest.skip(f"mknod not permitted here: {e}")
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to("zero")


def _fifo_config(folder: Path) -> None:
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")


def _outside_config(folder: Path) -> None:
    outside = folder.parent / f"{folder.name}-outside.json"
    shutil.move(folder / "config.json", outside)
    (folder / "config.json").symlink_to(outside)


def _huge_config(folder: Path) -> None:
    with open(folder / "config.json", "r+b") as f:
        f.truncate(64 * 2**20)  # sparse: no disk used


def _sharded(shard: str) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        _weights(folder).unlink()
        index = {"metadata": {}, "weight_map": {"embeddings.word_embeddings.weight": shard}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return make


def _layers_in_weights(count: int) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        config = scratch.BertConfig(**{**TINY, "num_hidden_layers": count})
        scratch.BertModel(config).save_pretrained(folder)
        _config(folder, num_hidden_layers=2)
    return make


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "empty safetensors": (lambda f: _weights(f).write_bytes(b""), "the file is empty"),
    "truncated safetensors": (_truncate, "the file is truncated: its tensors need"),
    "garbage safetensors": (lambda f: _weights(f).write_bytes(os.urandom(4096)),
                            "not a safetensors file"),
    "header not JSON": (lambda f: _weights(f).write_bytes((8).to_bytes(8, "little") + b"{{{{{{{{"),
                        "its header is not JSON"),
    "pickle with a Python object": (_pickled_bin(Path("x")),
                                    r"refused to unpickle it.*asks for pathlib"),
    "pickle that runs code": (_raw_pickle, r"pytorch_model\.bin': refused to unpickle it"),
    "unknown hidden_act": (lambda f: _config(f, hidden_act="gelu_of_doom"),
                           "hidden_act 'gelu_of_doom' is not supported"),
    "zero heads": (lambda f: _config(f, num_attention_heads=0),
                   "num_attention_heads is 0; it must be a whole number > 0"),
    "hidden_size a string": (lambda f: _config(f, hidden_size="32"),
                             "hidden_size is '32'; it must be a whole number"),
    "hidden_size a fraction": (lambda f: _config(f, hidden_size=32.5),
                               "hidden_size is 32.5; it must be a whole number"),
    "hidden_size not divisible": (lambda f: _config(f, num_attention_heads=5),
                                  r"hidden size \(32\) is not a multiple"),
    "layer_norm_eps negative": (lambda f: _config(f, layer_norm_eps=-1),
                                "layer_norm_eps is -1; it must be a number > 0"),
    "num_labels 1e9": (lambda f: _config(f, num_labels=1e9),
                       "num_labels is 1000000000.0; it must be a whole number"),
    "100000 layers": (lambda f: _config(f, num_hidden_layers=100000),
                      r"num_hidden_layers 100000, but .* holds 2 .*would be random"),
    "a model larger than memory": (lambda f: _config(f, hidden_size=2**20, num_attention_heads=2),
                                   r"describes a model of about .* parameters .* available"),
    "fewer layers in the config than in the weights": (
        _layers_in_weights(4), r"encoder\.layer\.2\..*fit no parameter|fit no parameter"),
    "empty vocab.txt": (lambda f: (f / "vocab.txt").write_text(""), "vocab.txt' is empty"),
    "binary vocab.txt": (lambda f: (f / "vocab.txt").write_bytes(os.urandom(512) + b"\xff"),
                         "vocab.txt' is not UTF-8 text"),
    "config.json not JSON": (lambda f: (f / "config.json").write_text("{nope"),
                             r"config\.json' as JSON"),
    "config.json 64 MiB": (_huge_config, "more than the 16,777,216 such a file may have"),
    "config.json a link to a /dev/zero replica": (_device_config, "is not a regular file"),
    "config.json a FIFO": (_fifo_config, "is not a regular file"),
    "config.json a link out of the folder": (_outside_config, "outside the checkpoint folder"),
    "shard index pointing up": (_sharded("../elsewhere.safetensors"),
                                "outside the checkpoint folder"),
    "shard index with an absolute path": (_sharded("/etc/hostname"),
                                          "outside the checkpoint folder"),
}
# The from-scratch loader reads no tokenizer file; an unknown activation it refuses with its
# own (shorter) list, while the CLI checks --candidate-model up front with HF's list.
# Everything else it must refuse with the very same line.
NOT_FOR_SCRATCH = {"empty vocab.txt", "binary vocab.txt", "unknown hidden_act"}


@pytest.fixture(params=sorted(CASES))
def hostile(request, good_checkpoint, tmp_path) -> tuple[str, Path, str]:
    folder = tmp_path / "checkpoint"
    shutil.copytree(good_checkpoint, folder)
    make, message = CASES[request.param]
    make(folder)
    return request.param, folder, message


def _one_line(stderr: str, command: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"introspect {command}: error: "), stderr
    assert "Traceback" not in stderr and len(lines[0]) < 200
    return lines[0]


def _as_printed(error: BaseException, command: str) -> str:
    """The API's message as the CLI prints it: one line, its long paths shortened."""
    return one_line(f"introspect {command}: error: {error}")


def _steady(line: str) -> str:
    """``line`` with amounts of memory left out: the memory available, quoted by the
    refusal of a model larger than it, moves between the API's call and the CLI's."""
    return re.sub(r"\d[\d,.]* ?[KMGT]i?B\b", "<memory>", line)


def test_the_hf_loader_and_the_cli_refuse_it_with_one_line(hostile, capsys):
    name, folder, message = hostile
    with pytest.raises(InputError, match=message) as caught:
        load_model(str(folder))
    capsys.readouterr()
    assert main(["trace", "--model", str(folder)]) == 2
    line = _one_line(capsys.readouterr().err, "trace")
    assert _steady(line) == _steady(_as_printed(caught.value, "trace"))
    assert re.search(message, line)  # the problem
    assert main(["diff", "--model", "bert-tiny", "--candidate", "hf", "--candidate-model",
                 str(folder), "-q"]) == 2
    assert _steady(_one_line(capsys.readouterr().err, "diff")) == \
        _steady(_as_printed(caught.value, "diff"))
    assert not (ROOT / "tests" / ".pickle-ran").exists()


def test_the_scratch_loader_and_the_cli_refuse_it_with_one_line(hostile, capsys):
    name, folder, message = hostile
    if name in NOT_FOR_SCRATCH:
        pytest.skip("the from-scratch loader reads no tokenizer file; its own activation list "
                    "is tested below")
    with pytest.raises(InputError) as caught:
        scratch.BertModel.from_pretrained(folder)
    assert "\n" not in str(caught.value)
    capsys.readouterr()
    assert main(["diff", "--model", "bert-tiny", "--candidate-model", str(folder), "-q"]) == 2
    assert _steady(_one_line(capsys.readouterr().err, "diff")) == \
        _steady(_as_printed(caught.value, "diff"))
    assert not (ROOT / "tests" / ".pickle-ran").exists()


def _real_cli(argv: list[str]) -> tuple[int, str, int]:
    """Exit code, stderr and peak memory (KiB) of the real CLI in a fresh process.

    The peak is VmHWM, the high-water mark of this process's own memory: ru_maxrss would
    carry over the size of the forked test runner (Linux keeps it across exec).
    """
    script = ("import re, sys\n"
              "from introspect.cli.main import main\n"
              "code = main(sys.argv[1:])\n"
              "status = open('/proc/self/status').read()\n"
              "print('peak', re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1))\n"
              "sys.exit(code)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE",
                                                             "TRANSFORMERS_OFFLINE")}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True,
                         text=True, env=env, timeout=300)
    return run.returncode, run.stderr, int(run.stdout.split()[-1])


@pytest.mark.parametrize("case", ["100000 layers", "truncated safetensors",
                                  "pickle that runs code"])
def test_the_real_cli_exits_2_with_one_line_and_little_memory(good_checkpoint, tmp_path, case):
    folder = tmp_path / "checkpoint"
    shutil.copytree(good_checkpoint, folder)
    make, message = CASES[case]
    make(folder)
    code, stderr, peak_kib = _real_cli(["trace", "--model", str(folder)])
    assert code == 2
    assert _one_line(stderr, "trace")
    assert peak_kib < 2**20, f"peak memory {peak_kib} KiB"  # under 1 GiB
    assert not (ROOT / "tests" / ".pickle-ran").exists()


def test_100000_layers_over_minilm_sized_weights_is_refused_before_allocating(tmp_path):
    from introspect.models.load import minilm_folder

    folder = tmp_path / "minilm"
    shutil.copytree(minilm_folder(), folder)
    _config(folder, num_hidden_layers=100000)
    code, stderr, peak_kib = _real_cli(["diff", "--model", str(folder)])
    assert code == 2 and ("num_hidden_layers" in stderr or "describes a model" in stderr)
    assert peak_kib < 2**20, f"peak memory {peak_kib} KiB"


def test_the_hf_loader_names_layers_the_config_drops(good_checkpoint, tmp_path):
    folder = tmp_path / "checkpoint"
    _layers_in_weights(4)(folder)
    with pytest.raises(InputError, match=r"fit no parameter of BertModel: encoder\.layer\.2\."):
        load_model(str(folder))


def test_a_good_checkpoint_still_loads(good_checkpoint):
    loaded = load_model(str(good_checkpoint))
    assert loaded.model.config.num_hidden_layers == 2
    scratch.BertModel.from_pretrained(good_checkpoint)


def test_the_scratch_loader_refuses_an_unknown_activation_with_its_own_list(good_checkpoint,
                                                                            tmp_path):
    folder = tmp_path / "checkpoint"
    shutil.copytree(good_checkpoint, folder)
    _config(folder, hidden_act="gelu_of_doom")
    with pytest.raises(InputError, match=r"hidden_act 'gelu_of_doom' is not supported; use "
                                         r"one of gelu, gelu_new"):
        scratch.BertModel.from_pretrained(folder)
