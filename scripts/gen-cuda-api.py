#!/usr/bin/env python3
"""Generate guest/src/cuda_api.inc from the CUDA toolkit's driver API headers.

Usage:
    python3 scripts/gen-cuda-api.py [--cuda /usr/local/cuda] [--out guest/src/cuda_api.inc]
                                    [--stub PATH | --no-stub] [--verbose]

Python 3 standard library only; no compiler is needed.

What it reads
  * Declarations: cuda.h, cudaGL.h, cudaEGL.h, cudaVDPAU.h, cudaProfiler.h.
  * cuGetProcAddress versions: the PFN_<name>_v<VERSION>[_ptds|_ptsz] typedefs in cudaTypedefs.h,
    cudaGLTypedefs.h, cudaEGLTypedefs.h, cudaVDPAUTypedefs.h and cudaProfilerTypedefs.h.
  * Optionally the toolkit's link stub lib64/stubs/libcuda.so (ELF .dynsym, parsed here), which
    NVIDIA generates from the real driver's export list: used only as a cross-check, reported on
    stdout; it never changes the output.

How
  The headers are run through a small C preprocessor (#if/#ifdef/#elif/#else/#endif with
  defined(), object-like and function-like macros with ##, #undef; #include is ignored because
  the files are read in order) under three configurations:
    plain     nothing defined                              (what an application sees)
    ptds      CUDA_API_PER_THREAD_DEFAULT_STREAM           (the _ptds/_ptsz names)
    internal  __CUDA_API_VERSION_INTERNAL                  (the _ptds/_ptsz names plus the
                                                            legacy unversioned prototypes)
  The body of cuda.h spells e.g. `cuMemcpyHtoD(...)`; the macros at its top turn that into
  cuMemcpyHtoD_v2 (plain) or cuMemcpyHtoD_v2_ptds (ptds/internal), and the
  `#if defined(__CUDA_API_VERSION_INTERNAL)` block at its end #undefs the macros and declares
  the old names (cuMemAlloc, cuCtxCreate_v2, cuMemcpyHtoD_v2, ...).  A symbol is listed in
  ORION_CUDA_SYMBOL when any configuration declares it with a `CUresult CUDAAPI name(...);`
  prototype (static inline helpers such as cuGetProcAddress_v2_ptsz are not exported and are
  skipped).

  For ORION_CUDA_PROC every PFN typedef is matched against the prototypes of its candidate
  symbols: `<name>` or `<name>_v<N>` for a plain typedef, `<name>[_v<N>]_ptds|_ptsz` for a
  _ptds/_ptsz typedef (same suffix).  Parameter lists are compared after dropping parameter
  names and resolving typedef aliases (CUdeviceptr -> CUdeviceptr_v2, CUdevice -> CUdevice_v1,
  CUDA_MEMCPY2D -> CUDA_MEMCPY2D_v2, `unsigned` -> `unsigned int`, ...).  When several
  candidates have the same signature (cuCtxCreate/cuCtxCreate_v2, cuDeviceGetUuid/_v2,
  cuStreamWaitValue32/_v2, cuGraphInstantiate/_v2, ...) the family is resolved by order: each
  version threshold of a family maps to its own symbol and a later threshold never maps to an
  older symbol (strictly increasing suffix); if cuda.h has `#define <name> <name>_vN`, the
  newest plain threshold must map to <name>_vN.  A family that still has more than one
  solution is reported as ambiguous and resolved by taking, for each row, the newest symbol.
  Anything that cannot be mapped is printed on stdout and left out.  ALIAS_ROWS adds the one row
  that cuda.h implies through a `#define cuX cuY` with a different base name instead of through a
  PFN typedef (cuGraphInstantiate@12000 -> cuGraphInstantiateWithFlags).
"""

import argparse
import os
import re
import struct
import sys

