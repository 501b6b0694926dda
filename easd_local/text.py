"""Checking text before it reaches the tokenizer.

Python hands us text that cannot be encoded as UTF-8 in two ways: bytes that were not UTF-8
(argv and stdin decoded with ``surrogateescape`` keep each bad byte as a surrogate
U+DC80..U+DCFF) and lone surrogates written as JSON escapes (``"\\ud800"``). llama.cpp needs
UTF-8 bytes, and silently replacing the bad characters would answer a question nobody asked,
so such text is refused with a message that says where the first bad character is.
"""

from __future__ import annotations

from .errors import InvalidTextError


def check_text(text: str, what: str) -> str:
    """Return ``text`` if it encodes as UTF-8; InvalidTextError naming ``what`` otherwise."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidTextError(f"{what} is not valid UTF-8: {describe_bad_char(text, e.start)}") from None
    return text


def describe_bad_char(text: str, index: int) -> str:
    ch = ord(text[index])
    if 0xDC80 <= ch <= 0xDCFF:  # a byte that was not UTF-8, kept by surrogateescape
        return f"byte 0x{ch - 0xDC00:02x} at character {index + 1} is not part of a UTF-8 character"
    return f"lone surrogate U+{ch:04X} at character {index + 1} (an unpaired JSON \\u escape?)"


def decode_input(data: bytes, what: str) -> str:
    """Bytes read from stdin or a file as text, refusing what is not UTF-8."""
    return check_text(data.decode("utf-8", errors="surrogateescape"), what)
