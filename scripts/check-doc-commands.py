#!/usr/bin/env python3
"""Every `capstan` command the docs show is one the binary takes.

Reads the fenced code blocks and the `capstan …` code spans of README.md and
docs/*.md. For each command that runs `capstan` (or `kubectl capstan`;
`a|b` and `a/b` name alternatives), it finds the subcommand the line names
and checks, against that subcommand's `--help`, that the subcommand exists
and that every flag the line passes is one of its flags. Blocks whose info
string says `tested` (```` ```sh tested ````) are also run, in a scratch
directory with the binary first on PATH, and must succeed.

Usage: scripts/check-doc-commands.py PATH/TO/capstan
Exits 1 naming each file:line that does not hold.
"""

import os
import re
import shlex
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(\s*)(```+)(.*)$")


def blocks(path):
    """(info string, first line number, lines) of each fenced block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(2), m.group(3).strip(), i + 1
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        yield info, start + 1, body


def commands(body, first):
    """(line number, text) of each command, continuation lines joined."""
    pending, at = "", None
    for n, line in enumerate(body, first):
        text = line.strip()
        if at is None:
            at = n
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        yield at, pending + text
        pending, at = "", None


@lru_cache(maxsize=None)
def help_of(binary, path):
    out = subprocess.run(
        [binary, *path, "--help"], capture_output=True, text=True, timeout=30
    )
    return out.returncode, out.stdout + out.stderr


def subcommands(help_text):
    """The subcommand names a `--help` lists under `Commands:`."""
    names, inside = set(), False
    for line in help_text.splitlines():
        if line.strip() == "Commands:":
            inside = True
            continue
        if inside:
            if not line.startswith("  "):
                break
            name = line.split()[0] if line.split() else ""
            if name:
                names.add(name.rstrip(","))
    return names


def words(text):
    """The line as the shell would split it, comments and pipes cut off."""
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError:
        return None
    for stop in ("|", ">", "&&", ";", "2>&1"):
        if stop in tokens:
            tokens = tokens[: tokens.index(stop)]
    return tokens


def check_line(binary, tokens):
    """Why this `capstan …` line is not one the binary takes, or None."""
    if tokens[:2] == ["kubectl", "capstan"]:
        tokens = tokens[1:]
    tokens = [t.strip("[]") for t in tokens]
    path = []
    code, text = help_of(binary, ())
    rest = tokens[1:]
    while rest and not rest[0].startswith("-"):
        names = subcommands(text)
        # `rollout status|pause` or `plugin push/pull`: each alternative.
        options = re.split(r"[|/]", rest[0])
        if len(options) > 1 and names and all(o in names for o in options):
            for option in options:
                why = check_line(binary, ["capstan", *path, option, *rest[1:]])
                if why:
                    return why
            return None
        if not names or rest[0] not in names:
            break
        path.append(rest[0])
        rest = rest[1:]
        code, text = help_of(binary, tuple(path))
        if code != 0:
            return f"`capstan {' '.join(path)} --help` failed"
    if not path:
        return f"`capstan {rest[0] if rest else ''}` is not a subcommand"
    if subcommands(text) and rest and not rest[0].startswith("-"):
        return f"`capstan {' '.join(path)}` has no subcommand {rest[0]}"
    flags = [t.split("=", 1)[0] for t in rest if t.startswith("-") and t not in ("-", "--")]
    missing = [
        f
        for f in flags
        if not re.search(r"(^|[\s,\[])" + re.escape(f) + r"([\s,=\]<\[]|$)", text, re.M)
    ]
    if missing:
        return f"`capstan {' '.join(path)}` has no {', '.join(missing)}"
    return None


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    binary = str(Path(sys.argv[1]).resolve())
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    problems, checked, ran = [], 0, 0
    for path in files:
        shown = path.relative_to(ROOT)
        for info, first, body in blocks(path):
            for n, text in commands(body, first):
                bare = text[2:] if text.startswith("$ ") else text
                tokens = words(bare)
                if not tokens:
                    continue
                if tokens[0] != "capstan" and tokens[:2] != ["kubectl", "capstan"]:
                    continue
                checked += 1
                why = check_line(binary, tokens)
                if why:
                    problems.append(f"{shown}:{n}: {why}")
            if "tested" in info.split():
                ran += 1
                script = "\n".join(body)
                with tempfile.TemporaryDirectory() as scratch:
                    env = dict(os.environ)
                    env["PATH"] = f"{Path(binary).parent}:{env.get('PATH', '')}"
                    out = subprocess.run(
                        ["bash", "-euo", "pipefail", "-c", script],
                        cwd=scratch,
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=120,
                    )
                if out.returncode != 0:
                    problems.append(
                        f"{shown}:{first}: the tested block failed ({out.returncode}): {out.stderr.strip()[-400:]}"
                    )
    # Commands in running text and tables: `capstan …` code spans.
    for path in files:
        shown = path.relative_to(ROOT)
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in re.finditer(r"`((?:kubectl )?capstan [^`]+)`", line):
                tokens = words(m.group(1).replace("\\|", "|").replace("…", ""))
                if not tokens or len(tokens) < 2 or tokens[-1] == "capstan":
                    continue
                checked += 1
                why = check_line(binary, tokens)
                if why:
                    problems.append(f"{shown}:{n}: {why}")
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"{len(problems)} documented command(s) the binary does not take", file=sys.stderr)
        sys.exit(1)
    print(f"docs: {checked} capstan commands match the binary's subcommands and flags; {ran} tested block(s) ran")


if __name__ == "__main__":
    main()
