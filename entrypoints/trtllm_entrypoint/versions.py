"""Release numbers of version strings, with the standard library alone: the image has no `packaging`, and the host
imports this module too, so both sides read a version the same way (as PEP 440 does, for the versions the matrix
holds: tests/unit/test_matrix.py compares it with `packaging` over all of them)."""

from __future__ import annotations


def version_tuple(version: str) -> tuple[int, ...]:
    """Leading numeric release of a version string: '0.17.0.post1' -> (0, 17, 0), '1.2.0rc8' -> (1, 2, 0)."""
    parts: list[int] = []
    for piece in version.split("."):
        digits = ""
        for ch in piece:
            if not "0" <= ch <= "9":
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if digits != piece:
            break
    return tuple(parts[:3])
