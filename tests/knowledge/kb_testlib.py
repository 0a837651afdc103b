"""Fixtures made on the fly: small pdf and docx files, a tiny knowledge base."""
from __future__ import annotations

import io
import zipfile


def make_pdf(pages: list[str]) -> bytes:
    """A minimal valid PDF: one Helvetica text line per page (ASCII), with a correct xref table."""
    objs: list[bytes] = []
    n_pages = len(pages)
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(n_pages))
    objs.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objs.append(f"<< /Type /Pages /Kids [{kids}] /Count {n_pages} >>".encode())
    font_id = 3 + 2 * n_pages
    for i, text in enumerate(pages):
        content = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R "
                    f"/Resources << /Font << /F1 {font_id} 0 R >> >> >>".encode())
        objs.append(b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream")
    objs.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    return pdf_of(objs)


def pdf_of(objs: list[bytes]) -> bytes:
    """A PDF file of the objects ``objs`` (numbered from 1, the first the catalog), with its xref table."""
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % i + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1))
    for off in offsets:
        out.write(b"%010d 00000 n \n" % off)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref))
    return out.getvalue()


def make_docx(parts: list[tuple[str, int]], table: list[list[str]] | None = None) -> bytes:
    """A docx with paragraphs ``(text, heading level or 0)`` and an optional table."""
    import docx
    d = docx.Document()
    for text, level in parts:
        if level:
            d.add_heading(text, level)
        else:
            d.add_paragraph(text)
    if table:
        t = d.add_table(rows=len(table), cols=len(table[0]))
        for r, row in enumerate(table):
            for c, val in enumerate(row):
                t.cell(r, c).text = val
    buf = io.BytesIO()
    d.save(buf)
    return buf.getvalue()


def make_zip_bomb(member_bytes: int) -> bytes:
    """A "docx" whose one member expands ``member_bytes`` of zeros (compresses ~1000x)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("[Content_Types].xml", "<Types/>")
        with zf.open("word/document.xml", "w") as f:
            block = b"\0" * (1 << 20)
            for _ in range(member_bytes >> 20):
                f.write(block)
    return buf.getvalue()


def docx_with_body(xml: bytes | str, stored: bool = False) -> bytes:
    """A docx (python-docx's template) whose body holds ``xml`` before its section properties;
    ``stored``: document.xml uncompressed (the zip-bomb ratio checks pass whatever its size)."""
    src = zipfile.ZipFile(io.BytesIO(make_docx([("Intro", 1)])))
    body = xml.encode() if isinstance(xml, str) else xml
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == "word/document.xml":
                i = data.index(b"<w:sectPr")
                data = data[:i] + body + data[i:]
                z.writestr(info, data, compress_type=zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
            else:
                z.writestr(info, data)
    return out.getvalue()
