#!/usr/bin/env python3
"""The house's shape, as issue 65 measures it, over the product code
(host/, registry/ and sdk/; test modules, tests.rs files and tests/ folders
left out):
  - circles: two top-level modules of one crate that name each other
    (`crate::a` in b and `crate::b` in a, directly or around a loop);
  - functions over 120 lines;
  - files over 800 lines.
Prints each, then the counts; exits 1 when any is found (run by .ci/run).
`--limits F L` changes the two limits (to plan a tighter house)."""
import os
import re
import sys

FUNCTION_LIMIT, FILE_LIMIT = 120, 800
if len(sys.argv) == 4 and sys.argv[1] == "--limits":
    FUNCTION_LIMIT, FILE_LIMIT = int(sys.argv[2]), int(sys.argv[3])
os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOTS = ["host", "registry", "sdk"]


def product_files():
    for root in ROOTS:
        for d, _, files in os.walk(root):
            parts = d.split(os.sep)
            if "tests" in parts or "target" in parts:
                continue
            for f in files:
                if f.endswith(".rs") and f != "tests.rs":
                    yield os.path.join(d, f)


def without_tests(text):
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("#[cfg(test)]") and i + 1 < len(lines) and lines[i + 1].startswith("mod tests"):
            return lines[:i]
    return lines


def crates():
    for root in ROOTS:
        for d, _, files in os.walk(root):
            if "Cargo.toml" in files and os.path.isdir(os.path.join(d, "src")):
                yield d


def circles():
    found = []
    for crate in sorted(set(crates())):
        src = os.path.join(crate, "src")
        mods = {}
        for d, _, files in os.walk(src):
            for f in files:
                if f.endswith(".rs") and f != "tests.rs":
                    rel = os.path.relpath(os.path.join(d, f), src)
                    top = rel[:-3].split(os.sep)[0]
                    if top not in ("lib", "main"):
                        mods.setdefault(top, []).append(os.path.join(d, f))
        graph = {m: set() for m in mods}
        for m, files in mods.items():
            for f in files:
                code = "\n".join(l for l in without_tests(open(f).read())
                                 if not l.strip().startswith("//"))
                top_level = os.path.relpath(f, src).count(os.sep) == 0
                for other in mods:
                    if other == m:
                        continue
                    named = re.escape(other)
                    if (re.search(r"crate::" + named + r"\b", code)
                            or re.search(r"crate::\{[^}]*\b" + named + r"\b", code, re.S)
                            or (top_level and re.search(r"super::" + named + r"\b", code))):
                        graph[m].add(other)
        index, low, stack, on, counter = {}, {}, [], set(), [0]

        def strong(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in graph[v]:
                if w not in index:
                    strong(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(f"{crate}: {' <-> '.join(sorted(component))}")

        for v in graph:
            if v not in index:
                strong(v)
    return found


def depths(lines):
    """The brace depth at the start and at the end of each line, read by a
    small Rust lexer: comments, strings (raw ones and ones across lines
    too) and char literals hold no braces."""
    text = "\n".join(lines) + "\n"
    starts, ends = [], []
    depth, i, n = 0, 0, len(text)
    line_start = 0

    def skip_to(k):
        nonlocal line_start
        for _ in range(text.count("\n", i, k)):
            starts.append(line_start)
            ends.append(depth)
            line_start = depth
        return k

    while i < n:
        c = text[i]
        if c == "\n":
            i = skip_to(i + 1)
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = skip_to(n if end < 0 else end + 2)
        elif (m := re.match(r'b?r(#*)"', text[i:i + 40])) and (
                i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            close = '"' + m.group(1)
            end = text.find(close, i + m.end())
            i = skip_to(n if end < 0 else end + len(close))
        elif c == '"':
            k = i + 1
            while k < n and text[k] != '"':
                k += 2 if text[k] == "\\" else 1
            i = skip_to(k + 1)
        elif c == "'" and (m := re.match(r"'(\\[^']*|[^'\\])'", text[i:i + 12])):
            i += m.end()
        else:
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            i += 1
    return starts, ends


def long_functions():
    found = []
    start = re.compile(r"\s*(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)")
    for path in product_files():
        lines = without_tests(open(path).read())
        begin, end = depths(lines)
        i = 0
        while i < len(lines):
            m = start.match(lines[i])
            if not m:
                i += 1
                continue
            j = i
            while j < len(lines) and end[j] <= begin[i] and not lines[j].rstrip().endswith(";"):
                j += 1
            if j < len(lines) and end[j] > begin[i]:
                while j < len(lines) and end[j] > begin[i]:
                    j += 1
                if j - i + 1 > FUNCTION_LIMIT:
                    found.append(f"{path}:{i + 1}: fn {m.group(6)}: {j - i + 1} lines")
            i = j + 1
    return found


def long_files():
    return [f"{p}: {n} lines" for p in product_files()
            if (n := len(open(p).read().rstrip("\n").split("\n"))) > FILE_LIMIT]


report = [("circles", circles()), (f"functions over {FUNCTION_LIMIT} lines", long_functions()),
          (f"files over {FILE_LIMIT} lines", long_files())]
for _, items in report:
    for item in items:
        print(item)
print("shape: " + ", ".join(f"{len(items)} {what}" for what, items in report))
sys.exit(1 if any(items for _, items in report) else 0)
