#!/usr/bin/python3
"""The house rules that keep Tally's code readable, checked on every test run:

1. Dependencies point one way (ARCHITECTURE.md "Libraries"): a file includes only from its own
   folder and from the folders its library may depend on (ALLOWED). Between the top-level folders
   the layers run base <- metrics <- common <- the roles (server, worker, client), and the graph of
   folders that the includes draw has no loop.
2. Within a folder of the shared libraries, no two files include each other round a loop (a file
   and its header are one unit). The decoders of common/formats include, of their folder, only the interface
   (image_formats.h; PNG its fast path): calls run decode -> a format -> the interface, never back.
3. No function in server/, worker/, client/, common/, base/ or metrics/ is longer than 80 lines, unless
   the comment just above it says why it "reads better whole"; no source file is longer than 1000
   lines; no folder of common/ holds more than 3500.
4. server/ and worker/ hold at most 12 source files directly (the process's wiring: main, services,
   options); everything else lives in their sub-folders, and a folder that ALLOWED does not know is a
   problem until the table learns it.
5. Files speak of Tally, not of how it was made: no line names a numbered work session, round or
   issue (WORDS).

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
MAX_FILE_LINES = 1000
MAX_COMMON_FOLDER_LINES = 3500
EXCEPTION_MARK = "reads better whole"

# The top-level layers: a folder includes only from its own layer's folder or a lower layer.
LAYERS = {"base": 0, "metrics": 1, "common": 2, "server": 3, "worker": 3, "client": 3}
COMMON = ["base", "metrics", "common/security", "common/process", "common/formats", "common/coco",
          "common/sources", "common/job", "common/store"]
# Folder -> the folders its files may include from (besides its own). proto/ is everyone's.
# server/ and worker/ are cut by what they do; within each, includes point one way (a folder never
# includes one listed after it, and the process's wiring at the top may include every part):
#   server: store <- report <- coordinator <- follow <- access <- http <- server/ (main, services)
#   worker: interfaces <- scoring <- pipeline, torch, python, store <- worker/ (main, control plane)
ALLOWED = {
    "base": [],
    "metrics": ["base"],
    "metrics/gpu": ["metrics", "base"],
    "common/security": ["base"],
    "common/process": ["base"],
    "common/formats": ["base", "common/security", "metrics"],
    "common/coco": ["base", "common/security", "common/formats", "metrics"],
    "common/sources": ["base", "common/security", "common/formats", "common/coco", "metrics"],
    "common/job": ["base", "common/security", "common/formats", "common/coco", "common/sources", "metrics"],
    "common/store": ["base", "common/security", "common/formats", "common/coco", "common/sources", "common/job", "metrics"],
    "server/store": COMMON,
    "server/report": COMMON + ["server/store"],
    "server/coordinator": COMMON + ["server/store", "server/report"],
    "server/follow": COMMON + ["server/coordinator", "server/store", "server/report"],
    "server/access": COMMON + ["server/follow", "server/coordinator", "server/store", "server/report"],
    "server/http": COMMON + ["server/access", "server/follow", "server/coordinator", "server/store", "server/report"],
    "server": COMMON + ["server/http", "server/access", "server/follow", "server/coordinator", "server/store",
                        "server/report"],
    "worker/interfaces": COMMON,
    "worker/scoring": COMMON + ["metrics/gpu", "worker/interfaces"],
    "worker/pipeline": COMMON + ["worker/interfaces", "worker/scoring"],
    "worker/torch": COMMON + ["metrics/gpu", "worker/interfaces"],
    "worker/python": COMMON + ["worker/interfaces"],
    "worker/store": COMMON + ["worker/interfaces"],
    "worker": COMMON + ["metrics/gpu", "worker/interfaces", "worker/scoring", "worker/pipeline", "worker/torch",
                        "worker/python", "worker/store"],
    "client": ["client/verbs"] + COMMON,
    "client/verbs": ["client"] + COMMON,
}
# The shared libraries, whose folders (and the files within each folder) never include each other
# round a loop (rules 1 and 2); a role's own folders are ordered by ALLOWED alone (its top folder
# holds the wiring, which may include every part).
LOOP_FREE_TOPS = {"base", "metrics", "common"}
# Units of a folder -> the units of that folder they may include (rule 2): the decoders.
UNIT_RULES = {
    "common/formats": {"image_formats": set(), "png_fast": {"image_formats"}, "png": {"image_formats", "png_fast"},
                       "jpeg": {"image_formats"}, "tiff": {"image_formats"}, "webp": {"image_formats"},
                       "dicom": {"image_formats"}},
}
# Folders whose own top level holds only the process's wiring (rule 4).
MAX_FLAT_SOURCES = {"server": 12, "worker": 12}
CODE_DIRS = ["server", "worker", "client", "common", "base", "metrics"]
# Rule 3's file length also covers the tests' and benchmarks' code.
LENGTH_DIRS = CODE_DIRS + ["tests", "bench", "python", "scripts"]
SOURCE_SUFFIXES = (".h", ".cc", ".cu")
LENGTH_SUFFIXES = SOURCE_SUFFIXES + (".py", ".sh")
# Rule 5 (spelled in pieces so that this file does not name what it forbids).
WORDS = re.compile(r"\b(?:sess" r"ions?|iss" r"ues?|rou" r"nds?|ite" r"ms?) #?[0-9]+\b|\(#" r"[0-9]+\)", re.I)
WORD_SKIP_DIRS = {".git", "node_modules", "__pycache__", "corpus"}


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


def unit_of(name):
    return name.rsplit(".", 1)[0]


def find_cycle(graph):
    """One loop of `graph` (node -> set of nodes) as a list of nodes, or None."""
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def check_includes(root, rel_folder, name, text, allowed, folder_graph, unit_graph, problems):
    rel = f"{rel_folder}/{name}"
    for m in re.finditer(r'^#include "([^"]+)/([^/"]+)"', text, re.M):
        dep, header = m.group(1), m.group(2)
        top, dep_top = rel_folder.split("/")[0], dep.split("/")[0]
        if dep_top not in LAYERS:
            continue  # proto/ (everyone's) and third-party headers.
        if dep == rel_folder:
            unit_graph.setdefault(unit_of(name), set())
            if unit_of(header) != unit_of(name):
                unit_graph[unit_of(name)].add(unit_of(header))
            continue
        if top != dep_top:
            folder_graph.setdefault(top, set()).add(dep_top)
        elif top in LOOP_FREE_TOPS:
            folder_graph.setdefault(rel_folder, set()).add(dep)
        include = f"{dep}/{header}"
        if top != dep_top and LAYERS[dep_top] >= LAYERS[top]:
            problems.append(f"{rel}: includes {include}; {top}/ may include only the layers below it "
                            f"({', '.join(t for t, l in LAYERS.items() if l < LAYERS[top]) or 'none'})")
        elif allowed is not None and dep not in allowed:
            problems.append(f"{rel}: includes {include}; {rel_folder}/ may include from "
                            f"{', '.join(['proto'] + allowed) or 'nothing else'}")


def check_units(rel_folder, unit_graph, problems):
    cycle = find_cycle(unit_graph) if rel_folder.split("/")[0] in LOOP_FREE_TOPS else None
    if cycle:
        problems.append(f"{rel_folder}/: its files include each other round a loop: {' -> '.join(cycle)}")
    rules = UNIT_RULES.get(rel_folder, {})
    for unit, may in sorted(rules.items()):
        for dep in sorted(unit_graph.get(unit, set()) - may):
            problems.append(f"{rel_folder}/{unit}: includes {dep}.h; a decoder includes, of its folder, only "
                            f"{', '.join(sorted(may)) or 'nothing'} (calls run decode -> a format -> the interface)")


def check_lengths(root, problems):
    for top in LENGTH_DIRS:
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [d for d in dirs if d not in WORD_SKIP_DIRS]
            for name in sorted(files):
                if not name.endswith(LENGTH_SUFFIXES):
                    continue
                path = os.path.join(folder, name)
                lines = open(path, errors="replace").read().count("\n")
                if lines > MAX_FILE_LINES:
                    problems.append(f"{os.path.relpath(path, root)}: {lines} lines (at most {MAX_FILE_LINES}); split it "
                                    f"by responsibility")
    common = os.path.join(root, "common")
    for sub in sorted(os.listdir(common)) if os.path.isdir(common) else []:
        total = 0
        for folder, _, files in os.walk(os.path.join(common, sub)):
            total += sum(open(os.path.join(folder, f), errors="replace").read().count("\n")
                         for f in files if f.endswith(SOURCE_SUFFIXES))
        if total > MAX_COMMON_FOLDER_LINES:
            problems.append(f"common/{sub}/: {total} lines of code (at most {MAX_COMMON_FOLDER_LINES}); split it by concern")


def check_words(root, problems):
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in WORD_SKIP_DIRS and not d.startswith((".", "build"))]
        for name in sorted(files):
            path = os.path.join(folder, name)
            try:
                data = open(path, "rb").read(4 << 20)
            except OSError:
                continue
            if b"\0" in data:
                continue  # Binary.
            for i, line in enumerate(data.decode("utf-8", "replace").split("\n"), 1):
                m = WORDS.search(line)
                if m:
                    problems.append(f"{os.path.relpath(path, root)}:{i}: names '{m.group(0)}'; say what it refers to "
                                    f"(the behaviour, the benchmark, a date or a commit)")


def check(root):
    """Every problem in the tree at `root`, a line each."""
    problems = []
    folder_graph = {}
    for top in CODE_DIRS:
        for folder, _, files in os.walk(os.path.join(root, top)):
            rel_folder = os.path.relpath(folder, root)
            allowed = ALLOWED.get(rel_folder)
            sources = sorted(f for f in files if f.endswith(SOURCE_SUFFIXES))
            if sources and allowed is None:
                problems.append(f"{rel_folder}/: a folder tests/structure/check.py does not know; add it to ALLOWED "
                                f"with the folders it may include from")
            limit = MAX_FLAT_SOURCES.get(rel_folder)
            if limit is not None and len(sources) > limit:
                problems.append(f"{rel_folder}/: {len(sources)} source files directly in it (at most {limit}: the "
                                f"process's wiring); put the rest in its sub-folders by what they do")
            unit_graph = {}
            for name in sources:
                path = os.path.join(folder, name)
                text = open(path, errors="replace").read()
                check_includes(root, rel_folder, name, text, allowed, folder_graph, unit_graph, problems)
                lines = text.split("\n")
                for start, count, fn in functions(path):
                    if count > MAX_FUNCTION_LINES and not excepted(lines, start):
                        problems.append(f"{rel_folder}/{name}:{start}: {fn} is {count} lines (over {MAX_FUNCTION_LINES}); "
                                        f"split it by what it does, or say above it why it {EXCEPTION_MARK}")
            # A header without a source file holds types and inline helpers its folder's files share; what
            # it includes is not a call, so it starts no loop.
            with_code = {unit_of(f) for f in sources if not f.endswith(".h")}
            check_units(rel_folder, {u: d for u, d in unit_graph.items() if u in with_code}, problems)
    cycle = find_cycle(folder_graph)
    if cycle:
        problems.append(f"the folders include each other round a loop: {' -> '.join(cycle)}")
    check_lengths(root, problems)
    check_words(root, problems)
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
        expect("metrics/ including common/",
               ("metrics/bad_layer.cc", '#include "common/formats/decode.h"\n'), "metrics/bad_layer.cc: includes")
        expect("a role including another role",
               ("client/bad_role.cc", '#include "server/server.h"\n'), "client/bad_role.cc: includes server/server.h")
        def expect_edits(what, edits, needle):
            """`edits`: (path, text) pairs appended to the copy's files (new files made); all undone after."""
            saved = {}
            for path, text in edits:
                full = os.path.join(tmp, path)
                if full not in saved:
                    saved[full] = open(full).read() if os.path.exists(full) else None
                with open(full, "a") as f:
                    f.write(text)
            found = [p for p in check(tmp) if needle in p]
            for full, original in saved.items():
                if original is None:
                    os.remove(full)
                else:
                    with open(full, "w") as f:
                        f.write(original)
            if not found:
                failures.append(f"{what}: not reported")
            else:
                print(f"self-test: {what}: reported: {found[0]}")

        expect_edits("a decoder including another decoder",
                     [("common/formats/webp.cc", '#include "common/formats/tiff.h"\n')],
                     "common/formats/webp: includes tiff.h")
        expect_edits("a decoder including the dispatcher",
                     [("common/formats/dicom.cc", '#include "common/formats/decode.h"\n')],
                     "common/formats/dicom: includes decode.h")
        expect_edits("a folder loop between common/coco and common/sources",
                     [("common/coco/bad_loop.cc", '#include "common/sources/manifest.h"\n')], "round a loop")
        expect_edits("two files of a folder including each other",
                     [("common/job/rpc.cc", '#include "common/job/row_order.h"\n'),
                      ("common/job/row_order.cc", '#include "common/job/rpc.h"\n')],
                     "common/job/: its files include each other round a loop")
        expect("a file over 1000 lines", ("base/too_long.h", "// line\n" * 1001), "1001 lines")
        expect("a line naming a work session", ("base/history.h", "// As se" "ssion 12 found.\n"), "names 'se")
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
