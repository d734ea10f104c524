"""An offline wheelhouse: the wheels a GPU node without internet lacks, built on a machine with the registries.

    python tools/wheelhouse.py build --out wheelhouse                          # make wheelhouse: the full set
    python tools/wheelhouse.py build --out wheelhouse --freeze node-freeze.txt # only what that node lacks
    python tools/wheelhouse.py build --out wheelhouse --python-version 3.11 --platform manylinux2014_x86_64
    python tools/wheelhouse.py check wheelhouse                                # on the node: one line per gap, or OK
    python tools/wheelhouse.py install wheelhouse --project .                  # check, then pip --no-index

**build** resolves prove's dependencies (pyproject.toml's ``dependencies`` and the ``deepspeed`` extra, less
``--without``) for the target interpreter and platform (default CPython 3.12, ``manylinux_2_28_x86_64``, which also
takes the older manylinux wheels) with pip's resolver, metadata only (``pip install --dry-run --report``), then
downloads the wheels it picked (``pip download --no-deps``). The torch / CUDA stack (:data:`NODE_STACK`) is always
the node's own: neither it nor what only it needs (sympy, networkx, triton, the nvidia-* libraries) enters the
wheelhouse. ``--freeze`` takes the node's ``pip freeze``: each package there is pinned at the node's version (a
wheel of nothing, :func:`write_stub`, stands in for it, so local versions such as ``2.6.0a0+ecf3bae`` resolve too)
and left out. A package with no wheel at all (DeepSpeed, antlr4-python3-runtime) is built once into a wheel from
its sdist with this venv's torch (``DS_BUILD_OPS=0``: DeepSpeed's ops are built just in time on the node) and kept
in the wheelhouse, so a rebuild reuses it; a build that is not pure Python is refused (it would hold this machine's
interpreter). The wheelhouse gets ``requirements.txt`` (what ``install`` asks for) and ``wheelhouse.json`` (target,
files, sizes), and the sizes are printed, largest first.

**check** (run by the node's Python, in the venv that will get the wheels) walks the same requirements through the
wheelhouse with that interpreter's tags and what it already has installed. A requirement that neither is met
by an installed package nor by a wheel of the wheelhouse this interpreter can install gets one line naming the
package and the ``make wheelhouse`` call that fixes it (a wheel held for another Python or platform says so), and
the exit status is 1, before anything is installed. **install** runs check, then ``pip install --no-index
--find-links`` of the requirements and ``--no-deps -e`` of the checkout. Needs only the standard library and
``packaging`` (transformers' own dependency; pip's vendored copy otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from email.parser import Parser
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.tags import sys_tags
    from packaging.utils import canonicalize_name, parse_wheel_filename
    from packaging.version import InvalidVersion, Version
except ImportError:  # a bare interpreter: pip's vendored copy
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef,assignment]
    from pip._vendor.packaging.tags import sys_tags  # type: ignore[no-redef,assignment]
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename  # type: ignore[no-redef,assignment]
    from pip._vendor.packaging.version import InvalidVersion, Version  # type: ignore[no-redef,assignment]

ROOT = Path(__file__).resolve().parents[1]
PYTHON_VERSION = "3.12"
PLATFORM = "manylinux_2_28_x86_64"
NODE_STACK = ("torch", "torchvision", "torchaudio", "triton", "pytorch-triton")
"""Always the node's: the CUDA build of torch and what ships with it (names starting ``nvidia-`` too)."""
SDIST_ENV = {"DS_BUILD_OPS": "0"}
"""While a wheel is built from an sdist: DeepSpeed builds none of its CUDA ops ahead of time (JIT on the node)."""
MANIFEST = "wheelhouse.json"
SHOWN = 3
"""Gaps the check's line spells out; the others it names only (a wheelhouse for another Python lacks them all)."""
REQUIREMENTS = "requirements.txt"


def node_stack(name: str) -> bool:
    name = canonicalize_name(name)
    return name in NODE_STACK or name.startswith("nvidia-")


def project_requirements(pyproject: Path, without: Iterable[str] = ()) -> list[str]:
    """prove's runtime requirements and the deepspeed extra, less ``without`` (canonical names) and the node stack."""
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = [*project["dependencies"], *project.get("optional-dependencies", {}).get("deepspeed", [])]
    skip = {canonicalize_name(n) for n in without}
    return [
        r
        for r in reqs
        if not node_stack(Requirement(r).name) and canonicalize_name(Requirement(r).name) not in skip
    ]


