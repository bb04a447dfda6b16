"""The report's two renderings of the same content: one self-contained HTML page (plots
inlined) and a Markdown twin."""

from __future__ import annotations

import base64
import html
import os
from pathlib import Path


def _img_tag(path: Path | None) -> str:
    if not path or not Path(path).exists():
        return ""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<p><img src="data:image/png;base64,{data}" style="max-width:100%"></p>'


def render_html(title: str, content: list[tuple[str, list]], images: dict[str, Path]) -> str:
    e = html.escape
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>",
        "<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;"
        "padding:0 1em;color:#222}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:4px 8px;font-size:14px;text-align:left}"
        "th{background:#f3f3f3}.ok{background:#e6f4ea;border-left:6px solid #1e8e3e}"
        ".bad{background:#fce8e6;border-left:6px solid #d93025;font-weight:bold}"
        ".banner{padding:10px 14px;margin:1em 0}</style></head><body>",
        f"<h1>{e(title)}</h1>",
    ]
    for heading, blocks in content:
        parts.append(f"<h2>{e(heading)}</h2>")
        for b in blocks:
            if b[0] == "p":
                parts.append(f"<p>{e(b[1])}</p>")
            elif b[0] == "banner":
                parts.append(f"<div class='banner {'ok' if b[1] else 'bad'}'>{e(b[2])}</div>")
            elif b[0] == "table":
                parts.append(
                    "<table><tr>" + "".join(f"<th>{e(str(h))}</th>" for h in b[1]) + "</tr>"
                )
                for row in b[2]:
                    parts.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>")
                parts.append("</table>")
            elif b[0] == "img":
                parts.append(_img_tag(images.get(b[1])))
    parts.append("</body></html>")
    return "\n".join(parts)


def render_markdown(
    title: str, content: list[tuple[str, list]], images: dict[str, Path], base: Path
) -> str:
    lines = [f"# {title}", ""]
    for heading, blocks in content:
        lines += [f"## {heading}", ""]
        for b in blocks:
            if b[0] == "p":
                lines += [b[1], ""]
            elif b[0] == "banner":
                lines += [("**OK:** " if b[1] else "**PROBLEM:** ") + b[2], ""]
            elif b[0] == "table":
                header = [str(h) or " " for h in b[1]]
                lines.append("| " + " | ".join(header) + " |")
                lines.append("|" + "---|" * len(header))
                for row in b[2]:
                    lines.append("| " + " | ".join(str(c).replace("|", "/") for c in row) + " |")
                lines.append("")
            elif b[0] == "img" and images.get(b[1]) and Path(images[b[1]]).exists():
                rel = os.path.relpath(Path(images[b[1]]).resolve(), base.resolve())
                lines += [f"![{b[1]}]({rel})", ""]
    return "\n".join(lines)
