#!/usr/bin/env bash
# scripts/gpu-e2e.sh — Orion's GPU end-to-end check: builds Orion and the self-checking programs of
# tests/gpu/, starts oriond with the real-driver `cuda` backend on a fresh shared-memory region, then
# runs every program twice — natively (the real libcuda.so.1) and remoted (Orion's libcuda.so.1,
# through oriond) — and compares results and timings. Needs one NVIDIA GPU, its driver and nvcc.
#
# Usage:
#   scripts/gpu-e2e.sh [OUTDIR]   on the GPU machine; OUTDIR defaults to bench/results/gpu-e2e-<date>/
#   scripts/gpu-e2e.sh --prepare  on the dev machine: build a prefix to carry to the GPU machine (below)
#
# Output (OUTDIR): summary.txt (environment + tables), <prog>.native.txt / <prog>.orion.txt (each
# run's stdout+stderr), torch.*.txt / cupy.*.txt, green.txt (the green-context probe), bin/ (the
# programs and their build logs),
# orion-build.log, oriond-logs/ (server.log, session/*.log, oriond's stderr), console.txt.
# Exit status: 0 when every program passed both natively and through Orion, else 1 (the summary is
# written either way). The PyTorch/CuPy checks are informational and never change the status.
#
# Orion itself. The script builds it with the machine's own cmake into build-gpu-local/ (tests off,
# only oriond, orion-shm and libcuda.so.1). That needs a C++20 compiler, pkg-config and the headers
# and libraries of spdlog, fmt, CLI11, inih, lz4 and zstd (Debian packages on the dev machine; a GPU
# machine usually lacks them and cannot install them). GoogleTest and libxml2 are not needed: stand-ins
# satisfy their find_package() (the tests and orion-vm, their only users, are not built). When something is missing the script says what, and
#   ORION_PREBUILT=<prefix>   uses an install prefix built elsewhere (bin/oriond, bin/orion-shm,
#                             lib/orion/libcuda.so.1, optionally lib/deps*/ with bundled libraries).
# Without ORION_PREBUILT it falls back to build-gpu/install when that exists. To make one on the dev
# machine:
#   scripts/gpu-e2e.sh --prepare   # -> build-gpu/install (~6 MiB): RelWithDebInfo, debug info
#                                  #    stripped, oriond's non-glibc libraries (spdlog, fmt, inih; and
#                                  #    libstdc++/libgcc_s in lib/deps-cxx) bundled, BUILD-INFO written
# build-gpu/ is git-ignored (/build*/), so pass it to the device tool with carry: ["build-gpu/install"].
# `scripts/build` + ORION_PREBUILT=build/install also works when the GPU machine has the shared
# libraries oriond links (libspdlog.so.1.10, libfmt.so.9, libinih.so.1); --prepare bundles them.
# A prefix built on Debian bookworm needs glibc >= 2.36 on the GPU machine (libcuda.so.1 uses
# arc4random through the static libstdc++); the script checks that the binaries load and says so.
#
# Other settings (environment):
#   ORION_E2E_GMEM=<MiB>     ORION_GMEM of the remoted runs (default 16384, less on a GPU under 40 GiB)
#   ORION_E2E_BUDGET_S=<s>   wall-clock budget from the start (default 420): run timeouts shrink to fit
#   ORION_E2E_ARCH=sm_XX     nvcc -arch (default: native when nvcc can query the GPU, else sm_90)
#   ORION_E2E_REGION_MIB=<MiB>, ORION_E2E_CHANNEL_MIB=<MiB>   the region (orion-shm -s, default 1024)
#                            and its per-client channel (server.conf shm_buffer_size, default 64). Note:
#                            Orion serves cudaMallocHost from the channel's window when it fits, else
#                            from ordinary memory; the 256 MiB pinned buffers here take the latter path
#                            unless the channel is made larger than them.
#   ORION_E2E_SUITE=<dir>    also run the self-checking programs of tests/cuda found in <dir> (built
#                            on the dev machine; they print "CHECK name ok|FAIL" and "DONE checks=N
#                            failed=M"), natively and remoted, after everything else, while the
#                            budget lasts. Informational: they were written against the sim, so a
#                            check may be sim-specific; the table lists every failing check by name.
#   ORION_E2E_REV=<text>     the source revision for the summary when the tree has no .git
#   ORION_E2E_KEEP=1         keep the temporary directory (region file, logs)
#   NVCC=<path>              the nvcc to use (default: PATH, $CUDA_HOME, /usr/local/cuda)
#   ORION_E2E_SELFTEST=1     exercise the script without a GPU (oriond on its sim backend; the results
#                            mean nothing: kernels do not run on sim and there is no native driver)
set -euo pipefail

PROGRAMS=(vector_add matrix_mul reduction streams_overlap cublas_sgemm many_launches memcpy_bw)
NATIVE_TIMEOUT=90
ORION_TIMEOUT=120
PY_TIMEOUT=100
REGION_MIB=${ORION_E2E_REGION_MIB:-1024}
CHANNEL_MIB=${ORION_E2E_CHANNEL_MIB:-64}

# ---------------------------------------------------------------------------------------------------
out_arg=""
mode=run
case "${1:-}" in
  --prepare) mode=prepare ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  -*) echo "gpu-e2e: unknown option $1 (see --help)" >&2; exit 2 ;;
  *) out_arg=$1 ;;
esac
if [ -n "$out_arg" ]; then
  mkdir -p "$out_arg"
  out_arg=$(cd "$out_arg" && pwd)
fi
ORIG_PWD=$PWD
cd "$(dirname "$0")/.."
ROOT=$PWD

say() { printf '%s\n' "$*"; }
hr() { say "----------------------------------------------------------------------------------------"; }
die() {
  say "gpu-e2e: ERROR: $*" >&2
  if [ "$mode" = run ] && [ -n "${OUT:-}" ] && [ -d "$OUT" ] && declare -F write_summary >/dev/null; then
    write_summary "$*" || true
  fi
  exit 1
}

# install_three BUILD_DIR PREFIX: copies oriond, orion-shm and libcuda.so.1 out of a build tree that
# built only those targets (cmake --install would also want every other installed target).
install_three() {
  local b=$1 pre=$2 f name dest
  rm -rf "$pre"
  mkdir -p "$pre/bin" "$pre/lib/orion"
  for name in oriond orion-shm libcuda.so.1; do
    case $name in libcuda.so.1) dest=$pre/lib/orion ;; *) dest=$pre/bin ;; esac
    f=$b/lib/orion/libcuda.so.1
    if [ "$name" != libcuda.so.1 ]; then
      f=$(find "$b" -path "$b/install" -prune -o -path '*/CMakeFiles' -prune -o -type f -name "$name" -perm -u+x -print |
        sed -n 1p)
    fi
    if [ -z "$f" ] || [ ! -f "$f" ]; then say "install_three: no $name under $b" >&2; return 1; fi
    cp -L "$f" "$dest/$name"
  done
}

