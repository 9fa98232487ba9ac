"""The message of the concise line, shortened so the line fits in 100 columns.

A finding's message says what is wrong and why ("... forces a host-device sync
on every iteration of `for step, (x, y) in enumerate(loader)`; keep the value
on the device ..."). The concise line (ruff's `path:line:col: CODE message`)
keeps the first clause, what is wrong here; ``--output-format full`` keeps the
whole message, the evidence notes and the fix. Shortening goes step by step,
stopping as soon as the line fits:

1. the first clause: the text before the first `; ` or `: ` outside code;
2. parentheticals outside code dropped (`pinned batch data (a DataLoader with ...)`);
3. code spans shortened: arguments to `(…)` (`` `optimizer.zero_grad(…)` ``),
   then a span still long to its start;
4. the longest run of whole comma-separated parts that fits
   (`` `.cuda()` hardcodes the CUDA device`` of "…, so this code fails without one");
5. the rule's summary, a whole sentence, in place of a site's sentence cut short;
6. the text cut at a word boundary, with `…`.
"""

from __future__ import annotations

import re
from typing import List

LINE_WIDTH = 100
# A path so long that it leaves less than this for the message still gets it:
# a message cut to nothing says nothing.
MIN_MESSAGE_WIDTH = 40
LONG_CODE_SPAN = 24
ELLIPSIS = "…"

_CODE_SPAN = re.compile(r"`[^`]*`")


def shorten(message: str, width: int, summary: str = "") -> str:
    """``message`` in at most ``max(width, MIN_MESSAGE_WIDTH)`` characters;
    ``summary`` (the rule's) stands in when the message's first clause cannot fit."""
    width = max(width, MIN_MESSAGE_WIDTH)
    if len(message) <= width:
        return message
    for step in (_first_clause, _without_parentheticals, _short_code_spans):
        message = step(message)
        if len(message) <= width:
            return message
    parts = _leading_parts(message, width)
    if parts:
        return parts
    for candidate in (summary, _without_parentheticals(summary)):
        if candidate and len(candidate) <= width:
            return candidate
    return _cut(message, width)


def _outside_code(message: str) -> List[bool]:
    """For each character, whether it is outside every `code span`."""
    outside = [True] * len(message)
    for span in _CODE_SPAN.finditer(message):
        for index in range(span.start(), span.end()):
            outside[index] = False
    return outside


def _first_clause(message: str) -> str:
    outside = _outside_code(message)
    for index, char in enumerate(message):
        if outside[index] and char in ";:" and message[index + 1 : index + 2] == " " and index > 0:
            return message[:index]
    return message


def _leading_parts(message: str, width: int) -> str:
    """The longest prefix that ends before a `, ` outside code and fits (empty: none)."""
    outside = _outside_code(message)
    ends = [i for i in range(1, min(len(message), width + 1)) if outside[i] and message[i : i + 2] == ", "]
    return message[: ends[-1]] if ends else ""


def _without_parentheticals(message: str) -> str:
    outside = _outside_code(message)
    result, depth = [], 0
    for index, char in enumerate(message):
        if outside[index] and char == "(" and index > 0 and message[index - 1] == " ":
            depth += 1
        if depth == 0:
            result.append(char)
        elif outside[index] and char == ")":
            depth -= 1
    return re.sub(r" {2,}", " ", "".join(result)).replace(" ,", ",").strip()


_ARGUMENTS = re.compile(r"\((?:[^()]|\([^()]*\))+\)")


def _short_code_spans(message: str) -> str:
    def shorten_span(match: "re.Match[str]") -> str:
        span = match.group(0)
        if len(span) <= LONG_CODE_SPAN + 2:
            return span
        span = _ARGUMENTS.sub("(" + ELLIPSIS + ")", span)
        if len(span) <= LONG_CODE_SPAN + 2:
            return span
        return span[: LONG_CODE_SPAN - 1].rstrip() + ELLIPSIS + "`"

    return _CODE_SPAN.sub(shorten_span, message)


def _cut(message: str, width: int) -> str:
    cut = message[: width - 1]
    space = cut.rfind(" ")
    if space > width // 2:
        cut = cut[:space]
    cut = cut.rstrip(" ,;:")
    if cut.count("`") % 2:  # never leave a code span open
        cut = cut[: cut.rfind("`")].rstrip()
    return cut + ELLIPSIS
