#!/bin/sh
# isa_digest_check.sh XTE_ISA_RUN XTE_ISA_DIGEST [DIGEST ARGS...]   (ctest isa_digest_identity)
# The numerics contract (docs/numerics.md): the same output bytes on every CPU ISA and thread
# count. Runs xte_isa_digest (tests/isa_digest/) under every ISA that xte_isa_run can run here
# (`xte_isa_run ISA true` exits 77 for the others: reported as skipped), then on the best native
# ISA with 1, 2 and 3 threads, on avx512 without AMX and without AMX and VNNI, on every ISA with
# streaming stores always and on the best one never: paths that must give the same bytes (under
# an emulator only the ISAs and 1 and 2 threads). Every run's lines must equal the scalar ISA's;
# the cases that differ are printed, with the first differing output elements of the first such
# case (xte_isa_digest --dump). Exit 0 when all runs agree, 1 otherwise.
# XTE_DIGEST_EMULATOR (optional): a command both programs run under (e.g. qemu-x86_64 -cpu max).
set -u
if [ $# -lt 2 ]; then
  echo "usage: isa_digest_check.sh XTE_ISA_RUN XTE_ISA_DIGEST [DIGEST ARGS...]" >&2
  exit 2
fi
isa_run=$1
digest=$2
shift 2
emu=${XTE_DIGEST_EMULATOR:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/xte_isa_digest.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
trap 'exit 2' INT TERM
status=0
ran=""

# run_digest NAME ISA [VAR=VALUE...] -- ARGS: runs the digest with XTE_CPU_ISA=ISA (and the
# variables) into $tmp/NAME.out / NAME.err. Returns its exit status.
run_digest() {
  _n=$1
  _isa=$2
  shift 2
  _env="XTE_CPU_ISA=$_isa"
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    _env="$_env $1"
    shift
  done
  [ $# -gt 0 ] && shift
  # shellcheck disable=SC2086 # word splitting of the emulator command and assignments is intended
  env $_env $emu "$digest" "$@" >"$tmp/$_n.out" 2>"$tmp/$_n.err" </dev/null
}

# run_case NAME ISA [VAR=VALUE...]
run_case() {
  name=$1
  isa=$2
  shift 2
  env_args="$*"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  run_digest "$name" "$isa" $env_args -- $DIGEST_ARGS
  rc=$?
  t1=$(date +%s)
  summary=$(tail -n 1 "$tmp/$name.err" 2>/dev/null)
  label="$isa${env_args:+ ($env_args)}"
  if [ $rc -ne 0 ]; then
    echo "FAIL  $label: xte_isa_digest exited $rc"
    grep -v '^xte_isa_digest:' "$tmp/$name.err" | head -n 20
    grep ' FAILED' "$tmp/$name.out" | head -n 20
    status=1
    return 1
  fi
  if ! grep -q "isa $isa," "$tmp/$name.err"; then
    echo "FAIL  $label: the digest did not run on $isa: $(head -n 1 "$tmp/$name.err")"
    status=1
    return 1
  fi
  if ! tail -n 1 "$tmp/$name.out" | grep -q '^TOTAL '; then
    echo "FAIL  $label: no TOTAL line"
    status=1
    return 1
  fi
  if [ "$name" = ref ]; then
    echo "ran   $label: $(tail -n 1 "$tmp/$name.out") [$((t1 - t0)) s] ${summary#xte_isa_digest: }"
    return 0
  fi
  if cmp -s "$tmp/ref.out" "$tmp/$name.out"; then
    echo "same  $label: $(tail -n 1 "$tmp/$name.out") [$((t1 - t0)) s] ${summary#xte_isa_digest: }"
    return 0
  fi
  status=1
  # the cases whose line differs (or that one side lacks)
  awk 'NR == FNR { ref[$1] = $0; next }
       $1 != "TOTAL" { seen[$1] = 1; if (!($1 in ref)) print $1 " (only here)"; else if (ref[$1] != $0) print $1 }
       END { for (k in ref) if (k != "TOTAL" && !(k in seen)) print k " (missing here)" }' \
    "$tmp/ref.out" "$tmp/$name.out" >"$tmp/$name.diff"
  n=$(wc -l <"$tmp/$name.diff")
  echo "DIFF  $label: $n cases differ from scalar:"
  head -n 60 "$tmp/$name.diff" | sed 's/^/        /'
  [ "$n" -gt 60 ] && echo "        ... ($((n - 60)) more)"
  first=$(head -n 1 "$tmp/$name.diff" | cut -d' ' -f1)
  if [ -n "$first" ]; then
    # shellcheck disable=SC2086
    run_digest "${name}_dump" "$isa" $env_args -- $DIGEST_ARGS --filter "$first" --dump "$first"
    # shellcheck disable=SC2086
    run_digest ref_dump scalar -- $DIGEST_ARGS --filter "$first" --dump "$first"
    echo "        first differing elements of $first (< scalar, > $label):"
    diff "$tmp/ref_dump.out" "$tmp/${name}_dump.out" | grep '^[<>]' | head -n 16 | sed 's/^/        /'
  fi
  return 1
}

DIGEST_ARGS="$*"

# 1. every ISA against scalar
run_case ref scalar || exit 1
ran=scalar
best=scalar
for isa in avx2 avx512 avx512_simde; do
  # shellcheck disable=SC2086
  $emu "$isa_run" "$isa" true >"$tmp/probe_$isa" 2>&1
  rc=$?
  if [ $rc -eq 77 ]; then
    echo "skip  $isa: $(grep SKIPPED "$tmp/probe_$isa" | head -n 1)"
    continue
  elif [ $rc -ne 0 ]; then
    echo "FAIL  $isa: xte_isa_run $isa true exited $rc: $(head -n 3 "$tmp/probe_$isa")"
    status=1
    continue
  fi
  run_case "$isa" "$isa"
  ran="$ran $isa"
  [ "$isa" != avx512_simde ] && best=$isa
done

# 2. thread counts on the best native ISA (under an emulator, 1 and 2 only: every run is slow)
threads="1 2 3"
[ -n "$emu" ] && threads="1 2"
for n in $threads; do
  run_case "${best}_t$n" "$best" "XTE_NUM_THREADS=$n"
done

# 3. other kernel paths that must give the same bytes (natively only)
if [ -z "$emu" ]; then
  if [ "$best" = avx512 ]; then
    run_case avx512_noamx avx512 XTE_CPU_AMX=0
    run_case avx512_noamx_novnni avx512 XTE_CPU_AMX=0 XTE_CPU_VNNI=0
  fi
  for isa in $ran; do
    run_case "${isa}_stream1" "$isa" XTE_STREAMING_STORES=1
  done
  run_case "${best}_stream0" "$best" XTE_STREAMING_STORES=0
fi

echo "ISAs run: $ran"
if [ $status -eq 0 ]; then
  echo "isa_digest_identity: every run gives the scalar ISA's bytes"
else
  echo "isa_digest_identity: FAILED (see DIFF / FAIL above)"
fi
exit $status
