#!/usr/bin/env python3
"""Generate guest/src/nvml_api.inc (the NVML entry points) from NVIDIA's nvml.h.

Usage:
    python3 scripts/gen-nvml-api.py --nvml-h PATH/nvml.h [--out guest/src/nvml_api.inc]

Python 3 standard library only. nvml.h is not part of the CUDA toolkit's runfile layout on every
machine; NVIDIA ships it in the `nvidia-nvml-dev` wheel (nvidia/cu13/include/nvml.h) and the
`cuda-nvml-dev` package. Only names are taken from it (facts), never declarations: the types Orion's
libnvidia-ml.so.1 implements are written out in guest/src/nvml_abi.h.

What it lists
  Every function nvml.h declares with DECLDIR, under any configuration: the current names in the
  header's body (nvmlInit_v2, nvmlDeviceGetComputeRunningProcesses_v3, ...) and the older ones in its
  `#ifdef NVML_NO_UNVERSIONED_FUNC_DEFS` block (nvmlInit, nvmlDeviceGetCount, ..._v2), which remain
  exported by NVIDIA's library for binaries built against older headers. The text is read without
  macro expansion, so each name appears as spelled. Each row records whether the function returns
  nvmlReturn_t (a stub may answer NVML_ERROR_NOT_SUPPORTED) or something else (listed apart: Orion
  must implement it).
"""

import argparse
import os
import re
import sys

DECL_RE = re.compile(r"(?P<ret>[\w\s\*]*?)\bDECLDIR\b\s*(?P<ret2>[\w\s\*]*?)\b(?P<name>nvml\w+)\s*\(")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nvml-h", required=True)
    ap.add_argument("--out", default=os.path.join(root, "guest", "src", "nvml_api.inc"))
    a = ap.parse_args()
    with open(a.nvml_h, encoding="utf-8", errors="replace") as f:
        text = strip_comments(f.read())
    mv = re.search(r"#define\s+NVML_API_VERSION\s+(\d+)", text)
    api = mv.group(1) if mv else "?"
    returns_status, other = set(), {}
    for line in text.split(";"):
        line = " ".join(line.split())
        if line.lstrip().startswith("#"):
            line = line.split("\n")[-1]
        m = DECL_RE.search(line)
        if not m:
            continue
        ret = " ".join((m.group("ret") + " " + m.group("ret2")).split())
        ret = re.sub(r"\bDEPRECATED\s*\(.*?\)", "", ret)
        ret = re.sub(r"^.*\b(define|endif|else)\b\s*\w*", "", ret).strip()
        if re.search(r"\bnvmlReturn_t$", ret):
            returns_status.add(m.group("name"))
        else:
            other[m.group("name")] = ret
    if not returns_status:
        raise SystemExit("no NVML declarations found in %s" % a.nvml_h)
    names = sorted(returns_status)
    lines = [
        "/* %s -- GENERATED, DO NOT EDIT." % os.path.relpath(a.out, root),
        " *",
        " * Regenerate with:  python3 scripts/gen-nvml-api.py --nvml-h <nvml.h>",
        " * Source: nvml.h, NVML_API_VERSION %s." % api,
        " *",
        " * ORION_NVML_SYMBOL(sym): %d NVML entry points returning nvmlReturn_t (current names and the" % len(names),
        " *   older ones of the NVML_NO_UNVERSIONED_FUNC_DEFS block).",
        " * ORION_NVML_OTHER(sym): %d entry points returning something else (%s); Orion implements them." % (
            len(other), ", ".join("%s: %s" % (k, v) for k, v in sorted(other.items()))),
        " */",
        "",
        "#ifdef ORION_NVML_SYMBOL",
    ]
    lines += ["ORION_NVML_SYMBOL(%s)" % n for n in names]
    lines += ["#endif /* ORION_NVML_SYMBOL */", "", "#ifdef ORION_NVML_OTHER"]
    lines += ["ORION_NVML_OTHER(%s)" % n for n in sorted(other)]
    lines += ["#endif /* ORION_NVML_OTHER */"]
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %s: %d nvmlReturn_t entry points, %d other (%s)" % (
        a.out, len(names), len(other), " ".join(sorted(other))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