DECL_HEADERS = ["cuda.h", "cudaGL.h", "cudaEGL.h", "cudaVDPAU.h", "cudaProfiler.h"]
TYPEDEF_HEADERS = ["cudaTypedefs.h", "cudaGLTypedefs.h", "cudaEGLTypedefs.h",
                   "cudaVDPAUTypedefs.h", "cudaProfilerTypedefs.h"]

# Predefined by a 64-bit Linux GCC/Clang.  _WIN32/_MSC_VER stay undefined.
BASE_DEFINES = {"__GNUC__": "1", "__linux__": "1", "__LP64__": "1", "__x86_64__": "1",
                "__STDC_VERSION__": "201710L"}
CONFIGS = [
    ("plain", {}),
    ("ptds", {"CUDA_API_PER_THREAD_DEFAULT_STREAM": "1"}),
    ("internal", {"__CUDA_API_VERSION_INTERNAL": "1"}),
]

TOKEN_RE = re.compile(r"[A-Za-z_]\w*|\d[\w.]*|##|#|\.\.\.|->|<<|>>|&&|\|\||[<>=!]=|\S")
IDENT_RE = re.compile(r"[A-Za-z_]\w*$")


# --------------------------------------------------------------------------------------------
# Minimal C preprocessor
# --------------------------------------------------------------------------------------------

def strip_comments(text):
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(" " + "\n" * text.count("\n", i, j))  # keep line structure
            i = j
        elif c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


class Macro:
    def __init__(self, params, body):
        self.params = params  # None for object-like
        self.body = body      # list of tokens


