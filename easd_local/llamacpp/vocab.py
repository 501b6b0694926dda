"""A model's vocabulary and chat template: tokenize and detokenize, token pieces, the
end-of-generation ids, and the conversation rendered with the GGUF's own template into
tokens where only the template's markers are special.

Part of the runtime layer (with ``runtime``, ``llama_log`` and ``devices``): the only
modules that touch ctypes. A :class:`Vocab` reads a loaded ``llama_model`` (weights or
vocabulary only) through its ``ModelHandle``, which it keeps alive: a vocabulary kept after the
``ModelFile`` that made it was dropped still works; after an explicit ``close`` it says so.
"""

from __future__ import annotations

import codecs
import ctypes
import re
import secrets
from pathlib import Path
from typing import Sequence

import llama_cpp as _ll

from ..errors import ChatTemplateError, RuntimeFailure
from .template import compile_template, exception_line
from ..text import check_text

_TYPE_NAMES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}


class ModelHandle:
    """Owns one ``llama_model``: frees it when ``free`` is called or when nobody holds the handle
    any more (the ``ModelFile`` that loaded it and the ``Vocab`` that reads it both do)."""

    __slots__ = ("ptr",)

    def __init__(self, ptr) -> None:
        self.ptr = ptr

    def free(self) -> None:
        # the handle off the object before it is freed: a Ctrl-C between the two leaks it,
        # the other order would free it again from __del__ (a double free)
        ptr, self.ptr = self.ptr, None
        if ptr:
            _ll.llama_model_free(ptr)

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self.free()
        except Exception:
            pass


