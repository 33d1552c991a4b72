"""README.md's relative links lead somewhere: ``mkdocs build --strict`` checks the links of the
pages under docs/, but README.md is outside the site, so its links (to docs pages, to their
headings, to files of the repository) are checked here."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import markdown

ROOT = Path(__file__).resolve().parents[2]

#: ``[text](target)`` and ``![alt](target)``, with an optional title; ``[ref]: target``.
INLINE = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^)]*[\"'])?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose(text: str) -> str:
    """The text without fenced blocks and code spans, where brackets are not links."""
    out: list[str] = []
    fence = ""
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence:
            if m and m[1][0] == fence[0] and len(m[1]) >= len(fence) and not line.strip().strip(fence[0]):
                fence = ""
            continue
        if m:
            fence = m[1]
            continue
        out.append(line)
    return re.sub(r"(`+)(?:(?!\1).)+?\1", "", "\n".join(out), flags=re.S)


def anchors(page: Path) -> set[str]:
    """The ids of a page's headings, as the site's ``toc`` extension makes them."""
    md = markdown.Markdown(extensions=["fenced_code", "attr_list", "tables", "toc"])
    md.convert(page.read_text(encoding="utf-8"))

    def walk(tokens: list[dict]) -> set[str]:
        return {t["id"] for t in tokens} | {i for t in tokens for i in walk(t["children"])}

    return walk(md.toc_tokens)


def broken_links(page: Path) -> tuple[int, list[str]]:
    """How many relative links the page has, and those that lead nowhere (a missing file, or a
    ``#heading`` the Markdown page it names lacks)."""
    text = prose(page.read_text(encoding="utf-8"))
    targets = INLINE.findall(text) + REFERENCE.findall(text)
    checked, broken = 0, []
    for target in targets:
        if SCHEME.match(target) or target.startswith("//"):
            continue
        checked += 1
        path, _, fragment = unquote(target).partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            where = file.relative_to(page.parent) if file.is_relative_to(page.parent) else file
            broken.append(f"{target}: no file {where}")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(f"{target}: no heading #{fragment} in {file.name}")
    return checked, broken


def test_every_relative_link_of_the_readme_leads_to_a_file_and_heading():
    checked, broken = broken_links(ROOT / "README.md")
    assert checked >= 5, f"only {checked} relative links found: is the link pattern still right?"
    assert not broken, "README.md has broken links:\n" + "\n".join(broken)


def test_a_missing_file_or_heading_is_reported(tmp_path):
    # given a page beside a docs page, with good and bad links in prose and none in code
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## What holds on which database\n\ntext\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# Top\n\n[good](docs/guide.md#what-holds-on-which-database), [self](#top), "
        "[web](https://example.com/x.md), [gone](docs/gone.md), [bad anchor](docs/guide.md#what-holds)\n\n"
        "`[in code](docs/none.md)`\n\n```text\n[in a block](docs/none.md)\n```\n\n[ref]: docs/also-gone.md\n"
    )

    # when its links are checked
    checked, broken = broken_links(page)

    # then the missing file, the missing heading and the missing reference target are reported
    assert checked == 5
    assert broken == [
        "docs/gone.md: no file docs/gone.md",
        "docs/guide.md#what-holds: no heading #what-holds in guide.md",
        "docs/also-gone.md: no file docs/also-gone.md",
    ]
