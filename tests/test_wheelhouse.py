"""tools/wheelhouse.py offline: a small wheelhouse of wheels built here from throwaway projects, checked and installed
with no index; and the build's pure parts (the node's freeze, the platform tags, pip's no-wheel error, the walk that
leaves the node's packages and the torch stack out)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.tags import Tag

from tests.tools_helpers import TOOLS, load_tool

wh = load_tool("wheelhouse")
ROOT = TOOLS.parent
PY = f"{sys.version_info.major}.{sys.version_info.minor}"


def make_project(src: Path, name: str, version: str = "1.0", requires: tuple[str, ...] = ()) -> Path:
    """A throwaway project: one module, ``name``, built by setuptools."""
    project = src / name
    (project / name).mkdir(parents=True)
    (project / name / "__init__.py").write_text(f"VERSION = {version!r}\n")
    (project / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools>=61"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "{name}"
            version = "{version}"
            dependencies = {json.dumps(list(requires))}
            [tool.setuptools]
            packages = ["{name}"]
            """
        )
    )
    return project


def build_wheel(
    src: Path, out: Path, name: str, version: str = "1.0", requires: tuple[str, ...] = ()
) -> Path:
    """A wheel of a throwaway project built with this venv's setuptools, no index."""
    project = make_project(src, name, version, requires)
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index", "--no-build-isolation", "-q", "-w",
         str(out), str(project)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (wheel,) = out.glob(f"{name}-{version}-*.whl")
    return wheel


def retag(wheel: Path, tag: str) -> Path:
    """The same wheel under another tag (what a wheelhouse built for another Python holds)."""
    dest = wheel.with_name(wheel.name.replace("py3-none-any", tag))
    wheel.rename(dest)
    return dest


def manifest(folder: Path, requirements: list[str], build: list[str] | None = None) -> None:
    """wheelhouse.json and requirements.txt as ``build`` writes them."""
    (folder / wh.MANIFEST).write_text(
        json.dumps(
            {
                "platform": "manylinux_2_28_x86_64",
                "requirements": requirements,
                "build_requirements": build or [],
            }
        )  # fmt: skip
    )
    (folder / wh.REQUIREMENTS).write_text("\n".join(requirements) + "\n")


@pytest.fixture(scope="module")
def house(tmp_path_factory) -> Path:
    """alpha 1.0 (needs beta>=2 and, for its [fast] extra, gamma) and beta 2.0, as built wheels."""
    root = tmp_path_factory.mktemp("wh")
    out = root / "wheels"
    build_wheel(root / "src", out, "alpha", requires=("beta>=2", "gamma; extra == 'fast'"))
    build_wheel(root / "src", out, "beta", version="2.0")
    manifest(out, ["alpha>=1"])
    return out


def copy_house(house: Path, dest: Path, drop: tuple[str, ...] = ()) -> Path:
    dest.mkdir()
    for p in house.iterdir():
        if not p.name.startswith(drop):
            (dest / p.name).write_bytes(p.read_bytes())
    return dest


def test_a_complete_wheelhouse_passes_the_check(house):
    assert wh.check(house, installed={}) == []
    # the node's own beta serves when it satisfies the requirement
    assert (
        wh.check(copy_house(house, house.parent / "no-beta", drop=("beta",)), installed={"beta": "2.1"}) == []
    )


