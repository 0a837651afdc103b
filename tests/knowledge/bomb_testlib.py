"""Hostile and slow files built on the fly: PDFs whose pages share one compressed content stream,
deeply nested JSON / YAML."""
from __future__ import annotations

import zlib


def shared_stream_pdf(pages: int, content: bytes, tag: bytes = b"") -> bytes:
    """A valid PDF of ``pages`` pages that all draw the same FlateDecode content stream (stored
    once, compressed): a few KB on disk, ``pages * len(content)`` bytes of content to interpret.
    ``tag`` (a comment) makes distinct bytes of the same document."""
    comp = zlib.compress(content, 9)
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % (5 + i) for i in range(pages)), pages),
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
            b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(comp) + comp + b"\nendstream"]
    page = (b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
            b"/Contents 4 0 R >>")
    objs += [page] * pages
    out = bytearray(b"%PDF-1.4\n%" + tag + b"\n")
    offsets = []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def text_lines(n: int, chars: int = 1) -> bytes:
    """Content stream: ``n`` text objects of ``chars`` characters each."""
    return (b"BT /F1 12 Tf 72 720 Td (" + b"A" * chars + b") Tj ET\n") * n
