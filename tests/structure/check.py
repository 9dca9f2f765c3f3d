#!/usr/bin/python3
"""The house rules that keep Tally's code readable, checked on every test run (issue 29):

1. Dependencies point one way (ARCHITECTURE.md "Libraries"): a file includes only from its own
   folder and from the folders its library may depend on.
2. No function in server/, worker/, client/, common/ or metrics/ is longer than 80 lines, unless
   the comment just above it says why it "reads better whole".

    /usr/bin/python3 tests/structure/check.py [SOURCE_DIR]

Function extents come from a small brace matcher over the source with comments and string
literals removed (a definition is a '{' after a ')' at namespace or class scope), not a compiler:
it errs towards reporting, and its report names the file and line to look at.
"""
import os
import re
import sys

MAX_FUNCTION_LINES = 80
EXCEPTION_MARK = "reads better whole"

# Folder -> the folders its files may include from (besides its own). proto/ is everyone's.
ALLOWED = {
    "common/base": [],
    "metrics": ["common/base"],
    "metrics/gpu": ["metrics", "common/base"],
    "common/security": ["common/base"],
    "common/io": ["common/base", "common/security", "metrics"],
    "common/process": ["common/base"],
    "common/job": ["common/base", "common/security", "common/io", "metrics"],
    "server": ["common/base", "common/security", "common/io", "common/process", "common/job", "metrics"],
    "worker": ["common/base", "common/security", "common/io", "common/process", "common/job", "metrics",
               "metrics/gpu"],
    "client": ["client/verbs", "common/base", "common/security", "common/io", "common/process", "common/job",
               "metrics"],
    "client/verbs": ["client", "common/base", "common/security", "common/io", "common/process", "common/job",
                     "metrics"],
}
CODE_DIRS = ["server", "worker", "client", "common", "metrics"]


def strip(src):
    """`src` with comments and string/char literals blanked, newlines kept."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * src.count("\n", i, j))
            i = j
            continue
        m = re.match(r'R"([^(]*)\(', src[i:i + 40])
        if m and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            end = ")" + m.group(1) + '"'
            j = src.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j
            continue
        c = src[i]
        if c == '"' or (c == "'" and not (i > 0 and src[i - 1].isalnum())):
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def functions(path):
    """(first line, line count, name) of each function definition at namespace or class scope."""
    src = strip(open(path, errors="replace").read())
    found, stack, head, line = [], [], [], 1
    for ch in src:
        if ch == "\n":
            line += 1
        if ch == "{":
            text = re.sub(r"\s+", " ", "".join(head)).strip()
            kind = "other"
            if not any(k == "fn" for k, _, _ in stack):
                if re.search(r"\bnamespace\b[^()]*$", text) or text.startswith('extern "'):
                    kind = "ns"
                elif re.search(r"\b(class|struct|union|enum)\b[^()]*$", text):
                    kind = "class"
                elif "(" in text and ")" in text and not text.endswith(("=", ",")):
                    kind = "fn"
            name = ""
            if kind == "fn":
                cut = text.find("(")
                m = re.search(r"([~\w:]+)\s*$", text[:cut])
                name = m.group(1) if m else text[:60]
            stack.append((kind, line, name))
            head = []
        elif ch == "}":
            if stack:
                kind, start, name = stack.pop()
                if kind == "fn":
                    found.append((start, line - start + 1, name))
            head = []
        elif ch == ";":
            head = []
        else:
            head.append(ch)
    return found


def excepted(lines, start):
    """Whether the comment block above line `start` (1-based, the line of the '{') says why."""
    i = start - 1
    while i > 0 and not lines[i - 1].strip().startswith("//") and start - i < 8:
        i -= 1  # Back over the signature's lines.
    text = []
    while i > 0 and lines[i - 1].strip().startswith("//"):
        text.append(lines[i - 1])
        i -= 1
    return EXCEPTION_MARK in " ".join(text)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../.."))
    problems = []
    for top in CODE_DIRS:
        for folder, _, files in os.walk(os.path.join(root, top)):
            rel_folder = os.path.relpath(folder, root)
            allowed = ALLOWED.get(rel_folder)
            for name in sorted(files):
                if not name.endswith((".h", ".cc", ".cu")):
                    continue
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, root)
                text = open(path, errors="replace").read()
                for m in re.finditer(r'^#include "([^"]+)/[^/"]+"', text, re.M):
                    dep = m.group(1)
                    if dep.split("/")[0] not in CODE_DIRS:
                        continue  # proto/ (everyone's) and third-party headers.
                    if dep == rel_folder or allowed is None or dep in allowed:
                        continue
                    problems.append(f"{rel}: includes {m.group(0)[10:]}; {rel_folder}/ may include from "
                                    f"{', '.join(['proto'] + allowed) or 'nothing else'}")
                lines = text.split("\n")
                for start, count, fn in functions(path):
                    if count > MAX_FUNCTION_LINES and not excepted(lines, start):
                        problems.append(f"{rel}:{start}: {fn} is {count} lines (over {MAX_FUNCTION_LINES}); split it "
                                        f"by what it does, or say above it why it {EXCEPTION_MARK}")
    for p in problems:
        print(p)
    print(f"structure: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
