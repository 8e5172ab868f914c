"""Lines of generated code and their indentation: the one emitter every renderer writes with."""
from __future__ import annotations

INDENT = "    "


def under(cond: str, code: str) -> str:
    """`code` (lines) run only when `cond` holds."""
    return f"if {cond}:\n" + "\n".join(INDENT + ln for ln in code.split("\n"))


class Emitter:
    """Lines at indentation depths.  `add(code)` appends each line of `code` at the current
    `depth`, one level deeper per 4 leading spaces of the line (so a fragment such as
    "if c:\\n    continue" keeps its shape); renderers move `depth` as they open and close
    loops."""

    def __init__(self, depth: int = 1):
        self.body: list[tuple[int, str]] = []
        self.depth = depth

    def add(self, code: str):
        for ln in code.split("\n"):
            extra = (len(ln) - len(ln.lstrip(" "))) // len(INDENT)
            self.body.append((self.depth + extra, ln.strip()))

    def lines(self) -> list[str]:
        """The lines, indented."""
        return [INDENT * d + s for d, s in self.body]

    def text(self) -> str:
        """The lines as one text, ending with a newline."""
        return "\n".join(self.lines()) + "\n"
