#!/usr/bin/env bash
# Builds the Debian package (Release, in build-pkg/, `cpack -G DEB`), installs
# it, and exercises only the installed files:
#   /usr/bin/thinfs format; mount -t thinfs; a volume made with truncate and
#   written; an instant clone with cp --reflink=auto --sparse=never; umount;
#   remount from an fstab line (mount -T); data persisted; thinfs check;
#   thinfs --version; man -w thinfs; the bash completion (bash -n, and a few
#   completions); systemd-analyze verify on the unit (when it can run);
# then purges the package and checks its files are gone. Prints the
# package's file list and size. Exits non-zero on any failure; a trap
# unmounts, and purges the package, on the way out.
#
# Needs root (mount, apt-get). Refuses to run over a thinfs already
# installed by other means. THINFS_PKG_KEEP_BUILD=1 skips the rebuild when
# build-pkg/ already holds a package.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd)

say() { printf '== %s\n' "$*"; }
pass() { printf 'ok   %s\n' "$*"; }
fail() { printf 'FAIL %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || fail "package-test.sh needs root (mount, apt-get install)"
export DEBIAN_FRONTEND=noninteractive

installed_status=$(dpkg-query -W -f='${db:Status-Status}' thinfs 2>/dev/null || true)
if [[ $installed_status == installed ]]; then
  fail "a thinfs package is already installed; remove it first (this test purges it)"
fi
for f in /usr/bin/thinfs /usr/libexec/thinfs/thinfs-engine /usr/sbin/mount.thinfs; do
  [[ ! -e $f ]] || fail "$f exists outside any package (cmake --install?); remove it first"
done

# --- build ------------------------------------------------------------------
bash scripts/deps.sh
tools=()
command -v dpkg-shlibdeps >/dev/null || tools+=(dpkg-dev)
command -v man >/dev/null || tools+=(man-db)
if [[ ${#tools[@]} -gt 0 ]]; then
  say "installing ${tools[*]}"
  apt-get install -y -q --no-install-recommends "${tools[@]}" ||
    { apt-get update -q && apt-get install -y -q --no-install-recommends "${tools[@]}"; }
fi

# THINFS_PKG_BUILD_DIR: package an existing build tree configured with
# -DCMAKE_INSTALL_PREFIX=/usr (scripts/test.sh reuses its Debug build
# instead of compiling a Release one) rather than build-pkg/.
PKG=${THINFS_PKG_BUILD_DIR:-build-pkg}
if [[ $PKG != build-pkg ]]; then
  say "cpack -G DEB in $PKG/ (an existing build)"
  cmake --build "$PKG" -j2 --target thinfs thinfs_man
  rm -f "$PKG"/thinfs_*.deb
  (cd "$PKG" && cpack -G DEB)
elif [[ ${THINFS_PKG_KEEP_BUILD:-0} == 1 ]] && compgen -G 'build-pkg/thinfs_*.deb' >/dev/null; then
  say "reusing $(ls build-pkg/thinfs_*.deb)"
else
  say "Release build and cpack -G DEB in build-pkg/"
  # Only the files the package holds are built: not the tests, not bench.
  cmake -S . -B build-pkg -DCMAKE_BUILD_TYPE=Release -DTHINFS_WERROR=OFF \
    -DCMAKE_INSTALL_PREFIX=/usr -DTHINFS_BENCH=OFF -DCMAKE_SKIP_INSTALL_ALL_DEPENDENCY=ON
  cmake --build build-pkg -j2 --target thinfs thinfs_man
  rm -f build-pkg/thinfs_*.deb
  (cd build-pkg && cpack -G DEB)
fi
debs=("$PKG"/thinfs_*.deb)
[[ ${#debs[@]} -eq 1 && -f ${debs[0]} ]] || fail "expected one $PKG/thinfs_*.deb, got ${debs[*]}"
DEB=$SRC/${debs[0]}

say "package $(basename "$DEB")"
dpkg-deb --info "$DEB"
say "contents"
dpkg-deb --contents "$DEB"
printf 'size: %s bytes (%s KiB on disk as .deb), Installed-Size: %s KiB\n' \
  "$(stat -c %s "$DEB")" "$(( ($(stat -c %s "$DEB") + 1023) / 1024 ))" \
  "$(dpkg-deb -f "$DEB" Installed-Size)"

depends=$(dpkg-deb -f "$DEB" Depends)
# fuse3 for fusermount3, named by hand; then the package of every shared
# library the packaged engine binary needs (with THINFS_STATIC_DEPS, the
# default, that is glibc's alone; the front, /usr/bin/thinfs, is then a
# static PIE and needs none).
for dep in fuse3 libc6; do
  [[ $depends == *"$dep"* ]] || fail "Depends lacks $dep: $depends"
done
x=$(mktemp -d /tmp/thinfs-deb.XXXXXX)
dpkg-deb -x "$DEB" "$x"
needed=$(objdump -p "$x/usr/libexec/thinfs/thinfs-engine" | awk '$1 == "NEEDED" {print $2}')
front_needed=$(objdump -p "$x/usr/bin/thinfs" | awk '$1 == "NEEDED" {print $2}')
rm -rf "$x"
[[ -n $needed ]] || fail "objdump found no NEEDED entry in the packaged thinfs-engine"
[[ -z $front_needed ]] || fail "the packaged front /usr/bin/thinfs is not static: needs $front_needed"
for lib in $needed; do
  # Each reader consumes its whole input: one that stops early (awk's exit,
  # head) makes the writer die of SIGPIPE, and pipefail turns that into 141.
  path=$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ && !p {p = $NF} END {print p}')
  [[ -n $path ]] || fail "$lib, needed by thinfs-engine, is not installed here"
  pkg=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | awk -F: 'NR == 1 {print $1}') ||
    pkg=$(dpkg -S "$path" | awk -F: 'NR == 1 {print $1}')
  [[ -n $pkg && $depends == *"$pkg"* ]] ||
    fail "thinfs needs $lib (package ${pkg:-unknown}) but Depends lacks it: $depends"
done
pass "Depends: $depends (covers every NEEDED library: $(echo $needed))"
contents=$(dpkg-deb --contents "$DEB")
for f in ./usr/bin/thinfs ./usr/libexec/thinfs/thinfs-engine ./usr/sbin/mount.thinfs \
         ./lib/systemd/system/thinfs@.service \
         ./usr/share/man/man8/thinfs.8.gz ./usr/share/bash-completion/completions/thinfs \
         ./usr/share/doc/thinfs/README.md ./usr/share/doc/thinfs/packaging.md; do
  grep -q " $f\$" <<<"$contents" || fail "the package lacks $f"
done
pass "the package holds the two binaries, mount helper, unit, man page, completion, docs"
stage=$(mktemp -d /tmp/thinfs-stage.XXXXXX)
DESTDIR=$stage cmake --install "$PKG" --strip >/dev/null
staged=$(cd "$stage" && find . -type f | sort)
rm -rf "$stage"
[[ $staged == "$(awk '$1 ~ /^-/ {print $6}' <<<"$contents" | sort)" ]] ||
  fail "cmake --install and the package hold different files"
pass "cmake --install (DESTDIR) installs the same files as the package"

# --- install ----------------------------------------------------------------
T=$(mktemp -d /tmp/thinfs-pkgtest.XXXXXX)
POOL=$T/pool
MNT=$T/mnt
installed=0

cleanup() {
  local rc=$?
  set +e
  if findmnt -rn -M "$MNT" >/dev/null 2>&1; then
    umount "$MNT" 2>/dev/null || umount -l "$MNT"
  fi
  # A daemon still holding the pool's lock is ours: wait for its final
  # commit, then end it by the PID it wrote into the lock file.
  if [[ -e $POOL/lock ]] && ! flock -n "$POOL/lock" true 2>/dev/null; then
    sleep 2
    pid=$(tr -dc 0-9 <"$POOL/lock" 2>/dev/null)
    if [[ -n $pid ]] && ! flock -n "$POOL/lock" true; then kill "$pid"; fi
  fi
  if [[ $installed == 1 ]] && dpkg-query -W thinfs >/dev/null 2>&1; then
    echo "cleanup: purging the thinfs package"
    apt-get remove --purge -y -q thinfs >/dev/null
  fi
  rm -rf "$T"
  if [[ $rc -ne 0 ]]; then echo "package-test: FAILED (exit $rc)" >&2; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "apt-get install $(basename "$DEB")"
installed=1
apt-get install -y -q "$DEB" ||
  { apt-get update -q && apt-get install -y -q "$DEB"; }
[[ $(dpkg-query -W -f='${db:Status-Status}' thinfs) == installed ]] || fail "thinfs not installed"
pass "installed"

# From here on only the installed files: no build tree on PATH, run from $T.
cd "$T"
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
hash -r
[[ $(command -v thinfs) == /usr/bin/thinfs ]] || fail "thinfs resolves to $(command -v thinfs)"

# Waits until the daemon serving $1 has let go of the pool (final commit done).
wait_released() {
  for _ in $(seq 100); do
    flock -n "$1/lock" true 2>/dev/null && return 0
    sleep 0.1
  done
  fail "the daemon did not release $1 within 10 s"
}

ver=$(thinfs --version)
pkgver=$(dpkg-query -W -f='${Version}' thinfs)
[[ $ver == "thinfs ${pkgver%-*}" ]] || fail "thinfs --version says '$ver', package is $pkgver"
pass "thinfs --version: $ver (package $pkgver)"

say "format, mount -t thinfs, volume, clone"
thinfs format "$POOL" --size 1G --block-size 64K
mkdir "$MNT"
mount -t thinfs -o commit_interval=500ms,log_level=info "$POOL" "$MNT"
findmnt -rn -M "$MNT" -o SOURCE,FSTYPE,OPTIONS
[[ $(findmnt -rn -M "$MNT" -o FSTYPE) == fuse.thinfs ]] || fail "$MNT is not a fuse.thinfs mount"
pass "mount -t thinfs $POOL $MNT"

truncate -s 64M "$MNT/vol"
[[ $(stat -c %s "$MNT/vol") -eq $((64 << 20)) ]] || fail "vol is not 64 MiB"
head -c 4M /dev/urandom >"$T/a"
head -c 3M /dev/urandom >"$T/b"
dd if="$T/a" of="$MNT/vol" bs=1M conv=notrunc,fsync status=none
dd if="$T/b" of="$MNT/vol" bs=1M seek=40 conv=notrunc,fsync status=none
vol_sum=$(sha256sum <"$MNT/vol")
pass "volume vol: 64 MiB, 7 MiB written"

free_before=$(stat -f -c %f "$MNT")
start=$(date +%s%N)
cp --reflink=auto --sparse=never "$MNT/vol" "$MNT/snap"
ms=$(( ($(date +%s%N) - start) / 1000000 ))
sync "$MNT/snap"
free_after=$(stat -f -c %f "$MNT")
bsize=$(stat -f -c %S "$MNT")
used_kib=$(( (free_before - free_after) * bsize / 1024 ))
[[ $(sha256sum <"$MNT/snap") == "$vol_sum" ]] || fail "snap differs from vol"
# A byte-for-byte copy of the 64 MiB device would take 64 MiB (zero_detect
# would still store the 7 MiB of data); a clone takes (almost) nothing.
(( used_kib < 1024 )) || fail "the clone took $used_kib KiB of pool space: not a clone"
pass "cp --reflink=auto --sparse=never: snap == vol, ${ms} ms, ${used_kib} KiB of pool space"

printf 'snapshot diverges' | dd of="$MNT/snap" bs=1 seek=100 conv=notrunc,fsync status=none
[[ $(sha256sum <"$MNT/vol") == "$vol_sum" ]] || fail "writing snap changed vol"
snap_sum=$(sha256sum <"$MNT/snap")
[[ $snap_sum != "$vol_sum" ]] || fail "the write to snap did not land"
pass "copy-on-write: a write to snap leaves vol unchanged"

# Device commands of a mounted pool: served by /usr/bin/thinfs itself.
thinfs snapshot "$POOL" vol snap2 || fail "thinfs snapshot (mounted) exited $?"
[[ $(sha256sum <"$MNT/snap2") == "$vol_sum" ]] || fail "snap2 differs from vol"
thinfs delete "$POOL" snap2 || fail "thinfs delete (mounted) exited $?"
[[ ! -e $MNT/snap2 ]] || fail "snap2 is still in the mount after delete"
pass "thinfs snapshot and delete on the mounted pool"

umount "$MNT"
! findmnt -rn -M "$MNT" >/dev/null || fail "$MNT still mounted after umount"
wait_released "$POOL"
pass "umount $MNT (daemon exited, pool released)"

say "mount.thinfs option handling"
if mount -t thinfs -o bogus_option "$POOL" "$MNT" 2>"$T/err"; then
  fail "mount accepted -o bogus_option"
fi
grep -q bogus_option "$T/err" || fail "the error does not name the option: $(cat "$T/err")"
! findmnt -rn -M "$MNT" >/dev/null || fail "a failed mount left $MNT mounted"
pass "an unknown option is refused: $(head -1 "$T/err")"
mount -f -v -t thinfs -o defaults,noatime "$POOL" "$MNT" >/dev/null 2>&1 ||
  fail "mount -f (fake) failed"
! findmnt -rn -M "$MNT" >/dev/null || fail "mount -f mounted"
pass "mount -f: nothing mounted"

say "remount from an fstab line (mount -T)"
printf '# test fstab\n%s %s thinfs defaults,nofail,x-systemd.device-timeout=5s,commit_interval=1s,_netdev 0 0\n' \
  "$POOL" "$MNT" >"$T/fstab"
cat "$T/fstab"
mount -T "$T/fstab" "$MNT"
[[ $(findmnt -rn -M "$MNT" -o FSTYPE) == fuse.thinfs ]] || fail "fstab mount missing"
[[ $(sha256sum <"$MNT/vol") == "$vol_sum" ]] || fail "vol changed across the remount"
[[ $(sha256sum <"$MNT/snap") == "$snap_sum" ]] || fail "snap changed across the remount"
cmp -n $((4 << 20)) "$T/a" "$MNT/vol" || fail "vol lost its data"
pass "mount -T fstab: vol and snap persisted"
mount -T "$T/fstab" -a || fail "mount -a over the mounted fstab line exited $?"
[[ $(findmnt -rn -M "$MNT" | wc -l) -eq 1 ]] || fail "mount -a mounted the pool twice"
pass "mount -a again: the line already mounted is left alone"
ls -ls "$MNT"
umount "$MNT"
wait_released "$POOL"
pass "umount $MNT"

thinfs check "$POOL" || fail "thinfs check $POOL exited $?"
pass "thinfs check: clean"
# Unmounted: /usr/bin/thinfs runs /usr/libexec/thinfs/thinfs-engine.
listed=$(thinfs list "$POOL") || fail "thinfs list (unmounted) exited $?"
grep -q '^snap ' <<<"$listed" || fail "thinfs list (unmounted) lacks snap: $listed"
pass "thinfs list of the unmounted pool (through thinfs-engine)"
thinfs status "$POOL"

say "man page"
manpath=$(man -w thinfs)
[[ $manpath == /usr/share/man/man8/thinfs.8.gz ]] || fail "man -w thinfs: $manpath"
# mount.thinfs(8) is a ".so" link: man -w follows it to thinfs.8.gz.
[[ -f /usr/share/man/man8/mount.thinfs.8.gz ]] || fail "mount.thinfs.8.gz missing"
rendered_link=$(MANPAGER=cat man mount.thinfs 2>/dev/null)
grep -q '^MOUNT HELPER' <<<"$rendered_link" || fail "man mount.thinfs"
rendered=$(MANPAGER=cat MANWIDTH=80 man thinfs 2>"$T/manerr")
for section in SYNOPSIS COMMANDS 'MOUNT OPTIONS' 'EXIT STATUS' FILES EXAMPLES; do
  grep -q "^$section" <<<"$rendered" || fail "the man page lacks $section"
done
[[ ! -s $T/manerr ]] || fail "man reported: $(cat "$T/manerr")"
pass "man -w thinfs: $manpath ($(wc -l <<<"$rendered") lines rendered)"

say "bash completion"
comp=/usr/share/bash-completion/completions/thinfs
[[ -f $comp ]] || fail "$comp missing"
bash -n "$comp" || fail "$comp is not valid bash"
# Completes the words $1 (the last one being completed) with the installed
# script, and prints the candidates on one line.
complete_words() {
  bash -c '
    source "$1"; shift
    COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 ))
    COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
    _thinfs thinfs "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
    printf "%s " "${COMPREPLY[@]}"' _ "$comp" "$@"
}
got=$(complete_words thinfs sn)
[[ $got == "snapshot " ]] || fail "'thinfs sn<TAB>' gave '$got'"
got=$(complete_words thinfs format /tmp --bl)
[[ $got == "--block-size " ]] || fail "'thinfs format /tmp --bl<TAB>' gave '$got'"
got=$(complete_words thinfs mount "$POOL" "$MNT" -o ro,commit)
[[ $got == "ro,commit_interval= " ]] || fail "'-o ro,commit<TAB>' gave '$got'"
got=$(complete_words thinfs mount "$POOL" "$MNT" -o ro,def)
[[ $got == "ro,deferred_copy= " ]] || fail "'-o ro,def<TAB>' gave '$got'"
got=$(complete_words thinfs check "$POOL" --re)
[[ $got == *--repair* && $got == *--read-only* ]] || fail "'check --re<TAB>' gave '$got'"
got=$(complete_words thinfs status "$T/p")
[[ $got == "$POOL " ]] || fail "'thinfs status $T/p<TAB>' gave '$got'"
pass "completion: bash -n, subcommands, options, -o keys, directories"
if thinfs help list >/dev/null 2>&1; then
  mount -t thinfs "$POOL" "$MNT"
  got=$(complete_words thinfs delete "$POOL" "")
  umount "$MNT"
  wait_released "$POOL"
  [[ $got == *snap* && $got == *vol* ]] || fail "'thinfs delete POOL <TAB>' gave '$got'"
  pass "completion: device names from thinfs list: $got"
else
  echo "note: this thinfs has no 'list' yet: device-name completion not exercised"
fi

say "systemd unit"
unit=/lib/systemd/system/thinfs@.service
[[ -f $unit ]] || fail "$unit missing"
if command -v systemd-analyze >/dev/null; then
  # A template verifies through an instance: a link named after one.
  mkdir "$T/units"
  ln -s "$unit" "$T/units/thinfs@$(systemd-escape --path "$POOL").service"
  if systemd-analyze verify --man=no "$T/units/"thinfs@*.service >"$T/verify" 2>&1; then
    pass "systemd-analyze verify $(basename "$T"/units/thinfs@*.service): no complaints"
  elif [[ ! -d /run/systemd/system ]] &&
       [[ -z $(grep -v -E 'Failed to .*(bus|manager|connect)|System has not been booted with systemd|Operation not permitted' "$T/verify") ]]; then
    echo "note: systemd is not running here (PID 1 is $(ps -p 1 -o comm=)); verify could not load units:"
    sed 's/^/  /' "$T/verify"
  else
    sed 's/^/  /' "$T/verify"
    fail "systemd-analyze verify found problems in $unit"
  fi
else
  echo "note: no systemd-analyze: unit not verified"
fi
[[ -d /run/systemd/system ]] || echo "note: systemd is not PID 1 here: thinfs@.service not started"

say "apt-get remove --purge thinfs"
cd /
apt-get remove --purge -y -q thinfs
installed=0
hash -r
for f in /usr/bin/thinfs /usr/libexec/thinfs "$unit" /usr/sbin/mount.thinfs \
         /usr/share/man/man8/thinfs.8.gz \
         /usr/share/bash-completion/completions/thinfs /usr/share/doc/thinfs; do
  [[ ! -e $f ]] || fail "$f is still there after purge"
done
! dpkg-query -W thinfs >/dev/null 2>&1 || fail "dpkg still knows thinfs"
pass "purged: /usr/bin/thinfs and the other files are gone"

say "package-test: all checks passed ($(basename "$DEB"), $(stat -c %s "$DEB") bytes)"
