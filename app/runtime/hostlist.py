"""Expand Slurm-style host lists: ``node[01-03,07],gpu5`` -> node01 node02 node03 node07 gpu5."""

import re

from app.errors import UsageError

_BRACKET = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<ranges>[^\[\]]+)\](?P<rest>.*)$")


def split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p]


def _expand_range(item: str, nodelist: str) -> list[str]:
    if "-" not in item:
        return [item]
    low, _, high = item.partition("-")
    if not (low.isdigit() and high.isdigit()) or int(low) > int(high):
        raise UsageError(f"bad range {item!r} in host list {nodelist!r}: use e.g. node[01-04]")
    width = len(low)
    return [str(n).zfill(width) for n in range(int(low), int(high) + 1)]


def _expand_one(pattern: str, nodelist: str) -> list[str]:
    match = _BRACKET.match(pattern)
    if match is None:
        if "[" in pattern or "]" in pattern:
            raise UsageError(f"unbalanced brackets in host list {nodelist!r}")
        return [pattern]
    suffixes = _expand_one(match["rest"], nodelist) if match["rest"] else [""]
    numbers = [n for item in match["ranges"].split(",") for n in _expand_range(item, nodelist)]
    return [f"{match['prefix']}{n}{s}" for n in numbers for s in suffixes]


def expand(nodelist: str) -> list[str]:
    """Return every host name of a Slurm host list, in order."""
    hosts = [h for part in split_top_level(nodelist.strip()) for h in _expand_one(part, nodelist)]
    if not hosts:
        raise UsageError(f"empty host list {nodelist!r}")
    return hosts
