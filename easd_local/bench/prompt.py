"""The one fixed prompt used for every benchmark question (and for speed scripts), so
that methods and pairs are compared on identical inputs."""

from __future__ import annotations

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def build_messages(question: str, system: str | None = None) -> list[dict]:
    msgs = [{"role": "system", "content": system}] if system else []
    msgs.append({"role": "user", "content": f"{question.strip()}\n\n{INSTRUCTION}"})
    return msgs