# ---------------------------------------------------------------------------------------------------
# --prepare (dev machine): a prefix that runs on another Linux machine without Orion's build deps.
if [ "$mode" = prepare ]; then
  bdir=build-gpu
  prefix=$ROOT/$bdir/install
  gen=()
  if [ ! -f "$bdir/CMakeCache.txt" ] && command -v ninja >/dev/null; then gen=(-G Ninja); fi
  cmake -S . -B "$bdir" ${gen[@]+"${gen[@]}"} -DCMAKE_BUILD_TYPE=RelWithDebInfo -DORION_BUILD_TESTS=OFF \
    -DORION_BUILD_CUDA_TESTS=OFF >/dev/null
  cmake --build "$bdir" --target oriond orion-shm orion_cuda
  install_three "$bdir" "$prefix" || die "could not collect the binaries from $bdir"
  for f in "$prefix/bin/oriond" "$prefix/bin/orion-shm" "$prefix/lib/orion/libcuda.so.1"; do
    [ -f "$f" ] || die "$f was not installed"
    strip --strip-debug "$f" 2>/dev/null || true
  done
  mkdir -p "$prefix/lib/deps" "$prefix/lib/deps-cxx"
  for f in "$prefix/bin/oriond" "$prefix/bin/orion-shm" "$prefix/lib/orion/libcuda.so.1"; do
    while read -r soname path; do
      case "$soname" in
        linux-vdso*|ld-linux*|libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libresolv.so.*) ;;
        libstdc++.so.*|libgcc_s.so.*) cp -L "$path" "$prefix/lib/deps-cxx/$soname" ;;
        *) [ "${f##*/}" = libcuda.so.1 ] && say "warning: libcuda.so.1 needs $soname (not bundled)" >&2
           cp -L "$path" "$prefix/lib/deps/$soname" ;;
      esac
    done < <(ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
  done
  {
    echo "built-by: scripts/gpu-e2e.sh --prepare"
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "host: $(uname -srm); $(ldd --version 2>/dev/null | sed -n 1p)"
    echo "compiler: $(c++ --version 2>/dev/null | sed -n 1p)"
    echo "git: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "git-dirty: $(git status --porcelain --untracked-files=no 2>/dev/null | wc -l) modified tracked files"
    echo "glibc-needed: $(objdump -T "$prefix"/bin/* "$prefix"/lib/orion/libcuda.so.1 "$prefix"/lib/deps*/* 2>/dev/null |
      grep -oE 'GLIBC_[0-9.]+' | sort -uV | tail -1)"
    echo "bundled: $(cd "$prefix/lib" && find deps deps-cxx -type f -printf '%p ')"
  } >"$prefix/BUILD-INFO"
  cat "$prefix/BUILD-INFO"
  du -sh "$prefix"
  say "prepared $prefix"
  say "on the GPU machine: ORION_PREBUILT=$bdir/install scripts/gpu-e2e.sh   (device tool: carry [\"$bdir/install\"])"
  exit 0
fi

# ---------------------------------------------------------------------------------------------------
T0=$SECONDS
BUDGET=${ORION_E2E_BUDGET_S:-420}
SELFTEST=${ORION_E2E_SELFTEST:-0}
GMEM=${ORION_E2E_GMEM:-}
OUT=${out_arg:-$ROOT/bench/results/gpu-e2e-$(date +%Y-%m-%d-%H%M%S)}
mkdir -p "$OUT/bin"
exec > >(tee -a "$OUT/console.txt") 2>&1
TEE_PID=$!
# At exit: let tee write everything before the script's own exit status is reported.
flush_output() {
  exec >&- 2>&-
  wait "$TEE_PID" 2>/dev/null || true
}

left() { echo $((BUDGET - (SECONDS - T0))); }
# The timeout for a run that wants $1 seconds: what the budget leaves, less a margin for teardown.
limit_for() {
  local want=$1 l
  l=$(($(left) - 15))
  if [ "$l" -lt "$want" ]; then want=$l; fi
  echo "$want"
}
# with_ldpath PATH CMD...: CMD with LD_LIBRARY_PATH=PATH (unset when PATH is empty).
with_ldpath() {
  local p=$1
  shift
  if [ -n "$p" ]; then env LD_LIBRARY_PATH="$p" "$@"; else env -u LD_LIBRARY_PATH "$@"; fi
}
# $LD_LIBRARY_PATH without entries that hold Orion's libcuda.so.1 (or a CUDA stub libcuda).
clean_ldpath() {
  local out="" d
  local IFS=:
  for d in ${LD_LIBRARY_PATH:-}; do
    [ -n "$d" ] || continue
    case "$d" in */lib/orion|*/lib/orion/|*/stubs|*/stubs/) continue ;; esac
    out=${out:+$out:}$d
  done
  echo "$out"
}

# State the summary reads (set for real further down).
GPU_NAME=unknown DRIVER=unknown DRIVER_CUDA=unknown NVCC_VER="" ARCH="" ARCH_NOTE="" REV=unknown
GPU_MIB="" PREFIX="" BUILD_NOTE="" WORK="" WORK_BASE="" REGION="" ORIOND_PID="" ORIOND_STARTS=0 BACKEND=cuda
[ "$SELFTEST" = 1 ] && BACKEND=sim
NVCC=${NVCC:-}
BIN=$OUT/bin

# --- running and reading the programs -------------------------------------------------------------------
declare -A RES RC WALL
ALL_PASS=1

