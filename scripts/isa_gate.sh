#!/usr/bin/env bash
# ISA purity gate: disassembles every object of each CPU ISA object library
# (cmake/XteCpuIsa.cmake) and of the baseline library target xte, and fails on any instruction
# above what that library may use. A native AVX-512 instruction in the SIMDe build of
# src/cpu/avx512/ (or in the AVX2 or baseline code) is a SIGILL on an AVX2-only machine (Zen 3,
# Haswell) that no test on an AVX-512 machine sees.
#
#   scripts/isa_gate.sh [BUILD_DIR]      (default build; ctest: check_isa_purity, label isa)
#   exit 0: every object passes; 1: an instruction above its library's ISA, or a library that
#   the build should have and does not; 2: cannot run (no objdump, no build).
#
# The rules, per library (objects CMakeFiles/<library>.dir/**.o):
#   xte (baseline x86-64: src/*.c, src/cpu/*.c, src/cpu/scalar/*.c, ...): no VEX, EVEX or XOP
#       encoding; no ymm, zmm, k0-k7 or tmm register; no v-prefixed (AVX) mnemonic; nothing above
#       SSE2 that is legacy-encoded either (SSE3, SSSE3, SSE4.1/4.2, POPCNT, LZCNT, MOVBE,
#       CMPXCHG16B); no AMX.
#   xte_isa_avx2, xte_isa_avx512_simde (AVX2 + FMA + F16C): no EVEX or XOP encoding at all (so
#       no AVX-512 instruction of any width, AVX-512VL xmm/ymm forms included, whatever its
#       mnemonic); no zmm, k0-k7, xmm16-31, ymm16-31 or tmm register; no VEX-encoded extension
#       above AVX2 (AVX-VNNI, AVX-IFMA, AVX-NE-CONVERT, GFNI, VAES, VPCLMULQDQ, ...); no AMX.
#   xte_isa_avx512 (AVX-512 F, BW, VL, DQ): EVEX maps 1-3 only (map 5/6 is AVX512-FP16); none of
#       the AVX-512 extensions it does not check for at run time: CD, VNNI (EVEX and VEX),
#       VBMI, VBMI2, IFMA, BF16, BITALG, VPOPCNTDQ, VP2INTERSECT, GFNI, VAES, ...; no AMX.
#   xte_isa_vnni: avx512's rules, VNNI and VBMI allowed (no AMX).
#   xte_isa_bf16: avx512's rules, AVX512-BF16 and AMX-TILE / AMX-BF16 allowed (its compile flags).
#   xte_isa_amx: avx512's rules, VBMI and AMX-TILE / AMX-INT8 allowed (its compile flags).
# Encodings are read from the raw instruction bytes (after the legacy and REX prefixes: 0xC4 /
# 0xC5 VEX, 0x62 EVEX, 0x8F with a map >= 8 XOP), so a new EVEX-only mnemonic cannot slip by;
# the mnemonic lists only separate extensions that share an encoding.
#
# The objects are the ones the build system lists (build.ninja, or the targets' build.make), so
# a stale object of a deleted source is not read and an object that is listed but missing fails.
# A library the configuration should have (XTE_SIMDE=ON: xte_isa_avx512_simde; XTE_AVX512=ON:
# xte_isa_avx512; ...) but that has no objects fails: a missing library is never a silent pass.
# XTE_ISA_LIBRARIES ("a,b,..." or "a;b;..."; ctest passes CMake's global property of that name)
# names the ISA libraries that must be there and have a rule here.
set -uo pipefail
build=${1:-build}
max_show=${XTE_ISA_GATE_SHOW:-4} # offending instructions shown per object (at most 60 a library)
t0=$(date +%s.%N)

command -v objdump >/dev/null || { echo "isa_gate: objdump is missing (binutils)" >&2; exit 2; }
if [ ! -f "$build/CMakeCache.txt" ]; then
  echo "isa_gate: $build is not a CMake build directory (no CMakeCache.txt)" >&2
  exit 2
fi
cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -n1; }
on() { case "${1^^}" in ON | 1 | YES | TRUE | Y) return 0 ;; *) return 1 ;; esac; }

