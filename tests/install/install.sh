#!/usr/bin/env bash
# install.sh — `cmake --install` of the build into a temporary prefix, then,
# as a user of the installed package would: every public header, both
# libraries, the CLI and moerun.pc are there; a C program (consumer.c)
# that includes every public header builds with
# `pkg-config --cflags --libs moerun` against the shared library and with
# `pkg-config --static` against the static one, and both run; the shared
# build resolves libmoerun from the prefix; the installed CLI runs.
# Args: <cmake> <build dir> <source dir> <C compiler> <scratch dir> [build flags of
# the library the program must share, e.g. its sanitizers]
set -u
CMAKE=$1; B=$2; SRC=$3; CC=$4; S=$5; read -r -a XF <<< "${6:-}"
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$S"; mkdir -p "$S"
P="$S/prefix with space"
out=$("$CMAKE" --install "$B" --prefix "$P" 2>&1) || fail "cmake --install: $out"

# the .pc file and what it points at
pc=$(find "$P" -name moerun.pc -path '*/pkgconfig/*' | head -1)
[ -n "$pc" ] || fail "no moerun.pc under $P"
export PKG_CONFIG_PATH="$(dirname "$pc")"
# pkg-config's answers as shell words: it escapes the space of the prefix
words() { eval "set -- $1"; printf '%s\n' "$@"; }
ver=$(pkg-config --modversion moerun) || fail "pkg-config does not read $pc"
want=$(sed -n 's/^project(moerun VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")
[ "$ver" = "$want" ] || fail "moerun.pc says version '$ver', CMakeLists.txt '$want'"
inc=$(words "$(pkg-config --variable includedir moerun)"); lib=$(words "$(pkg-config --variable libdir moerun)")
[ "$(cd "$inc" 2>/dev/null && pwd -P)" = "$(cd "$P/include" && pwd -P)" ] || fail "includedir $inc is not in $P"
for h in "$SRC"/include/moerun/*.h; do
  [ -f "$inc/moerun/$(basename "$h")" ] || fail "public header $(basename "$h") not installed"
done
for f in libmoerun.a libmoerun.so; do [ -e "$lib/$f" ] || fail "$f not installed in $lib"; done
[ -x "$P/bin/moerun" ] || fail "the CLI is not installed in $P/bin"

# a program that includes every public header, by its installed name only
{ for h in "$SRC"/include/moerun/*.h; do echo "#include <moerun/$(basename "$h")>"; done; } > "$S/all_headers.h"
cflags=$(pkg-config --cflags moerun) || fail "pkg-config --cflags"
libs=$(pkg-config --libs moerun) || fail "pkg-config --libs"
eval "set -- $cflags"; cf=("$@")   # the flags as words (the prefix holds a space, pkg-config escapes it)
eval "set -- $libs"; lf=("$@")
out=$("$CC" -std=c11 -Wall -Wextra -Wpedantic -Werror "${XF[@]}" -I"$S" "${cf[@]}" "$SRC/tests/install/consumer.c" -o "$S/consumer" \
      "${lf[@]}" -lm 2>&1) || fail "build against the shared library: $out"
out=$(LD_LIBRARY_PATH="$lib" "$S/consumer" "$ver" 2>&1) || fail "consumer (shared): $out"
echo "shared: $out"
where=$(LD_LIBRARY_PATH="$lib" ldd "$S/consumer" | sed -n 's/^.*libmoerun[^ ]* => \(.*\) (0x[0-9a-f]*)$/\1/p')
[ -n "$where" ] && [ "$(cd "$(dirname "$where")" && pwd -P)" = "$(cd "$lib" && pwd -P)" ] \
  || fail "the consumer resolves libmoerun to '$where', not the installed $lib"

# static: the same program with the archive and the .pc's private libraries
slibs=$(pkg-config --static --libs moerun) || fail "pkg-config --static --libs"
eval "set -- $slibs"; sf=()
for a in "$@"; do [ "$a" = -lmoerun ] && a="-l:libmoerun.a"; sf+=("$a"); done
out=$("$CC" -std=c11 "${XF[@]}" -I"$S" "${cf[@]}" "$SRC/tests/install/consumer.c" -o "$S/consumer_static" "${sf[@]}" -lm 2>&1) \
  || fail "build against the static library: $out"
ldd "$S/consumer_static" | grep -q libmoerun && fail "the static consumer still needs libmoerun.so"
out=$(env -u LD_LIBRARY_PATH "$S/consumer_static" "$ver" 2>&1) || fail "consumer (static): $out"
echo "static: $out"

# the installed CLI
out=$("$P/bin/moerun" version 2>&1) || fail "installed moerun version: $out"
echo "$out" | grep -qF "$ver" || fail "installed moerun version does not say $ver: $out"
rm -rf "$S"
echo "ok"