def build_requirements(pyproject: Path) -> list[str]:
    import tomllib

    return list(tomllib.loads(pyproject.read_text())["build-system"]["requires"])


def read_freeze(text: str) -> dict[str, str | None]:
    """``pip freeze`` → {canonical name: version}; None for a direct reference (``name @ url``), whose version is
    unknown. Editable lines and options are skipped."""
    out: dict[str, str | None] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        if " @ " in line:
            out[canonicalize_name(line.split(" @ ", 1)[0].strip())] = None
        elif "==" in line:
            name, version = line.split("==", 1)
            out[canonicalize_name(name.strip())] = version.strip()
    return out


def write_stub(folder: Path, name: str, version: str) -> Path:
    """A wheel of nothing at ``name==version`` with no dependencies: the resolver's stand-in for a node package."""
    dist = f"{canonicalize_name(name).replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(
            f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{dist}.dist-info/RECORD", "")
    return path


LEGACY_MANYLINUX = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}


def platforms(platform: str) -> list[str]:
    """The platform tags a node of ``platform`` installs, newest first: a manylinux glibc 2.N node takes every
    manylinux_2_M wheel with M ≤ N and the legacy aliases (pip's ``--platform`` does not widen them itself)."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    legacy = re.fullmatch(r"(manylinux2014|manylinux2010|manylinux1)_(\w+)", platform)
    if legacy:
        m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", f"manylinux_2_{LEGACY_MANYLINUX[legacy[1]]}_{legacy[2]}")
    if not m:
        return [platform]
    glibc, arch = int(m[1]), m[2]
    tags = [f"manylinux_2_{n}_{arch}" for n in range(glibc, 4, -1)]
    return tags + [f"{alias}_{arch}" for alias, n in LEGACY_MANYLINUX.items() if n <= glibc]


def target_args(python_version: str, platform: str) -> list[str]:
    abi = "cp" + python_version.replace(".", "")
    return ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp", "--abi", abi,
            *[a for p in platforms(platform) for a in ("--platform", p)]]  # fmt: skip


def pip(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})  # fmt: skip


NO_MATCH = re.compile(r"No matching distribution found for (\S+)")
NO_DIST = re.compile(r"have no matching distributions available for your environment:\n((?:\s+\S+\n?)+)")


def wheelless(stderr: str) -> str | None:
    """The requirement pip found no wheel for, from its error: ``No matching distribution found for X``, or a
    conflict whose packages "have no matching distributions" (the spec from the first ``depends on`` line)."""
    m = NO_MATCH.search(stderr)
    if m:
        return m.group(1)
    m = NO_DIST.search(stderr)
    if not m:
        return None
    name = m.group(1).split()[0]
    dep = re.search(rf"depends on ({re.escape(name)}\S*)", stderr, re.IGNORECASE)
    return dep.group(1) if dep else name


def build_sdist_wheel(spec: str, out: Path) -> Path:
    """``spec``'s wheel built from its sdist with this interpreter (and its torch), into ``out``; refused unless
    pure Python."""
    with tempfile.TemporaryDirectory() as tmp:
        print(f"wheelhouse: {spec} has no wheel: building one from its sdist", file=sys.stderr, flush=True)
        r = pip("wheel", "--no-deps", "--no-build-isolation", "--no-binary", Requirement(spec).name, "-w", tmp,
                spec, env=SDIST_ENV)  # fmt: skip
        wheels = list(Path(tmp).glob("*.whl"))
        if r.returncode or len(wheels) != 1:
            raise SystemExit(
                f"wheelhouse: building {spec} from its sdist failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
            )
        wheel = wheels[0]
        tags = parse_wheel_filename(wheel.name)[3]
        if any(t.platform != "any" or t.abi != "none" for t in tags):
            raise SystemExit(
                f"wheelhouse: {spec}'s sdist builds a platform wheel ({wheel.name}) here: build the wheelhouse on a "
                "machine with the node's Python and platform"
            )
        dest = out / wheel.name
        os.replace(wheel, dest)
        return dest


def resolve(roots: list[str], target: list[str], links: list[Path], constraints: Path) -> list[dict]:
    """pip's resolution of ``roots`` for the target (metadata only), building sdist-only packages into
    ``links[0]`` as they come up; the report's ``install`` list."""
    built: set[str] = set()
    while True:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.json"
            r = pip("install", "--dry-run", "--ignore-installed", "--report", str(report), "--target",
                    str(Path(tmp) / "t"), *target, "-c", str(constraints),
                    *[a for p in links for a in ("--find-links", str(p))], *roots)  # fmt: skip
            if r.returncode == 0:
                return json.loads(report.read_text())["install"]
        spec = wheelless(r.stdout + r.stderr)
        if spec is None or canonicalize_name(Requirement(spec).name) in built:
            err = "\n".join(
                line
                for line in (r.stdout + r.stderr).splitlines()
                if not line.startswith("WARNING: Location")
            )
            raise SystemExit(f"wheelhouse: pip could not resolve the requirements:\n{err[-3000:]}")
        built.add(canonicalize_name(Requirement(spec).name))
        build_sdist_wheel(spec, links[0])


