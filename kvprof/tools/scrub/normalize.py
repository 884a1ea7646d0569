"""What a reader sees in a string: text layers decoded, invisible characters dropped, look-alikes folded.

scrub matches its rules on every *view* of a string, not on the characters as stored:

- ``fold``: what a reader does not see is dropped (format characters such as zero-width
  spaces, joiners, soft hyphens and the BOM; other control characters but tab and newline; ANSI
  escape sequences; combining marks, after compatibility decomposition) and what a reader
  sees as the same character is folded onto one (Unicode NFKC: full-width forms,
  mathematical letters, ligatures; the common Cyrillic and Greek look-alikes of Latin
  letters; dashes onto ``-``). Case is kept: secret values are case-sensitive; host names
  are matched without case.
- ``unescape``: the escapes of text layers decoded in one pass: JSON and Python
  (``\\u002d``, surrogate pairs, ``\\U0001F600``, ``\\x2d`` byte runs as UTF-8, octal ``\\055``,
  ``\\n``...), HTML and XML character references (``&#45;``, ``&#x2d;``, ``&amp;``) and URL
  percent-escapes (``%2D``, byte runs as UTF-8).
- ``runs``: the runs of the base64 alphabets (standard and URL-safe) and of hex digits, each
  decoded to bytes, and bytes to text (``bytes_text``: UTF-8/16/32 by their BOM or by where
  their NUL bytes lie; gzip and zlib streams decompressed, bounded).

Every view keeps a map from each of its characters back to the span of the original it came
from (``View.span``), so a match in a view names the characters of the original it covers
(a secret cut across JSON strings is taken from the strings it touches, no more). Each pass is
one left-to-right scan of its input: every view of a string of n characters costs O(n), and the
views of one string are a fixed number (``MAX_DEPTH`` nested layers, a decoded payload being
at most 3/4 of its run).
"""

from __future__ import annotations

import binascii
import codecs
import html
import re
import unicodedata
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

MAX_DEPTH = 4  # nested encoding layers looked through (base64 of gzip of UTF-16 of escapes...)
MAX_DECODED = 1 << 26  # the most a compressed payload inside one string is inflated to

# ANSI / VT escape sequences: CSI (colours, cursor), OSC (titles, links; ended by BEL or ST),
# and the two-character ones. Each scan starts only at ESC, so the whole pass is linear.
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")

# Non-Latin letters a reader takes for Latin ones (Unicode's confusables for the Latin
# alphabet, the common ones: Cyrillic, Greek, a few Latin extensions) and dashes.
CONFUSABLES = str.maketrans({
    **dict(zip("аеорсухіјѕԁһӏԛԝɡνοαρτκιυ", "aeopcyxijsdhlqwgvoaptkiu")),
    **dict(zip("АВЕКМНОРСТХІЈЅҮΑΒΕΖΗΙΚΜΝΟΡΤΥΧ", "ABEKMHOPCTXIJSYABEZHIKMNOPTYX")),
    **dict(zip("ıȷℓ", "ijl")),
    **{c: "-" for c in "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe58\ufe63\uff0d"},
})
_KEEP_CONTROL = frozenset("\t\n\r")


@lru_cache(maxsize=1 << 14)
def fold_char(c: str) -> str:
    """One character as a reader sees it ("" for one not seen): see the module docstring."""
    if c in _KEEP_CONTROL:
        return c
    cat = unicodedata.category(c)
    if cat in ("Cf", "Cc", "Mn", "Me", "Cs", "Co", "Zl", "Zp"):
        return ""
    if c.isascii():
        return c
    out = "".join(d for d in unicodedata.normalize("NFKD", c) if unicodedata.category(d) not in ("Mn", "Me", "Cf"))
    return unicodedata.normalize("NFKC", out.translate(CONFUSABLES))