class Preprocessor:
    def __init__(self, defines):
        self.macros = {}
        for k, v in defines.items():
            self.macros[k] = Macro(None, TOKEN_RE.findall(v))
        self.text = []  # active, macro-expanded source lines

    # ---- expansion ------------------------------------------------------------------------
    def expand(self, tokens, hide=frozenset()):
        out = []
        i = 0
        while i < len(tokens):
            t = tokens[i]
            m = self.macros.get(t)
            if m is None or t in hide:
                out.append(t)
                i += 1
                continue
            if m.params is None:
                out.extend(self.expand(m.body, hide | {t}))
                i += 1
                continue
            # function-like: needs '(' next
            if i + 1 >= len(tokens) or tokens[i + 1] != "(":
                out.append(t)
                i += 1
                continue
            args, j = self._collect_args(tokens, i + 2)
            if args is None:
                out.append(t)
                i += 1
                continue
            body = self._substitute(m, args, hide | {t})
            out.extend(self.expand(body, hide | {t}))
            i = j
        return out

    @staticmethod
    def _collect_args(tokens, i):
        args, cur, depth = [], [], 0
        while i < len(tokens):
            t = tokens[i]
            if t == "(":
                depth += 1
            elif t == ")":
                if depth == 0:
                    args.append(cur)
                    return args, i + 1
                depth -= 1
            elif t == "," and depth == 0:
                args.append(cur)
                cur = []
                i += 1
                continue
            cur.append(t)
            i += 1
        return None, i

    def _substitute(self, m, args, hide):
        if len(m.params) == 0 and args == [[]]:
            args = []
        amap = dict(zip(m.params, args))
        body = m.body
        res = []
        i = 0
        while i < len(body):
            t = body[i]
            if t == "##":
                i += 1
                continue
            pasted_left = i > 0 and body[i - 1] == "##"
            pasted_right = i + 1 < len(body) and body[i + 1] == "##"
            if t in amap:
                val = amap[t] if (pasted_left or pasted_right) else self.expand(amap[t], hide)
                val = list(val)
            else:
                val = [t]
            if pasted_left and res and val:
                res[-1] = res[-1] + val[0]
                res.extend(val[1:])
            else:
                res.extend(val)
            i += 1
        return res

    # ---- conditions -----------------------------------------------------------------------
    def eval_cond(self, expr):
        toks = TOKEN_RE.findall(expr)
        # resolve defined(X) / defined X before macro expansion
        out = []
        i = 0
        while i < len(toks):
            if toks[i] == "defined":
                if i + 1 < len(toks) and toks[i + 1] == "(":
                    name = toks[i + 2]
                    i += 4
                else:
                    name = toks[i + 1]
                    i += 2
                out.append("1" if name in self.macros else "0")
            else:
                out.append(toks[i])
                i += 1
        toks = self.expand(out)
        py = []
        for t in toks:
            if t == "&&":
                py.append(" and ")
            elif t == "||":
                py.append(" or ")
            elif t == "!":
                py.append(" not ")
            elif IDENT_RE.match(t):
                py.append("0")  # undefined identifiers are 0
            elif t[0].isdigit():
                py.append(str(int(re.sub(r"[uUlL]+$", "", t), 0)))
            else:
                py.append(t)
        try:
            return bool(eval("".join(py), {"__builtins__": {}}))
        except Exception as e:  # pragma: no cover
            raise SystemExit("cannot evaluate #if %r: %s" % (expr, e))

    # ---- driver ---------------------------------------------------------------------------
    def process(self, text):
        text = strip_comments(text).replace("\\\n", " ")
        stack = []  # (active, taken, parent_active)
        active = True
        for line in text.split("\n"):
            s = line.strip()
            if s.startswith("#"):
                d = s[1:].strip()
                m = re.match(r"(\w+)\s*(.*)$", d)
                if not m:
                    continue
                kw, rest = m.group(1), m.group(2).strip()
                if kw in ("if", "ifdef", "ifndef"):
                    if active:
                        if kw == "if":
                            c = self.eval_cond(rest)
                        elif kw == "ifdef":
                            c = rest.split()[0] in self.macros
                        else:
                            c = rest.split()[0] not in self.macros
                    else:
                        c = False
                    stack.append([active, c, active])
                    active = active and c
                elif kw == "elif":
                    top = stack[-1]
                    if top[2] and not top[1]:
                        c = self.eval_cond(rest)
                        top[1] = c
                        active = c
                    else:
                        active = False
                elif kw == "else":
                    top = stack[-1]
                    active = top[2] and not top[1]
                    top[1] = True
                elif kw == "endif":
                    active = stack.pop()[0]
                elif not active:
                    continue
                elif kw == "define":
                    dm = re.match(r"([A-Za-z_]\w*)(\(([^)]*)\))?\s*(.*)$", rest)
                    name = dm.group(1)
                    if dm.group(2) is not None:
                        params = [p.strip() for p in dm.group(3).split(",") if p.strip()]
                    else:
                        params = None
                    self.macros[name] = Macro(params, TOKEN_RE.findall(dm.group(4)))
                elif kw == "undef":
                    self.macros.pop(rest.split()[0], None)
                # include, pragma, error (inactive CUDA_FORCE_API_VERSION only), line: ignored
                continue
            if active and s:
                self.text.append(" ".join(self.expand(TOKEN_RE.findall(s))))
        if stack:
            raise SystemExit("unbalanced #if in header")


# --------------------------------------------------------------------------------------------
# Declarations and typedefs
# --------------------------------------------------------------------------------------------

PROTO_RE = re.compile(r"\bCUresult\s+(\w+)\s*\(([^;{}]*?)\)\s*([;{])")
PFN_RE = re.compile(r"typedef\s+CUresult\s*\(\s*\*\s*(PFN_\w+)\s*\)\s*\(([^;{}]*?)\)\s*;")
SIMPLE_TYPEDEF_RE = re.compile(r"typedef\s+(?:(?:struct|enum|union)\s+)?(\w+)\s+(\w+)\s*;")
BUILTIN = {"void", "char", "short", "int", "long", "float", "double", "unsigned", "signed",
           "const", "volatile", "struct", "enum", "union", "size_t", "uint32_t", "uint64_t",
           "int32_t", "int64_t"}
NON_TYPE_WORDS = {"const", "volatile", "struct", "enum", "union"}