# run_one KEY MODE TIMEOUT CMD...: runs CMD natively or remoted, output to $OUT/KEY.MODE.txt.
run_one() {
  local key=$1 mode=$2 want=$3 lim rc=0 t cpid deadline dead_at="" why=""
  shift 3
  local file=$OUT/$key.$mode.txt
  lim=$(limit_for "$want")
  if [ "$lim" -lt 5 ]; then
    echo "skipped: the time budget (ORION_E2E_BUDGET_S=$BUDGET) is spent" >"$file"
    RC[$key.$mode]=skip WALL[$key.$mode]=0
    return
  fi
  t=$(date +%s.%N)
  if [ "$mode" = native ]; then
    env -u ORION_SHM -u ORION_VGPU -u ORION_GMEM "$@" >"$file" 2>&1 &
  else
    env LD_LIBRARY_PATH="$PREFIX/lib/orion${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ORION_SHM="$REGION" \
      ORION_VGPU=1 ORION_GMEM="$GMEM" "$@" >"$file" 2>&1 &
  fi
  cpid=$!
  # Our own timeout, and for remoted runs a watch on oriond: a client whose server died may wait
  # for it a long time, so it gets 5 s and is then stopped.
  deadline=$((SECONDS + lim))
  while kill -0 "$cpid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      why=TIMEOUT
    elif [ "$mode" = orion ] && [ -z "$dead_at" ] && ! kill -0 "$ORIOND_PID" 2>/dev/null; then
      dead_at=$SECONDS
    elif [ -n "$dead_at" ] && [ $((SECONDS - dead_at)) -ge 5 ]; then
      why=ORIOND-DIED
    fi
    if [ -n "$why" ]; then
      kill -TERM "$cpid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$cpid" 2>/dev/null || true
      break
    fi
    sleep 0.1
  done
  wait "$cpid" || rc=$?
  [ "$why" != TIMEOUT ] || rc=124
  [ -z "$why" ] || echo "$why: stopped by scripts/gpu-e2e.sh after $(($(date +%s) - ${t%.*})) s" >>"$file"
  RC[$key.$mode]=$rc
  WALL[$key.$mode]=$(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  if [ "$mode" = orion ] && ! kill -0 "$ORIOND_PID" 2>/dev/null; then
    say "!! oriond died during $key (remoted); its logs are kept; starting a new one"
    grep -q '^ORIOND-DIED' "$file" || echo "ORIOND-DIED during this run" >>"$file"
    wait "$ORIOND_PID" 2>/dev/null || true
    ORIOND_PID=""
    start_oriond
  fi
}

# classify KEY MODE: ok | FAIL | SKIP | TIMEOUT | ORIOND-DIED | CRASH(rc) | NOT-REMOTED | NOT-NATIVE | BUDGET
classify() {
  local key=$1 mode=$2 file=$OUT/$1.$2.txt rc=${RC[$1.$2]:-none} res lib
  if [ "$rc" = none ]; then echo "NOT-RUN"; return; fi
  if [ "$rc" = skip ]; then echo "BUDGET"; return; fi
  res=$(grep -m1 -E "^RESULT $key " "$file" 2>/dev/null | awk '{print $3}' || true)
  lib=$(grep -m1 '^LIBCUDA ' "$file" 2>/dev/null | cut -d' ' -f2- || true)
  if grep -q '^ORIOND-DIED' "$file" 2>/dev/null; then echo "ORIOND-DIED"; return; fi
  if [ "$rc" = 124 ]; then echo "TIMEOUT"; return; fi
  if [ "$mode" = orion ] && [ -n "$lib" ] && [ "$lib" != none ] && [[ "$lib" != "$PREFIX/lib/orion/"* ]]; then
    echo "NOT-REMOTED"; return
  fi
  if [ "$mode" = native ] && [[ "$lib" == "$PREFIX/"* ]]; then echo "NOT-NATIVE"; return; fi
  case "$res" in
    ok) if [ "$rc" = 0 ]; then echo ok; else echo "CRASH($rc)"; fi ;;
    FAIL) echo FAIL ;;
    SKIP) echo SKIP ;;
    *) echo "CRASH($rc)" ;;
  esac
}

# times FILE: "name ms" per TIME line.
times_of() { awk '$1 == "TIME" {print $2, $3}' "$1" 2>/dev/null || true; }
time_of() { awk -v n="$2" '$1 == "TIME" && $2 == n {v = $3} END {print v}' "$1" 2>/dev/null || true; }
bw_of() { awk -v n="$2" '$1 == "BW" && $2 == n {v = $3} END {print v}' "$1" 2>/dev/null || true; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a + 0 > 0 && b != "") printf "%.2f", b / a; else print "-"}'; }

TABLE=$OUT/.table.txt
BWTABLE=$OUT/.bw.txt
PYTABLE=$OUT/.py.txt
FAILS=$OUT/.fails.txt
: >"$TABLE"; : >"$BWTABLE"; : >"$PYTABLE"; : >"$FAILS"
trap 'rm -f "$TABLE" "$BWTABLE" "$PYTABLE" "$FAILS"; flush_output' EXIT  # replaced by cleanup() later

row() { printf '%-26s %-12s %-12s %11s %11s %7s\n' "$@"; }
write_tables() {
  local p n o names name nf of tn to first
  {
    row "program / timed section" "native" "orion" "native ms" "orion ms" "ratio"
    row "------------------------" "------" "-----" "---------" "--------" "-----"
    for p in "${PROGRAMS[@]}" torch cupy; do
      [ -n "${RES[$p.native]:-}${RES[$p.orion]:-}" ] || continue
      n=${RES[$p.native]:-NOT-RUN} o=${RES[$p.orion]:-NOT-RUN}
      nf=$OUT/$p.native.txt of=$OUT/$p.orion.txt
      names=$( { times_of "$nf"; times_of "$of"; } | awk '!seen[$1]++ {print $1}')
      [ -n "$names" ] || names=$p
      first=1
      for name in $names; do
        tn=$(time_of "$nf" "$name") to=$(time_of "$of" "$name")
        if [ "$first" = 1 ]; then
          local label=$name
          case $p in torch|cupy) label="$name (info only)" ;; esac
          row "$label" "$n" "$o" "${tn:--}" "${to:--}" "$(ratio "$tn" "$to")"
          first=0
        else
          row "  $name" "" "" "${tn:--}" "${to:--}" "$(ratio "$tn" "$to")"
        fi
      done
    done
    echo "(ratio = orion ms / native ms; TIME sections are measured after one warm-up, final sync included)"
  } >"$TABLE"
  {
    if [ -f "$OUT/memcpy_bw.native.txt" ] || [ -f "$OUT/memcpy_bw.orion.txt" ]; then
      printf '%-26s %12s %12s %7s\n' "bandwidth (GB/s)" "native" "orion" "orion/native"
      while read -r name; do
        tn=$(bw_of "$OUT/memcpy_bw.native.txt" "$name") to=$(bw_of "$OUT/memcpy_bw.orion.txt" "$name")
        printf '%-26s %12s %12s %7s\n' "$name" "${tn:--}" "${to:--}" "$(ratio "$tn" "$to")"
      done < <(awk '$1 == "BW" && !seen[$2]++ {print $2}' "$OUT/memcpy_bw.native.txt" "$OUT/memcpy_bw.orion.txt" 2>/dev/null)
    fi
  } >"$BWTABLE"
  {
    for p in "${PROGRAMS[@]}" torch cupy; do
      for m in native orion; do
        local r=${RES[$p.$m]:-}
        if [ -z "$r" ] || [ "$r" = ok ]; then continue; fi
        case "$p:$r" in torch:SKIP|cupy:SKIP|torch:NOT-RUN|cupy:NOT-RUN) continue ;; esac
        echo "$p ($m): $r   [wall ${WALL[$p.$m]:-?} s, exit ${RC[$p.$m]:-?}; $OUT/$p.$m.txt]"
        if [ -f "$OUT/$p.$m.txt" ]; then
          { grep -E '^(RESULT|LIBCUDA|ORIOND-DIED)' "$OUT/$p.$m.txt" || true; grep -vE '^(RESULT|LIBCUDA|DEVICE|TIME|BW|INFO)' "$OUT/$p.$m.txt" | tail -6 || true; } |
            sed -n 1,12p | sed 's/^/    /'
        elif [ "$r" = BUILD-FAIL ]; then
          tail -5 "$BIN/$p.build.log" | sed 's/^/    /'
        fi
      done
    done
  } >"$FAILS"
}

