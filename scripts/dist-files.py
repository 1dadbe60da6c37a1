"""The files of Python distributions and of what they require, for scripts/image --pytorch.

    dist-files.py plan CHUNK_BYTES NAME...        prints "LAYERS TOTAL_BYTES"
    dist-files.py copy CHUNK_BYTES INDEX DEST NAME...

Run by the venv's python. The closure: NAME... and, transitively, what each requires (markers
evaluated for this python, extras followed: torch's "cuda-toolkit[cudart,...]" brings what the extras
name). Each distribution's files as its RECORD lists them, below site-packages only (no console
scripts). The files, sorted by path, are cut into layers of at most CHUNK_BYTES each (a file larger
than that is a layer of its own); `copy` copies layer INDEX's files to DEST. Prints the closure's
distribution names to stderr (`plan`)."""
import importlib.metadata as md
import os
import shutil
import sys

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name


def closure(names, say):
    todo, done, files = [(n, "") for n in names], set(), {}
    while todo:
        name, extra = todo.pop()
        name = canonicalize_name(name)
        if (name, extra) in done:
            continue
        first = not any(n == name for n, _ in done)
        done.add((name, extra))
        dist = md.distribution(name)
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                todo.append((req.name, ""))
                todo.extend((req.name, e) for e in req.extras)
        if first:
            for f in dist.files or []:
                src = f.locate()
                if f.parts[0] != ".." and os.path.isfile(src):
                    files[str(f)] = (str(src), os.path.getsize(src))
    if say:
        print(" ".join(sorted({n for n, _ in done})), file=sys.stderr)
    return files


def layers(files, chunk):
    out, cur, size = [], [], 0
    for rel in sorted(files):
        n = files[rel][1]
        if cur and size + n > chunk:
            out.append(cur)
            cur, size = [], 0
        cur.append(rel)
        size += n
    if cur:
        out.append(cur)
    return out


def main(argv):
    mode, chunk = argv[1], int(argv[2])
    if mode == "plan":
        files = closure(argv[3:], True)
        print(len(layers(files, chunk)), sum(n for _, n in files.values()))
    elif mode == "copy":
        index, dest = int(argv[3]), argv[4]
        files = closure(argv[5:], False)
        for rel in layers(files, chunk)[index]:
            out = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            shutil.copy2(files[rel][0], out)
    else:
        sys.exit(f"dist-files.py: unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv)