def read_headers(inc, names, defines):
    pp = Preprocessor(dict(BASE_DEFINES, **defines))
    for n in names:
        p = os.path.join(inc, n)
        with open(p, encoding="utf-8", errors="replace") as f:
            pp.process(f.read())
    return " ".join(pp.text)


def split_params(s):
    parts, cur, depth = [], [], 0
    for t in TOKEN_RE.findall(s):
        if t in "([":
            depth += 1
        elif t in ")]":
            depth -= 1
        if t == "," and depth == 0:
            parts.append(cur)
            cur = []
        else:
            cur.append(t)
    if cur or parts:
        parts.append(cur)
    return parts


class TypeNorm:
    def __init__(self, text):
        self.alias = {}
        for a, b in SIMPLE_TYPEDEF_RE.findall(text):
            if a != b:
                self.alias[b] = a

    def resolve(self, t):
        seen = set()
        while t in self.alias and t not in seen:
            seen.add(t)
            t = self.alias[t]
        return t

    def param(self, toks):
        toks = [t for t in toks if t not in ("__restrict", "restrict")]
        # drop array suffix and parameter name
        arr = 0
        while toks and toks[-1] == "]":
            k = len(toks) - 1 - toks[::-1].index("[")
            toks = toks[:k]
            arr += 1
        # the last identifier is the parameter's name when a type precedes it
        if (len(toks) >= 2 and IDENT_RE.match(toks[-1]) and toks[-1] not in BUILTIN
                and any(IDENT_RE.match(t) and t not in NON_TYPE_WORDS for t in toks[:-1])):
            toks = toks[:-1]
        toks = toks + ["*"] * arr
        out = []
        for i, t in enumerate(toks):
            if t == "unsigned" and (i + 1 >= len(toks) or toks[i + 1] not in
                                    ("int", "char", "short", "long")):
                out.extend(["unsigned", "int"])
            elif IDENT_RE.match(t):
                out.append(self.resolve(t))
            else:
                out.append(t)
        return " ".join(out)

    def signature(self, params):
        ps = [self.param(p) for p in split_params(params)]
        if ps == ["void"]:
            ps = []
        return tuple(ps)


# --------------------------------------------------------------------------------------------
# ELF .dynsym reader (link stub cross-check)
# --------------------------------------------------------------------------------------------

