"""The GGUF chat template compiled by the formatter llama-cpp-python's chat completion uses
(Jinja2ChatFormatter: its sandbox and jinja2 extensions). One definition for both a header
check without a model (``models inspect``) and the loaded vocabulary's rendering, so a
template that passes the check compiles at load, and both name a fault the same way."""

from __future__ import annotations

from ..errors import ChatTemplateError


def exception_line(e: Exception) -> str:
    """A template's compile or render error in one line: type, message, template line."""
    text = " ".join(str(e).split()) or type(e).__name__
    line = getattr(e, "lineno", None)
    return f"{type(e).__name__}: {text}" + (f" (template line {line})" if line else "")


def compile_template(template: str, *, eos_token: str = "", bos_token: str = "",
                     add_generation_prompt: bool = True):
    """The compiled formatter; ChatTemplateError (its one-line cause) when it does not compile."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    try:
        return Jinja2ChatFormatter(template=template, eos_token=eos_token, bos_token=bos_token,
                                   add_generation_prompt=add_generation_prompt)
    except Exception as e:  # jinja2's TemplateSyntaxError and kin, from a template we did not write
        raise ChatTemplateError(exception_line(e)) from None
