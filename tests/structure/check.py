#!/usr/bin/python3
"""The house rules that keep Tally's code readable, checked on every test run (issue 29):

1. Dependencies point one way (ARCHITECTURE.md "Libraries"): a file includes only from its own
   folder and from the folders its library may depend on.
2. No function in server/, worker/, client/, common/ or metrics/ is longer than 80 lines, unless
   the comment just above it says why it "reads better whole".
3. server/ and worker/ hold at most 12 source files directly (the process's wiring: main, services,
   options); everything else lives in their sub-folders (issue 47), and a folder that ALLOWED does not
   know is a problem until the table learns it.

    /usr/bin/python3 tests/structure/check.py [SOURCE_DIR]
    /usr/bin/python3 tests/structure/check.py --self-test     # the checks catch what they must

Function extents come from a small brace matcher over the source with comments and string
literals removed (a definition is a '{' after a ')' at namespace or class scope), not a compiler:
it errs towards reporting, and its report names the file and line to look at.
"""
import os
import re
import sys

MAX_FUNCTION_LINES = 80
EXCEPTION_MARK = "reads better whole"

COMMON = ["common/base", "common/security", "common/io", "common/process", "common/job", "metrics"]
# Folder -> the folders its files may include from (besides its own). proto/ is everyone's.
# server/ and worker/ are cut by what they do; within each, includes point one way (a folder never
# includes one listed after it, and the process's wiring at the top may include every part):
#   server: store <- report <- coordinator <- access <- http <- server/ (main, services)
#   worker: interfaces <- scoring <- pipeline, torch, python <- worker/ (main, control plane)
ALLOWED = {
    "common/base": [],
    "metrics": ["common/base"],
    "metrics/gpu": ["metrics", "common/base"],
    "common/security": ["common/base"],
    "common/io": ["common/base", "common/security", "metrics"],
    "common/process": ["common/base"],
    "common/job": ["common/base", "common/security", "common/io", "metrics"],
    "server/store": COMMON,
    "server/report": COMMON + ["server/store"],
    "server/coordinator": COMMON + ["server/store", "server/report"],
    "server/access": COMMON + ["server/coordinator", "server/store", "server/report"],
    "server/http": COMMON + ["server/access", "server/coordinator", "server/store", "server/report"],
    "server": COMMON + ["server/http", "server/access", "server/coordinator", "server/store", "server/report"],
    "worker/interfaces": COMMON,
    "worker/scoring": COMMON + ["metrics/gpu", "worker/interfaces"],
    "worker/pipeline": COMMON + ["worker/interfaces", "worker/scoring"],
    "worker/torch": COMMON + ["metrics/gpu", "worker/interfaces"],
    "worker/python": COMMON + ["worker/interfaces"],
    "worker": COMMON + ["metrics/gpu", "worker/interfaces", "worker/scoring", "worker/pipeline", "worker/torch",
                        "worker/python"],
    "client": ["client/verbs"] + COMMON[:-1] + ["metrics"],
    "client/verbs": ["client"] + COMMON,
}
# Folders whose own top level holds only the process's wiring (rule 3).
MAX_FLAT_SOURCES = {"server": 12, "worker": 12}
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


