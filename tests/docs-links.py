#!/usr/bin/env python3
"""Fails when a relative link or #anchor in the repository's Markdown leads nowhere.

    tests/docs-links.py [ROOT]     check every tracked (or new, not ignored) *.md file
    tests/docs-links.py --self-test

The documents link to each other's sections by heading; a section renamed or moved to another
page breaks those links silently. For each inline link `[text](target)`, image and reference
definition `[ref]: target` outside code, a relative target must name a file or directory of the
repository (relative to the document, or to the root when it starts with `/`), and a `#anchor`
into a Markdown file (or the document itself) must match one of its headings as GitHub makes
them: the heading's text without markup, lower-cased, every character but letters, digits,
spaces, `-` and `_` dropped, spaces turned into `-`, and `-1`, `-2`, ... appended to repeats.
`<a id=...>`/`<a name=...>` anchors count too. Links with a scheme (https:, mailto:) are not
followed. Python's standard library only.
"""
import os
import re
import subprocess
import sys
import tempfile
import unicodedata
from urllib.parse import unquote

sys.dont_write_bytecode = True

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
# [text](target) or ![alt](target), target optionally in <>, optionally followed by a title.
INLINE = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^>]*>|[^\s)]*)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ANCHOR = re.compile(r"<a\s+(?:[^>]*?\s)?(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def heading_text(raw):
    """A heading's text as GitHub renders it: links and images by their text, no markup."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", raw)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "")
    text = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)  # emphasis; `_` inside words stays
    return text.strip()


def slug(text):
    """GitHub's anchor for a heading text (before de-duplication)."""
    out = []
    for ch in heading_text(text).lower():
        cat = unicodedata.category(ch)
        if ch in "-_" or cat[0] in "LN" or cat == "Mn":
            out.append(ch)
        elif ch == " ":
            out.append("-")
    return "".join(out)


def blank_code_spans(line):
    """The line with inline code replaced by spaces, so links inside it are not links."""
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def parse(text):
    """(anchors, links) of one Markdown document; links are (line number, target)."""
    anchors, links, seen = set(), [], {}

    def add_heading(raw):
        base = slug(raw)
        n = seen.get(base, 0)
        seen[base] = n + 1
        anchors.add(base if n == 0 else f"{base}-{n}")

    fence, prev = None, None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)):].strip():
                fence = None
            prev = None
            continue
        if m:
            fence, prev = m.group(1), None
            continue
        for a in HTML_ANCHOR.findall(line):
            anchors.add(a)
        h = ATX.match(line)
        if h:
            add_heading(h.group(2) or "")
        elif SETEXT.match(line) and prev and not re.match(r"^ {0,3}([|>*+-]|\d+[.)]\s|#)", prev) and "|" not in prev:
            add_heading(prev.strip())
        scan = blank_code_spans(line)
        for lm in INLINE.finditer(scan):
            links.append((number, lm.group(2)))
        rd = REFDEF.match(scan)
        if rd:
            links.append((number, rd.group(1)))
        prev = line if line.strip() and not h else None
    return anchors, links


class Repo:
    def __init__(self, root, files):
        self.root = os.path.abspath(root)
        self.files = set(files)
        self.dirs = {os.path.dirname(f) for f in files}
        for d in list(self.dirs):
            while d:
                d = os.path.dirname(d)
                self.dirs.add(d)
        self.anchor_cache = {}

    def anchors(self, rel):
        if rel not in self.anchor_cache:
            with open(os.path.join(self.root, rel), encoding="utf-8") as f:
                self.anchor_cache[rel] = parse(f.read())[0]
        return self.anchor_cache[rel]

    def check(self, doc):
        """Broken links of one document: (document, line, target, why)."""
        with open(os.path.join(self.root, doc), encoding="utf-8") as f:
            _, links = parse(f.read())
        broken = []
        for number, target in links:
            target = target.strip("<>")
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue
            path, _, anchor = target.partition("#")
            path = unquote(path.split("?", 1)[0])
            if path:
                base = "" if path.startswith("/") else os.path.dirname(doc)
                rel = os.path.normpath(os.path.join(base, path.lstrip("/"))).replace(os.sep, "/")
                rel = "" if rel == "." else rel
                if rel.startswith("../") or rel == "..":
                    broken.append((doc, number, target, "outside the repository"))
                    continue
                if rel not in self.files and rel not in self.dirs:
                    broken.append((doc, number, target, f"no file {rel} in the repository"))
                    continue
            else:
                rel = doc
            if anchor and rel.endswith(".md") and rel in self.files:
                if unquote(anchor).lower() not in self.anchors(rel):
                    broken.append((doc, number, target, f"no heading in {rel} has the anchor #{anchor}"))
        return broken


def markdown_files(root):
    """Tracked Markdown files plus new ones not ignored, so a local run sees what CI will."""
    out = subprocess.run(
        ["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, text=True, check=True).stdout
    files = [f for f in out.split("\0") if f and not f.startswith("target/")]
    return [f for f in files if os.path.isfile(os.path.join(root, f))]


def run(root, files):
    repo = Repo(root, files)
    broken = []
    for doc in sorted(f for f in files if f.endswith(".md")):
        broken += repo.check(doc)
    return broken


def self_test():
    """The check finds a missing file and a missing anchor, and passes GitHub's slugs."""
    docs = {
        "README.md": (
            "# Top\n\n"
            "See [the guide](docs/guide.md), [its install](docs/guide.md#install-with-helm-v2),\n"
            "[the repeat](docs/guide.md#notes-1), [code](docs/guide.md#the-mode-bothaddresses-field),\n"
            "[here](#top), [a dir](docs/), [web](https://example.com/x#y), ![img](docs/pic.png)\n"
            "and `[not a link](nowhere.md)`.\n\n"
            "```\n[not a link either](nowhere.md)\n```\n\n"
            "[ref]: docs/guide.md#tested-against\n"),
        "docs/guide.md": (
            "# Guide\n\n## Install with Helm (v2)\n\n## Notes\n\n## Notes\n\n"
            "## The `mode: BothAddresses` field\n\nTested against\n---\n\n"
            "Back to [the top](../README.md#top) and [the page](/README.md).\n"),
        "docs/pic.png": "",
        "docs/broken.md": (
            "# Broken\n\n"
            "A [missing file](missing.md), a [missing anchor](guide.md#no-such-heading),\n"
            "a [missing local anchor](#nowhere) and [outside](../../etc/passwd).\n"),
    }
    with tempfile.TemporaryDirectory() as root:
        for name, text in docs.items():
            os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)
        got = [(d, t) for d, _, t, _ in run(root, list(docs))]
    want = [("docs/broken.md", "missing.md"), ("docs/broken.md", "guide.md#no-such-heading"),
            ("docs/broken.md", "#nowhere"), ("docs/broken.md", "../../etc/passwd")]
    if got != want:
        sys.exit(f"docs-links self-test: expected exactly {want} to be reported, got {got}")
    print("docs-links self-test: a broken file link, a broken anchor and a link outside the tree are caught; valid links pass")


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    files = markdown_files(root)
    broken = run(root, files)
    for doc, number, target, why in broken:
        print(f"{doc}:{number}: ({target}) {why}")
    docs = sum(1 for f in files if f.endswith(".md"))
    if broken:
        sys.exit(f"tests/docs-links.py: {len(broken)} broken links in {docs} Markdown files; fix the link or the heading it names")
    print(f"tests/docs-links.py: every relative link and anchor in {docs} Markdown files resolves")


if __name__ == "__main__":
    main()