write_summary() {
  local why=${1:-}
  write_tables
  {
    echo "Orion GPU end-to-end check — $(date '+%Y-%m-%d %H:%M:%S %Z')"
    echo
    echo "GPU:            $GPU_NAME"
    echo "driver:         $DRIVER (CUDA $DRIVER_CUDA)"
    echo "nvcc:           $NVCC (CUDA $NVCC_VER), -arch=${ARCH:-?}${ARCH_NOTE:-}"
    echo "host:           $(uname -srm); $(ldd --version 2>/dev/null | sed -n 1p)"
    echo "source:         $REV"
    echo "orion prefix:   ${PREFIX:-none} (${BUILD_NOTE:-})"
    echo "oriond:         backend $BACKEND, region $REGION_MIB MiB in ${WORK_BASE}, vgpu_count 2, channel $CHANNEL_MIB MiB;"
    echo "                started $ORIOND_STARTS time(s)"
    echo "remoted runs:   LD_LIBRARY_PATH=<prefix>/lib/orion ORION_SHM=<region> ORION_VGPU=1 ORION_GMEM=$GMEM"
    if [ -n "${WORK:-}" ] && [ -f "$WORK/logs1/server.log" ]; then
      grep -E "Physical GPU|Final virtual gpu list" "$WORK/logs1/server.log" | sed 's/^\[[^]]*\] \[[a-z]*\] /oriond:         /'
    fi
    echo "elapsed:        $((SECONDS - T0)) s"
    [ "$SELFTEST" = 1 ] && echo "SELFTEST: sim backend, no GPU: the results below mean nothing"
    echo
    cat "$TABLE"
    echo
    [ -s "$BWTABLE" ] && { cat "$BWTABLE"; echo; }
    [ -s "$PYTABLE" ] && { cat "$PYTABLE"; echo; }
    if [ -s "${SUITETABLE:-/nonexistent}" ]; then
      echo "tests/cuda programs (ORION_E2E_SUITE; informational, written against the sim):"
      cat "$SUITETABLE"
      echo
    fi
    if [ -s "${GREENTABLE:-/nonexistent}" ]; then
      echo "green contexts (bench/gpu/green_split.cu; informational, native):"
      cat "$GREENTABLE"
      echo
    fi
    if [ -s "$FAILS" ]; then
      echo "Problems:"
      cat "$FAILS"
      echo
    fi
    if [ -n "$why" ]; then
      echo "VERDICT: FAIL — $why"
    elif [ "$ALL_PASS" = 1 ]; then
      echo "VERDICT: PASS — all ${#PROGRAMS[@]} programs correct natively and through Orion"
    else
      echo "VERDICT: FAIL — see Problems"
    fi
  } >"$OUT/summary.txt"
}

for tool in timeout awk sed grep; do
  command -v "$tool" >/dev/null || die "'$tool' is not installed"
done

hr
say "Orion GPU end-to-end check — $(date '+%Y-%m-%d %H:%M:%S')   output: $OUT"
hr

# --- the GPU ------------------------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null; then
  if ! smi_l=$(nvidia-smi -L 2>&1); then
    [ "$SELFTEST" = 1 ] || die "nvidia-smi fails: $smi_l"
  fi
  say "nvidia-smi -L:"
  printf '%s\n' "$smi_l" | sed 's/^/  /'
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sed -n 1p || true)
  DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | sed -n 1p || true)
  DRIVER_CUDA=$(nvidia-smi 2>/dev/null | grep -oE 'CUDA Version: *[0-9.]+' | grep -oE '[0-9.]+$' | sed -n 1p || true)
  : "${GPU_NAME:=unknown}" "${DRIVER:=unknown}" "${DRIVER_CUDA:=unknown}"
  say "driver version: $DRIVER (supports CUDA $DRIVER_CUDA)"
  GPU_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | sed -n 1p | tr -dc 0-9 || true)
  cmode=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | sed -n 1p || true)
  case "$cmode" in
    *Exclusive*|*Prohibited*) say "warning: compute mode $cmode: oriond holds a context during the remoted runs; the native runs come first, before oriond starts" ;;
  esac
elif [ "$SELFTEST" = 1 ]; then
  say "selftest: no nvidia-smi, going on without a GPU"
else
  ls /dev/nvidia* >/dev/null 2>&1 || die "no GPU: neither nvidia-smi nor /dev/nvidia* is here"
  say "warning: nvidia-smi is missing but /dev/nvidia* exists; going on"
fi
# ORION_GMEM: 16 GiB, or less where a vGPU (half the GPU: vgpu_count = 2) is smaller than that.
if [ -z "$GMEM" ]; then
  GMEM=16384
  if [ -n "${GPU_MIB:-}" ] && [ "$((GPU_MIB * 2 / 5))" -lt "$GMEM" ]; then GMEM=$((GPU_MIB * 2 / 5)); fi
fi
REAL_LIBCUDA=$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true) | awk '/libcuda\.so\.1 / {print $NF; exit}')
say "real libcuda.so.1 (ldconfig): ${REAL_LIBCUDA:-not in the ld.so cache}; LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-<unset>}"
say "glibc: $(ldd --version 2>/dev/null | sed -n 1p || echo unknown)"