# ---------------------------------------------------------------- the objects of each library
# lists "library object" pairs (object relative to $build)
list_objects() {
  if [ -f "$build/build.ninja" ]; then
    sed -n 's#^build \(CMakeFiles/\(xte\|xte_isa_[A-Za-z0-9_]*\)\.dir/[^ :]*\.o\):.*#\2 \1#p' \
      "$build/build.ninja"
  else
    local d lib
    for d in "$build"/CMakeFiles/xte.dir "$build"/CMakeFiles/xte_isa_*.dir; do
      [ -d "$d" ] || continue
      lib=$(basename "$d" .dir)
      if [ -f "$d/build.make" ]; then
        sed -n "s#^\\(CMakeFiles/$lib\\.dir/[^ :]*\\.o\\): .*\\.c\$#$lib \\1#p" "$d/build.make" | sort -u
      else
        (cd "$build" && find "CMakeFiles/$lib.dir" -name '*.o' | sort | sed "s#^#$lib #")
      fi
    done
  fi | grep -v '_O0 ' # the -O0 copies (check_kernels_O0) are never linked
}
objs_all=$(list_objects)

rule_of() {
  case "$1" in
    xte) echo baseline ;;
    xte_isa_avx2 | xte_isa_avx512_simde) echo avx2 ;;
    xte_isa_avx512) echo avx512 ;;
    xte_isa_vnni) echo vnni ;;
    xte_isa_bf16) echo bf16 ;;
    xte_isa_amx) echo amx ;;
    *) echo "" ;;
  esac
}

fail=0
libs=$(printf '%s\n' "$objs_all" | awk 'NF { print $1 }' | sort -u)
# the libraries this configuration must have
want="xte xte_isa_avx2"
on "$(cache XTE_SIMDE)" && want="$want xte_isa_avx512_simde"
if on "$(cache XTE_AVX512)"; then
  want="$want xte_isa_avx512"
  on "$(cache XTE_AMX)" && on "$(cache XTE_CC_HAS_AMX)" && want="$want xte_isa_amx"
  on "$(cache XTE_VNNI)" && on "$(cache XTE_CC_HAS_VNNI)" && want="$want xte_isa_vnni"
  on "$(cache XTE_CC_HAS_AVX512_BF16)" && want="$want xte_isa_bf16"
fi
isa_libs=${XTE_ISA_LIBRARIES:-}
for l in $want $(printf "%s" "$isa_libs" | tr ";," "  "); do
  if ! grep -qx "$l" <<<"$libs"; then
    echo "isa_gate: FAIL: library $l has no objects in $build, but this configuration builds it" \
      "(XTE_SIMDE=$(cache XTE_SIMDE), XTE_AVX512=$(cache XTE_AVX512), XTE_AMX=$(cache XTE_AMX)," \
      "XTE_VNNI=$(cache XTE_VNNI), XTE_ISA_LIBRARIES=${isa_libs:-unset}): a library left out" \
      "must not pass unchecked"
    fail=1
  fi
done