def elf_exports(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
    secs = []
    for i in range(e_shnum):
        (name, typ, flags, addr, off, size, link, info, align,
         entsize) = struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize)
        secs.append((typ, off, size, link, entsize))
    names = set()
    for typ, off, size, link, entsize in secs:
        if typ != 11:  # SHT_DYNSYM
            continue
        stroff = secs[link][1]
        for k in range(size // entsize):
            st_name, st_info, st_other, st_shndx, st_value, st_size = struct.unpack_from(
                "<IBBHQQ", data, off + k * entsize)
            if st_shndx == 0 or (st_info >> 4) == 0:  # undefined or local
                continue
            end = data.index(b"\0", stroff + st_name)
            names.add(data[stroff + st_name:end].decode())
    return names


# --------------------------------------------------------------------------------------------

# Rows that no PFN typedef spells but cuda.h implies: since CUDA 12.0, cuda.h has
# `#define cuGraphInstantiate cuGraphInstantiateWithFlags` and documents cuGraphInstantiate with the
# (CUgraphExec *, CUgraph, unsigned long long flags) signature, so a caller asking for
# "cuGraphInstantiate" at >= 12000 expects cuGraphInstantiateWithFlags' ABI (the 5-argument
# cuGraphInstantiate_v2 is what 11.x callers get).  The version (12000) is not in the headers; the
# macro and the signature are checked below, and the row is dropped with a warning if they differ.
ALIAS_ROWS = [("cuGraphInstantiate", 12000, "DEFAULT", "cuGraphInstantiateWithFlags")]

SUFFIX_RE = re.compile(r"^(?P<base>\w+?)(?:_v(?P<n>\d+))?(?P<pt>_ptds|_ptsz)?$")
PFN_NAME_RE = re.compile(r"^PFN_(?P<name>\w+?)_v(?P<ver>\d+)(?P<pt>_ptds|_ptsz)?$")


def sym_rank(sym):
    m = SUFFIX_RE.match(sym)
    return int(m.group("n")) if m.group("n") else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--cuda", default=os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    ap.add_argument("--out", default=os.path.join(root, "guest", "src", "cuda_api.inc"))
    ap.add_argument("--stub", default=None,
                    help="libcuda.so stub to cross-check exports (default: <cuda>/lib64/stubs)")
    ap.add_argument("--no-stub", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    inc = os.path.join(a.cuda, "include")

    with open(os.path.join(inc, "cuda.h"), encoding="utf-8", errors="replace") as f:
        cuda_h = f.read()
    mv = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", cuda_h)
    cuda_version = int(mv.group(1))

    # ---- declarations per configuration -------------------------------------------------
    protos = {}        # sym -> signature (first seen)
    declared_in = {}   # sym -> set(config)
    pfns = {}          # PFN name -> signature
    texts = {}
    for cname, defs in CONFIGS:
        text = read_headers(inc, DECL_HEADERS + TYPEDEF_HEADERS, defs)
        texts[cname] = text
    norm = TypeNorm(texts["internal"] + " " + texts["plain"])
    sig_conflicts = []
    for cname, _ in CONFIGS:
        text = texts[cname]
        for m in PROTO_RE.finditer(text):
            sym, params = m.group(1), m.group(2)
            start = max(text.rfind(";", 0, m.start()), text.rfind("{", 0, m.start()),
                        text.rfind("}", 0, m.start()))
            quals = set(re.findall(r"\w+", text[start + 1:m.start()]))
            if m.group(3) == "{" or quals & {"typedef", "static", "inline", "return"}:
                continue  # static inline helpers (cuGetProcAddress_v2_ptsz) are not exported
            sig = norm.signature(params)
            if sym in protos and protos[sym] != sig:
                sig_conflicts.append((sym, protos[sym], sig))
            protos.setdefault(sym, sig)
            declared_in.setdefault(sym, set()).add(cname)
        for m in PFN_RE.finditer(text):
            pfns.setdefault(m.group(1), norm.signature(m.group(2)))

    # `#define cuX cuX_vN` (plain configuration): the current default of each API.
    pp = Preprocessor(dict(BASE_DEFINES))
    pp.process(cuda_h)
    current = {}
    for name, mac in pp.macros.items():
        if mac.params is None and name.startswith("cu"):
            tgt = pp.expand([name])
            if len(tgt) == 1 and tgt[0] != name:
                current[name] = tgt[0]

    # ---- PFN families --------------------------------------------------------------------
    unmapped = []
    families = {}  # (name, kind, pt) -> [(ver, pfn)]
    for pfn in sorted(pfns):
        m = PFN_NAME_RE.match(pfn)
        if not m:
            unmapped.append((pfn, "typedef name has no _v<VERSION>"))
            continue
        pt = m.group("pt") or ""
        kind = "PTDS" if pt else "DEFAULT"
        families.setdefault((m.group("name"), kind, pt), []).append((int(m.group("ver")), pfn))

    by_base = {}
    for sym in protos:
        sm = SUFFIX_RE.match(sym)
        by_base.setdefault((sm.group("base"), sm.group("pt") or ""), []).append(sym)

    rows = []          # (name, ver, kind, sym)
    ambiguous = []     # text lines
    order_resolved = []
    for (name, kind, pt), vers in sorted(families.items()):
        vers.sort()
        cands = sorted(by_base.get((name, pt), []), key=sym_rank)
        matches = []
        for ver, pfn in vers:
            ok = [s for s in cands if protos[s] == pfns[pfn]]
            matches.append(ok)
        pinned = current.get(name) if kind == "DEFAULT" else None
        if pinned not in cands:
            pinned = None

        # enumerate strictly increasing assignments
        sols = []

        def rec(i, last, acc):
            if len(sols) > 64:
                return
            if i == len(vers):
                if pinned is None or acc[-1] == pinned:
                    sols.append(list(acc))
                return
            for s in matches[i]:
                if sym_rank(s) > last:
                    rec(i + 1, sym_rank(s), acc + [s])

        rec(0, 0, [])
        if len(sols) == 1:
            choice = sols[0]
        else:
            choice = []
            for i, (ver, pfn) in enumerate(vers):
                choice.append(matches[i][-1] if matches[i] else None)
            if len(sols) == 0:
                detail = "no order-consistent assignment"
            else:
                detail = "%d order-consistent assignments" % len(sols)
            if any(choice):
                ambiguous.append("%s [%s]: %s; candidates %s; per-row matches %s; took %s" % (
                    name, kind, detail, cands,
                    ["%d:%s" % (v, ms) for (v, _), ms in zip(vers, matches)], choice))
        for i, (ver, pfn) in enumerate(vers):
            sym = choice[i]
            if sym is None:
                why = "no declared symbol with this signature among %s" % (cands or "none")
                unmapped.append((pfn, why))
                continue
            if len(matches[i]) > 1:
                order_resolved.append("%s -> %s (same signature as %s)" % (
                    pfn, sym, ", ".join(s for s in matches[i] if s != sym)))
            rows.append((name, ver, kind, sym))

    alias_added = []
    for name, ver, kind, sym in ALIAS_ROWS:
        fam = [r for r in rows if r[0] == name and r[2] == kind]
        if current.get(name) != sym or sym not in protos:
            print("alias row %s@%d -> %s dropped: cuda.h no longer has #define %s %s" % (
                name, ver, sym, name, sym))
        elif any(r[1] >= ver for r in fam):
            print("alias row %s@%d -> %s dropped: a PFN typedef now covers it" % (name, ver, sym))
        else:
            rows.append((name, ver, kind, sym))
            alias_added.append((name, ver, kind, sym))
            order_resolved.append("%s@%d -> %s (alias row: #define %s %s, not a PFN typedef)" % (
                name, ver, sym, name, sym))

    # cuGetProcAddress sanity (the runtime relies on these two rows)
    for want in (("cuGetProcAddress", 11030, "DEFAULT", "cuGetProcAddress"),
                 ("cuGetProcAddress", 12000, "DEFAULT", "cuGetProcAddress_v2")):
        if want not in rows:
            raise SystemExit("internal check failed: missing row %s" % (want,))

    symbols = sorted(protos)
    mapped_syms = {r[3] for r in rows}
    no_pfn = sorted(s for s in symbols if s not in mapped_syms)
    not_internal = sorted(s for s in symbols if "internal" not in declared_in[s])

    # ---- stub cross-check ----------------------------------------------------------------
    stub = None if a.no_stub else (a.stub or os.path.join(a.cuda, "lib64", "stubs", "libcuda.so"))
    stub_report = []
    if stub and os.path.exists(stub):
        exp = {s for s in elf_exports(stub) if s.startswith("cu")}
        stub_report.append("stub %s: %d exports" % (stub, len(exp)))
        d1 = sorted(set(symbols) - exp)
        d2 = sorted(exp - set(symbols))
        stub_report.append("  declared but not exported by the stub (%d): %s" % (len(d1), " ".join(d1)))
        stub_report.append("  exported by the stub but declared in no header (%d): %s" % (len(d2), " ".join(d2)))
    elif stub:
        stub_report.append("stub %s not found: export cross-check skipped" % stub)

    # ---- write ---------------------------------------------------------------------------
    rows.sort(key=lambda r: (r[0], r[2] != "DEFAULT", r[1]))
    names = sorted({r[0] for r in rows})
    n_ptds = sum(1 for r in rows if r[2] == "PTDS")
    n_alias = len(alias_added)
    rel_out = os.path.relpath(a.out, root)
    lines = []
    lines.append("/* %s -- GENERATED, DO NOT EDIT." % rel_out)
    lines.append(" *")
    lines.append(" * Regenerate with:  python3 scripts/gen-cuda-api.py --cuda <toolkit>")
    lines.append(" * Source: CUDA_VERSION %d headers (%s, %s)." % (
        cuda_version, ", ".join(DECL_HEADERS), ", ".join(TYPEDEF_HEADERS)))
    lines.append(" *")
    lines.append(" * ORION_CUDA_SYMBOL(sym): %d driver entry points declared by those headers" % len(symbols))
    lines.append(" *   (union of the plain, CUDA_API_PER_THREAD_DEFAULT_STREAM and")
    lines.append(" *   __CUDA_API_VERSION_INTERNAL views: base names, _vN, _ptds and _ptsz variants).")
    lines.append(" * ORION_CUDA_PROC(name, version, flags_kind, sym): %d rows for %d names"
                 " (%d DEFAULT, %d PTDS)," % (len(rows), len(names), len(rows) - n_ptds, n_ptds))
    lines.append(" *   one per PFN_<name>_v<version>[_ptds|_ptsz] typedef; sym is the exported symbol")
    lines.append(" *   whose prototype matches the typedef.  Lookup: among rows with the same name and")
    lines.append(" *   flags_kind take the greatest version <= the requested cudaVersion; for a")
    lines.append(" *   CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM request with no such PTDS row, use")
    lines.append(" *   the DEFAULT rows.  %d row(s) come from a cuda.h `#define cuX cuY` alias rather than" % n_alias)
    lines.append(" *   a PFN typedef: %s." % ", ".join("%s@%d -> %s" % (r[0], r[1], r[3]) for r in alias_added))
    lines.append(" *")
    lines.append(" * Each list is emitted only if its macro is defined, so a user may define one,")
    lines.append(" * include this file, and #undef it afterwards.")
    lines.append(" */")
    lines.append("")
    lines.append("#ifdef ORION_CUDA_SYMBOL")
    lines += ["ORION_CUDA_SYMBOL(%s)" % s for s in symbols]
    lines.append("#endif /* ORION_CUDA_SYMBOL */")
    lines.append("")
    lines.append("#ifdef ORION_CUDA_PROC")
    lines += ["ORION_CUDA_PROC(%s, %d, %s, %s)" % r for r in rows]
    lines.append("#endif /* ORION_CUDA_PROC */")
    content = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(content)

    # ---- report --------------------------------------------------------------------------
    print("wrote %s: %d symbols, %d proc rows (%d names, %d PTDS rows)" % (
        a.out, len(symbols), len(rows), len(names), n_ptds))
    for cname, _ in CONFIGS:
        print("  declared in the %s view: %d" % (
            cname, sum(1 for s in symbols if cname in declared_in[s])))
    print("unmapped PFN typedefs (%d):" % len(unmapped))
    for pfn, why in unmapped:
        print("  %s: %s" % (pfn, why))
    print("ambiguous families (%d):" % len(ambiguous))
    for s in ambiguous:
        print("  " + s)
    if sig_conflicts:
        print("symbols declared with different signatures across configurations (%d):" % len(sig_conflicts))
        for s, x, y in sig_conflicts:
            print("  %s: %s vs %s" % (s, x, y))
    print("symbols declared but not reachable through any PFN typedef (%d): %s" % (
        len(no_pfn), " ".join(no_pfn)))
    print("symbols not declared under __CUDA_API_VERSION_INTERNAL (%d): %s" % (
        len(not_internal), " ".join(not_internal)))
    for s in stub_report:
        print(s)
    if a.verbose:
        print("rows resolved by version order (same signature) (%d):" % len(order_resolved))
        for s in order_resolved:
            print("  " + s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
