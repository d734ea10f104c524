"""The repository is self-contained: no tracked file cites a document that is not in it.

Checked over every file ``git ls-files`` lists:

- no citation of the developers' briefings that live outside the repository (their names, their
  section marks, and paths into the folder that held them);
- every ``docs/<name>.md`` path names a file that exists;
- every ``docs/design.md §N`` citation names a section heading that exists in docs/design.md, and so
  does every bare ``§N`` inside docs/design.md itself.

The forbidden words are assembled from pieces so that this file does not cite them itself.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN_DOC = "docs/design.md"

_D, _S, _SH = "DES" + "IGN", "STY" + "LE", "sha" + "red"
FORBIDDEN = {
    f"the {_D} briefing": re.compile(rf"\b{_D}\b"),  # upper case: "{_D} §2", "({_D})", "{_D}.md", "{_D}'s"
    f"the {_S} briefing": re.compile(rf"\b{_S}\b"),
    "the briefings' folder": re.compile(rf"(\.\./)+{_SH}\b|/work/{_SH}\b|\b{_SH}/(?i:design|style)\b"),
}
DOC_PATH = re.compile(r"(?<![\w./-])docs/[\w./-]*?\.md\b")
NUMBER = r"\d+(?:\.\d+)*"
DESIGN_CITATION = re.compile(
    rf"docs/design\.md((?:\s*(?:,|and|or)?\s*§{{1,2}}\s*{NUMBER}(?:\s*[–-]\s*{NUMBER})?)+)"
)
SECTION_MARK = re.compile(rf"§{{1,2}}\s*({NUMBER}(?:\s*[–-]\s*{NUMBER})?)")
HEADING = re.compile(rf"^#{{1,6}}\s+({NUMBER})\.?\s", re.MULTILINE)
REQUIRED_SECTIONS = {"1", "2", "2.1", "2.2", "2.3", "3", "3.1", "3.2", "4", "5", "6"}


@cache
def tracked_files() -> tuple[Path, ...]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return tuple(ROOT / name for name in out.split("\0") if name)


def text_of(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
        return None


@cache
def tracked_lines() -> tuple[tuple[Path, int, str], ...]:
    """(path, line number, line) of every tracked text file, read once for all the tests here."""
    return tuple(
        (path, lineno, line)
        for path in tracked_files()
        if (text := text_of(path)) is not None
        for lineno, line in enumerate(text.splitlines(), 1)
    )


def lines_matching(pattern: re.Pattern[str]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}"
        for path, lineno, line in tracked_lines()
        if pattern.search(line)
    ]


def design_sections() -> set[str]:
    text = text_of(ROOT / DESIGN_DOC)
    assert text is not None, f"{DESIGN_DOC} is missing"
    return set(HEADING.findall(text))


def section_numbers(marks: str) -> list[str]:
    """``"§2.1"`` → ["2.1"]; ``"§§2–3"`` → ["2", "3"]; ``"§2, §2.1"`` → ["2", "2.1"]."""
    return [n for mark in SECTION_MARK.findall(marks) for n in re.split(r"\s*[–-]\s*", mark)]


@pytest.mark.parametrize("what", sorted(FORBIDDEN))
def test_no_citation_of_documents_outside_the_repo(what):
    hits = lines_matching(FORBIDDEN[what])
    where = "\n".join(hits)
    assert hits == [], f"cite {DESIGN_DOC} §N or the module that holds the fact instead of {what}:\n{where}"


def test_every_cited_docs_file_exists():
    missing = [
        f"{path.relative_to(ROOT)}:{lineno}: {doc}"
        for path, lineno, line in tracked_lines()
        for doc in DOC_PATH.findall(line)
        if not (ROOT / doc).is_file()
    ]
    assert missing == [], "these files cite a document that does not exist:\n" + "\n".join(missing)


def test_design_doc_has_the_numbered_sections():
    missing = REQUIRED_SECTIONS - design_sections()
    assert not missing, f"{DESIGN_DOC} lacks the section heading(s) {sorted(missing)} that code comments cite"


def test_every_design_citation_names_an_existing_section():
    sections = design_sections()
    bad = []
    for path, lineno, line in tracked_lines():
        own = path.relative_to(ROOT).as_posix() == DESIGN_DOC
        marks = SECTION_MARK.findall(line) if own else []
        cited = [n for m in marks for n in section_numbers("§" + m)]
        for chunk in DESIGN_CITATION.findall(line):
            cited += section_numbers(chunk)
        bad += [f"{path.relative_to(ROOT)}:{lineno}: §{n}" for n in cited if n not in sections]
    assert bad == [], f"citations of sections that {DESIGN_DOC} does not have:\n" + "\n".join(bad)


def test_the_patterns_catch_what_they_are_for():
    """The checks above are only as good as their patterns: each bad citation is caught, good ones pass."""
    assert FORBIDDEN[f"the {_D} briefing"].search(f"MARS loss ({_D} §2.1)")
    assert FORBIDDEN[f"the {_D} briefing"].search(f"see {_D}.md")
    assert FORBIDDEN[f"the {_S} briefing"].search(f"({_S}: errors say what to change)")
    assert FORBIDDEN["the briefings' folder"].search(f"see ../{_SH}/notes.md")
    assert not any(p.search("the design doc: docs/design.md §2.1, a linestyle") for p in FORBIDDEN.values())
    assert DOC_PATH.findall("see docs/eval.md and docs/" + "nope.md; not lm_eval/docs/x.md") == [
        "docs/eval.md",
        "docs/" + "nope.md",
    ]
    listed = DESIGN_CITATION.findall("docs/design.md §2, §2.1 and docs/design.md §§3–4")
    assert [section_numbers(chunk) for chunk in listed] == [["2", "2.1"], ["3", "4"]]
    assert section_numbers(DESIGN_CITATION.findall("as docs/design.md §§3–4 says")[0]) == ["3", "4"]
    assert HEADING.findall("## 2. Training\n### 2.1 MARS\n#### 3.1.2 x\n## Notes") == ["2", "2.1", "3.1.2"]


DOTTED = re.compile(r"`(prove(?:\.\w+)+)")
REPO_PATH = re.compile(r"`((?:tests|conf|recipes|docs|decode|train|data)/[^`\s]*)")


def _resolves(dotted: str) -> bool:
    """``prove.a.b.c``: the longest importable module prefix, then attributes for the rest."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_design_doc_names_only_modules_and_files_that_exist():
    """Moving or renaming a module the design document names must update the document too."""
    text = text_of(ROOT / DESIGN_DOC)
    assert text is not None
    names = sorted(set(DOTTED.findall(text)) - {"prove.json"})
    assert [n for n in names if not _resolves(n)] == [], f"{DESIGN_DOC} names these, which do not import"
    paths = sorted(set(REPO_PATH.findall(text)))
    assert [p for p in paths if not (ROOT / p).exists()] == [], (
        f"{DESIGN_DOC} names these, which do not exist"
    )