# ---------------------------------------------------------------- the disassembly and the rules
# Reads objdump -d output of one library's objects; prints one line per object
# ("OBJ <path> <instructions> <offending>"), each offending instruction shown
# ("BAD <path> <function>+<offset>: <instruction>  [<why>]"), and "SUM <instructions>".
read -r -d '' AWK_RULES <<'EOF'
function hexval(s,    i, v) {
  v = 0; s = tolower(s)
  for (i = 1; i <= length(s); i++) v = v * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1
  return v
}
# the encoding of an instruction from its raw bytes: "legacy", "vex", "evex:<map>", "xop"
function encoding(bytes,    n, b, i, op) {
  n = split(bytes, b, " ")
  for (i = 1; i <= n; i++) {
    op = b[i]
    if (op ~ /^(26|2e|36|3e|64|65|66|67|f0|f2|f3|4[0-9a-f])$/) continue
    break
  }
  if (i > n) return "legacy"
  if (op == "c4" || op == "c5") return "vex"
  if (op == "62") return "evex:" (i < n ? hexval(b[i + 1]) % 8 : "?")
  if (op == "8f" && i < n && hexval(b[i + 1]) % 32 >= 8) return "xop"
  return "legacy"
}
# the extension of a mnemonic, where it is one above AVX-512 F/BW/VL/DQ or AVX2, else ""
function extension(m, ops) {
  if (m ~ /^(ldtilecfg|sttilecfg|tile|tdp|tcmm|tcvt|ttdp|ttrans|tmmul|t2rp)/ || ops ~ /%tmm/)
    return "AMX"
  if (m ~ /^vpdp(busd|wssd)/) return "VNNI"
  if (m ~ /^vpdp(b(ss|su|uu)|w(su|us|uu))d/) return "AVX-VNNI-INT8/16"
  if (m ~ /^(vpermb|vpermi2b|vpermt2b|vpmultishiftqb)$/) return "VBMI"
  if (m ~ /^(vpcompress[bw]|vpexpand[bw]|vpshld|vpshrd)/) return "VBMI2"
  if (m ~ /^(vpconflict|vplzcnt|vpbroadcastm)/) return "AVX512CD"
  if (m ~ /^vpmadd52/) return "IFMA"
  if (m ~ /^(vcvtne2ps2bf16|vcvtneps2bf16|vdpbf16ps)/) return "BF16"
  if (m ~ /^(vbcstne|vcvtnee|vcvtneo)/) return "AVX-NE-CONVERT"
  if (m ~ /^(vpopcnt|vpshufbitqmb)/) return "VPOPCNTDQ/BITALG"
  if (m ~ /^vp2intersect/) return "VP2INTERSECT"
  if (m ~ /^v?gf2p8/) return "GFNI"
  if (m ~ /^v?aes/) return "AES/VAES"
  if (m ~ /^v?pclmul/) return "PCLMULQDQ"
  if (m ~ /^(sha1|sha256|vsha512|vsm3|vsm4)/) return "SHA/SM3/SM4"
  if (m ~ /^(vexp2p|vrcp28|vrsqrt28|vgatherpf|vscatterpf|v4f|vp4dpwssd)/) return "AVX512ER/PF/4FMAPS"
  if (m ~ /^vf(n?madd|n?msub|maddsub|msubadd)(ps|pd|ss|sd)$/) return "FMA4"
  if (m ~ /^(extrq|insertq|movnts[sd])$/) return "SSE4a"
  return ""
}
# legacy-encoded instructions above the x86-64 baseline (SSE2)
function above_sse2(m) {
  if (m ~ /^(addsubp[sd]|haddp[sd]|hsubp[sd]|lddqu|movddup|movs[hl]dup|monitor|mwait)$/ || m ~ /^fisttp/)
    return "SSE3"
  if (m ~ /^(pabs[bwd]|palignr|phadd(w|d|sw)|phsub(w|d|sw)|pmaddubsw|pmulhrsw|pshufb|psign[bwd])$/)
    return "SSSE3"
  if (m ~ /^(blendp[sd]|blendvp[sd]|dpp[sd]|extractps|insertps|movntdqa|mpsadbw|packusdw|pblendvb|pblendw|pcmpeqq|pextr[bdq]|pinsr[bdq]|phminposuw|pmaxs[bd]|pmaxu[wd]|pmins[bd]|pminu[wd]|pmov[sz]x[bwd][wdq]|pmuldq|pmulld|ptest|round[ps][sd])$/)
    return "SSE4.1"
  if (m ~ /^(pcmp[ei]str[im]|pcmpgtq)$/ || m ~ /^crc32[bwlq]?$/) return "SSE4.2"
  if (m ~ /^(popcnt|lzcnt|movbe)[wlq]?$/) return "POPCNT/LZCNT/MOVBE"
  if (m ~ /^cmpxchg16b$/) return "CMPXCHG16B"
  return ""
}
# why the instruction is above rule R, or ""
function offence(R, m, ops, enc,    e, map) {
  e = extension(m, ops)
  if (R == "baseline") {
    if (enc != "legacy") return toupper(enc ~ /^evex/ ? "evex" : enc) " encoding"
    if (ops ~ /%[yz]mm|%k[0-7]/) return "AVX register"
    if (m ~ /^v/ && m !~ /^ver[rw]$/) return "AVX mnemonic"
    if (e != "") return e
    return above_sse2(m)
  }
  if (R == "avx2") {
    if (enc ~ /^evex/) return "EVEX encoding (AVX-512)"
    if (enc == "xop") return "XOP encoding"
    if (ops ~ /%zmm|%k[0-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])/) return "AVX-512 register"
    return e
  }
  # avx512, vnni, amx, bf16
  if (enc == "xop") return "XOP encoding"
  if (enc ~ /^evex/) {
    map = substr(enc, 6)
    if (map != "1" && map != "2" && map != "3")
      return "EVEX map " map (map == "5" || map == "6" ? " (AVX512-FP16)" : "")
  }
  if (e == "") return ""
  if (R == "vnni" && (e == "VNNI" || e == "VBMI")) return ""
  if (R == "amx" && (e == "VBMI" || e == "AMX")) return ""
  if (R == "bf16" && (e == "BF16" || e == "AMX")) return ""
  return e
}
function flush_obj() {
  if (obj != "") print "OBJ", obj, nins, nbad
}
BEGIN { FS = "\t"; obj = ""; fn = "?"; total = 0 }
/^[^ \t].*:[ \t]+file format / {
  flush_obj()
  obj = $0; sub(/:[ \t]+file format .*/, "", obj)
  nins = 0; nbad = 0; fn = "?"
  next
}
/^[0-9a-f]+ <.*>:$/ {
  fn = $0; sub(/^[0-9a-f]+ </, "", fn); sub(/>:$/, "", fn); fnaddr = $0; sub(/ .*/, "", fnaddr)
  next
}
/^ +[0-9a-f]+:\t/ {
  if (NF < 3) next # bytes only (a continuation): the instruction was counted on its first line
  addr = $1; gsub(/[ :]/, "", addr)
  bytes = $2; gsub(/^ +| +$/, "", bytes)
  insn = $3
  for (i = 4; i <= NF; i++) insn = insn " " $i
  sub(/[ \t]+#.*$/, "", insn)
  n = split(insn, w, " ")
  k = 1
  while (k < n && w[k] ~ /^(rep|repz|repnz|repe|repne|lock|notrack|bnd|data16|addr32|\{vex\}|\{vex3\}|\{evex\}|cs|ds|es|fs|gs|ss|xacquire|xrelease)$/) k++
  m = w[k]
  ops = ""
  for (j = k + 1; j <= n; j++) ops = ops " " w[j]
  nins++; total++
  why = offence(RULE, m, ops, encoding(bytes))
  if (why != "") {
    nbad++
    if (nbad <= SHOW)
      printf "BAD %s: %s+0x%x: %s  [%s]\n", obj, fn, hexval(addr) - hexval(fnaddr), insn, why
  }
}
END { flush_obj(); print "SUM", total }
EOF

tmp=$(mktemp)
trap 'rm -f "$tmp" "$tmp.err"' EXIT
for lib in $libs; do
  rule=$(rule_of "$lib")
  objs=$(printf '%s\n' "$objs_all" | awk -v l="$lib" '$1 == l { print $2 }')
  n=$(printf '%s\n' "$objs" | grep -c .)
  if [ -z "$rule" ]; then
    echo "isa_gate: FAIL: $lib: no rule for this library in scripts/isa_gate.sh (a new ISA" \
      "folder: give it one)"
    fail=1
    continue
  fi
  missing=()
  for o in $objs; do
    [ -f "$build/$o" ] || missing+=("$o")
  done
  if [ ${#missing[@]} != 0 ]; then
    echo "isa_gate: FAIL: $lib: ${#missing[@]} of $n objects listed by the build are not built" \
      "(build first), e.g. ${missing[0]}"
    fail=1
    continue
  fi
  # (--insn-width=15 keeps each instruction's bytes on one line)
  if ! (cd "$build" && objdump -d --insn-width=15 $objs) >"$tmp" 2>"$tmp.err"; then
    echo "isa_gate: FAIL: $lib: objdump failed: $(head -n 5 "$tmp.err")"
    fail=1
    continue
  fi
  out=$(awk -v RULE="$rule" -v SHOW="$max_show" "$AWK_RULES" "$tmp")
  ninsn=$(printf '%s\n' "$out" | sed -n 's/^SUM //p')
  nbad=$(printf '%s\n' "$out" | awk '$1 == "OBJ" { s += $4 } END { print s + 0 }')
  if [ "$nbad" != 0 ]; then
    printf '%-22s FAIL  %3d objects, %7d instructions, %d above its ISA (rule %s):\n' \
      "$lib" "$n" "$ninsn" "$nbad" "$rule"
    printf '%s\n' "$out" | awk '$1 == "OBJ" && $4 > 0 { printf "  %s: %d offending instructions\n", $2, $4 }'
    printf '%s\n' "$out" | sed -n 's/^BAD /    /p' | awk 'NR <= 60 { print; next }
      END { if (NR > 60) printf "    ... and %d more shown lines (XTE_ISA_GATE_SHOW)\n", NR - 60 }'
    fail=1
  else
    printf '%-22s ok    %3d objects, %7d instructions checked (rule %s)\n' "$lib" "$n" "$ninsn" "$rule"
  fi
  if [ "$lib" != xte ] && [ "${ninsn:-0}" = 0 ]; then
    echo "isa_gate: FAIL: $lib: no instructions disassembled (empty objects?)"
    fail=1
  fi
done

dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
if [ "$fail" != 0 ]; then
  echo "isa_gate: FAILED ($dt s): an object has instructions above its library's ISA (a SIGILL" \
    "on a CPU without them), or a library is missing; see cmake/XteCpuIsa.cmake"
  exit 1
fi
echo "isa_gate: all libraries pass ($dt s)"