def test_a_missing_package_is_one_line_naming_it_and_the_fix(house, tmp_path):
    lacking = copy_house(house, tmp_path / "wh", drop=("beta",))
    (line,) = wh.check(lacking, installed={})
    assert "no beta>=2 (needed by alpha)" in line
    assert f"make wheelhouse WHEELHOUSE={lacking} PYTHON_VERSION={PY} PLATFORM=manylinux_2_28_x86_64" in line
    # an installed beta too old for alpha is not enough, and the line says which one is there
    (line,) = wh.check(lacking, installed={"beta": "1.5"})
    assert "beta 1.5 installed here does not satisfy it" in line
    # an extra pulls its own requirements: alpha[fast] needs gamma, which no one has
    (line,) = wh.check(house, requirements=["alpha[fast]"], installed={})
    assert "no gamma (needed by alpha)" in line and "beta" not in line.split(":")[0]
    # many gaps (a wheelhouse for another node): still one line, the first spelled out, the rest named
    (line,) = wh.check(lacking, requirements=["alpha", "d1", "d2", "d3", "d4"], installed={})
    assert (
        "holds no d1 (needed by prove); no d2 (needed by prove); no d3 (needed by prove); and 2 more: d4, beta:"
        in line
    )
    assert line.count("\n") == 0
    # a node without torch: that gap is the node's to fix, and said first
    (line,) = wh.check(house, requirements=["alpha", "d1", "torch>=2.4"], installed={})
    assert "holds no torch>=2.4 (needed by prove) — the torch / CUDA stack is the node's own" in line
    # a folder that is no wheelhouse at all
    (line,) = wh.check(tmp_path, installed={})
    assert "holds no wheelhouse.json" in line and "make wheelhouse" in line


def test_a_wheel_for_another_python_is_named_as_such(house, tmp_path):
    other = copy_house(house, tmp_path / "wh")
    (beta,) = other.glob("beta-*.whl")
    retag(beta, "cp39-cp39-manylinux_2_28_x86_64")
    (line,) = wh.check(other, installed={})
    assert "beta>=2 (needed by alpha) only as beta-2.0-cp39-cp39-manylinux_2_28_x86_64.whl" in line
    assert "another Python or platform" in line and f"PYTHON_VERSION={PY}" in line
    # the same wheel is fine for an interpreter that has the tag
    assert wh.check(other, installed={}, tags=[Tag("cp39", "cp39", "manylinux_2_28_x86_64"),
                                               Tag("py3", "none", "any")]) == []  # fmt: skip


BACKEND = """
import base64, hashlib, os, zipfile


def _row(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    here = os.path.dirname(os.path.abspath(__file__))
    info = "checkout-1.0.dist-info"
    files = {
        "checkout.pth": (here + "\\n").encode(),
        f"{info}/METADATA": b"Metadata-Version: 2.1\\nName: checkout\\nVersion: 1.0\\nRequires-Dist: alpha\\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    name = "checkout-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{info}/RECORD", "\\n".join([*(_row(p, d) for p, d in files.items()), f"{info}/RECORD,,"]))
    return name
"""


def make_checkout(folder: Path) -> Path:
    """A checkout whose build backend lives in it (no build requirement to fetch): editable installs add it to
    sys.path."""
    (folder / "checkout").mkdir(parents=True)
    (folder / "checkout" / "__init__.py").write_text("")
    (folder / "backend.py").write_text(BACKEND)
    (folder / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    )
    return folder