class Vocab:
    """The vocabulary of a loaded ``llama_model`` (``model``: its handle) and its chat
    template (``chat_template``: the GGUF's, None when it has none). ``path`` names the
    file in error messages."""

    def __init__(self, model: ModelHandle, path: Path, chat_template: str | None):
        self.path = path
        self.chat_template = chat_template
        self._model = model
        self._ptr = _ll.llama_model_get_vocab(model.ptr)
        self.n_vocab = int(_ll.llama_vocab_n_tokens(self._ptr))
        self._pieces: dict[tuple[int, bool], bytes] = {}

    @property
    def _vocab(self):
        """llama.cpp's vocabulary, while its model is loaded (a freed one would crash llama.cpp)."""
        if self._model.ptr is None:
            raise RuntimeFailure(f"{self.path.name}: the model is closed; its vocabulary cannot be used")
        return self._ptr

    @property
    def vocab_type(self) -> int:
        return int(_ll.llama_vocab_type(self._vocab))

    @property
    def type_name(self) -> str:
        """The tokenizer kind as llama.cpp names it: "bpe", "spm"..."""
        return _TYPE_NAMES.get(self.vocab_type, "unknown")

    @property
    def bos_id(self) -> int:
        return int(_ll.llama_vocab_bos(self._vocab))

    @property
    def eos_id(self) -> int:
        return int(_ll.llama_vocab_eos(self._vocab))

    @property
    def add_bos(self) -> bool:
        return bool(_ll.llama_vocab_get_add_bos(self._vocab))

    @property
    def add_eos(self) -> bool:
        return bool(_ll.llama_vocab_get_add_eos(self._vocab))

    def is_eog(self, token: int) -> bool:
        return bool(_ll.llama_vocab_is_eog(self._vocab, token))

    def eog_ids(self) -> frozenset[int]:
        if not hasattr(self, "_eog"):
            self._eog = frozenset(t for t in range(self.n_vocab) if _ll.llama_vocab_is_eog(self._vocab, t))
        return self._eog

    def token_text(self, token: int) -> bytes:
        """The vocabulary's own text for a token id (as stored in the GGUF)."""
        return _ll.llama_vocab_get_text(self._vocab, token) or b""

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            check_text(text, "the text")  # raises InvalidTextError, naming the bad character
            raise
        n_max = len(data) + 8
        buf = (_ll.llama_token * n_max)()
        n = _ll.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (_ll.llama_token * n_max)()
            n = _ll.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
            if n < 0:
                raise RuntimeFailure(f"{self.path.name}: tokenization failed")
        return list(buf[:n])

    def token_to_piece(self, token: int, *, special: bool = False) -> bytes:
        key = (token, special)
        piece = self._pieces.get(key)
        if piece is None:  # a token's piece never changes: asked once (streaming asks per token)
            buf = ctypes.create_string_buffer(64)
            n = _ll.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = _ll.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
            piece = self._pieces[key] = buf.raw[: max(n, 0)]
        return piece

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return b"".join(self.token_to_piece(t, special=special) for t in tokens).decode("utf-8", errors="replace")

    def streamer(self) -> "Detokenizer":
        return Detokenizer(self)

    def _formatter_for(self, add_generation_prompt: bool):
        """llama-cpp-python's Jinja2 formatter for the GGUF's template (compiled once);
        ChatTemplateError when there is none or it does not compile."""
        template = self.chat_template
        if not template:
            raise ChatTemplateError(f"{self.path.name} has no chat template in its GGUF metadata")
        if not hasattr(self, "_formatter"):
            bos = self.token_to_piece(self.bos_id, special=True).decode("utf-8", "replace") if self.bos_id >= 0 else ""
            eos = self.token_to_piece(self.eos_id, special=True).decode("utf-8", "replace") if self.eos_id >= 0 else ""
            self._formatter = {}
            self._fmt_tokens = (eos, bos)
        key = add_generation_prompt
        if key not in self._formatter:
            eos, bos = self._fmt_tokens
            try:
                self._formatter[key] = compile_template(
                    template, eos_token=eos, bos_token=bos, add_generation_prompt=add_generation_prompt
                )
            except ChatTemplateError as e:
                raise ChatTemplateError(
                    f"{self.path.name}: the chat template in its GGUF metadata is broken ({e})"
                ) from None
        return self._formatter[key]

    def chat_template_error(self) -> str | None:
        """Why the GGUF's chat template cannot be used (missing, does not compile), or None."""
        try:
            self._formatter_for(True)
        except ChatTemplateError as e:
            return str(e)
        return None

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        """Render messages with the GGUF's own chat template (llama-cpp-python's Jinja2
        formatter, the same one llama-cpp-python's chat completion uses)."""
        formatter = self._formatter_for(add_generation_prompt)
        try:
            return formatter(messages=messages).prompt
        except Exception as e:  # jinja errors from a template we did not write
            raise ChatTemplateError(f"{self.path.name}: the chat template failed to render ({exception_line(e)})") from None

    def chat_tokens(self, messages: list[dict], *, add_generation_prompt: bool = True) -> list[int]:
        """The rendered conversation as tokens, where only the template's own markers are
        special: text inside a message that spells a control token (``<|im_end|>``) stays
        text, so a message cannot close its turn and open a system turn of its own.

        The template is rendered once more with each message's text replaced by a unique
        placeholder, which tells the template's text from the messages'. Control tokens are
        then split out of the template's text only, the way llama.cpp splits them (longest
        first; LSTRIP/RSTRIP whitespace), and each run of text between two of them is
        tokenized in one piece without special-token parsing, as llama.cpp tokenizes its
        text fragments, so a conversation with no marker in its messages gets exactly the
        tokens of tokenizing the whole rendering with special-token parsing on."""
        text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        segments = self._message_segments(messages, text, add_generation_prompt)
        pieces: list[str | int] = []  # text runs and control-token ids
        for seg, is_message in segments:
            pieces.extend([seg] if is_message else self._split_control_tokens(seg))
        # the template already wrote BOS where the model wants it: add_special=False
        return self._tokenize_pieces(pieces)

    def _message_segments(self, messages: list[dict], text: str, add_generation_prompt: bool) -> list[tuple[str, bool]]:
        """``text`` cut into (piece, is a message's text) by rendering placeholders."""
        marks = [f"\ue000{secrets.token_hex(6)}-{i}\ue001" for i in range(len(messages))]
        masked = [{**m, "content": marks[i]} if isinstance(m.get("content"), str) else m
                  for i, m in enumerate(messages)]
        rendered = self.apply_chat_template(masked, add_generation_prompt=add_generation_prompt)
        index = {mark: i for i, mark in enumerate(marks)}
        parts = re.split("(" + "|".join(map(re.escape, marks)) + ")", rendered)
        segments = [(messages[index[p]]["content"], True) if j % 2 else (p, False) for j, p in enumerate(parts)]
        if "".join(seg for seg, _ in segments) == text:
            return segments
        # The template changed a message's text (trimmed it, say), so the placeholders do
        # not line up. Without a marker in any message the plain rendering is safe.
        if not any(isinstance(m.get("content"), str) and self._split_control_tokens(m["content"]) != [m["content"]]
                   for m in messages):
            return [(text, False)]
        raise ChatTemplateError(
            f"{self.path.name}: a message spells one of the model's control tokens, and this chat template "
            "rewrites message text, so it cannot be kept as text; remove the marker or use --raw"
        )

    def _control_tokens(self) -> list[tuple[str, int, int]]:
        """(text, id, attributes) of the tokens llama.cpp recognises only when it parses
        special tokens (control and unknown ones), longest text first as llama.cpp tries them."""
        if not hasattr(self, "_controls"):
            found = []
            for t in range(self.n_vocab):
                attr = int(_ll.llama_vocab_get_attr(self._vocab, t))
                if attr & (_ll.LLAMA_TOKEN_ATTR_CONTROL | _ll.LLAMA_TOKEN_ATTR_UNKNOWN):
                    text = self.token_text(t).decode("utf-8", errors="replace")
                    if text:
                        found.append((text, t, attr))
            self._controls = sorted(found, key=lambda c: -len(c[0].encode("utf-8")))
        return self._controls

    def _split_control_tokens(self, text: str) -> list[str | int]:
        """``text`` as text runs and control-token ids (llama.cpp's tokenizer_st_partition)."""
        pieces: list[str | int] = [text]
        for tok_text, tok, _attr in self._control_tokens():
            out: list[str | int] = []
            for p in pieces:
                if isinstance(p, int) or tok_text not in p:
                    out.append(p)
                    continue
                parts = p.split(tok_text)
                for k, part in enumerate(parts):
                    if k:
                        out.append(tok)
                    out.append(part)
            pieces = out
        return pieces

    def _tokenize_pieces(self, pieces: list[str | int]) -> list[int]:
        attrs = {tok: attr for _text, tok, attr in self._control_tokens()}
        runs: list[str | int] = []  # adjacent text merged: one fragment, as llama.cpp sees it
        for p in pieces:
            if isinstance(p, str) and runs and isinstance(runs[-1], str):
                runs[-1] += p
            else:
                runs.append(p)
        ws = " \t\n\v\f\r"  # C isspace, which llama.cpp strips with
        for k, p in enumerate(runs):
            if isinstance(p, int):
                if attrs.get(p, 0) & _ll.LLAMA_TOKEN_ATTR_LSTRIP and k and isinstance(runs[k - 1], str):
                    runs[k - 1] = runs[k - 1].rstrip(ws)
                if attrs.get(p, 0) & _ll.LLAMA_TOKEN_ATTR_RSTRIP and k + 1 < len(runs) and isinstance(runs[k + 1], str):
                    runs[k + 1] = runs[k + 1].lstrip(ws)
        tokens: list[int] = []
        for p in runs:
            if isinstance(p, int):
                tokens.append(p)
            elif p:
                tokens.extend(self.tokenize(p, add_special=False, parse_special=False))
        return tokens


class Detokenizer:
    """Incremental detokenizer for streaming: returns only complete UTF-8 characters, so a
    multi-byte character split across tokens is never emitted half-way."""

    def __init__(self, vocab: Vocab):
        self._vocab = vocab
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token: int) -> str:
        return self._dec.decode(self._vocab.token_to_piece(token))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)