def needed(install: list[dict], roots: list[str], node: Mapping[str, str | None]) -> dict[str, dict]:
    """The resolved packages reachable from ``roots`` without passing through the node stack or a node package:
    {canonical name: report entry}. Markers are the target's (the report's environment is pip's own; the
    target's python_version is not in it), so the walk reads them with the
    target's Python version (:data:`TARGET_ENV`)."""
    by_name = {canonicalize_name(e["metadata"]["name"]): e for e in install}
    out: dict[str, dict] = {}
    todo = [Requirement(r) for r in roots]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        key = (name, frozenset(req.extras))
        if key in seen or node_stack(name) or name in node or name not in by_name:
            continue
        seen.add(key)
        entry = by_name[name]
        out[name] = entry
        for dep in entry["metadata"].get("requires_dist", []):
            d = Requirement(dep)
            if d.marker is not None:
                if not any(d.marker.evaluate({**TARGET_ENV, "extra": e}) for e in (req.extras or {""})):
                    continue
            todo.append(d)
    return out


TARGET_ENV: dict[str, str] = {}
"""The marker environment of the target interpreter (set by :func:`marker_env`)."""


def marker_env(python_version: str) -> dict[str, str]:
    major_minor = python_version.split(".")[:2]
    return {
        "python_version": ".".join(major_minor),
        "python_full_version": ".".join(major_minor) + ".0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "os_name": "posix",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "platform_release": "",
        "platform_version": "",
        "implementation_version": ".".join(major_minor) + ".0",
    }


