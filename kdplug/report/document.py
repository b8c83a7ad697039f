"""The report as a document: headings, paragraphs, tables and images, rendered to Markdown and to
HTML, and how numbers are written in it."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import compare


@dataclass
class Document:
    title: str
    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def heading(self, text: str) -> None:
        self.blocks.append(("h2", text))

    def para(self, text: str) -> None:
        self.blocks.append(("p", text))

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(("table", (header, rows)))

    def image(self, path: str, caption: str) -> None:
        self.blocks.append(("img", (path, caption)))

    def markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for kind, value in self.blocks:
            if kind == "h2":
                out += [f"## {value}", ""]
            elif kind == "p":
                out += [value, ""]
            elif kind == "table":
                header, rows = value
                out.append("| " + " | ".join(header) + " |")
                out.append("|" + "---|" * len(header))
                out += ["| " + " | ".join(row) + " |" for row in rows]
                out.append("")
            elif kind == "img":
                out += [f"![{value[1]}]({value[0]})", "", f"*{value[1]}*", ""]
        return "\n".join(out)

    def html(self) -> str:
        esc = html.escape
        body = [f"<h1>{esc(self.title)}</h1>"]
        for kind, value in self.blocks:
            if kind == "h2":
                body.append(f"<h2>{esc(value)}</h2>")
            elif kind == "p":
                body.append(f"<p>{esc(value).replace('**', '')}</p>")
            elif kind == "table":
                header, rows = value
                body.append(
                    "<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr></thead><tbody>"
                )
                body += [
                    "<tr>" + "".join(f"<td>{esc(c).replace('**', '')}</td>" for c in row) + "</tr>" for row in rows
                ]
                body.append("</tbody></table>")
            elif kind == "img":
                body.append(
                    f'<figure><img src="{esc(value[0])}" alt="{esc(value[1])}">'
                    f"<figcaption>{esc(value[1])}</figcaption></figure>"
                )
        style = (
            "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
            "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;"
            "text-align:right}th{background:#f3f3f3}td:first-child{text-align:left}img{max-width:100%}"
            "figcaption{font-style:italic;color:#555}"
        )
        return (
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{esc(self.title)}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
        )


def pct(value: Optional[float]) -> str:
    return "–" if value is None or math.isnan(value) else f"{value * 100:.2f}"


def points(value: Optional[float], signed: bool = True) -> str:
    if value is None or math.isnan(value):
        return "–"
    if math.isinf(value):
        return "−∞" if value < 0 else "∞"
    return f"{value * 100:+.2f}" if signed else f"{value * 100:.2f}"


def _interval(interval: Optional[tuple[float, float]]) -> str:
    return "–" if interval is None else f"[{points(interval[0])}, {points(interval[1])}]"


def _needed(comparison: compare.Comparison) -> str:
    if comparison.sd is None:
        return "– (one seed)"
    if comparison.seeds_needed is None:
        return "∞ (no difference)" if comparison.mean == 0 else "∞ (dev set too small)"
    return str(comparison.seeds_needed)
