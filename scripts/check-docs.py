#!/usr/bin/env python3
"""Check the links between the project's Markdown pages: every relative
link names a file that exists, and every `#anchor` a heading of its page
(GitHub's anchors). Exits 1 listing each broken link (file:line: link:
why). Run by .ci/run; `python3 scripts/check-docs.py` by hand."""
import os
import re
import subprocess
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(root)


def markdown_files():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.md"],
                         capture_output=True, text=True, check=True).stdout
    return sorted(p for p in out.split("\n") if p and os.path.exists(p)
                  and "node_modules" not in p and not p.startswith("target"))


def slug(heading):
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found, fence = set(), False
        counts = {}
        for line in open(path, encoding="utf-8"):
            if line.startswith("```"):
                fence = not fence
            m = None if fence else re.match(r"^#{1,6} (.*)", line)
            if m:
                s = slug(m.group(1))
                n = counts.get(s, 0)
                counts[s] = n + 1
                found.add(s if n == 0 else f"{s}-{n}")
        cache[path] = found
    return cache[path]


broken = []
for page in markdown_files():
    fence = False
    for number, line in enumerate(open(page, encoding="utf-8"), 1):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(resolved):
                broken.append(f"{page}:{number}: {target}: no such file {resolved}")
                continue
            if anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                broken.append(f"{page}:{number}: {target}: no heading #{anchor} in {resolved}")
if broken:
    print("\n".join(broken))
    print(f"{len(broken)} broken link(s)", file=sys.stderr)
    sys.exit(1)
print(f"docs: every link of {len(markdown_files())} Markdown files resolves")