def test_install_checks_first_then_installs_with_no_index(house, tmp_path):
    """The node's path end to end in a fresh venv over this interpreter's site-packages: a wheelhouse lacking beta
    installs nothing (one line, exit 1); the complete one installs alpha and beta and the checkout, editable."""
    complete = copy_house(house, tmp_path / "wh")
    lacking = copy_house(complete, tmp_path / "wh-lacking", drop=("beta",))
    checkout = make_checkout(tmp_path / "src")
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(tmp_path / "venv")], check=True
    )
    py = str(tmp_path / "venv" / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # this machine's find-links and indexes stay out of it
    tool = [py, str(TOOLS / "wheelhouse.py"), "install"]
    probe = [py, "-c", "import importlib.util as u; print(u.find_spec('alpha') is None)"]

    r = subprocess.run(
        [*tool, str(lacking), "--project", str(checkout)], capture_output=True, text=True, env=env
    )
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "no beta>=2 (needed by alpha)" in r.stderr, r.stderr
    assert subprocess.run(probe, capture_output=True, text=True).stdout.strip() == "True"  # nothing installed

    r = subprocess.run(
        [*tool, str(complete), "--project", str(checkout)], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    got = subprocess.run(
        [py, "-c", "import alpha, beta, checkout; print(alpha.VERSION, beta.VERSION, checkout.__file__)"],
        capture_output=True, text=True, cwd=tmp_path,
    ).stdout.split()  # fmt: skip
    assert got[:2] == ["1.0", "2.0"] and got[2].startswith(str(checkout)), (
        got
    )  # editable: the checkout itself


def test_make_install_with_a_wheelhouse_runs_the_node_path():
    """`make install WHEELHOUSE=dir`: a venv over the node's site-packages, then the checked install — not the
    registry path (pip install torch, deepspeed from PyPI)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", "install", "VENV=/tmp/nowhere-venv", "WHEELHOUSE=/tmp/wh",
         "NODE_PYTHON=python3.12"],
        cwd=ROOT, capture_output=True, text=True, env=env,
    ).stdout  # fmt: skip
    assert "python3.12 -m venv --system-site-packages /tmp/nowhere-venv" in out
    assert "/tmp/nowhere-venv/bin/python tools/wheelhouse.py install /tmp/wh --project ." in out
    assert "deepspeed" not in out and "pip install" not in out


def test_the_node_freeze_and_the_platform_tags():
    freeze = wh.read_freeze(
        "torch==2.6.0a0+ecf3bae40a\nNumPy==1.26.4\nmylib @ file:///src/mylib\n-e git+https://x/y#egg=y\n# note\n"
    )
    assert freeze == {"torch": "2.6.0a0+ecf3bae40a", "numpy": "1.26.4", "mylib": None}
    tags = wh.platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and {"manylinux_2_17_x86_64", "manylinux2014_x86_64"} <= set(
        tags
    )
    assert "manylinux_2_29_x86_64" not in tags and "linux_x86_64" not in tags
    assert wh.platforms("manylinux2014_x86_64")[0] == "manylinux_2_17_x86_64"
    assert "manylinux_2_28_x86_64" not in wh.platforms("manylinux2014_x86_64")
    assert wh.platforms("macosx_11_0_arm64") == ["macosx_11_0_arm64"]


def test_pips_no_wheel_errors_name_the_sdist_to_build():
    assert wh.wheelless("ERROR: No matching distribution found for deepspeed>=0.16\n") == "deepspeed>=0.16"
    conflict = textwrap.dedent(
        """
        The conflict is caused by:
            hydra-core 1.3.8 depends on antlr4-python3-runtime==4.9.*
            hydra-core 1.3.7 depends on antlr4-python3-runtime==4.9.*

        Additionally, some packages in these conflicts have no matching distributions available for your environment:
            antlr4-python3-runtime

        To fix this you could try to:
        """
    )
    assert wh.wheelless(conflict) == "antlr4-python3-runtime==4.9.*"
    assert wh.wheelless("ERROR: ResolutionImpossible: numpy<1 and numpy>2") is None


def _entry(name: str, version: str, *requires: str) -> dict:
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


def test_the_walk_leaves_the_node_and_the_torch_stack_out():
    """From pip's resolution: what only torch needs (sympy, nvidia-*) stays out, so do the node's packages and their
    dependencies, and a marker is read for the target Python, not this one."""
    install = [
        _entry("hydra-core", "1.3.8", "omegaconf>=2.2", "antlr4-python3-runtime==4.9.*"),
        _entry("omegaconf", "2.3.1", "PyYAML>=5.1"),
        _entry("antlr4-python3-runtime", "4.9.3"),
        _entry("PyYAML", "6.0.4"),
        _entry("deepspeed", "0.19.8", "torch", "hjson", "backports.zoneinfo; python_version < '3.12'"),
        _entry("hjson", "3.1.0"),
        _entry("backports.zoneinfo", "0.2.1"),
        _entry("torch", "2.7.1", "sympy>=1.13", "nvidia-cublas-cu12; platform_system == 'Linux'"),
        _entry("sympy", "1.14.0", "mpmath"),
        _entry("mpmath", "1.3.0"),
        _entry("nvidia-cublas-cu12", "12.6.4.1"),
        _entry("transformers", "5.25.0", "tokenizers", "pyyaml"),
        _entry("tokenizers", "0.23.3"),
        _entry("datasets", "5.2.0", "fsspec[http]"),
        _entry("fsspec", "2026.9.0", "aiohttp; extra == 'http'", "s3fs; extra == 's3'"),
        _entry("aiohttp", "3.13.0"),
        _entry("s3fs", "2026.9.0"),
    ]
    wh.TARGET_ENV.clear()
    wh.TARGET_ENV.update(wh.marker_env("3.12"))
    roots = ["hydra-core>=1.3.2", "deepspeed>=0.16", "transformers>=5", "datasets"]
    got = wh.needed(install, roots, node={"transformers": "5.25.0", "pyyaml": "6.0.4"})
    assert set(got) == {"hydra-core", "omegaconf", "antlr4-python3-runtime", "deepspeed", "hjson", "datasets",
                        "fsspec", "aiohttp"}  # fmt: skip
    wh.TARGET_ENV.update(wh.marker_env("3.11"))
    assert "backports-zoneinfo" in wh.needed(install, roots, node={})
    full = wh.needed(install, roots, node={})
    assert {"transformers", "tokenizers", "pyyaml"} <= set(full) and not {"torch", "sympy", "mpmath"} & set(
        full
    )


def test_the_requirements_are_the_projects_less_the_node_stack_and_without():
    reqs = wh.project_requirements(ROOT / "pyproject.toml", without=["wandb"])
    names = {r.split(">")[0].split("=")[0].split("<")[0].strip() for r in reqs}
    assert {"hydra-core", "deepspeed", "datasets", "transformers"} <= names
    assert "torch" not in names and "wandb" not in names and "matplotlib" in names
    assert any(r.startswith("setuptools") for r in wh.build_requirements(ROOT / "pyproject.toml"))


def test_a_rebuild_keeps_what_it_holds_and_drops_stale_wheels(tmp_path, monkeypatch):
    """build's bookkeeping, with pip's resolution and download stood in: a wheel already held at the resolved version
    (a built DeepSpeed) is not fetched again, an older one of another build is removed, the rest is fetched; the
    manifest and requirements.txt say what the node installs. Catches a rebuild that re-downloads or keeps stale files."""
    out = tmp_path / "wh"
    out.mkdir()
    (out / "deepspeed-0.19.8-py3-none-any.whl").write_bytes(b"built once")
    (out / "hjson-3.0.0-py3-none-any.whl").write_bytes(b"stale")
    install = [
        _entry("deepspeed", "0.19.8", "hjson"),
        _entry("hjson", "3.1.0"),
        _entry("setuptools", "84.2.1"),
    ]
    monkeypatch.setattr(wh, "resolve", lambda roots, *a: install)
    monkeypatch.setattr(wh, "project_requirements", lambda *a: ["deepspeed>=0.16"])
    monkeypatch.setattr(wh, "build_requirements", lambda *a: ["setuptools>=77"])
    fetched: list[str] = []

    def pip(*args, env=None):
        assert args[0] == "download" and "--no-deps" in args and "--only-binary=:all:" in args
        for pin in args[args.index(str(out)) + 1 :]:
            fetched.append(pin)
            name, version = pin.split("==")
            (out / f"{name}-{version}-py3-none-any.whl").write_bytes(b"x" * 10)
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(wh, "pip", pip)
    assert wh.main(["build", "--out", str(out), "--python-version", "3.12"]) == 0
    assert sorted(fetched) == ["hjson==3.1.0", "setuptools==84.2.1"]
    assert sorted(p.name for p in out.glob("*.whl")) == [
        "deepspeed-0.19.8-py3-none-any.whl", "hjson-3.1.0-py3-none-any.whl", "setuptools-84.2.1-py3-none-any.whl"
    ]  # fmt: skip
    manifest = json.loads((out / wh.MANIFEST).read_text())
    assert manifest["python_version"] == "3.12" and set(manifest["files"]) == {
        "deepspeed",
        "hjson",
        "setuptools",
    }
    assert manifest["total_bytes"] == len(b"built once") + 20
    assert (out / wh.REQUIREMENTS).read_text() == "deepspeed>=0.16\n"
