#!/usr/bin/env bash
# Fetch the English evaluation corpus (Debian Reference, plain text) into data/.
# Source: the Debian package debian-reference-en (apt-get download, dpkg-deb -x, take
# debian-reference.en.txt.gz, gunzip). Idempotent, sha256-verified, atomic move.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST_DIR="${TQ_DATA_DIR:-$ROOT/data}"
NAME="debian-reference.en.txt"
SHA256="fc8dce7f9d076f78432b74cc91555017c855d19d5bbc5b8e7e3ad472f00ec6cf"  # debian-reference-en 2.100
DEST="$DEST_DIR/$NAME"

source "$ROOT/scripts/fetch-lib.sh"
fetch_done_if_verified "$DEST" "$SHA256"

mkdir -p "$DEST_DIR"
TMP="$(mktemp -d "$DEST_DIR/.fetch.XXXXXX")"
chmod 755 "$TMP"   # apt's _apt user must be able to write the .deb here
trap 'rm -rf "$TMP"' EXIT

( cd "$TMP" && apt-get download debian-reference-en >/dev/null 2>"$TMP/apt.log" ) \
  || { cat "$TMP/apt.log" >&2; die "apt-get download debian-reference-en failed (run apt-get update?)"; }
DEB="$(ls "$TMP"/debian-reference-en_*.deb 2>/dev/null | head -n1)"
[[ -n "$DEB" ]] || die "no .deb after apt-get download"
dpkg-deb -x "$DEB" "$TMP/x" || die "dpkg-deb could not extract $DEB (truncated?)"
GZ="$(find "$TMP/x" -name "$NAME.gz" | head -n1)"
[[ -n "$GZ" ]] || die "$NAME.gz not found in $DEB"
gunzip -c "$GZ" > "$TMP/$NAME" || die "gunzip of $GZ failed (corrupt?)"
got_sha="$(sha_of "$TMP/$NAME")"
if [[ "$got_sha" != "$SHA256" ]]; then
  die "sha256 mismatch for $NAME: got $got_sha, expected $SHA256 (package version $(basename "$DEB") differs from the pinned 2.100?)"
fi
mv -f "$TMP/$NAME" "$DEST"
echo "fetch-corpus.sh: installed $DEST"