def build(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pyproject = Path(args.project) / "pyproject.toml"
    roots = project_requirements(pyproject, args.without)
    node = read_freeze(Path(args.freeze).read_text()) if args.freeze else {}
    for name in args.upgrade:
        node.pop(canonicalize_name(name), None)
    TARGET_ENV.clear()
    TARGET_ENV.update(marker_env(args.python_version))
    target = target_args(args.python_version, args.platform)
    keep = wheels_to_keep(pyproject, roots, node, target, out)
    files = fetch_wheels(out, keep, target)
    (out / REQUIREMENTS).write_text("\n".join(roots) + "\n")
    sizes = {n: p.stat().st_size for n, p in files.items()}
    manifest = {
        "python_version": args.python_version,
        "platform": args.platform,
        "requirements": roots,
        "build_requirements": build_requirements(pyproject),
        "without": sorted(canonicalize_name(n) for n in args.without),
        "node_freeze": bool(args.freeze),
        "files": {n: {"file": p.name, "bytes": sizes[n]} for n, p in sorted(files.items())},
        "total_bytes": sum(sizes.values()),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    for n in sorted(sizes, key=sizes.get, reverse=True):  # type: ignore[arg-type]
        print(f"{sizes[n] / 1e6:9.2f} MB  {files[n].name}")
    print(f"{sum(sizes.values()) / 1e6:9.2f} MB  in {len(files)} wheels: {out}")
    return 0


def wheels_to_keep(
    pyproject: Path, roots: list[str], node: dict[str, str | None], target: list[str], out: Path
) -> dict[str, dict]:
    """What the node lacks of the resolution of ``roots`` for the target, with the node's own versions pinned (as
    stub wheels, so pip takes them as installed), plus the build backend of ``pip install -e .`` (resolved on its
    own: the node's setuptools may be older)."""
    with tempfile.TemporaryDirectory() as tmp:
        stubs, constraints = Path(tmp) / "stubs", Path(tmp) / "constraints.txt"
        stubs.mkdir()
        pins = []
        for name, version in node.items():
            if version is not None:
                write_stub(stubs, name, version)
                pins.append(f"{name}=={version}")
        constraints.write_text("\n".join(pins) + "\n")
        install = resolve(roots, target, [out, stubs], constraints)
        keep = needed(install, roots, node)
        build_install = resolve(build_requirements(pyproject), target, [out], Path(os.devnull))
        keep.update(needed(build_install, build_requirements(pyproject), {}))
    return keep


def _held(p: Path) -> tuple[str, Version]:
    """A wheel file's canonical name and version."""
    name, version = parse_wheel_filename(p.name)[:2]
    return canonicalize_name(name), version


def fetch_wheels(out: Path, keep: dict[str, dict], target: list[str]) -> dict[str, Path]:
    """Download the kept wheels ``out`` does not hold yet, drop the stale ones of an earlier build (another node,
    another target); the wheel file of every kept name, or exit naming those that did not come."""
    wanted = {n: Version(e["metadata"]["version"]) for n, e in keep.items()}
    have = {_held(p) for p in out.glob("*.whl")}
    fetch = sorted(f"{keep[n]['metadata']['name']}=={v}" for n, v in wanted.items() if (n, v) not in have)
    if fetch:
        r = pip("download", "--no-deps", *target, "-d", str(out), *fetch)
        if r.returncode:
            raise SystemExit(f"wheelhouse: pip download failed:\n{r.stderr[-3000:]}")
    files = {}
    for p in sorted(out.glob("*.whl")):
        name, got = _held(p)
        if wanted.get(name) == got:
            files[name] = p
        else:
            p.unlink()
    missing = sorted(set(keep) - set(files))
    if missing:
        raise SystemExit(f"wheelhouse: no wheel came for {', '.join(missing)}")
    return files


# ---- on the node -------------------------------------------------------------------------------------------------


def wheel_metadata(path: Path) -> list[str]:
    """Requires-Dist of a wheel file."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        return Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []


def installed_versions() -> dict[str, str]:
    from importlib.metadata import distributions

    return {canonicalize_name(d.metadata["Name"]): d.version for d in distributions() if d.metadata["Name"]}


def fix_call(folder: Path, manifest: Mapping) -> str:
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    platform = manifest.get("platform", PLATFORM)
    return (
        f"make wheelhouse WHEELHOUSE={folder} PYTHON_VERSION={py} PLATFORM={platform} "
        "NODE_FREEZE=<this node's pip freeze> (on a machine with the registries)"
    )


def _short(req: Requirement) -> str:
    """``name[extras]specifier``, without the marker that selected it."""
    return req.name + (f"[{','.join(sorted(req.extras))}]" if req.extras else "") + str(req.specifier)


def _satisfies(version: str, req: Requirement) -> bool:
    try:
        return req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


Wheels = dict[str, list[tuple[Version, Path, frozenset]]]
"""The wheelhouse's wheels by canonical name: (version, file, tags)."""


def check(
    folder: Path,
    requirements: list[str] | None = None,
    installed: Mapping[str, str] | None = None,
    tags: Iterable | None = None,
) -> list[str]:
    """One line naming every requirement this interpreter can meet neither from what it has installed nor from
    the wheelhouse, and the ``make wheelhouse`` call that fixes it; [] when every one is met. ``installed`` / ``tags``: the interpreter's own unless given (tests)."""
    manifest_path = folder / MANIFEST
    if not manifest_path.exists():
        return [f"wheelhouse: {folder} holds no {MANIFEST}: build it with {fix_call(folder, {})}"]
    manifest = json.loads(manifest_path.read_text())
    reqs = [*(requirements if requirements is not None else manifest["requirements"]),
            *manifest.get("build_requirements", [])]  # fmt: skip
    have = installed_versions() if installed is None else dict(installed)
    supported = list(tags if tags is not None else sys_tags())
    gaps = walk_gaps(reqs, have, wheels_by_name(folder), {t: i for i, t in enumerate(supported)})
    if not gaps:
        return []
    gaps.sort(key=lambda g: not node_stack(g[0]))  # torch missing is the node's to fix: said first
    shown = "; ".join(gap for _, gap in gaps[:SHOWN])
    if len(gaps) > SHOWN:  # still one line: the rest by name
        shown += f"; and {len(gaps) - SHOWN} more: {', '.join(name for name, _ in gaps[SHOWN:])}"
    return [f"wheelhouse: {folder} holds {shown}: rebuild it with {fix_call(folder, manifest)}"]


def wheels_by_name(folder: Path) -> Wheels:
    wheels: Wheels = {}
    for p in folder.glob("*.whl"):
        name, version, _, wtags = parse_wheel_filename(p.name)
        wheels.setdefault(canonicalize_name(name), []).append((version, p, wtags))
    return wheels


def walk_gaps(
    reqs: list[str], have: Mapping[str, str], wheels: Wheels, rank: Mapping[object, int]
) -> list[tuple[str, str]]:
    """Breadth first from ``reqs``: a requirement met by what is installed stops there (its dependencies are the
    node's business); else the newest wheel for this interpreter's tags meets it and its dependencies follow; a
    requirement neither meets is a gap, ``(name, what is wrong)``."""
    gaps: list[tuple[str, str]] = []
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(Requirement(r), "prove") for r in reqs]
    while todo:
        req, parent = todo.pop(0)
        name = canonicalize_name(req.name)
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        if name in have and _satisfies(have[name], req):
            continue
        candidates = [
            (v, p, t) for v, p, t in wheels.get(name, []) if req.specifier.contains(v, prereleases=True)
        ]
        usable = sorted(
            (c for c in candidates if any(t in rank for t in c[2])), key=lambda c: c[0], reverse=True
        )
        if not usable:
            held = sorted(p.name for _, p, _ in candidates) or sorted(
                p.name for _, p, _ in wheels.get(name, [])
            )
            gaps.append((name, gap_line(req, parent, held, have)))
            continue
        todo += [(d, name) for d in wheel_requirements(usable[0][1], req)]
    return gaps


def gap_line(req: Requirement, parent: str, held: list[str], have: Mapping[str, str]) -> str:
    """What is wrong with one requirement: wheels only for another Python or platform, or none; and whether the
    installed version falls short, or it is the node's own torch / CUDA stack."""
    name = canonicalize_name(req.name)
    gap = (
        f"{_short(req)} (needed by {parent}) only as {', '.join(held)}, built for another Python or platform "
        f"than this {sys.implementation.name} {sys.version_info.major}.{sys.version_info.minor}"
        if held
        else f"no {_short(req)} (needed by {parent})"
    )
    if name in have:
        gap += f", and {name} {have[name]} installed here does not satisfy it"
    if node_stack(name):
        gap += " — the torch / CUDA stack is the node's own: install its build here first"
    return gap


def wheel_requirements(wheel: Path, req: Requirement) -> list[Requirement]:
    """A wheel's dependencies that apply to ``req``'s extras."""
    deps = [Requirement(dep) for dep in wheel_metadata(wheel)]
    return [
        d
        for d in deps
        if d.marker is None or any(d.marker.evaluate({"extra": e}) for e in (req.extras or {""}))
    ]


def install(folder: Path, project: Path) -> int:
    problems = check(folder)
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        return 1
    common = ["install", "--no-index", "--find-links", str(folder)]
    for args in ([*common, "-r", str(folder / REQUIREMENTS)], [*common, "--no-deps", "-e", str(project)]):
        r = subprocess.run([sys.executable, "-m", "pip", *args])
        if r.returncode:
            return r.returncode
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/wheelhouse.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser(
        "build", help="resolve, build and download the wheelhouse (a machine with the registries)"
    )
    b.add_argument("--out", default="wheelhouse")
    b.add_argument(
        "--python-version", default=PYTHON_VERSION, help=f"the node's Python (default {PYTHON_VERSION})"
    )
    b.add_argument("--platform", default=PLATFORM, help=f"the node's wheel platform (default {PLATFORM})")
    b.add_argument("--freeze", default=None, help="the node's `pip freeze`: leave out what it has")
    b.add_argument(
        "--without", default="", help="comma-separated packages to leave out, e.g. wandb,matplotlib"
    )
    b.add_argument(
        "--upgrade", default="", help="comma-separated node packages to take from the wheelhouse anyway"
    )
    b.add_argument("--project", default=str(ROOT))
    c = sub.add_parser(
        "check", help="on the node: does the wheelhouse meet every requirement? (exit 1 if not)"
    )
    c.add_argument("wheelhouse")
    i = sub.add_parser("install", help="on the node: check, then pip install --no-index --find-links")
    i.add_argument("wheelhouse")
    i.add_argument("--project", default=str(ROOT))
    args = ap.parse_args(argv)
    if args.cmd == "build":
        args.without = [n for n in args.without.split(",") if n]
        args.upgrade = [n for n in args.upgrade.split(",") if n]
        return build(args)
    if args.cmd == "check":
        problems = check(Path(args.wheelhouse))
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    return install(Path(args.wheelhouse), Path(args.project))


if __name__ == "__main__":
    sys.exit(main())