# --- nvcc ------------------------------------------------------------------------------------------
if [ -z "$NVCC" ]; then
  for c in "$(command -v nvcc || true)" "${CUDA_HOME:-}/bin/nvcc" "${CUDA_PATH:-}/bin/nvcc" /usr/local/cuda/bin/nvcc; do
    if [ -n "$c" ] && [ -x "$c" ] && [ "$c" != /bin/nvcc ]; then NVCC=$c; break; fi
  done
fi
if [ -z "$NVCC" ] || [ ! -x "$NVCC" ]; then die "nvcc not found (set NVCC=/path/to/nvcc)"; fi
CUDA_ROOT=$(cd "$(dirname "$(readlink -f "$NVCC")")/.." && pwd)
NVCC_VER=$("$NVCC" --version | grep -oE 'release [0-9.]+' | awk '{print $2}')
say "nvcc: $NVCC (CUDA $NVCC_VER, toolkit $CUDA_ROOT)"
if [ "$DRIVER_CUDA" != unknown ] && [ -n "$NVCC_VER" ] &&
   [ "$(printf '%s\n%s\n' "$DRIVER_CUDA" "$NVCC_VER" | sort -V | sed -n 1p)" != "$NVCC_VER" ]; then
  say "warning: the driver supports CUDA $DRIVER_CUDA, older than nvcc's $NVCC_VER: the native runs of"
  say "         the nvcc-built programs may fail with cudaErrorInsufficientDriver (35)"
fi

# --- source revision ----------------------------------------------------------------------------------
if [ -n "${ORION_E2E_REV:-}" ]; then
  REV=$ORION_E2E_REV
elif REV=$(git rev-parse --short HEAD 2>/dev/null); then
  d=$(git status --porcelain --untracked-files=no 2>/dev/null | wc -l)
  [ "$d" -eq 0 ] || REV="$REV (+$d modified files)"
else
  REV="unknown (no .git; set ORION_E2E_REV)"
fi
say "source revision: $REV"
hr

# --- Orion: build here, or a prebuilt prefix ------------------------------------------------------------
CXX_BIN=${CXX:-c++}

# Prints the missing build dependencies, one per line.
missing_deps() {
  local h
  command -v cmake >/dev/null || echo "cmake"
  command -v "$CXX_BIN" >/dev/null || { echo "a C++ compiler ($CXX_BIN)"; return; }
  command -v pkg-config >/dev/null || echo "pkg-config (find_package(PkgConfig REQUIRED))"
  command -v ninja >/dev/null || command -v make >/dev/null || echo "make or ninja"
  for h in spdlog/spdlog.h fmt/format.h CLI/CLI.hpp ini.h lz4.h zstd.h; do
    printf '#include <%s>\n' "$h" | "$CXX_BIN" -std=c++20 -fsyntax-only -x c++ - >/dev/null 2>&1 ||
      echo "header <$h> ($(case $h in spdlog*) echo spdlog;; fmt*) echo fmt;; CLI*) echo CLI11;; ini.h) echo inih;;
        lz4.h) echo lz4;; zstd.h) echo zstd;; esac))"
  done
  if grep -rqis xxhash CMakeLists.txt ./*/CMakeLists.txt cmake/ host/*.cmake 2>/dev/null; then
    printf '#include <xxhash.h>\n' | "$CXX_BIN" -x c++ -fsyntax-only - >/dev/null 2>&1 || echo "header <xxhash.h> (xxhash)"
  fi
  if command -v pkg-config >/dev/null; then
    for m in liblz4 libzstd inih; do pkg-config --exists "$m" || echo "pkg-config module $m"; done
  fi
  if command -v cmake >/dev/null; then
    local v
    v=$(cmake --version | sed -n 1p | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | sed -n 1p)
    [ "$(printf '3.20\n%s\n' "$v" | sort -V | sed -n 1p)" = 3.20 ] || echo "cmake >= 3.20 (have $v)"
  fi
}

build_orion() {
  local bdir=$ROOT/build-gpu-local gen=() gtest=() missing  # gtest: every stand-in's cmake arguments
  missing=$(missing_deps)
  if [ -n "$missing" ]; then
    say "cannot build Orion here; missing:"
    printf '%s\n' "$missing" | sed 's/^/  - /'
    return 1
  fi
  if ! printf '#include <gtest/gtest.h>\n' | "$CXX_BIN" -x c++ -fsyntax-only - >/dev/null 2>&1; then
    # CMakeLists.txt asks for GTest even with the tests off; a stub package answers (nothing links it).
    mkdir -p "$bdir/gtest-stub"
    cat >"$bdir/gtest-stub/GTestConfig.cmake" <<'CMAKE'
foreach(_t gtest gtest_main gmock gmock_main)
  if(NOT TARGET GTest::${_t})
    add_library(GTest::${_t} INTERFACE IMPORTED)
  endif()
endforeach()
set(GTest_FOUND TRUE)
set(GTest_VERSION 0.0.0)
CMAKE
    gtest=(-DGTest_DIR="$bdir/gtest-stub")
    say "GoogleTest is missing: using a stub package (the tests are not built)"
  fi
  if grep -qs 'find_package(LibXml2' "$ROOT/CMakeLists.txt" "$ROOT"/*/CMakeLists.txt &&
     ! pkg-config --exists libxml-2.0 2>/dev/null && [ ! -f /usr/include/libxml2/libxml/parser.h ]; then
    # Only orion-vm (not built here) links libxml2: an empty stand-in satisfies find_package(LibXml2).
    mkdir -p "$bdir/libxml2-stub/include/libxml"
    : >"$bdir/libxml2-stub/include/libxml/xmlversion.h"
    rm -f "$bdir/libxml2-stub/libxml2.a"
    ar rc "$bdir/libxml2-stub/libxml2.a"
    gtest+=(-DLIBXML2_INCLUDE_DIR="$bdir/libxml2-stub/include" -DLIBXML2_LIBRARY="$bdir/libxml2-stub/libxml2.a")
    say "libxml2 is missing: using a stand-in (only orion-vm needs it, and it is not built)"
  fi
  if [ ! -f "$bdir/CMakeCache.txt" ] && command -v ninja >/dev/null; then gen=(-G Ninja); fi
  say "building Orion in $bdir (log: $OUT/orion-build.log) ..."
  local t=$SECONDS
  if ! { cmake -S "$ROOT" -B "$bdir" ${gen[@]+"${gen[@]}"} -DCMAKE_BUILD_TYPE=RelWithDebInfo -DORION_BUILD_TESTS=OFF \
           -DORION_BUILD_CUDA_TESTS=OFF -DORION_CUDA_ROOT="$CUDA_ROOT" ${gtest[@]+"${gtest[@]}"} &&
         timeout 240 cmake --build "$bdir" --target oriond orion-shm orion_cuda -j "$(nproc 2>/dev/null || echo 8)" &&
         install_three "$bdir" "$bdir/install"; } >"$OUT/orion-build.log" 2>&1; then
    say "the Orion build failed; the end of $OUT/orion-build.log:"
    tail -25 "$OUT/orion-build.log" | sed 's/^/  | /'
    return 1
  fi
  say "built Orion in $((SECONDS - t)) s"
  PREFIX=$bdir/install
}