def check(root):
    """Every problem in the tree at `root`, a line each."""
    problems = []
    for top in CODE_DIRS:
        for folder, _, files in os.walk(os.path.join(root, top)):
            rel_folder = os.path.relpath(folder, root)
            allowed = ALLOWED.get(rel_folder)
            sources = sorted(f for f in files if f.endswith((".h", ".cc", ".cu")))
            if sources and allowed is None and rel_folder.split("/")[0] in ("server", "worker"):
                problems.append(f"{rel_folder}/: a folder tests/structure/check.py does not know; add it to ALLOWED "
                                f"with the folders it may include from")
            limit = MAX_FLAT_SOURCES.get(rel_folder)
            if limit is not None and len(sources) > limit:
                problems.append(f"{rel_folder}/: {len(sources)} source files directly in it (at most {limit}: the "
                                f"process's wiring); put the rest in its sub-folders by what they do")
            for name in sources:
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, root)
                text = open(path, errors="replace").read()
                for m in re.finditer(r'^#include "([^"]+)/[^/"]+"', text, re.M):
                    dep = m.group(1)
                    if dep.split("/")[0] not in CODE_DIRS:
                        continue  # proto/ (everyone's) and third-party headers.
                    if dep == rel_folder or allowed is None or dep in allowed:
                        continue
                    header = m.group(0)[len('#include "'):-1]
                    problems.append(f"{rel}: includes {header}; {rel_folder}/ may include from "
                                    f"{', '.join(['proto'] + allowed) or 'nothing else'}")
                lines = text.split("\n")
                for start, count, fn in functions(path):
                    if count > MAX_FUNCTION_LINES and not excepted(lines, start):
                        problems.append(f"{rel}:{start}: {fn} is {count} lines (over {MAX_FUNCTION_LINES}); split it "
                                        f"by what it does, or say above it why it {EXCEPTION_MARK}")
    return problems


def self_test(root):
    """The checks on a copy of the tree: clean as it is, then each rule broken once must be reported."""
    import shutil
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for top in CODE_DIRS:
            shutil.copytree(os.path.join(root, top), os.path.join(tmp, top),
                            ignore=shutil.ignore_patterns("*.txt", "*.md", "*.py"))
        failures = []
        base = check(tmp)
        if base:
            failures.append(f"the unchanged tree has problems: {base}")

        def expect(what, edit, needle):
            with open(os.path.join(tmp, edit[0]), "w") as f:
                f.write(edit[1])
            found = [p for p in check(tmp) if needle in p]
            os.remove(os.path.join(tmp, edit[0]))
            if not found:
                failures.append(f"{what}: not reported")
            else:
                print(f"self-test: {what}: reported: {found[0]}")

        flat = [f for f in os.listdir(os.path.join(tmp, "server")) if f.endswith((".h", ".cc"))]
        fillers = [os.path.join(tmp, "server", f"filler_{i}.h") for i in range(MAX_FLAT_SOURCES["server"] - len(flat))]
        for name in fillers:  # Up to the limit: still clean.
            open(name, "w").write("// filler\n")
        if check(tmp):
            failures.append("server/ at the limit is reported")
        expect("a file dropped flat into server/ past the limit", ("server/one_too_many.cc", "int F() { return 0; }\n"),
               "source files directly in it")
        for name in fillers:
            os.remove(name)
        expect("report/ including coordinator/",
               ("server/report/bad_include.cc", '#include "server/coordinator/coordinator.h"\n'),
               "server/report/bad_include.cc: includes server/coordinator/coordinator.h")
        expect("worker/interfaces/ including worker/pipeline/",
               ("worker/interfaces/bad_include.h", '#include "worker/pipeline/pipeline.h"\n'),
               "worker/interfaces/bad_include.h: includes worker/pipeline/pipeline.h")
        os.makedirs(os.path.join(tmp, "server", "newroom"))
        expect("a sub-folder of server/ the table does not know",
               ("server/newroom/thing.cc", "int Thing() { return 1; }\n"), "server/newroom/: a folder")
        long_fn = "int Long() {\n" + "  int x = 0;\n" * 90 + "  return x;\n}\n"
        expect("a function over 80 lines", ("metrics/long_function.cc", long_fn), "Long is 93 lines")
        for f in failures:
            print("self-test FAILED:", f)
        print(f"structure self-test: {len(failures)} failure(s)")
        return 1 if failures else 0


def main():
    args = sys.argv[1:]
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../..")
    if args and args[0] == "--self-test":
        return self_test(os.path.abspath(args[1] if len(args) > 1 else here))
    problems = check(os.path.abspath(args[0] if args else here))
    for p in problems:
        print(p)
    print(f"structure: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
