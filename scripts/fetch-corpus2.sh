#!/usr/bin/env bash
# Fetch a second English evaluation text into data/: the Python tutorial (Python 3.11
# documentation, "The Python Tutorial", every chapter in the order of its table of contents) as
# plain text. Source: Debian's python3.11-doc, installed with apt-get as scripts/install-deps.sh
# installs packages (sudo when not root); the HTML of /usr/share/doc/python3.11/html/tutorial
# is turned into text by the Python standard library's HTML parser (the page body only: no
# navigation, code blocks kept as text). Idempotent, sha256-verified, atomic move.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST_DIR="${TQ_DATA_DIR:-$ROOT/data}"
NAME="python-tutorial.en.txt"
PKG="python3.11-doc"
PKG_VERSION="3.11.2-6+deb12u9"
SHA256="1a08a4b7a0e3c7539807625679f42f9b28f103e77e3e07e2c3758f7a079e1a2a"  # the text extracted from python3.11-doc $PKG_VERSION
HTML="/usr/share/doc/python3.11/html/tutorial"
DEST="$DEST_DIR/$NAME"

source "$ROOT/scripts/fetch-lib.sh"
fetch_done_if_verified "$DEST" "$SHA256"

command -v python3 >/dev/null || die "python3 not found (run scripts/install-deps.sh)"
if ! dpkg-query -W -f='${Status}' "$PKG" 2>/dev/null | grep -q "install ok installed"; then
  SUDO=""
  if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null || die "$PKG is not installed and this is not root (no sudo): apt-get install $PKG as root"
    SUDO="sudo"
  fi
  echo "fetch-corpus2.sh: installing $PKG"
  export DEBIAN_FRONTEND=noninteractive
  LOG="$(mktemp)"
  trap 'rm -f "$LOG"' EXIT
  { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "$PKG"; } >"$LOG" 2>&1 \
    || { cat "$LOG" >&2; die "apt-get install $PKG failed"; }
fi
got_version="$(dpkg-query -W -f='${Version}' "$PKG")"
[[ -f "$HTML/index.html" ]] || die "$HTML/index.html missing (is $PKG $got_version complete?)"

mkdir -p "$DEST_DIR"
TMP="$(mktemp "$DEST_DIR/.fetch2.XXXXXX")"
trap 'rm -f "$TMP" ${LOG:+"$LOG"}' EXIT
python3 - "$HTML" "$TMP" <<'EOF' || die "extracting the text from $HTML failed"
import html.parser, os, re, sys

src, out = sys.argv[1], sys.argv[2]

class Body(html.parser.HTMLParser):
    """Text of <div class="body" role="main">, one paragraph per block element."""
    BLOCK = {"p", "pre", "li", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "div", "table", "blockquote"}
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth = 0      # nesting of <div> inside the body div (0: outside)
        self.pre = 0
        self.skip = 0       # headerlink anchors
        self.parts = []
        self.links = []     # toctree links in order (index.html)
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if self.depth == 0:
            if tag == "div" and a.get("role") == "main":
                self.depth = 1
            return
        if tag == "div":
            self.depth += 1
        if tag == "a" and "headerlink" in (a.get("class") or ""):
            self.skip += 1
        if tag == "a" and "reference internal" in (a.get("class") or "") and "toctree-l1" in self.li_class:
            self.links.append(a.get("href", "").split("#")[0])
        if tag == "li":
            self.li_class = a.get("class") or ""
        if tag == "pre":
            self.pre += 1
        if tag in self.BLOCK or tag == "br":
            self.parts.append("\n\n" if tag != "br" else "\n")
    li_class = ""
    def handle_endtag(self, tag):
        if self.depth == 0:
            return
        if tag == "div":
            self.depth -= 1
        if tag == "a" and self.skip:
            self.skip -= 1
        if tag == "pre":
            self.pre -= 1
        if tag in self.BLOCK:
            self.parts.append("\n\n")
    def handle_data(self, data):
        if self.depth == 0 or self.skip:
            return
        self.parts.append(data if self.pre else re.sub(r"\s+", " ", data))
    def text(self):
        t = "".join(self.parts)
        t = "\n".join(line.rstrip() if line.strip() else "" for line in t.split("\n"))
        t = re.sub(r"\n{3,}", "\n\n", t)
        return "\n".join(l.lstrip(" ") if not l.startswith("    ") and not l.startswith(">>>") else l
                         for l in t.split("\n")).strip() + "\n"

def parse(path):
    p = Body()
    with open(path, encoding="utf-8") as f:
        p.feed(f.read())
    return p

index = parse(os.path.join(src, "index.html"))
chapters = []
for h in index.links:
    if h and h.endswith(".html") and "/" not in h and h not in chapters:
        chapters.append(h)
if len(chapters) < 10:
    sys.exit(f"expected the tutorial's chapters in index.html, found {len(chapters)}: {chapters}")
texts = [index.text().split("\n\n")[0] + "\n"]  # the title
for c in chapters:
    texts.append(parse(os.path.join(src, c)).text())
with open(out, "w", encoding="utf-8") as f:
    f.write("\n\n".join(texts))
EOF
[[ -s "$TMP" ]] || die "the extracted text is empty"
got_sha="$(sha_of "$TMP")"
if [[ "$got_sha" != "$SHA256" ]]; then
  die "sha256 mismatch for $NAME: got $got_sha, expected $SHA256 ($PKG $got_version installed, the checksum is of $PKG_VERSION)"
fi
chmod 644 "$TMP"
mv -f "$TMP" "$DEST"
echo "fetch-corpus2.sh: installed $DEST ($(wc -c <"$DEST") bytes, from $PKG $got_version)"