if [ -n "${ORION_PREBUILT:-}" ]; then
  case "$ORION_PREBUILT" in
    /*) PREFIX=$ORION_PREBUILT ;;
    *) PREFIX=$ORIG_PWD/$ORION_PREBUILT; [ -d "$PREFIX" ] || PREFIX=$ROOT/$ORION_PREBUILT ;;
  esac
  [ -d "$PREFIX" ] || die "ORION_PREBUILT=$ORION_PREBUILT is not a directory"
  PREFIX=$(cd "$PREFIX" && pwd)
  BUILD_NOTE="prebuilt prefix (ORION_PREBUILT)"
  say "using the prebuilt prefix $PREFIX (ORION_PREBUILT)"
elif build_orion; then
  BUILD_NOTE="built here with $(cmake --version | sed -n 1p)"
elif [ -x "$ROOT/build-gpu/install/bin/oriond" ]; then
  PREFIX=$ROOT/build-gpu/install
  BUILD_NOTE="prebuilt prefix build-gpu/install (the local build was not possible)"
  say "falling back to the prebuilt prefix $PREFIX"
else
  say ""
  say "No Orion to test. Either install the missing build dependencies, or build a prefix on a"
  say "machine that has them and bring it here:"
  say "  dev machine:  scripts/gpu-e2e.sh --prepare          (-> build-gpu/install, git-ignored)"
  say "  here:         ORION_PREBUILT=build-gpu/install scripts/gpu-e2e.sh"
  say "(with the device tool, pass carry: [\"build-gpu/install\"] so the ignored prefix travels along)"
  write_summary "no Orion build: the build dependencies are missing and there is no prebuilt prefix"
  exit 1
fi
PREFIX=$(cd "$PREFIX" && pwd -P)
if [ -f "$PREFIX/BUILD-INFO" ]; then
  say "prefix BUILD-INFO:"
  sed 's/^/  /' "$PREFIX/BUILD-INFO"
  built_rev=$(awk '/^git:/ {print substr($2, 1, 7)}' "$PREFIX/BUILD-INFO")
  here_rev=$(git rev-parse --short=7 HEAD 2>/dev/null || true)
  if [ -n "$here_rev" ] && [ -n "$built_rev" ] && [ "$built_rev" != "$here_rev" ]; then
    say "warning: the prefix was built from $built_rev, the tree here is at $here_rev"
  fi
fi
for f in bin/oriond bin/orion-shm lib/orion/libcuda.so.1; do
  [ -f "$PREFIX/$f" ] || die "$PREFIX/$f is missing"
done

# oriond and orion-shm run with the prefix's bundled libraries (if any) and without Orion's libcuda.
DAEMON_LDPATH=$(clean_ldpath)
[ -d "$PREFIX/lib/deps" ] && DAEMON_LDPATH=$PREFIX/lib/deps${DAEMON_LDPATH:+:$DAEMON_LDPATH}
if ! err=$(with_ldpath "$DAEMON_LDPATH" "$PREFIX/bin/oriond" --help 2>&1 >/dev/null); then
  if [ -d "$PREFIX/lib/deps-cxx" ] &&
     with_ldpath "$DAEMON_LDPATH:$PREFIX/lib/deps-cxx" "$PREFIX/bin/oriond" --help >/dev/null 2>&1; then
    DAEMON_LDPATH=$DAEMON_LDPATH:$PREFIX/lib/deps-cxx
    say "oriond uses the bundled libstdc++ (lib/deps-cxx)"
  else
    say "oriond does not start here: $err"
    with_ldpath "$DAEMON_LDPATH" ldd "$PREFIX/bin/oriond" 2>&1 | grep -E 'not found|version' | sed 's/^/  /' || true
    die "the Orion binaries do not load on this machine (missing shared libraries or too old a glibc:
       a prefix built on Debian bookworm needs glibc >= 2.36; build one with --prepare, or build here)"
  fi
fi
with_ldpath "$DAEMON_LDPATH" "$PREFIX/bin/orion-shm" --help >/dev/null 2>&1 ||
  die "orion-shm does not start here: $(with_ldpath "$DAEMON_LDPATH" "$PREFIX/bin/orion-shm" --help 2>&1 | sed -n 1,3p)"
if command -v python3 >/dev/null; then
  if ! err=$(python3 -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "$PREFIX/lib/orion/libcuda.so.1" 2>&1); then
    die "Orion's libcuda.so.1 does not load here: $(printf '%s' "$err" | tail -1)"
  fi
elif command -v ldd >/dev/null && ldd "$PREFIX/lib/orion/libcuda.so.1" 2>&1 | grep -qE 'not found'; then
  die "Orion's libcuda.so.1 does not load here: $(ldd "$PREFIX/lib/orion/libcuda.so.1" 2>&1 | grep 'not found')"
fi
say "Orion prefix: $PREFIX ($BUILD_NOTE)"
hr

# --- the test programs ----------------------------------------------------------------------------------
ARCH=${ORION_E2E_ARCH:-}
if [ -z "$ARCH" ]; then
  # -arch=native, unless nvcc cannot see the GPU (then it warns and silently picks its default arch).
  printf '__global__ void k() {}\nint main() { k<<<1, 1>>>(); return 0; }\n' >"$BIN/.probe.cu"
  if probe=$("$NVCC" -arch=native -o "$BIN/.probe" "$BIN/.probe.cu" 2>&1) &&
     ! printf '%s' "$probe" | grep -qiE 'cannot find valid gpu|default arch'; then
    ARCH=native
    resolved=$("$NVCC" -arch=native --dryrun -o "$BIN/.probe" "$BIN/.probe.cu" 2>&1 | grep -oE 'sm_[0-9]+[af]?' | sed -n 1p || true)
    [ -z "$resolved" ] || ARCH_NOTE=" (= $resolved)"
  else
    ARCH=sm_90
  fi
  rm -f "$BIN/.probe" "$BIN/.probe.cu"
fi
CUBLAS_LIBDIR=""
for d in "$CUDA_ROOT/lib64" "$CUDA_ROOT/targets/x86_64-linux/lib" "$CUDA_ROOT/lib"; do
  if compgen -G "$d/libcublas.so*" >/dev/null; then CUBLAS_LIBDIR=$d; break; fi
done
say "compiling tests/gpu with nvcc -O2 -arch=$ARCH${ARCH_NOTE:-} (cuBLAS: ${CUBLAS_LIBDIR:-not found under $CUDA_ROOT}) ..."
declare -A BUILD_PID BUILD_OK
t=$SECONDS
for p in "${PROGRAMS[@]}"; do
  extra=()
  if [ "$p" = cublas_sgemm ]; then
    extra=(-lcublas)
    [ -n "$CUBLAS_LIBDIR" ] && extra=(-L"$CUBLAS_LIBDIR" -Xlinker "-rpath=$CUBLAS_LIBDIR" -lcublas)
  fi
  "$NVCC" -O2 -std=c++17 -arch="$ARCH" -I"$ROOT/tests/gpu" -o "$BIN/$p" "$ROOT/tests/gpu/$p.cu" ${extra[@]+"${extra[@]}"} \
    >"$BIN/$p.build.log" 2>&1 &
  BUILD_PID[$p]=$!
done
for p in "${PROGRAMS[@]}"; do
  if wait "${BUILD_PID[$p]}"; then
    BUILD_OK[$p]=1
  else
    BUILD_OK[$p]=0
    say "nvcc failed for $p:"
    tail -8 "$BIN/$p.build.log" | sed 's/^/  | /'
  fi
done
say "compiled in $((SECONDS - t)) s"
hr

# --- oriond ---------------------------------------------------------------------------------------------
WORK_BASE=${TMPDIR:-/tmp}
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
  free_kib=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
  if [ -n "$free_kib" ] && [ "$free_kib" -gt $(((REGION_MIB + 512) * 1024)) ]; then WORK_BASE=/dev/shm; fi
fi
WORK=$(mktemp -d "$WORK_BASE/orion-gpu-e2e.XXXXXX")
REGION=$WORK/orionsock0

stop_oriond() {
  if [ -n "$ORIOND_PID" ] && kill -0 "$ORIOND_PID" 2>/dev/null; then
    kill -TERM "$ORIOND_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$ORIOND_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$ORIOND_PID" 2>/dev/null || true
  fi
  if [ -n "$ORIOND_PID" ]; then wait "$ORIOND_PID" 2>/dev/null || true; fi
  ORIOND_PID=""
}
save_logs() {
  mkdir -p "$OUT/oriond-logs"
  cp -r "$WORK"/logs* "$WORK"/server.conf "$OUT/oriond-logs/" 2>/dev/null || true
}
cleanup() {
  stop_oriond
  save_logs
  rm -f "$TABLE" "$BWTABLE" "$PYTABLE" "$FAILS"
  if [ "${ORION_E2E_KEEP:-0}" = 1 ]; then
    say "kept $WORK"
  else
    rm -rf "$WORK"
  fi
  flush_output
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cat >"$WORK/server.conf" <<EOF
[server]
    vgpu_count = 2
[server-shm]
    shm_buffer_size = $CHANNEL_MIB
EOF

# start_oriond: a fresh oriond on $REGION (logs in $WORK/logs<N>); fatal when it does not come up on
# the cuda backend.
start_oriond() {
  ORIOND_STARTS=$((ORIOND_STARTS + 1))
  local logs=$WORK/logs$ORIOND_STARTS
  mkdir -p "$logs"
  local extra=()
  # Newer oriond opens an admin socket (default /run/orion/oriond.sock, root only): keep it private.
  if with_ldpath "$DAEMON_LDPATH" "$PREFIX/bin/oriond" --help 2>/dev/null | grep -q -- --control-socket; then
    extra=(--control-socket "$WORK/oriond.sock")
  fi
  # env, not with_ldpath: a shell function run with & is a subshell, and $! would be its PID, not
  # oriond's (stop_oriond then killed the subshell and left oriond running).
  local ldenv=(-u LD_LIBRARY_PATH)
  [ -z "$DAEMON_LDPATH" ] || ldenv=("LD_LIBRARY_PATH=$DAEMON_LDPATH")
  env "${ldenv[@]}" "$PREFIX/bin/oriond" --config "$WORK/server.conf" --backend "$BACKEND" --foreground \
    --log-dir "$logs" --shm "$REGION" --cache-dir "$WORK/cache" --lease-timeout-ms 1000 ${extra[@]+"${extra[@]}"} \
    >"$logs/oriond.stderr" 2>&1 &
  ORIOND_PID=$!
  local i
  for i in $(seq 600); do
    grep -q "Orion Server listens" "$logs/server.log" 2>/dev/null && break
    kill -0 "$ORIOND_PID" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q "Orion Server listens" "$logs/server.log" 2>/dev/null; then
    say "oriond did not start (after $((i / 10)) s). server.log:"
    sed 's/^/  | /' "$logs/server.log" 2>/dev/null || true
    say "oriond stderr:"
    sed 's/^/  | /' "$logs/oriond.stderr"
    write_summary "oriond did not start"
    exit 1
  fi
  if [ "$SELFTEST" != 1 ] && grep -qE "SIM backend|\(backend sim\)" "$logs/server.log"; then
    say "oriond runs on its SIM backend, not on the GPU. server.log:"
    sed 's/^/  | /' "$logs/server.log"
    write_summary "oriond fell back to the sim backend"
    exit 1
  fi
  grep -E "Physical GPU|Final virtual gpu list|Using SHM|listens" "$logs/server.log" | sed 's/^/oriond: /'
}

# --- go -------------------------------------------------------------------------------------------------
# Phase 1, natively, before oriond exists (so that it neither perturbs the timings nor, on a GPU in
# EXCLUSIVE_PROCESS compute mode, holds the only context). Phase 2, remoted. Phase 3, Python remoted.
show() {  # show KEY MODE [note]
  say "$(printf '%-16s %-6s %-12s (%5s s)  %s' "$1" "$2" "${RES[$1.$2]}" "${WALL[$1.$2]:-0}" "${3:-}")"
}
for p in "${PROGRAMS[@]}"; do
  if [ "${BUILD_OK[$p]}" != 1 ]; then
    RES[$p.native]=BUILD-FAIL RES[$p.orion]=BUILD-FAIL
    show "$p" native
    continue
  fi
  run_one "$p" native "$NATIVE_TIMEOUT" "$BIN/$p"
  RES[$p.native]=$(classify "$p" native)
  show "$p" native
done
# Green contexts (issue #21 item 3; informational, native, before oriond): whether this GPU and driver
# confine a kernel to a green context's SMs (bench/gpu/green_split.cu says what it measures), the
# ground a `cap` session's spatial partition would stand on.
GREENTABLE=$OUT/green.txt
if [ "$SELFTEST" != 1 ] && [ "$(left)" -gt 120 ]; then
  if "$NVCC" -O2 -arch="$ARCH" -o "$BIN/green_split" "$ROOT/bench/gpu/green_split.cu" -lcuda >"$BIN/green_split.build.txt" 2>&1; then
    timeout "$(limit_for 60)" env -u ORION_SHM "$BIN/green_split" >"$GREENTABLE" 2>&1 || echo "exit status $?" >>"$GREENTABLE"
  else
    { echo "green_split did not build:"; tail -5 "$BIN/green_split.build.txt"; } >"$GREENTABLE"
  fi
  say "green contexts: $(tail -1 "$GREENTABLE")"
fi
PY_CHECKS=()
if ! command -v python3 >/dev/null; then
  echo "Python checks: no python3 here" >"$PYTABLE"
else
  {
    echo "Python checks (informational; they do not change the exit status). The remoted runs put"
    echo "<prefix>/lib/orion first in LD_LIBRARY_PATH: PyTorch/CuPy find libcuda.so.1 through their own"
    echo "libcudart's dlopen, which honours it. LIBCUDA shows which library each run actually loaded;"
    echo "a real driver path in an orion run means the framework bypassed Orion (NOT-REMOTED)."
  } >"$PYTABLE"
  for py in torch cupy; do
    if [ "$(left)" -lt 240 ]; then
      echo "$py: skipped (time budget)" >>"$PYTABLE"
      continue
    fi
    run_one "$py" native "$PY_TIMEOUT" python3 "$ROOT/tests/gpu/${py}_check.py"
    RES[$py.native]=$(classify "$py" native)
    if [ "${RES[$py.native]}" = SKIP ]; then
      echo "$py: not importable here ($(grep -m1 '^RESULT' "$OUT/$py.native.txt" | cut -d' ' -f4-))" >>"$PYTABLE"
      unset "RES[$py.native]"
      continue
    fi
    show "$py" native "(informational)"
    PY_CHECKS+=("$py")
  done
fi
hr

with_ldpath "$DAEMON_LDPATH" "$PREFIX/bin/orion-shm" -i 0 -s "$REGION_MIB" -d "$WORK" >/dev/null ||
  die "orion-shm could not create a $REGION_MIB MiB region in $WORK"
start_oriond
hr
for p in "${PROGRAMS[@]}"; do
  if [ "${BUILD_OK[$p]}" = 1 ]; then
    run_one "$p" orion "$ORION_TIMEOUT" "$BIN/$p"
    RES[$p.orion]=$(classify "$p" orion)
    show "$p" orion
  fi
  [ "${RES[$p.native]}" = ok ] && [ "${RES[$p.orion]}" = ok ] || ALL_PASS=0
done
for py in ${PY_CHECKS[@]+"${PY_CHECKS[@]}"}; do
  if [ "$(left)" -lt 40 ]; then
    echo "$py orion: skipped (time budget)" >>"$PYTABLE"
    continue
  fi
  run_one "$py" orion "$PY_TIMEOUT" python3 "$ROOT/tests/gpu/${py}_check.py"
  RES[$py.orion]=$(classify "$py" orion)
  show "$py" orion "(informational)"
done
for py in ${PY_CHECKS[@]+"${PY_CHECKS[@]}"}; do
  for m in native orion; do
    [ -n "${RES[$py.$m]:-}" ] || continue
    echo "$py $m: ${RES[$py.$m]} — $(grep -m1 '^RESULT' "$OUT/$py.$m.txt" 2>/dev/null | cut -d' ' -f3- || true);" \
      "libcuda: $(grep '^LIBCUDA' "$OUT/$py.$m.txt" 2>/dev/null | tail -1 | cut -d' ' -f2- || true)" >>"$PYTABLE"
  done
done
hr

# Phase 4 (ORION_E2E_SUITE): tests/cuda's self-checking programs, natively then remoted, each in turn.
SUITETABLE=$OUT/suite.txt
suite_res() {  # suite_res KEY MODE: "ok N" | "FAIL n/N: names" | TIMEOUT | CRASH(rc) ...
  local f=$OUT/$1.$2.txt rc=${RC[$1.$2]:-none} done_line failed
  [ "$rc" != none ] || { echo NOT-RUN; return; }
  [ "$rc" != skip ] || { echo BUDGET; return; }
  grep -q '^ORIOND-DIED' "$f" 2>/dev/null && { echo ORIOND-DIED; return; }
  [ "$rc" != 124 ] || { echo TIMEOUT; return; }
  done_line=$(grep -m1 -E '^DONE checks=[0-9]+ failed=[0-9]+$' "$f" 2>/dev/null || true)
  failed=$(awk '$1 == "CHECK" && $3 ~ /^FAIL/ {printf "%s%s", sep, $2; sep=","}' "$f" 2>/dev/null || true)
  if [ -z "$done_line" ]; then echo "CRASH($rc)${failed:+ failed: $failed}"; return; fi
  set -- $done_line
  if [ "$rc" = 0 ] && [ "${3#failed=}" = 0 ]; then echo "ok ${2#checks=}"; else echo "FAIL(rc=$rc) ${3#failed=}/${2#checks=}: $failed"; fi
}
if [ -n "${ORION_E2E_SUITE:-}" ]; then
  case "$ORION_E2E_SUITE" in /*) SUITE=$ORION_E2E_SUITE ;; *) SUITE=$ORIG_PWD/$ORION_E2E_SUITE ;; esac
  : >"$SUITETABLE"
  for s in "$SUITE"/*; do
    [ -f "$s" ] && [ -x "$s" ] || continue
    k=suite-${s##*/}
    if [ "$(left)" -lt 30 ]; then echo "${s##*/}: skipped (time budget)" >>"$SUITETABLE"; continue; fi
    run_one "$k" native 30 "$s"
    run_one "$k" orion 40 "$s"
    printf '%-18s native: %-40s orion: %s\n' "${s##*/}" "$(suite_res "$k" native)" "$(suite_res "$k" orion)" |
      tee -a "$SUITETABLE"
  done
  hr
fi

# --- summary --------------------------------------------------------------------------------------------
stop_oriond
save_logs
write_summary
hr
sed -n '/^program \/ timed section/,$p' "$OUT/summary.txt"
hr
say "summary: $OUT/summary.txt   (elapsed $((SECONDS - T0)) s)"
[ "$ALL_PASS" = 1 ]
