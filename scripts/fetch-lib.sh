# Shared by the fetch scripts (sourced, not run): the error helper, the checksum, and the
# "already there and verified" check that makes them idempotent.
#   source "$(dirname "${BASH_SOURCE[0]}")/fetch-lib.sh"   (sets FETCH_NAME from the caller)
#   fetch_done_if_verified DEST SHA256 [SIZE]   exits 0 when DEST has the checksum (and size)

FETCH_NAME="$(basename "${BASH_SOURCE[1]:-$0}")"

die() { echo "$FETCH_NAME: error: $*" >&2; exit 1; }
sha_of() { sha256sum "$1" | cut -d' ' -f1; }

fetch_done_if_verified() {
  local dest="$1" sha="$2" size="${3:-}"
  [[ -f "$dest" ]] || return 0
  if [[ ( -z "$size" || "$(stat -c %s "$dest")" == "$size" ) && "$(sha_of "$dest")" == "$sha" ]]; then
    echo "$FETCH_NAME: $dest present and verified"
    exit 0
  fi
  echo "$FETCH_NAME: $dest has the wrong ${size:+size or }checksum; fetching again" >&2
}