@dataclass
class View:
    """A string as a reader sees it, with where each of its characters came from: ``lo[j]`` and
    ``hi[j]`` bound the characters of the original that character ``j`` stands for (None: the
    identity, the view is the original)."""

    text: str
    lo: list[int] | None = None
    hi: list[int] | None = None
    how: str = "plain"

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The span of the original that ``text[start:end]`` stands for."""
        if self.lo is None or self.hi is None:
            return start, end
        if end <= start:
            return (self.lo[start], self.lo[start]) if start < len(self.lo) else (0, 0)
        return self.lo[start], self.hi[end - 1]

    def compose(self, inner: View, how: str) -> View:
        """``inner`` (a view of this view's text) as a view of the original."""
        if inner.lo is None or inner.hi is None:
            return View(inner.text, self.lo, self.hi, how)
        if self.lo is None or self.hi is None:
            return View(inner.text, inner.lo, inner.hi, how)
        lo, hi = self.lo, self.hi
        return View(inner.text, [lo[i] for i in inner.lo], [hi[i - 1] for i in inner.hi], how)


class _Builder:
    """Output text and its map, built piece by piece in one scan."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.lo: list[int] = []
        self.hi: list[int] = []

    def same(self, s: str, start: int, end: int) -> None:
        """Characters ``s[start:end]`` kept as they are."""
        if end > start:
            self.parts.append(s[start:end])
            self.lo.extend(range(start, end))
            self.hi.extend(range(start + 1, end + 1))

    def piece(self, text: str, start: int, end: int) -> None:
        """``text`` standing for the characters ``start:end`` of the original."""
        if text:
            self.parts.append(text)
            self.lo.extend([start] * len(text))
            self.hi.extend([end] * len(text))

    def view(self, how: str) -> View:
        return View("".join(self.parts), self.lo, self.hi, how)


_NEEDS_FOLD = re.compile(r"[^\t\n\r\x20-\x7e]")


def fold(s: str) -> View | None:
    """``s`` as a reader sees it (module docstring), or None when that is ``s`` itself."""
    if not _NEEDS_FOLD.search(s):
        return None
    b = _Builder()
    pos = 0
    ansi = [(m.start(), m.end()) for m in ANSI.finditer(s)] if "\x1b" in s else []
    ai = 0
    for m in _NEEDS_FOLD.finditer(s):
        i = m.start()
        if i < pos:
            continue
        b.same(s, pos, i)
        while ai < len(ansi) and ansi[ai][1] <= i:
            ai += 1
        if ai < len(ansi) and ansi[ai][0] == i:
            pos = ansi[ai][1]  # an escape sequence: dropped whole
            continue
        b.piece(fold_char(s[i]), i, i + 1)
        pos = i + 1
    b.same(s, pos, len(s))
    out = b.view("folded")
    return None if out.text == s else out


# One pass over every escape a text layer writes. Runs of byte escapes (\xNN, %NN) are taken
# together and read as UTF-8, runs of \uXXXX together so a surrogate pair becomes its character.
_ESCAPE = re.compile(
    r"(?P<u>(?:\\u[0-9A-Fa-f]{4})+)"
    r"|\\U(?P<U>[0-9A-Fa-f]{8})"
    r"|(?P<x>(?:\\x[0-9A-Fa-f]{2})+)"
    r"|(?P<pct>(?:%[0-9A-Fa-f]{2})+)"
    r"|\\(?P<oct>[0-7]{1,3})"
    r"|\\(?P<c>[\\/\"'nrtbfav])"
    r"|(?P<ent>&(?:#[xX][0-9A-Fa-f]{1,6}|#[0-9]{1,7}|[A-Za-z][A-Za-z0-9]{1,31});?)"
)
_SIMPLE = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", "a": "\a", "v": "\v"}


def _escape_text(m: re.Match[str]) -> str:
    g = m.lastgroup
    t = m.group()
    if g == "u":
        units = bytes.fromhex("".join(t[i + 2 : i + 6] for i in range(0, len(t), 6)))
        return units.decode("utf-16-be", errors="surrogatepass").encode("utf-16", "surrogatepass").decode(
            "utf-16", errors="replace")
    if g == "U":
        code = int(m.group("U"), 16)
        return chr(code) if code <= 0x10FFFF else t
    if g in ("x", "pct"):
        step = 4 if g == "x" else 3
        data = bytes.fromhex("".join(t[i + step - 2 : i + step] for i in range(0, len(t), step)))
        return data.decode("utf-8", errors="replace")
    if g == "oct":
        return chr(int(m.group("oct"), 8))
    if g == "c":
        c = m.group("c")
        return _SIMPLE.get(c, c)
    if t.startswith("&#"):  # any code point, controls included (an ESC then starts an ANSI sequence)
        body = t[2:].rstrip(";")
        code = int(body[1:], 16) if body[:1] in "xX" else int(body)
        return chr(code) if code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else t
    return html.unescape(t)


def unescape(s: str) -> View | None:
    """``s`` with every text-layer escape decoded (module docstring), or None when it has none."""
    if "\\" not in s and "%" not in s and "&" not in s:
        return None
    b = _Builder()
    pos = 0
    for m in _ESCAPE.finditer(s):
        b.same(s, pos, m.start())
        b.piece(_escape_text(m), m.start(), m.end())
        pos = m.end()
    if pos == 0:
        return None
    b.same(s, pos, len(s))
    out = b.view("escapes")
    return None if out.text == s else out


# ---------------------------------------------------------------- bytes to text

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"), (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def guess_encoding(data: bytes) -> tuple[str, int]:
    """(codec, bytes of BOM) for ``data``: its BOM, else UTF-16/32 when its NUL bytes lie where
    those put them for mostly-ASCII text, else UTF-8. Looks at the first 4 KiB only."""
    for bom, codec in _BOMS:
        if data.startswith(bom):
            return codec, len(bom)
    head = data[:4096]
    n = len(head) - len(head) % 4
    if n >= 4 and head.count(0) * 3 >= n:
        zeros = [sum(1 for i in range(k, n, 4) if head[i] == 0) for k in range(4)]
        quarter = n // 4
        if zeros[1] == zeros[2] == zeros[3] == quarter and zeros[0] < quarter:
            return "utf-32-le", 0
        if zeros[0] == zeros[1] == zeros[2] == quarter and zeros[3] < quarter:
            return "utf-32-be", 0
        if zeros[1] + zeros[3] > zeros[0] + zeros[2]:
            return "utf-16-le", 0
        return "utf-16-be", 0
    return "utf-8", 0


def inflate(data: bytes, limit: int = MAX_DECODED) -> bytes | None:
    """A gzip or zlib stream inflated (at most ``limit`` bytes; None when it is not one)."""
    if data[:2] == b"\x1f\x8b":
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0:
        d = zlib.decompressobj()
    else:
        return None
    try:
        out = d.decompress(data, limit)
    except zlib.error:
        return None
    return out or None


_UNPRINTABLE = re.compile(r"[^\t\n\r\x1b\x20-\x7e\u00a0-\ufffc]")  # ESC: ANSI sequences are text


def looks_like_text(s: str) -> bool:
    """At least 90 % of the characters printable (a decoded payload of text, not of binary)."""
    return len(_UNPRINTABLE.findall(s)) * 10 <= len(s)


# What a reader sees as visible ASCII (itself, its full-width forms, the look-alikes folded onto
# it) and the invisible characters put between such.
_ASCII_SEEN = re.compile("[\x21-\x7e\uff01-\uff5e\u00ad\u200b-\u200f\u2060\ufeff"
                         + re.escape("".join(map(chr, CONFUSABLES))) + "]")
_CODECS = ("utf-8", "utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")


def bytes_text(data: bytes, depth: int = 0) -> str:
    """Decoded bytes as text a reader would see: a compressed stream inflated first, then read
    in its encoding: its BOM's, else the first of ``guess_encoding``'s and the other UTF codecs
    that reads as text (``looks_like_text``) with at least half its characters visible ASCII
    (or its full-width forms and look-alikes, or zero-width spaces)
    (text with many characters outside ASCII has fewer NULs than the guess counts on; random
    bytes read as UTF-16 are printable too, but not ASCII); else as UTF-8."""
    for _ in range(MAX_DEPTH - depth):
        inner = inflate(data)
        if inner is None:
            break
        data = inner
    codec, skip = guess_encoding(data)
    if skip:
        return data[skip:].decode(codec, errors="replace")
    first = data.decode(codec, errors="replace")
    if looks_like_text(first) or 0 not in data:
        return first
    for other in _CODECS:
        if other != codec:
            text = data.decode(other, errors="replace")
            if looks_like_text(text) and len(_ASCII_SEEN.findall(text)) * 2 >= len(text):
                return text  # mostly (what reads as) ASCII: random bytes read as UTF-16 are not text
    return first


def strip_nuls(data: bytes) -> bytes:
    """Raw bytes with NULs removed: UTF-16/32 text of ASCII reads as ASCII (a raw-byte search)."""
    return data.replace(b"\x00", b"")


# ---------------------------------------------------------------- encoded runs

B64_RUN = re.compile(r"[A-Za-z0-9+/_\-]{8,}={0,2}")
HEX_RUN = re.compile(r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{12,}")


def b64_decode(run: str, start: int = 0) -> bytes:
    """A base64 run (either alphabet) decoded from its character ``start`` (b"" when too short)."""
    body = run.rstrip("=").replace("-", "+").replace("_", "/")[start:]
    if len(body) % 4 == 1:
        body = body[:-1]
    if len(body) < 8:
        return b""
    return binascii.a2b_base64(body + "=" * (-len(body) % 4))


def hex_decode(run: str, start: int = 0) -> bytes:
    chunk = run[start:]
    return bytes.fromhex(chunk[: len(chunk) - len(chunk) % 2])


_HEX_ONLY = re.compile(r"[0-9A-Fa-f]{12,}\Z")


def run_payloads(text: str) -> Iterator[tuple[int, int, str, list[bytes]]]:
    """(start, end, "base64" | "hex", decoded) for each encoded run of ``text``: base64 from its
    first character (the payload a layer wrote; the other alignments of a secret inside a larger
    payload are matched on the bytes by ``Rules``), hex at both nibble offsets. One scan."""
    for m in B64_RUN.finditer(text):
        run = m.group()
        data = b64_decode(run)
        if data:
            yield m.start(), m.end(), "base64", [data]
        if _HEX_ONLY.match(run):
            yield m.start(), m.end(), "hex", [hex_decode(run, 0), hex_decode(run, 1)]


def views(s: str, depth: int = 0) -> Iterator[View]:
    """Every view of ``s`` (module docstring), the original first. Text layers (folding and
    escapes) are applied in turn until nothing changes; each base64 or hex run of the most
    decoded one is decoded and its text viewed the same way, ``MAX_DEPTH`` layers deep, the
    view mapping every character of the payload to the whole run."""
    cur = View(s)
    yield cur
    for _ in range(2 * MAX_DEPTH):
        changed = False
        for step, how in ((fold, "folded"), (unescape, "escapes")):
            nxt = step(cur.text)
            if nxt is not None:
                cur = cur.compose(nxt, how)
                changed = True
                yield cur
        if not changed:
            break
    if depth >= MAX_DEPTH:
        return
    for start, end, how, payloads in run_payloads(cur.text):
        lo, hi = cur.span(start, end)
        for data in payloads:
            inner = bytes_text(data, depth + 1)
            if len(inner) < 4 or not looks_like_text(inner):
                continue  # not text: what its bytes hold is judged on the bytes themselves
            for v in views(inner, depth + 1):
                yield View(v.text, [lo] * len(v.text), [hi] * len(v.text), f"{how}/{v.how}")
