"""The docs cannot drift (issue #25): the README is a front page of at most 300 lines that leads to
every guide in docs/; every link in them resolves (file and heading); and every shell block names
the tests that run its commands, which must exist and use each command the block shows.

A fenced block is one of:
  ```sh test=test_x.py::test_name [test=...]   shell commands, run by the named tests (or by CI's
                                                 own script: test=.ci/run)
  ```text / ```ini / ```yaml / ```xml            output, a synopsis or configuration: never run
A block without an info string fails this test, so every block is classified. In a shell block,
`./app` stands for the reader's own CUDA program: the named tests must run one of tests/cuda's.
"""
import ast
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DOCS = ROOT / "docs"
# The guides: docs/*.md (docs/design/ and docs/spec/ are notes for developers, linked as folders).
GUIDES = sorted(p for p in DOCS.glob("*.md"))
PAGES = [ROOT / "README.md", *GUIDES, *sorted(DOCS.glob("design/*.md")), *sorted(DOCS.glob("spec/*.md"))]
KINDS = {"sh", "text", "ini", "yaml", "xml"}
# Shell builtins and wrappers a line may start with; the program after them is what is checked.
WRAPPERS = {"sudo", "exec", "env"}


def fences(page):
    """(line number, info string, body lines) of every fenced block of `page`."""
    out, body, start, info = [], None, 0, ""
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            if body is None:
                body, start, info = [], n, line[3:].strip()
            else:
                out.append((start, info, body))
                body = None
        elif body is not None:
            body.append(line)
    assert body is None, f"{page}: a fence opened at line {start} is never closed"
    return out


def slug(heading):
    """The anchor GitHub gives a heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(page):
    inside, out = False, set()
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside and re.match(r"^#{1,6} ", line):
            out.add(slug(line.lstrip("#")))
    return out


def links(page):
    """(target, line number) of every Markdown link outside fenced blocks."""
    inside, out = False, []
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            inside = not inside
            continue
        if not inside:
            out += [(m.group(1), n) for m in re.finditer(r"\]\(([^)\s]+)\)", line)]
    return out


def test_the_readme_is_a_front_page_that_leads_to_every_guide():
    readme = ROOT / "README.md"
    lines = readme.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; the front page keeps to 300"
    targets = {(readme.parent / t.split("#")[0]).resolve() for t, _ in links(readme) if not t.startswith("#")}
    missing = [g.name for g in GUIDES if g.resolve() not in targets]
    assert not missing, f"guides the README does not link: {missing}"
    assert len(GUIDES) >= 14, [g.name for g in GUIDES]


def test_every_link_resolves_to_a_file_and_heading():
    bad = []
    for page in PAGES:
        for target, n in links(page):
            if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
                continue
            path, _, frag = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.is_relative_to(ROOT):
                continue  # beside the repository (../shared/ in the workspace): not in a clone
            if not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}:{n}: {target} (no such file)")
            elif frag and dest.suffix == ".md" and frag not in anchors(dest):
                bad.append(f"{page.relative_to(ROOT)}:{n}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def commands(body):
    """The programs a shell block runs, one per command (a line, or lines joined by a backslash),
    after any VAR=value assignments and wrappers; `export VAR=...` is the variable's name."""
    joined, out = "\n".join(body).replace("\\\n", " "), []
    for line in joined.splitlines():
        if line.lstrip().startswith("#"):  # a comment line (a program's output): its `;` and `|` are text
            continue
        for part in re.split(r"&&|\|\||;|\|", line):
            try:
                words = shlex.split(part, comments=True)
            except ValueError as e:
                raise AssertionError(f"a shell line does not parse: {part!r}: {e}")
            while words and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) or words[0] in WRAPPERS):
                words = words[1:]
            if not words:
                continue
            if words[0] == "export":
                out += [w.split("=")[0] for w in words[1:]]
            else:
                out.append(words[0].removeprefix("./").split("/")[-1] if words[0].startswith("./") else words[0])
    return out


def functions_of(path):
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_every_block_is_classified_and_every_shell_block_names_the_tests_that_run_it():
    problems = []
    # What a named test uses: its own file, the shared fixtures and harness, the scripts its guests run.
    helpers = [HERE / "conftest.py", HERE / "vm.py", *(HERE / "harness").glob("*.py"), *(HERE / "guest").glob("*")]
    shared = "".join(p.read_text() for p in helpers if p.is_file())
    for page in PAGES:
        where = page.relative_to(ROOT)
        for start, info, body in fences(page):
            words = info.split()
            kind = words[0] if words else ""
            if kind not in KINDS:
                problems.append(f"{where}:{start}: a block without a kind ({sorted(KINDS)}): {info!r}")
                continue
            tests = [w.removeprefix("test=") for w in words[1:] if w.startswith("test=")]
            if kind != "sh":
                if tests:
                    problems.append(f"{where}:{start}: only a sh block names tests")
                continue
            if not tests:
                problems.append(f"{where}:{start}: a shell block that names no test=FILE::TEST")
                continue
            sources = shared
            for t in tests:
                if t == ".ci/run":  # CI's own script runs it (the README's scripts/test)
                    sources += (ROOT / ".ci" / "run").read_text()
                    continue
                file, _, name = t.partition("::")
                path = HERE / file
                if not path.is_file() or name not in functions_of(path):
                    problems.append(f"{where}:{start}: {t}: no such test")
                    continue
                sources += path.read_text()
                # ... and the project's scripts it runs (ROOT / "scripts" / "demo", or scripts/demo).
                for script in re.findall(r'scripts(?:/|" / ")([\w-]+)', path.read_text()):
                    if (ROOT / "scripts" / script).is_file():
                        sources += (ROOT / "scripts" / script).read_text()
            for program in commands(body):
                # `./app` is the reader's own CUDA program: the tests run one of tests/cuda's.
                if program == "app":
                    if "TEST_BIN" not in sources:
                        problems.append(f"{where}:{start}: `./app` (a CUDA program) is run by none of {tests}")
                    continue
                if not re.search(r"(?<![\w-])" + re.escape(program) + r"(?![\w-])", sources):
                    problems.append(f"{where}:{start}: `{program}` is used by none of {tests}")
    assert not problems, "\n".join(problems)
